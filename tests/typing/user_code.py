"""Typical user code, checked by mypy --strict and pyright (tests/test_typing.py).

It also runs: test_typing.py executes it, so every line is real usage.
"""

import dataclasses
import datetime as dt
import decimal
import enum
import uuid
from typing import Annotated, Literal, NamedTuple, Optional

import numpy as np

import kiln


@dataclasses.dataclass
class Reading:
    id: int
    sensor: str
    count: kiln.I32
    scale: kiln.F32
    values: kiln.F32Array
    tags: list[int]
    note: Optional[str] = None


class Point(NamedTuple):
    x: float
    y: float


def round_trip() -> Reading:
    r = Reading(7, "probe-a", 3, 0.5, np.array([1.0, -2.5], np.float32), [1, 2, 3])
    buf: bytes = kiln.encode(r, Reading)
    back: Reading = kiln.decode(buf, Reading)          # inferred as Reading
    assert back.tags == [1, 2, 3]                      # a list, as annotated
    assert back.values.dtype == np.float32
    dec = kiln.Decoder(Reading, frame=True)
    enc = kiln.Encoder(Reading, frame=True)
    again: Reading = dec.decode(enc.encode(back))      # Decoder[Reading]
    # an annotation as the type (mypy sees a special form: the result is Any)
    none = kiln.decode(kiln.encode(None, Optional[Reading]), Optional[Reading])
    maybe = kiln.decode(kiln.encode(back, Reading | None), Reading | None)
    assert none is None and maybe.tags == back.tags
    out = bytearray()
    end: int = enc.encode_into(again, out)
    assert end == len(out)
    p: Point = kiln.decode(kiln.encode(Point(1.0, 2.0), Point), Point)
    assert p.x == 1.0
    return again


def dynamic() -> None:
    t: kiln.Type = kiln.parse_type("struct{id:i64, values:list<f64>}")
    v = kiln.decode(kiln.encode({"id": 1, "values": [0.5]}, t), t)   # Any: a dict
    assert v["id"] == 1
    try:
        kiln.decode(b"\x01", "i32")
    except kiln.KilnError as e:
        code: str = e.code
        offset: int = e.offset
        assert (code, offset) == ("EOF", 0)


def tensors() -> None:
    w = np.eye(3, dtype=np.float32)
    d: kiln.TensorDirectory = kiln.decode_tensors(kiln.encode_tensors({"w": w}))
    t: kiln.Tensor = d["w"]
    arr: np.ndarray = t.numpy()
    assert arr.shape == (3, 3) and t.shape == (3, 3) and t.dtype == "f32"
    for name, tensor in d.items():
        assert isinstance(name, str) and tensor.nbytes == 36
    shared = np.from_dlpack(t)
    assert shared.flags.writeable is False


def files_and_schemas(folder: str) -> None:
    # names that kiln/__init__.py imports on first use (module __getattr__)
    path = folder + "/m.kiln"
    kiln.save_tensors(path, {"w": np.arange(4, dtype=np.int16)}, metadata={"v": 1})
    d: kiln.TensorDirectory = kiln.load_tensors(path)
    assert d["w"].numpy().tolist() == [0, 1, 2, 3]
    with kiln.TensorWriter(folder + "/s.kiln") as w:
        w.add("x", "f32", (2,))
        w.write("x", np.array([1, 2], dtype=np.float32))
    t: kiln.Type = kiln.schema_from_json({"type": "integer", "format": "int32"})
    assert kiln.to_json_schema(t)["format"] == "int32"
    try:
        kiln.schema_from_json({"type": "nothing"})
    except kiln.SchemaError as e:
        assert isinstance(str(e), str)
    assert kiln.files.load_metadata(path) == {"v": 1}


class Color(enum.IntEnum):
    RED = 1
    GREEN = 2


@dataclasses.dataclass
class Event:
    color: Color
    kind: Literal["a", "b"]
    at: dt.datetime
    pair: tuple[int, str]
    many: tuple[float, ...]
    id: uuid.UUID
    price: decimal.Decimal
    small: Annotated[Color, kiln.u8]
    note: str | None = None


def python_types() -> None:
    e = Event(Color.GREEN, "b", dt.datetime(2020, 1, 2, tzinfo=dt.timezone.utc), (1, "x"),
              (0.5,), uuid.UUID(int=1), decimal.Decimal("1.10"), Color.RED)
    back: Event = kiln.decode(kiln.encode(e, Event), Event)
    assert back == e and back.color is Color.GREEN
    c: Color = kiln.decode(kiln.encode(Color.RED, Color), Color)
    when: dt.datetime = kiln.decode(kiln.encode(e.at, dt.datetime), dt.datetime)
    pair: tuple[int, int] = kiln.decode(kiln.encode((1, 2), tuple[int, int]), tuple[int, int])
    assert (c, when, pair) == (Color.RED, e.at, (1, 2))


if __name__ == "__main__":
    import tempfile
    round_trip()
    dynamic()
    tensors()
    python_types()
    with tempfile.TemporaryDirectory() as folder:
        files_and_schemas(folder)
    print("ok")
