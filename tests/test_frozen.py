"""Frozen values: every wire rule, in both implementations."""

import dataclasses
import math
import mmap
import struct

import numpy as np
import pytest

import kiln


def u32(n):
    return struct.pack("<I", n)


def kstr(s):
    b = s.encode() if isinstance(s, str) else s
    return u32(len(b)) + b


def err(impl, buf, t, **kw):
    with pytest.raises(kiln.KilnError) as ei:
        impl.decode(buf, kiln.as_type(t), **kw)
    return ei.value.code, ei.value.offset


# --- byte order and bits ---------------------------------------------------

@pytest.mark.parametrize("text,value,hexbytes", [
    ("i16", -2, "feff"), ("u16", 0x1234, "3412"), ("i32", 1, "01000000"),
    ("u32", 0xDEADBEEF, "efbeadde"), ("i64", -1, "ff" * 8), ("u64", 1 << 63, "00" * 7 + "80"),
    ("int", 258, "0201000000000000"), ("uint", 2 ** 64 - 1, "ff" * 8),
    ("f32", 1.0, "0000803f"), ("f64", -2.0, "00000000000000c0"), ("bool", True, "01"),
    ("i8", -128, "80"), ("u8", 255, "ff"),
])
def test_scalars_little_endian(impl, text, value, hexbytes):
    b = impl.encode(value, text)
    assert b.hex() == hexbytes
    assert impl.decode(b, text) == value


def test_float_bits_kept(impl):
    for bits in (0x8000000000000000, 0x7FF8000000000001, 0x7FF0000000000000, 0x0000000000000001):
        b = struct.pack("<Q", bits)
        v = impl.decode(b, "f64")
        assert impl.encode(v, "f64") == b
    negzero = impl.decode(bytes.fromhex("00000080"), "f32")
    assert negzero == 0.0 and math.copysign(1, negzero) == -1
    assert impl.encode(-0.0, "f32") == bytes.fromhex("00000080")
    # a quiet f32 NaN with a payload survives the trip through a Python float
    qnan = bytes.fromhex("0100c07f")
    assert impl.encode(impl.decode(qnan, "f32"), "f32") == qnan


def test_float_lists_keep_every_bit(impl):
    raw = np.array([0x7FF8000000000001, 0x8000000000000000, 0x7FF4000000000000], "<u8")
    buf = u32(3) + raw.tobytes()
    arr = impl.decode(buf, "list<f64>")
    # the array is native-ordered: view its bits in the array's own byte order
    assert arr.view(np.dtype("u8").newbyteorder(arr.dtype.byteorder)).tolist() == raw.tolist()
    assert impl.encode(arr, "list<f64>") == buf
    raw32 = np.array([0x7F800001, 0x80000000, 0xFFC00123], "<u4")  # signalling NaN kept in lists
    buf32 = u32(3) + raw32.tobytes()
    assert impl.encode(impl.decode(buf32, "list<f32>"), "list<f32>") == buf32


# --- strings and UTF-8 -----------------------------------------------------

def test_string_round_trip(impl):
    for s in ["", "a", "héllo", "日本", "\U0010FFFF", "x" * 1000]:
        b = impl.encode(s, "str")
        assert b == kstr(s)
        assert impl.decode(b, "str") == s


@pytest.mark.parametrize("body,bad_at", [
    (b"ab\xc0\x80", 2),            # overlong NUL
    (b"\xe0\x80\xaf", 0),          # overlong 3-byte
    (b"a\xed\xa0\x80", 1),         # surrogate
    (b"abc\xe2\x82", 3),           # truncated
    (b"\xff", 0), (b"z\x80", 1),   # invalid start bytes
    (b"\xf4\x90\x80\x80", 0),      # above U+10FFFF
])
def test_strict_utf8(impl, body, bad_at):
    buf = kstr(body)
    assert err(impl, buf, "str") == ("UTF8", 4 + bad_at)
    # trusted skips the UTF-8 check only
    assert isinstance(impl.decode(buf, "str", trusted=True), str)
    # ... and still checks lengths
    assert err(impl, buf[:-1], "str", trusted=True) == ("EOF", 0)


