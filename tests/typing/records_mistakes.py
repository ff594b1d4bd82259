"""Record container mistakes a type checker must catch (tests/test_records_typing.py)."""

import dataclasses

import kiln


@dataclasses.dataclass
class Sample:
    id: int


rf = kiln.RecordFile("x.kilnr", Sample)
n: int = rf[0]  # E: item type
s: str = rf[0].id  # E: field type
names: list[str] = rf[0:2]  # E: slice type
w = kiln.RecordWriter("x.kilnr", Sample)
w.write("not a sample")  # E: write type
