"""Issue 11's smaller points and lying counts, in both implementations.

Lifetimes are in test_lifetimes.py, shared-memory mutation in
test_shared_mutation.py and the zero-size budget in test_amplification.py.
"""

import dataclasses
import struct

import numpy as np
import pytest

import kiln


class Lies:
    """A sequence whose len() and iteration disagree."""

    def __init__(self, length, items):
        self.length, self.items = length, items

    def __len__(self):
        return self.length

    def __iter__(self):
        return iter(self.items)


@pytest.mark.parametrize("length,items", [(1, []), (0, [1, 2]), (3, [1, 2]), (2, [1, 2, 3])])
def test_a_sequence_whose_len_lies_is_a_type_error(impl, length, items):
    with pytest.raises(kiln.EncodeError) as ei:
        impl.encode(Lies(length, items), "list<opt<i64>>")
    assert ei.value.code == "TYPE"
    assert "len() said %d" % length in str(ei.value)
    # raised where the items stop agreeing with the count: after min(len, items)
    # items of 9 bytes each, past the count word
    assert ei.value.offset == 4 + 9 * min(len(items), length)


def test_a_lying_sequence_inside_a_struct_does_not_shift_the_fields(impl):
    t = kiln.parse_type("struct{a:list<str>,b:i32,}")
    with pytest.raises(kiln.EncodeError) as ei:
        impl.encode({"a": Lies(0, ["x", "y"]), "b": 5}, t)
    assert ei.value.code == "TYPE"
    assert ei.value.path == ".a"
    # an honest sequence of the same items encodes
    buf = impl.encode({"a": Lies(2, ["x", "y"]), "b": 5}, t)
    assert impl.decode(buf, t) == {"a": ["x", "y"], "b": 5}


@pytest.mark.parametrize("bad", [5.0, 1.0, True, "5", None, -1])
def test_decode_caps_are_checked_even_when_the_cache_has_an_equal_key(bad):
    buf = kiln.encode(7, "i32")
    for cap in (5, 1):  # fill the cache with keys equal to 5.0, 1.0 and True
        assert kiln.decode(buf, "i32", max_count=cap, max_bytes=cap) == 7
    with pytest.raises(ValueError, match="max_count must be a non-negative int"):
        kiln.decode(buf, "i32", max_count=bad)
    with pytest.raises(ValueError, match="max_bytes must be a non-negative int"):
        kiln.decode(buf, "i32", max_bytes=bad)


class Scribbles:
    """An int whose __index__ rewrites the output bytearray at the same size."""

    def __init__(self, out, value):
        self.out, self.value = out, value

    def __index__(self):
        for i in range(len(self.out)):
            self.out[i] = 0xEE
        return self.value


def test_encode_into_is_safe_from_code_that_rewrites_the_output(impl):
    out = bytearray(b"head")
    enc = impl.encoder("list<i64>")
    v = [1, 2, Scribbles(out, 3), 4]
    end = enc.encode_into(v, out, -1)
    # the bytes before the offset are the caller's (here rewritten by its own
    # code); the encoding after them is exactly the value's
    assert end == len(out) == 4 + 4 + 32
    assert bytes(out[4:]) == impl.encode([1, 2, 3, 4], "list<i64>")


def test_encode_into_error_offsets_count_from_the_buffer_start(impl):
    out = bytearray(b"x" * 10)
    with pytest.raises(kiln.EncodeError) as ei:
        impl.encoder("struct{a:i32,b:str,}").encode_into({"a": 1, "b": 2}, out, -1)
    assert ei.value.offset == 10 + 4
    assert bytes(out) == b"x" * 10  # nothing written after the offset on error


def test_encode_into_notices_a_resize_during_encoding(impl):
    out = bytearray(b"abc")

    class Grows:
        def __index__(self):
            out.extend(b"zz")
            return 1

    with pytest.raises(RuntimeError, match="changed size"):
        impl.encoder("list<opt<i64>>").encode_into([Grows()] * 3, out, -1)


@pytest.mark.parametrize("shape", [(2 ** 64, 0), (0, 2 ** 70), (-1, 0)])
def test_tensor_dimensions_must_fit_u64(shape):
    with pytest.raises(ValueError, match="outside 0..2\\*\\*64-1"):
        kiln.Tensor(b"", dtype="f32", shape=shape)


def test_the_largest_u64_dimension_round_trips(impl):
    t = kiln.Tensor(b"", dtype="f32", shape=(2 ** 64 - 1, 0))
    d = impl.decode_tensors(impl.encode_tensors([t]))
    assert d[0].shape == (2 ** 64 - 1, 0)