@pytest.mark.parametrize("n", [1, 7, 8, 9, 16, 17, 127, 128, 129, 300])
def test_every_length_and_place_of_a_non_ascii_byte(impl, n):
    # the compiled kernel reads short ASCII strings itself (src/kiln_text.h):
    # a non-ASCII byte anywhere, in any word, must still reach the UTF-8
    # decoder, and a valid one decode to the same str
    for at in sorted({0, n // 2, n - 1, min(n - 1, 8), max(0, n - 8)}):
        ok = "a" * at + "é" + "b" * (n - at - 1)
        assert impl.decode(kstr(ok), "str") == ok
        assert type(impl.decode(kstr(ok), "str")) is str
        bad = b"a" * at + b"\xff" + b"b" * (n - at - 1)
        assert err(impl, kstr(bad), "str") == ("UTF8", 4 + at)
        assert impl.decode(kstr(bad), "str", trusted=True) == bad.decode("utf-8",
                                                                         "surrogateescape")
    plain = "".join(chr(32 + i % 95) for i in range(n))
    back = impl.decode(kstr(plain), "str")
    assert back == plain and back.isascii() and len(back) == n


def test_utf8_offset_inside_struct(impl):
    t = "struct{a:i32,s:str,}"
    buf = u32(7) + kstr(b"ok\xc0")
    assert err(impl, buf, t) == ("UTF8", 10)


def test_encode_unencodable_string(impl):
    with pytest.raises(kiln.EncodeError) as ei:
        impl.encode("\ud800", "str")
    assert ei.value.code == "UTF8"


# --- counts and allocation ---------------------------------------------------

def test_count_word_short_is_eof(impl):
    assert err(impl, b"\x01\x00", "list<i32>") == ("EOF", 0)
    assert err(impl, b"", "str") == ("EOF", 0)


def test_count_above_cap_is_limit(impl):
    buf = u32(11) + bytes(44)
    assert err(impl, buf, "list<i32>", max_count=10) == ("LIMIT", 0)
    assert impl.decode(buf, "list<i32>", max_count=11).shape == (11,)
    assert err(impl, kstr("x" * 11), "str", max_bytes=10) == ("LIMIT", 0)
    assert err(impl, u32(11) + bytes(11), "list<u8>", max_bytes=10) == ("LIMIT", 0)
    assert err(impl, u32(16_777_217), "list<struct{}>") == ("LIMIT", 0)


def test_count_product_past_buffer_is_eof_without_allocating(impl):
    import tracemalloc
    t = "list<struct{id:i64,name:str,}>"
    dec = impl.decoder(t, max_count=2 ** 32 - 1)
    tracemalloc.start()
    try:
        with pytest.raises(kiln.KilnError) as ei:
            dec.decode(u32(2 ** 32 - 1))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (ei.value.code, ei.value.offset) == ("EOF", 0)
    assert peak < 64 * 1024


def test_struct_min_size_is_sum(impl):
    # two structs of min 12 bytes claimed, one present: rejected by the count rule
    t = "list<struct{a:i64,b:str,}>"
    one = struct.pack("<q", 1) + kstr("")
    assert err(impl, u32(2) + one, t) == ("EOF", 0)
    assert impl.decode(u32(1) + one, t) == [{"a": 1, "b": ""}]


def test_empty_struct_list_bounded_by_cap(impl):
    assert impl.decode(u32(5), "list<struct{}>") == [{}] * 5
    assert err(impl, u32(6), "list<struct{}>", max_count=5) == ("LIMIT", 0)


def test_element_error_after_count_passes(impl):
    # count 3 strings, min 12 bytes present, but the first string claims more
    buf = u32(3) + u32(9) + bytes(8)
    assert err(impl, buf, "list<str>") == ("EOF", 4)


# --- lists of numbers ----------------------------------------------------------

@pytest.mark.parametrize("text,dtype", [
    ("list<i8>", "i1"), ("list<i16>", "<i2"), ("list<u16>", "<u2"), ("list<i32>", "<i4"),
    ("list<u32>", "<u4"), ("list<i64>", "<i8"), ("list<u64>", "<u8"), ("list<int>", "<i8"),
    ("list<uint>", "<u8"), ("list<f32>", "<f4"), ("list<f64>", "<f8"),
])
def test_pod_lists_are_one_run(impl, text, dtype):
    src = np.arange(-5, 6).astype(dtype) if "u" not in dtype else np.arange(11).astype(dtype)
    buf = impl.encode(src, text)
    assert buf == u32(len(src)) + src.astype(np.dtype(dtype).newbyteorder("<")).tobytes()
    out = impl.decode(buf, text)
    assert isinstance(out, np.ndarray) and out.ndim == 1
    assert out.flags.owndata or out.base is not None and not np.shares_memory(out, np.frombuffer(buf, np.uint8))
    np.testing.assert_array_equal(out, src)
    # any byte order in, the same bytes out
    assert impl.encode(src.astype(np.dtype(dtype).newbyteorder(">")), text) == buf
    assert impl.encode(src.tolist(), text) == buf


def test_bool_list(impl):
    buf = u32(3) + b"\x01\x00\x01"
    out = impl.decode(buf, "list<bool>")
    assert out.dtype == np.bool_ and out.tolist() == [True, False, True]
    assert impl.encode([True, False, True], "list<bool>") == buf
    assert err(impl, u32(3) + b"\x01\x02\x01", "list<bool>") == ("TYPE", 5)


def test_bytes(impl):
    for v in (b"", b"abc", bytearray(b"xy"), memoryview(b"q"), np.frombuffer(b"zz", np.uint8)):
        b = impl.encode(v, "list<u8>")
        assert b == u32(len(bytes(v))) + bytes(v)
        out = impl.decode(b, "list<u8>")
        assert type(out) is bytes and out == bytes(v)


def test_pod_encode_never_wraps(impl):
    for text, bad in [("list<i8>", [128]), ("list<u8>", [256]), ("list<u16>", [-1]),
                      ("list<i32>", np.array([2 ** 31], np.int64)), ("list<i32>", [1.5]),
                      ("list<u64>", np.array([-1], np.int64)), ("list<i32>", ["a"]), ("list<i32>", [True, "x"]),
                      ("list<f32>", [1e300]), ("list<bool>", [2])]:
        with pytest.raises(kiln.EncodeError) as ei:
            impl.encode(bad, text)
        assert ei.value.code == "TYPE"


@pytest.mark.parametrize("text,bad", [
    ("i8", 128), ("i8", -129), ("u8", -1), ("u16", 65536), ("i32", 2 ** 31), ("u32", -1),
    ("i64", 2 ** 63), ("u64", 2 ** 64), ("int", 1.5), ("f64", "1.0"), ("f32", 1e39),
    ("bool", 1), ("bool", None), ("str", b"x"), ("str", 5),
])
def test_scalar_encode_checks(impl, text, bad):
    with pytest.raises(kiln.EncodeError) as ei:
        impl.encode(bad, text)
    assert ei.value.code == "TYPE"


def test_numpy_scalars_accepted(impl):
    assert impl.encode(np.int16(-3), "i16") == impl.encode(-3, "i16")
    assert impl.encode(np.float32(1.5), "f64") == impl.encode(1.5, "f64")
    assert impl.encode(np.bool_(True), "bool") == b"\x01"


# --- bool, opt, dict -------------------------------------------------------------

@pytest.mark.parametrize("byte", [2, 0x80, 0xFF])
def test_bad_bool_and_opt_bytes_are_type(impl, byte):
    assert err(impl, bytes([byte]), "bool") == ("TYPE", 0)
    assert err(impl, bytes([byte]) + bytes(4), "opt<i32>") == ("TYPE", 0)
    assert err(impl, bytes(4) + bytes([byte]), "struct{a:i32,b:bool,}") == ("TYPE", 4)


def test_optional(impl):
    assert impl.encode(None, "opt<i32>") == b"\x00"
    assert impl.encode(5, "opt<i32>") == b"\x01\x05\x00\x00\x00"
    assert impl.decode(b"\x00", "opt<i32>") is None
    assert impl.decode(b"\x01\x05\x00\x00\x00", "opt<i32>") == 5
    assert err(impl, b"\x01\x05", "opt<i32>") == ("EOF", 1)
    assert err(impl, b"", "opt<i32>") == ("EOF", 0)


def test_nested_optionals_keep_their_level(impl):
    t = kiln.parse_type("opt<opt<i32>>")
    assert impl.decode(b"\x00", t) is None
    assert impl.decode(b"\x01\x00", t) == kiln.Some(None)
    assert impl.decode(b"\x01\x01\x07\x00\x00\x00", t) == 7
    assert impl.encode(kiln.Some(None), t) == b"\x01\x00"
    assert impl.encode(None, t) == b"\x00"
    assert impl.encode(kiln.Some(7), "opt<i32>") == impl.encode(7, "opt<i32>")
    deep = kiln.parse_type("opt<opt<opt<str>>>")
    for buf in (b"\x00", b"\x01\x00", b"\x01\x01\x00", b"\x01\x01\x01\x00\x00\x00\x00"):
        assert impl.encode(impl.decode(buf, deep), deep) == buf


def test_dict_keys_sorted_by_utf8_bytes(impl):
    value = {"é": 1, "b": 2, "a": 3, "Z": 4, "ab": 5}
    b = impl.encode(value, "dict<str,i8>")
    keys = sorted(k.encode() for k in value)
    assert b == u32(5) + b"".join(kstr(k) + bytes([value[k.decode()]]) for k in keys)
    assert impl.decode(b, "dict<str,i8>") == value


def test_dict_order_enforced(impl):
    unsorted = u32(2) + kstr("b") + b"\x01" + kstr("a") + b"\x02"
    assert err(impl, unsorted, "dict<str,i8>") == ("TYPE", 10)
    repeated = u32(2) + kstr("a") + b"\x01" + kstr("a") + b"\x02"
    assert err(impl, repeated, "dict<str,i8>") == ("TYPE", 10)


# --- structs, frames, trailing ------------------------------------------------

def test_struct_positional(impl):
    t = kiln.parse_type("struct{id:i64,name:str,score:f64,tags:list<i32>,}")
    v = {"id": 7, "name": "ab", "score": 0.5, "tags": [1, 2]}
    b = impl.encode(v, t)
    assert b == (struct.pack("<q", 7) + kstr("ab") + struct.pack("<d", 0.5) + u32(2)
                 + struct.pack("<2i", 1, 2))
    out = impl.decode(b, t)
    assert list(out) == ["id", "name", "score", "tags"]
    assert out["tags"].tolist() == [1, 2]


def test_struct_mapping_must_match_fields(impl):
    t = "struct{a:i32,b:i32,}"
    with pytest.raises(kiln.EncodeError):
        impl.encode({"a": 1}, t)
    with pytest.raises(kiln.EncodeError):
        impl.encode({"a": 1, "b": 2, "c": 3}, t)
    with pytest.raises(kiln.EncodeError):
        impl.encode([1, 2], t)


def test_encode_error_has_path(impl):
    t = "struct{rows:list<struct{x:i8,}>,}"
    with pytest.raises(kiln.EncodeError) as ei:
        impl.encode({"rows": [{"x": 1}, {"x": 1000}]}, t)
    assert ei.value.path == ".rows[1].x"
    assert "x" in str(ei.value)


def test_trailing(impl):
    assert err(impl, b"\x01\x00\x00\x00\x00", "i32") == ("TRAILING", 4)
    assert err(impl, u32(0) + b"\x00", "list<str>") == ("TRAILING", 4)


@pytest.mark.parametrize("text,value", [
    ("i32", 5), ("str", "hi"), ("list<f32>", np.array([1.0], np.float32)),
    ("struct{id:i64,batch:tensors,}", {"id": 7, "batch": []}),
])
def test_frame(impl, text, value):
    t = kiln.parse_type(text)
    b = impl.encode(value, t, frame=True)
    assert b[:8] == b"KLN0\0\0\0\0" and b[8:16] == struct.pack("<Q", t.schema_hash)
    assert b[16:] == impl.encode(value, t)
    impl.decode(b, t, frame=True)
    assert err(impl, b[:3], t, frame=True) == ("EOF", 0)
    assert err(impl, b[:15], t, frame=True) == ("EOF", 0)
    assert err(impl, b"KLN1" + b[4:], t, frame=True) == ("FRAME", 0)
    for i, code in ((4, "FRAME"), (5, "FRAME"), (6, "FRAME"), (7, "FRAME")):
        bad = bytearray(b)
        bad[i] = 1
        assert err(impl, bytes(bad), t, frame=True) == (code, i)
    other = kiln.parse_type("u64")
    assert err(impl, b, other, frame=True) == ("SCHEMA", 8)


def test_schema_checked_before_first_field(impl):
    t = kiln.parse_type("struct{a:i32,}")
    b = impl.encode({"a": 1}, t, frame=True)
    # the body is garbage, but the hash is wrong: SCHEMA, not EOF
    assert err(impl, b[:16], kiln.parse_type("struct{a:i64,}"), frame=True) == ("SCHEMA", 8)


# --- buffers ------------------------------------------------------------------

def test_any_contiguous_buffer(impl, tmp_path):
    t = kiln.parse_type("struct{a:i32,s:str,}")
    b = impl.encode({"a": 3, "s": "xyz"}, t)
    want = {"a": 3, "s": "xyz"}
    assert impl.decode(bytearray(b), t) == want
    assert impl.decode(memoryview(b), t) == want
    assert impl.decode(np.frombuffer(b, np.uint8), t) == want
    assert impl.decode(memoryview(b"..." + b)[3:], t) == want
    p = tmp_path / "x.bin"
    p.write_bytes(b)
    with open(p, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        assert impl.decode(m, t) == want
    # the same exception, with the same words, in both kernels
    with pytest.raises(TypeError, match="^kiln needs a contiguous buffer$"):
        impl.decode(memoryview(b * 2)[::2], t)


def test_encoder_reuses_buffer(impl):
    t = kiln.parse_type("struct{id:i64,values:list<f64>,}")
    enc = impl.encoder(t)
    buf = bytearray(b"head")
    end = enc.encode_into({"id": 1, "values": [1.0, 2.0]}, buf, 4)
    assert end == len(buf) == 4 + 8 + 4 + 16
    assert bytes(buf[:4]) == b"head" and bytes(buf[4:]) == enc.encode({"id": 1, "values": [1.0, 2.0]})
    end2 = enc.encode_into({"id": 2, "values": []}, buf, 0)
    assert end2 == len(buf) == 12
    end3 = enc.encode_into({"id": 3, "values": []}, buf, -1)
    assert end3 == 24 and impl.decode(bytes(buf[12:]), t)["id"] == 3
    fenc = impl.encoder(t, frame=True)
    fb = bytearray()
    fenc.encode_into({"id": 1, "values": []}, fb)
    assert bytes(fb) == fenc.encode({"id": 1, "values": []})


def test_decoder_object(impl):
    t = kiln.parse_type("list<str>")
    dec = impl.decoder(t, max_count=2)
    assert dec.decode(impl.encode(["a", "b"], t)) == ["a", "b"]
    with pytest.raises(kiln.KilnError) as ei:
        dec.decode(impl.encode(["a", "b", "c"], t))
    assert (ei.value.code, ei.value.offset) == ("LIMIT", 0)   # the count word, 3 > 2


# --- dataclass construction: decoding calls the class as a user would ---


@dataclasses.dataclass
class _Plain:
    a: int
    s: str


@dataclasses.dataclass(frozen=True)
class _Frozen:
    a: int
    s: str


@dataclasses.dataclass
class _PostInit:
    a: int
    s: str

    def __post_init__(self):
        self.s = self.s.upper()


@dataclasses.dataclass
class _OwnInit:
    a: int
    s: str

    def __init__(self, a, s):
        self.a = a * 10
        self.s = s


@dataclasses.dataclass
class _Guarded:
    a: int
    s: str

    def __setattr__(self, k, v):
        object.__setattr__(self, k, ("set", v))


@dataclasses.dataclass(slots=True)
class _Slots:
    a: int
    s: str


@dataclasses.dataclass(kw_only=True)
class _KwOnly:
    a: int
    s: str


@pytest.mark.parametrize("cls", [_Plain, _Frozen, _Slots, _KwOnly, _PostInit, _OwnInit, _Guarded])
def test_dataclass_decode_matches_calling_the_class(impl, cls):
    t = kiln.list_(cls)
    buf = impl.encode([{"a": 1, "s": "x"}, {"a": 2, "s": "yé"}], "list<struct{a:i64,s:str,}>")
    out = impl.decode(buf, t)
    assert out == [cls(a=1, s="x"), cls(a=2, s="yé")]
    assert all(type(o) is cls for o in out)
    if cls is _Frozen:
        with pytest.raises(dataclasses.FrozenInstanceError):
            out[0].a = 5
    if cls is _PostInit:
        assert out[1].s == "YÉ"
    if cls is _OwnInit:
        assert out[0].a == 10
    if cls is _Guarded:
        assert out[0].a == ("set", 1)


def _pod_cases():
    base = np.arange(20, dtype="<i4")
    return [("plain", base), ("empty", np.empty(0, "<i4")), ("slice", base[3:9]),
            ("strided", base[::3]), ("reversed", base[::-1]),
            ("big-endian", base.astype(">i4")), ("int64", base.astype("<i8")),
            ("readonly", np.frombuffer(base.tobytes(), "<i4"))]


@pytest.mark.parametrize("name, arr", _pod_cases(), ids=[n for n, _ in _pod_cases()])
def test_pod_array_layouts_encode_their_values(impl, name, arr):
    # whatever the array's layout or byte order, the wire holds its values
    buf = impl.encode(arr, "list<i32>")
    want = len(arr).to_bytes(4, "little") + np.asarray(arr, "<i4").tobytes()
    assert buf == want


def test_pod_array_with_two_dimensions_is_refused(impl):
    with pytest.raises(kiln.EncodeError) as ei:
        impl.encode(np.zeros((2, 3), "<i4"), "list<i32>")
    assert ei.value.code == "TYPE"
