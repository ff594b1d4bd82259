"""The value comparison itself (tests/_oracle.py) tells apart what it must."""

import struct

import numpy as np
import pytest

import kiln
from _oracle import Mismatch, kiln_form, ref_outcome
from _util import kiln_ref


def form(text, v):
    return kiln_form(kiln_ref.parse_type(text), v)


def test_types_and_dtypes_are_part_of_the_value():
    with pytest.raises(Mismatch):
        form("bool", 1)
    with pytest.raises(Mismatch):
        form("i32", True)
    with pytest.raises(Mismatch):
        form("list<i16>", np.arange(3, dtype=np.int64))        # widened
    with pytest.raises(Mismatch):
        form("list<i16>", [0, 1, 2])                            # a list, not an array
    with pytest.raises(Mismatch):
        form("list<u8>", bytearray(b"ab"))
    with pytest.raises(Mismatch):
        form("struct{a:i8,b:i8,}", {"b": 1, "a": 2})            # field order
    assert form("list<i16>", np.arange(3, dtype=np.int16)) == \
        ref_outcome(struct.pack("<I3h", 3, 0, 1, 2), "list<i16>")[1]


def test_floats_by_their_bits():
    assert form("f64", -0.0) != form("f64", 0.0)
    nan1, nan2 = (struct.unpack("<d", struct.pack("<Q", 0x7FF8000000000000 | p))[0]
                  for p in (1, 2))
    assert form("f64", nan1) != form("f64", nan2)
    assert form("f64", nan1) == ref_outcome(struct.pack("<d", nan1), "f64")[1]


def test_nested_optionals_keep_which_flag_was_zero():
    node = "opt<opt<i8>>"
    assert ref_outcome(b"\x01\x00", node) == ("ok", form(node, kiln.Some(None)))
    assert ref_outcome(b"\x00", node) == ("ok", form(node, None))
    assert ref_outcome(b"\x01\x01\x05", node) == ("ok", form(node, 5))
    assert form(node, None) != form(node, kiln.Some(None))
    with pytest.raises(Mismatch):
        form(node, kiln.Some(5))        # decode never wraps a plain value


def test_errors_and_trust():
    assert ref_outcome(b"\x02", "bool") == ("err", "TYPE", 0)
    bad = struct.pack("<I", 2) + b"\xff\xfe"
    assert ref_outcome(bad, "str") == ("err", "UTF8", 4)
    assert ref_outcome(bad, "str", trusted=True) == ("ok", "\udcff\udcfe")
