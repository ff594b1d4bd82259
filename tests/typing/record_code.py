"""kiln.Record subclasses as a type checker sees them (tests/test_record_class.py):
mypy --strict accepts this file."""

import kiln


class Point(kiln.Record):
    x: int
    y: float = 0.0


class Point3(Point):
    z: float = 0.0


def roundtrip(p: Point) -> Point:
    return kiln.decode(kiln.encode(p, Point), Point)


p = Point(1, 2.0)
q = Point(x=3)
r = Point3(1, 2.0, z=3.5)
x: int = p.x
y: float = q.y
ps: list[Point] = kiln.decode(kiln.encode([p, q], list[Point]), list[Point])
assert roundtrip(p) == p and ps == [p, q] and r.z == 3.5
print("ok")