@pytest.mark.parametrize("text", ["f64", "f32"])
@pytest.mark.parametrize("value", [10 ** 400, -(10 ** 400), 10 ** 5000], ids=["1e400", "-1e400", "1e5000"])
def test_an_int_too_large_for_a_float_is_an_encode_error(impl, text, value):
    with pytest.raises(kiln.EncodeError) as ei:
        impl.encode(value, text)
    assert ei.value.code == "TYPE"
    assert "does not fit %s" % text in str(ei.value)
    with pytest.raises(kiln.EncodeError) as ei:
        impl.encode({"x": value}, "struct{x:%s,}" % text)
    assert ei.value.code == "TYPE" and ei.value.path == ".x"


@pytest.mark.parametrize("value", ["1.0", b"1.0", None, [1.0]])
def test_a_non_number_in_a_float_field_says_so(impl, value):
    with pytest.raises(kiln.EncodeError) as ei:
        impl.encode(value, "f64")
    assert ei.value.code == "TYPE"
    assert "expected a float for f64, got %s" % type(value).__name__ in str(ei.value)


class TwiceKeys:
    def __init__(self, pairs):
        self.pairs = pairs

    def items(self):
        return iter(self.pairs)


def test_a_mapping_that_gives_a_key_twice_is_a_type_error(impl):
    with pytest.raises(kiln.EncodeError) as ei:
        impl.encode(TwiceKeys([("b", 1), ("a", 2), ("b", 3)]), "dict<str,i32>")
    assert ei.value.code == "TYPE"
    assert "'b' twice" in str(ei.value)
    # count word, then key "a" (4 + 1 bytes) and its value (4 bytes), then the second "b"
    assert ei.value.offset == 4 + 5 + 4 + 5 + 4


@dataclasses.dataclass
class Point:
    x: kiln.f64
    y: kiln.f64


def test_a_dataclass_field_too_large_is_an_encode_error(impl):
    with pytest.raises(kiln.EncodeError) as ei:
        impl.encode(Point(1.0, 10 ** 400), Point)
    assert ei.value.code == "TYPE" and ei.value.path == ".y"


EMPTY_BUFFERS = {
    "0x4 strided": lambda: np.zeros((0, 4), np.uint8)[:, ::2],
    "2x0 transposed": lambda: np.zeros((2, 0), np.uint8).T,
    "empty memoryview, step 2": lambda: memoryview(bytearray(0))[::2],
    "0x3 fortran": lambda: np.zeros((0, 3), np.uint8, order="F"),
    "0 int32 reversed": lambda: np.zeros(0, np.int32)[::-1],
    "bytes": lambda: b"",
}


@pytest.mark.parametrize("name", sorted(EMPTY_BUFFERS))
def test_every_empty_buffer_is_an_empty_input(impl, name):
    buf = EMPTY_BUFFERS[name]()
    for text in ("list<u8>", "struct{}", "tensors"):
        if text == "struct{}":
            assert impl.decode(buf, text) == {}
            continue
        with pytest.raises(kiln.KilnError) as ei:
            impl.decode(buf, text)
        assert (ei.value.code, ei.value.offset) == ("EOF", 0)


def test_a_non_contiguous_buffer_is_refused_alike(impl):
    buf = np.zeros((3, 2), np.uint8, order="F")
    with pytest.raises(TypeError, match="contiguous"):
        impl.decode(buf, "list<u8>")


def test_an_opt_byte_and_a_bool_are_read_once():
    # not a race test (see test_shared_mutation.py): the values themselves
    for text, raw, want in (("opt<bool>", b"\x01\x01", True), ("opt<bool>", b"\x00", None),
                            ("list<bool>", struct.pack("<I", 3) + b"\x01\x00\x01",
                             [True, False, True])):
        got = kiln.decode(raw, text)
        assert (got.tolist() if hasattr(got, "tolist") else got) == want


@pytest.mark.parametrize("text,body,caps,name", [
    ("list<i32>", struct.pack("<I", 9), {"max_count": 8}, "max_count=8"),
    ("str", struct.pack("<I", 9), {"max_bytes": 8}, "max_bytes=8"),
    ("dict<str,i32>", struct.pack("<II", 1, 9), {"max_bytes": 8}, "max_bytes=8"),
    ("list<u8>", struct.pack("<I", 9), {"max_bytes": 8}, "max_bytes=8"),
    # (list<u8> is bounded by max_bytes alone: test_traps.py)
    ("tensors", b"KLNT\x02\x02\x00\x00" + struct.pack("<I", 9) + bytes(52), {"max_count": 8},
     "max_count=8"),
])
def test_every_limit_names_the_parameter_that_raises_it(impl, text, body, caps, name):
    with pytest.raises(kiln.KilnError) as ei:
        impl.decode(body + bytes(64), text, **caps)
    assert ei.value.code == "LIMIT"
    assert name in str(ei.value)
