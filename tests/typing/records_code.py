"""Typical use of the record container; must pass mypy --strict and pyright strict."""

import dataclasses
import io
import os
import tempfile
from typing import TYPE_CHECKING, Any, Iterator, List

import kiln


@dataclasses.dataclass
class Sample:
    id: int
    name: str


def main(folder: str) -> None:
    path = os.path.join(folder, "s.kilnr")
    with kiln.RecordWriter(path, Sample) as w:
        first: int = w.write(Sample(1, "a"))
        w.write(Sample(2, "b"))
    assert first == 0
    with kiln.RecordFile(path, Sample) as rf:
        one: Sample = rf[0]
        last: Sample = rf[-1]
        some: List[Sample] = rf[0:2]
        it: Iterator[Sample] = iter(rf)
        names = [s.name for s in rf]
        assert one.id == 1 and last.id == 2 and len(some) == 2 and next(it) == one
        assert names == ["a", "b"] and len(rf) == 2
    loose: kiln.RecordFile[Any] = kiln.RecordFile(path, "struct{id:i64,name:str,}")
    loose.close()
    data = open(path, "rb").read()
    d = kiln.StreamDecoder(Sample)
    got: List[Sample] = d.feed(data)
    d.eof()
    streamed = [s.id for s in kiln.iter_records(io.BytesIO(data), Sample)]
    if TYPE_CHECKING:   # the record type, not Any
        from typing_extensions import assert_type
        assert_type(kiln.iter_records(io.BytesIO(data), Sample), Iterator[Sample])
    assert [s.id for s in got] == streamed == [1, 2]
    print("ok")


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as folder:
        main(folder)
