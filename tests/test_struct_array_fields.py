"""A struct field of a list of fixed-width numbers given a numpy array, in
every binding (NamedTuple, slots and plain dataclass, dict): the bytes are
the wire's (hand-packed here), whichever path the kernel takes (the compiled
kernel writes a 1-D C-contiguous array of the wire dtype in its one-pass
struct writers, anything else through the general path)."""

import dataclasses
import struct
import typing

import numpy as np
import pytest

import kiln

T = "struct{id:i64,tags:list<i32>,w:list<f64>,}"


class NT(typing.NamedTuple):
    id: int
    tags: kiln.list_(kiln.i32)
    w: kiln.list_(kiln.f64)


@dataclasses.dataclass(slots=True)
class Slots:
    id: int
    tags: kiln.list_(kiln.i32)
    w: kiln.list_(kiln.f64)


@dataclasses.dataclass
class Plain:
    id: int
    tags: kiln.list_(kiln.i32)
    w: kiln.list_(kiln.f64)


BINDINGS = {
    "namedtuple": (NT, NT),
    "slots": (Slots, Slots),
    "dataclass": (Plain, Plain),
    "dict": (T, lambda id, tags, w: {"id": id, "tags": tags, "w": w}),
}


def wire(id, tags, w):
    """The record's bytes, packed by hand: i64, then each list as a u32 count
    and its items little-endian."""
    tags, w = [int(x) for x in tags], [float(x) for x in w]
    return (struct.pack("<q", id) + struct.pack("<I%di" % len(tags), len(tags), *tags)
            + struct.pack("<I%dd" % len(w), len(w), *w))


TAGS = {
    "int32": np.array([1, -2, 2**31 - 1], np.int32),
    "empty": np.array([], np.int32),
    "long": np.arange(-50, 50, dtype=np.int32),
    "big-endian": np.array([5, -6, 7], ">i4"),
    "int64 in range": np.array([3, -(2**31)], np.int64),
    "strided": np.arange(10, dtype=np.int32)[::3],
    "uint8": np.array([0, 255], np.uint8),
}


@pytest.mark.parametrize("binding", sorted(BINDINGS))
@pytest.mark.parametrize("tags", sorted(TAGS))
def test_array_fields_write_the_wire_bytes(impl, binding, tags):
    t, make = BINDINGS[binding]
    w = np.array([0.5, -1.25], np.float64)
    rows = [make(i, TAGS[tags], w) for i in range(3)]
    want = b"".join(wire(i, TAGS[tags], w) for i in range(3))
    assert impl.encode(rows, kiln.list_(t)) == struct.pack("<I", 3) + want
    assert impl.encode(rows[1], t) == wire(1, TAGS[tags], w)
    back = impl.decode(wire(2, TAGS[tags], w), t)
    got = back["tags"] if binding == "dict" else back.tags
    assert [int(x) for x in got] == [int(x) for x in TAGS[tags]]


@pytest.mark.parametrize("binding", sorted(BINDINGS))
def test_an_array_out_of_the_field_range_is_refused(impl, binding):
    t, make = BINDINGS[binding]
    bad = make(1, np.array([1, 2**40], np.int64), np.array([], np.float64))
    with pytest.raises(kiln.EncodeError) as e:
        impl.encode(bad, t)
    assert e.value.code in ("RANGE", "TYPE")


@pytest.mark.parametrize("binding", sorted(BINDINGS))
def test_a_two_dimensional_array_is_encoded_as_the_general_path_does(impl, binding):
    """A 2-D array of the wire dtype is not the one-copy case: what the
    general path does with it (the list field alone) is what the struct gives."""
    t, make = BINDINGS[binding]
    a = np.arange(4, dtype=np.int32).reshape(2, 2)
    w = np.array([], np.float64)
    try:
        alone = impl.encode(a, "list<i32>")
    except kiln.EncodeError as e:
        with pytest.raises(kiln.EncodeError) as e2:
            impl.encode(make(1, a, w), t)
        assert e2.value.code == e.code
        return
    assert impl.encode(make(1, a, w), t) == struct.pack("<q", 1) + alone + struct.pack("<I", 0)
