"""Mistakes with kiln.Record that mypy reports, one per line marked with E."""

import kiln


class Point(kiln.Record):
    x: int
    y: float = 0.0


Point("one", 2.0)  # E: a str for an int field
Point(1, 2.0, 3)  # E: too many arguments
Point(y=2.0)  # E: x missing
Point(1, w=2)  # E: no field w
s: str = Point(1).x  # E: an int is not a str
