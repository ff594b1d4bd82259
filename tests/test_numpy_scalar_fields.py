"""Numpy scalars of every kind in every scalar field type, alone and as struct
fields (in a run of fixed scalars the pure kernel packs at once), in both
kernels: the same bytes or the same EncodeError code and offset (issue 38
item 8: the pure kernel raised a bare struct.error for ``np.True_`` in
``struct{a:i64,}`` and converted a drifting ``__index__`` twice).  The
expected bytes come from struct.pack of the value converted by hand by the
rules docs/records.md states: integer fields take integers and numpy's bool,
bool fields take bools, float fields anything with ``__float__``."""

import struct

import numpy as np
import pytest

import kiln

INT_FIELDS = {"i8": "b", "i16": "h", "i32": "i", "i64": "q",
              "u8": "B", "u16": "H", "u32": "I", "u64": "Q"}
FLOAT_FIELDS = {"f32": "f", "f64": "d"}
SCALARS = [np.True_, np.False_,
           np.int8(-128), np.int8(7), np.int16(-300), np.int32(-70000), np.int32(5),
           np.int64(-(1 << 63)), np.int64(1 << 40),
           np.uint8(255), np.uint16(65535), np.uint32(1 << 31), np.uint64((1 << 64) - 1),
           np.uint64(3),
           np.float16(1.5), np.float32(-2.25), np.float64(0.1), np.float64(1e300),
           np.float32(np.inf)]


def expected(field, v):
    """The bytes ``v`` encodes to in a ``field`` field, or None when refused."""
    if field == "bool":
        return bytes([bool(v)]) if isinstance(v, np.bool_) else None
    if field in INT_FIELDS:
        if isinstance(v, np.floating):
            return None
        x = int(v)
        try:
            return struct.pack("<" + INT_FIELDS[field], x)
        except struct.error:
            return None
    # one rounding rule (docs/records.md): a value the width cannot hold
    # exactly is refused (round_floats=True would round it)
    try:
        packed = struct.pack("<" + FLOAT_FIELDS[field], float(v))
    except OverflowError:
        return None
    back = struct.unpack("<" + FLOAT_FIELDS[field], packed)[0]
    if isinstance(v, (np.integer, np.bool_)):
        return packed if back == int(v) else None
    return packed if back == float(v) else None


def outcome(impl, t, value):
    try:
        return impl.encoder(t).encode(value)
    except kiln.EncodeError as e:
        return ("EncodeError", e.code, e.offset)


@pytest.mark.parametrize("field", ["bool"] + list(INT_FIELDS) + list(FLOAT_FIELDS))
def test_every_numpy_scalar_in_every_field_type(impl, field):
    for v in SCALARS:
        want = expected(field, v)
        # alone; the only field; between an i8 and an i32 (one packed run)
        cases = [(field, v, b"", b"", 0),
                 ("struct{a:%s,}" % field, {"a": v}, b"", b"", 0),
                 ("struct{p:i8,a:%s,b:i32,}" % field, {"p": 7, "a": v, "b": -1},
                  b"\x07", struct.pack("<i", -1), 1)]
        for t, value, pre, post, at in cases:
            got = outcome(impl, t, value)
            if want is None:
                assert got == ("EncodeError", "TYPE", at), (t, repr(v), got)
            else:
                assert got == pre + want + post, (t, repr(v), got)


class Drift:
    """An integer whose __index__ gives the next of ``seq`` each call (the
    last one from then on)."""

    def __init__(self, *seq):
        self.seq = list(seq)

    def __index__(self):
        return self.seq.pop(0) if len(self.seq) > 1 else self.seq[0]


def test_a_drifting_index_is_converted_once(impl):
    """Each value is converted once: what its first __index__ gives is
    written or refused, wherever the field sits."""
    t = "struct{p:i8,a:i64,b:i32,}"
    assert outcome(impl, t, {"p": 1, "a": Drift(5, 1 << 70), "b": 2}) == \
        b"\x01" + struct.pack("<qi", 5, 2)
    assert outcome(impl, t, {"p": 1, "a": Drift(1 << 70, 5), "b": 2}) == ("EncodeError", "TYPE", 1)
    # a later field refused: the error is that field's, the first stays converted once
    assert outcome(impl, t, {"p": 1, "a": Drift(5, 1 << 70), "b": 1 << 40}) == \
        ("EncodeError", "TYPE", 9)
    assert outcome(impl, t, {"p": 1, "a": Drift(5, 1 << 70), "b": np.True_}) == \
        b"\x01" + struct.pack("<qi", 5, 1)
    assert outcome(impl, "struct{a:i64,}", {"a": Drift(1 << 70, 5)}) == ("EncodeError", "TYPE", 0)
