#!/usr/bin/env python3
"""Build spec/kiln-v2-cases.json.

Every case's bytes are assembled here by hand (struct.pack of frames,
headers, descriptors, heaps and payloads); nothing is produced by an encoder.
Each case also records the offset the reference decoder must report, which is
checked but not written to the JSON file.  If any case does not come out of
kiln_ref.decode exactly as recorded, nothing is written and the exit status
is 1.

    python3 spec/reference/gen_v2_cases.py            # write the file
    python3 spec/reference/gen_v2_cases.py --check    # compare, exit 1 on drift
    python3 spec/reference/gen_v2_cases.py --out PATH
"""
import argparse
import json
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import kiln_ref  # noqa: E402

DEFAULT_OUT = os.path.join(os.path.dirname(HERE), "kiln-v2-cases.json")
CAP = 16777216
NO16, NO32 = 0xFFFF, 0xFFFFFFFF
U64_MAX = (1 << 64) - 1

# dtype codes
F64, F32, F16, BF16, F8E4M3, F8E5M2, BOOL, I8, U8 = 1, 2, 3, 4, 5, 6, 7, 8, 9
I16, U16, I32, U32, I64, U64, I4, U4, E2M1, E8M0 = 10, 11, 12, 13, 14, 15, 16, 17, 18, 19
OPAQUE = 4096


# --------------------------------------------------------------------------
# Byte builders
# --------------------------------------------------------------------------
def p(fmt, *vals):
    return struct.pack("<" + fmt, *vals)


def u32(v):
    return p("I", v)


def s(text):
    """A Frozen str from text (or raw bytes)."""
    raw = text.encode("utf-8") if isinstance(text, str) else text
    return u32(len(raw)) + raw


fnv_tokens = kiln_ref.fnv1a64_tokens


def frame(tokens, body, magic=b"KLN0", profile=0, flags=0, reserved=0, hash_value=None):
    """16-byte frame from an explicit token list, then the body."""
    h = fnv_tokens(tokens) if hash_value is None else hash_value
    return magic + p("BBHQ", profile, flags, reserved, h) + body


def header(count=0, name_bytes=0, payload_bytes=0, directory_bytes=None, flags=0x02,
           version=2, magic=b"KLNT"):
    if directory_bytes is None:
        directory_bytes = count * 128 + name_bytes
    return (magic + p("BBHIIQQ", version, flags, 0, count, name_bytes, payload_bytes,
                      directory_bytes) + bytes(32))


def descriptor(dtype, shape, rank=None, name_off=NO16, name_len=0, layout_off=NO16,
               layout_len=0, block_size=0, scheme=0, axis=NO16, group=0, scale=NO32,
               outer=NO32, offset=0, length=0):
    rank = len(shape) if rank is None else rank
    slots = list(shape) + [0] * (8 - len(shape))
    return p("HBBHHHHIHHIIIQQ8Q", dtype, rank, 0, name_off, name_len, layout_off, layout_len,
             block_size, scheme, axis, group, scale, outer, offset, length, *slots) + bytes(16)


def T(dtype, shape, payload, **fields):
    """One tensor for directory(): descriptor fields may be overridden."""
    return dict(dtype=dtype, shape=shape, payload=bytes(payload), **fields)


def directory(tensors, flags=None, **hdr):
    """Assemble a version-2 block in canonical layout from T() entries.
    Any descriptor field given in a T() entry replaces the computed one, and
    header fields can be replaced through **hdr, so a reject case changes
    exactly the field it is about."""
    names = [t.get("name") for t in tensors]
    layouts = [t.get("layout") for t in tensors]
    heap, descs = b"", []
    name_at, layout_at = {}, {}
    for i, nm in enumerate(names):
        if nm is not None:
            name_at[i] = len(heap)
            heap += nm
    for i, lay in enumerate(layouts):
        if lay is not None:
            layout_at[i] = len(heap)
            heap += lay
    run, offsets = 0, []
    for t in tensors:
        off = t.get("offset", (run + 63) // 64 * 64)
        offsets.append(off)
        run = off + len(t["payload"])
    payload_bytes = hdr.pop("payload_bytes", run)
    region = bytearray(payload_bytes)
    for t, off in zip(tensors, offsets):
        data = t["payload"][:max(0, payload_bytes - off)]
        region[off:off + len(data)] = data
    for i, t in enumerate(tensors):
        f = dict(offset=offsets[i], length=len(t["payload"]))
        if names[i] is not None:
            f.update(name_off=name_at[i], name_len=len(names[i]))
        if layouts[i] is not None:
            f.update(layout_off=layout_at[i], layout_len=len(layouts[i]))
        f.update({k: v for k, v in t.items() if k not in ("dtype", "shape", "payload",
                                                           "name", "layout")})
        descs.append(descriptor(t["dtype"], t["shape"], **f))
    heap = hdr.pop("heap", heap)
    name_bytes = hdr.pop("name_bytes", len(heap))
    if flags is None:
        flags = 0x03 if any(nm is not None for nm in names) else 0x02
    table = 64 + 128 * len(tensors) + len(heap)
    pad = bytes((-table) % 64)
    return header(count=len(tensors), name_bytes=name_bytes, payload_bytes=payload_bytes,
                  flags=flags, **hdr) + b"".join(descs) + heap + pad + bytes(region)


def poke(buf, at, fmt, value):
    """Overwrite one little-endian field of an already built buffer."""
    out = bytearray(buf)
    struct.pack_into("<" + fmt, out, at, value)
    return bytes(out)


D0 = 64           # first descriptor inside a standalone block
D1 = 64 + 128
D2 = 64 + 256


def payload_start(buf, s=0):
    directory_bytes = struct.unpack_from("<Q", buf, s + 24)[0]
    return s + ((64 + directory_bytes + 63) & ~63)


# --------------------------------------------------------------------------
# Case table
# --------------------------------------------------------------------------
CASES = []


def case(name, type_text, data, error=None, at=None, framed=False):
    CASES.append(dict(name=name, type=type_text, framed=framed, data=bytes(data),
                      error=error, at=at))


def f32b(*vals):
    return p("%df" % len(vals), *vals)


# shared blocks
EMPTY = header()
F32_BLOCK = directory([T(F32, [2], f32b(1.0, -2.0))])
STRUCT_TOKENS = ["struct{", "id", ":", "i64", ",", "batch", ":", "tensors", ",", "}"]
STRUCT = "struct{id:i64,batch:tensors,}"
SCALES = [T(E2M1, [32], bytes(range(16)), scheme=1, axis=0, group=32, scale=1),
          T(E8M0, [1], b"\x7f")]
OUTER = [T(E2M1, [16], bytes(range(0x10, 0x18)), scheme=2, axis=0, group=16, scale=1, outer=2),
         T(F8E4M3, [1], b"\x38"),
         T(F32, [1], f32b(0.5))]
OPAQUE_T = T(OPAQUE, [32], bytes(range(18)), layout=b"Q4_K", block_size=18)
F16_NAMED = directory([T(F16, [1], b"\x00\x3c", name=b"w")])
TWO_F32 = [T(F32, [2], f32b(1.0, 2.0)), T(F32, [2], f32b(3.0, 4.0))]


def golden():
    case("kiln-v2-empty", "tensors", EMPTY)
    case("kiln-v2-f32", "tensors", F32_BLOCK)
    case("kiln-v2-f32-scalar", "tensors", directory([T(F32, [], f32b(1.0))]))
    case("kiln-v2-f32-negzero", "tensors", directory([T(F32, [1], b"\x00\x00\x00\x80")]))
    case("kiln-v2-f64-nan", "tensors", directory([T(F64, [1], p("Q", 0x7FF8000000000001))]))
    case("kiln-v2-f16-named", "tensors", F16_NAMED)
    case("kiln-v2-bf16", "tensors", directory([T(BF16, [1], b"\x80\x3f")]))
    case("kiln-v2-i8", "tensors", directory([T(I8, [3], p("3b", 1, -1, -128))]))
    case("kiln-v2-bool", "tensors", directory([T(BOOL, [2], b"\x01\x00")]))
    case("kiln-v2-u4", "tensors", directory([T(U4, [3], b"\x21\x03")]))
    case("kiln-v2-f8-pair", "tensors",
         directory([T(F8E4M3, [1], b"\x38"), T(F8E5M2, [1], b"\x3c")]))
    case("kiln-v2-scales", "tensors", directory(SCALES))
    case("kiln-v2-scales-outer", "tensors", directory(OUTER))
    case("kiln-v2-opaque", "tensors", directory([OPAQUE_T]))
    case("kiln-v2-in-struct", STRUCT, p("q", 7) + F32_BLOCK)
    case("kiln-v2-framed", STRUCT, frame(STRUCT_TOKENS, p("q", 7) + EMPTY), framed=True)
    case("kiln-pod-list-f32", "list<f32>", u32(2) + f32b(1.0, -2.0))
    case("kiln-v2-bad-magic", "tensors", b"KLNX" + EMPTY[4:], "FRAME", 0)
    case("kiln-v2-bad-version", "tensors", header(version=1), "FRAME", 4)
    case("kiln-v2-empty-name-flag", "tensors", header(flags=0x03), "TYPE", 5)
    case("kiln-v2-le-clear", "tensors", header(flags=0x00), "FRAME", 5)
    case("kiln-v2-unknown-flag", "tensors", header(flags=0x06), "FRAME", 5)
    case("kiln-v2-reserved", "tensors", poke(EMPTY, 32, "B", 1), "FRAME", 32)
    case("kiln-v2-directory-eof", "tensors", header(count=1), "EOF", 8)
    case("kiln-v2-count-cap", "tensors", header(count=CAP + 1), "LIMIT", 8)
    case("kiln-v2-directory-mismatch", "tensors", poke(F32_BLOCK, 24, "Q", 129), "TYPE", 24)
    case("kiln-v2-shape-overflow", "tensors",
         directory([T(F32, [1 << 32, 1 << 32], f32b(1.0, -2.0))]), "LIMIT", D0 + 48)
    case("kiln-v2-length-mismatch", "tensors",
         directory([T(F32, [3], f32b(1.0, -2.0))]), "TYPE", D0 + 40)
    case("kiln-v2-overlap", "tensors",
         directory([T(F32, [2], f32b(1.0, 2.0)), T(F32, [2], f32b(3.0, 4.0), offset=4)]),
         "TYPE", D1 + 32)
    case("kiln-v2-unaligned", "tensors",
         directory([T(F32, [2], f32b(1.0, 2.0)), T(F32, [2], f32b(3.0, 4.0), offset=8)]),
         "TYPE", D1 + 32)
    case("kiln-v2-nonzero-pad", "tensors", poke(F16_NAMED, 64 + 128 + 1, "B", 0xAA),
         "TYPE", 64 + 128 + 1)
    case("kiln-v2-duplicate-name", "tensors",
         directory([T(F32, [1], f32b(1.0), name=b"a"), T(F32, [1], f32b(2.0), name=b"a")]),
         "TYPE", D1 + 4)
    case("kiln-v2-bad-utf8", "tensors", directory([T(F32, [1], f32b(1.0), name=b"\xff")]),
         "UTF8", 64 + 128)
    case("kiln-v2-bool-byte", "tensors", directory([T(BOOL, [2], b"\x01\x02")]),
         "TYPE", 192 + 1)
    case("kiln-v2-scale-count", "tensors",
         directory([SCALES[0], T(E8M0, [2], b"\x7f\x7f")]), "TYPE", D0 + 24)
    case("kiln-v2-opaque-no-layout", "tensors",
         directory([T(OPAQUE, [32], bytes(range(18)), block_size=18)]), "TYPE", D0 + 8)
    case("kiln-v2-trailing", "tensors", EMPTY + b"\x00", "TRAILING", 64)
    case("kiln-v2-high-nibble", "tensors", directory([T(U4, [3], b"\x21\x13")]),
         "TYPE", 192 + 1)
    case("kiln-v2-shape-tail", "tensors",
         directory([T(F32, [2, 1], f32b(1.0, -2.0), rank=1)]), "TYPE", D0 + 48 + 8)
    case("kiln-v2-dtype-zero", "tensors", poke(F32_BLOCK, D0, "H", 0), "TYPE", D0)
    case("kiln-v2-dtype-reserved", "tensors", poke(F32_BLOCK, D0, "H", 20), "TYPE", D0)
    case("kiln-v2-payload-overflow", "tensors", header(payload_bytes=U64_MAX), "LIMIT", 16)
    case("kiln-list-struct-hostile", "list<struct{id:i64,name:str,}>", u32(CAP), "EOF", 0)
    case("kiln-list-struct-short", "list<struct{id:i64,name:str,}>",
         u32(2) + p("q", 1) + s("a"), "EOF", 0)
    case("kiln-list-str-short", "list<str>", u32(3) + s("a"), "EOF", 0)
    case("kiln-pod-list-short", "list<f32>", u32(2) + f32b(1.0), "EOF", 0)


def scalars():
    # Every Frozen scalar type, with little-endian patterns.
    case("kpy-bool-false", "bool", b"\x00")
    case("kpy-bool-true", "bool", b"\x01")
    case("kpy-bool-2", "bool", b"\x02", "TYPE", 0)
    case("kpy-bool-ff", "bool", b"\xff", "TYPE", 0)
    case("kpy-i8-min", "i8", b"\x80")
    case("kpy-u8-max", "u8", b"\xff")
    case("kpy-i16-le", "i16", b"\x34\x12")
    case("kpy-u16-max", "u16", b"\xff\xff")
    case("kpy-i32-neg", "i32", b"\xfe\xff\xff\xff")
    case("kpy-u32-le", "u32", b"\x04\x03\x02\x01")
    case("kpy-i64-min", "i64", b"\x00" * 7 + b"\x80")
    case("kpy-u64-le", "u64", bytes(range(1, 9)))
    case("kpy-int-neg", "int", b"\xff" * 8)
    case("kpy-uint-max", "uint", b"\xff" * 8)
    case("kpy-f32-one", "f32", b"\x00\x00\x80\x3f")
    case("kpy-f32-negzero", "f32", b"\x00\x00\x00\x80")
    case("kpy-f32-nan-payload", "f32", p("I", 0x7FC00001))
    case("kpy-f64-one", "f64", b"\x00" * 6 + b"\xf0\x3f")
    case("kpy-f64-negzero", "f64", b"\x00" * 7 + b"\x80")
    case("kpy-f64-nan-payload", "f64", p("Q", 0x7FF8000000000001))
    # Scalars that do not fit, and values that do not use the whole buffer.
    case("kpy-bool-empty", "bool", b"", "EOF", 0)
    case("kpy-i32-short", "i32", b"\x01\x02\x03", "EOF", 0)
    case("kpy-f64-short", "f64", b"\x00" * 7, "EOF", 0)
    case("kpy-u8-trailing", "u8", b"\x01\x00", "TRAILING", 1)
    case("kpy-i32-trailing", "i32", b"\x01\x00\x00\x00\x00", "TRAILING", 4)
    case("kpy-struct-i16-u8-short", "struct{a:i16,b:u8,}", b"\x01\x00", "EOF", 2)


def strings():
    case("kpy-str-empty", "str", u32(0))
    case("kpy-str-ascii", "str", s("kiln"))
    case("kpy-str-multibyte", "str", s("\u00e9\u20ac\U0001f600"))
    case("kpy-str-max-scalar", "str", s("\U0010ffff"))
    case("kpy-str-overlong-2", "str", s(b"a\xc0\xaf"), "UTF8", 5)
    case("kpy-str-overlong-3", "str", s(b"\xe0\x80\xaf"), "UTF8", 4)
    case("kpy-str-surrogate", "str", s(b"ab\xed\xa0\x80"), "UTF8", 6)
    case("kpy-str-truncated", "str", s(b"ok\xe2\x82"), "UTF8", 6)
    case("kpy-str-bad-start-80", "str", s(b"\x80"), "UTF8", 4)
    case("kpy-str-bad-start-ff", "str", s(b"xyz\xff"), "UTF8", 7)
    case("kpy-str-above-max", "str", s(b"\xf4\x90\x80\x80"), "UTF8", 4)
    case("kpy-str-len-short", "str", b"\x01\x00", "EOF", 0)
    case("kpy-str-body-short", "str", u32(5) + b"abc", "EOF", 0)
    case("kpy-str-len-cap", "str", u32(CAP + 1), "LIMIT", 0)


def lists():
    case("kpy-list-i32-empty", "list<i32>", u32(0))
    case("kpy-list-u8", "list<u8>", u32(4) + b"\x00\x7f\x80\xff")
    case("kpy-list-u8-cap", "list<u8>", u32(CAP + 1), "LIMIT", 0)
    case("kpy-list-u8-short", "list<u8>", u32(4) + b"\x01\x02\x03", "EOF", 0)
    case("kpy-list-i16-le", "list<i16>", u32(2) + b"\x01\x00\xff\xff")
    case("kpy-list-u64", "list<u64>", u32(1) + bytes(range(8)))
    case("kpy-list-bool", "list<bool>", u32(3) + b"\x00\x01\x01")
    case("kpy-list-bool-bad", "list<bool>", u32(4) + b"\x01\x00\x02\xff", "TYPE", 6)
    case("kpy-list-f32-bits", "list<f32>", u32(3) + b"\x00\x00\x00\x80" + p("2I", 0x7FC00001,
                                                                              0x7F800001))
    case("kpy-list-f64-bits", "list<f64>", u32(2) + p("2Q", 0x8000000000000000,
                                                      0x7FF0000000000001))
    case("kpy-list-count-short", "list<i32>", b"\x01\x00\x00", "EOF", 0)
    case("kpy-list-i32-cap", "list<i32>", u32(CAP + 1), "LIMIT", 0)
    case("kpy-list-i64-short", "list<i64>", u32(2) + bytes(12), "EOF", 0)
    case("kpy-list-struct-empty-5", "list<struct{}>", u32(5))
    case("kpy-list-struct-empty-cap", "list<struct{}>", u32(CAP + 1), "LIMIT", 0)
    # the zero-size budget (spec section 4.3): one max_count for the whole value
    case("kpy-zero-budget-nested", "list<list<struct{}>>", u32(3) + u32(2) + u32(0) + u32(7))
    case("kpy-zero-budget-over", "list<list<struct{}>>", u32(2) + u32(1) + u32(CAP),
         "LIMIT", 8)
    case("kpy-zero-budget-fields", "struct{a:list<struct{}>,b:list<struct{c:struct{},}>,}",
         u32(CAP) + u32(1), "LIMIT", 4)
    case("kpy-zero-budget-not-charged", "list<list<opt<struct{}>>>",
         u32(2) + u32(1) + b"\x00" + u32(1) + b"\x01")
    case("kpy-list-str", "list<str>", u32(2) + s("a") + s(""))
    case("kpy-list-str-element-short", "list<str>", u32(2) + s("abcdefgh") + b"\x00",
         "EOF", 16)
    case("kpy-list-list-i32", "list<list<i32>>", u32(2) + u32(1) + p("i", 5) + u32(0))
    case("kpy-list-opt-i32", "list<opt<i32>>", u32(2) + b"\x00\x01" + p("i", 9))
    case("kpy-list-opt-bad", "list<opt<i32>>", u32(1) + b"\x02", "TYPE", 4)
    case("kpy-struct-empty", "struct{}", b"")
    case("kpy-struct-empty-trailing", "struct{}", b"\x00", "TRAILING", 0)
    case("kpy-struct-mixed", "struct{a:u8,b:str,c:list<u16>,d:opt<f64>,}",
         b"\x07" + s("hi") + u32(1) + p("H", 513) + b"\x01" + p("d", 1.5))


def optionals_and_dicts():
    case("kpy-opt-none", "opt<i32>", b"\x00")
    case("kpy-opt-some", "opt<i32>", b"\x01" + p("i", -1))
    case("kpy-opt-2", "opt<i32>", b"\x02" + p("i", 0), "TYPE", 0)
    case("kpy-opt-ff", "opt<str>", b"\xff", "TYPE", 0)
    case("kpy-opt-empty", "opt<i32>", b"", "EOF", 0)
    case("kpy-opt-some-short", "opt<i32>", b"\x01\x00\x00", "EOF", 1)
    case("kpy-dict-empty", "dict<str,i32>", u32(0))
    case("kpy-dict-sorted", "dict<str,i32>", u32(2) + s("a") + p("i", 1) + s("b") + p("i", 2))
    case("kpy-dict-byte-order", "dict<str,u8>",
         u32(4) + s("Z") + b"\x01" + s("a") + b"\x02" + s("ab") + b"\x03"
         + s("\u00e9") + b"\x04")
    case("kpy-dict-unsorted", "dict<str,i32>",
         u32(2) + s("b") + p("i", 1) + s("a") + p("i", 2), "TYPE", 13)
    case("kpy-dict-duplicate", "dict<str,i32>",
         u32(2) + s("a") + p("i", 1) + s("a") + p("i", 2), "TYPE", 13)
    case("kpy-dict-prefix-after", "dict<str,u8>",
         u32(2) + s("ab") + b"\x01" + s("a") + b"\x02", "TYPE", 11)
    case("kpy-dict-count-cap", "dict<str,u8>", u32(CAP + 1), "LIMIT", 0)
    case("kpy-dict-count-short", "dict<str,i32>", u32(2) + s("a") + p("i", 1), "EOF", 0)
    case("kpy-dict-key-bad-utf8", "dict<str,u8>", u32(1) + s(b"\xc3") + b"\x00", "UTF8", 8)


def depth():
    def nested(levels, inner):
        return "list<" * levels + inner + ">" * levels

    body64 = u32(1) * 63 + u32(1) + p("i", 42)
    case("kpy-depth-64", nested(64, "i32"), body64)
    case("kpy-depth-65", nested(65, "i32"), u32(1) * 64 + u32(1) + p("i", 42), "DEPTH", 320)
    case("kpy-depth-tensors-64", nested(63, "tensors"), u32(1) * 63 + EMPTY)
    case("kpy-depth-tensors-65", nested(64, "tensors"), u32(1) * 64 + EMPTY, "DEPTH", 320)
    mix = "struct{a:" + "opt<dict<str," * 31 + "u8" + ">>" * 31 + ",}"
    case("kpy-depth-mixed-63", mix, b"\x00")
    mix65 = "list<struct{a:" + "opt<dict<str," * 31 + "list<u8>" + ">>" * 31 + ",}>"
    case("kpy-depth-mixed-65", mix65, u32(0), "DEPTH", 14 + 31 * 13)


def frames():
    i32_tok = ["i32"]
    case("kpy-frame-i32", "i32", frame(i32_tok, p("i", 5)), framed=True)
    case("kpy-frame-str", "str", frame(["str"], s("hi")), framed=True)
    case("kpy-frame-tensors", "tensors", frame(["tensors"], F32_BLOCK), framed=True)
    case("kpy-frame-list-f32", "list<f32>",
         frame(["list<", "f32", ">"], u32(1) + f32b(2.0)), framed=True)
    case("kpy-frame-3-bytes", "i32", b"KLN", "EOF", 0, framed=True)
    case("kpy-frame-bad-magic", "i32", frame(i32_tok, p("i", 5), magic=b"KLNT"),
         "FRAME", 0, framed=True)
    case("kpy-frame-bad-magic-short", "i32", b"XLN0\x00", "FRAME", 0, framed=True)
    case("kpy-frame-15-bytes", "i32", frame(i32_tok, b"")[:15], "EOF", 0, framed=True)
    case("kpy-frame-profile-1", "i32", frame(i32_tok, p("i", 5), profile=1),
         "FRAME", 4, framed=True)
    case("kpy-frame-flags", "i32", frame(i32_tok, p("i", 5), flags=1), "FRAME", 5, framed=True)
    case("kpy-frame-reserved-6", "i32", frame(i32_tok, p("i", 5), reserved=0x0001),
         "FRAME", 6, framed=True)
    case("kpy-frame-reserved-7", "i32", frame(i32_tok, p("i", 5), reserved=0x0100),
         "FRAME", 7, framed=True)
    case("kpy-frame-wrong-hash", "i32", frame(["i64"], p("i", 5)), "SCHEMA", 8, framed=True)
    case("kpy-frame-int-not-i64", "int", frame(["i64"], p("q", 5)), "SCHEMA", 8, framed=True)
    case("kpy-frame-body-short", "i32", frame(i32_tok, b"\x05"), "EOF", 16, framed=True)
    case("kpy-frame-trailing", "i32", frame(i32_tok, p("i", 5) + b"\x00"),
         "TRAILING", 20, framed=True)


def nested_tensors():
    case("kpy-tensors-in-list", "list<tensors>", u32(2) + EMPTY + F32_BLOCK)
    case("kpy-tensors-in-opt", "opt<tensors>", b"\x01" + F16_NAMED)
    case("kpy-tensors-then-field", "struct{t:tensors,b:u8,}", F32_BLOCK + b"\x09")
    case("kpy-tensors-field-missing", "struct{t:tensors,b:u8,}", F32_BLOCK, "EOF", 200)
    case("kpy-tensors-list-count-short", "list<tensors>", u32(2) + EMPTY, "EOF", 0)
    case("kpy-tensors-in-struct-block-short", STRUCT, p("q", 7) + F32_BLOCK[:-1], "EOF", 8 + 16)
    case("kpy-tensors-in-struct-bad-pad", "struct{id:i64,batch:tensors,}",
         p("q", 7) + poke(F16_NAMED, 255, "B", 1), "TYPE", 8 + 255)
    case("kpy-tensors-in-list-trailing", "list<tensors>", u32(1) + EMPTY + b"\x00",
         "TRAILING", 68)


def directory_header():
    case("kpy-v2-3-bytes", "tensors", b"KLN", "EOF", 0)
    case("kpy-v2-63-bytes", "tensors", EMPTY[:63], "EOF", 0)
    case("kpy-v2-version-3", "tensors", header(version=3), "FRAME", 4)
    case("kpy-v2-flag-bit7", "tensors", header(flags=0x82), "FRAME", 5)
    case("kpy-v2-reserved-6", "tensors", poke(EMPTY, 6, "B", 1), "FRAME", 6)
    case("kpy-v2-reserved-7", "tensors", poke(EMPTY, 7, "B", 1), "FRAME", 7)
    case("kpy-v2-reserved-63", "tensors", poke(EMPTY, 63, "B", 1), "FRAME", 63)
    case("kpy-v2-name-bytes-cap", "tensors", header(name_bytes=CAP + 1), "LIMIT", 12)
    case("kpy-v2-count-at-cap-eof", "tensors", header(count=CAP), "EOF", 8)
    case("kpy-v2-heap-eof", "tensors", F16_NAMED[:64 + 128], "EOF", 8)
    case("kpy-v2-block-eof", "tensors", F32_BLOCK[:-1], "EOF", 16)
    case("kpy-v2-pad-eof", "tensors", F16_NAMED[:64 + 128 + 1], "EOF", 16)
    case("kpy-v2-pad-last-byte", "tensors", poke(F16_NAMED, 255, "B", 1), "TYPE", 255)
    case("kpy-v2-desc-reserved-3", "tensors", poke(F32_BLOCK, D0 + 3, "B", 1), "FRAME", D0 + 3)
    case("kpy-v2-desc-reserved-127", "tensors", poke(F32_BLOCK, D0 + 127, "B", 1),
         "FRAME", D0 + 127)


def directory_names():
    one = f32b(1.0)
    case("kpy-v2-named-multibyte", "tensors",
         directory([T(F32, [1], one, name="w\u00e9".encode()),
                    T(F32, [1], one, name=b"b")]))
    case("kpy-v2-name-without-flag", "tensors",
         directory([T(F32, [1], one, name=b"a")], flags=0x02), "TYPE", D0 + 4)
    case("kpy-v2-name-off-without-flag", "tensors",
         directory([T(F32, [1], one, name_off=0)]), "TYPE", D0 + 4)
    case("kpy-v2-flag-with-unnamed", "tensors",
         directory([T(F32, [1], one, name=b"a"), T(F32, [1], one)]), "TYPE", D1 + 4)
    # step 8(b)'s flag pass runs over every descriptor before the walk: the
    # empty name of descriptor 1 is the fault, not descriptor 0's slice
    case("kpy-v2-flag-pass-before-walk", "tensors",
         directory([T(F32, [1], one, name=b"a", name_off=1),
                    T(F32, [1], one, name=b"b", name_len=0)]), "TYPE", D1 + 4)
    case("kpy-v2-name-reordered", "tensors",
         directory([T(F32, [1], one, name=b"a", name_off=2),
                    T(F32, [1], one, name=b"bc", name_off=0)], heap=b"bca"), "TYPE", D0 + 4)
    case("kpy-v2-name-gap", "tensors",
         directory([T(F32, [1], one, name=b"a"), T(F32, [1], one, name=b"b", name_off=2)],
                   heap=b"a\x00b"), "TYPE", D1 + 4)
    case("kpy-v2-heap-extra-byte", "tensors",
         directory([T(F32, [1], one, name=b"a")], heap=b"a\x00"), "TYPE", 12)
    case("kpy-v2-name-past-heap", "tensors",
         directory([T(F32, [1], one, name=b"a", name_len=2)]), "TYPE", D0 + 4)
    case("kpy-v2-layout-off-without-len", "tensors",
         directory([T(F32, [1], one, layout_off=0)]), "TYPE", D0 + 8)
    case("kpy-v2-layout-before-name", "tensors",
         directory([dict(OPAQUE_T, name=b"w", name_off=4, layout_off=0)], heap=b"Q4_Kw"),
         "TYPE", D0 + 4)
    case("kpy-v2-layout-past-heap", "tensors",
         directory([dict(OPAQUE_T, layout_len=5)]), "TYPE", D0 + 8)
    case("kpy-v2-opaque-named", "tensors", directory([dict(OPAQUE_T, name=b"w")]))
    case("kpy-v2-layout-repeats", "tensors", directory([OPAQUE_T, OPAQUE_T]))
    case("kpy-v2-layout-bad-utf8", "tensors",
         directory([dict(OPAQUE_T, layout=b"Q4\xff")]), "UTF8", 64 + 128 + 2)
    case("kpy-v2-name-surrogate", "tensors",
         directory([T(F32, [1], one, name=b"x\xed\xbf\xbf")]), "UTF8", 64 + 128 + 1)
    case("kpy-v2-name-utf8-before-dup", "tensors",
         directory([T(F32, [1], one, name=b"a"), T(F32, [1], one, name=b"a"),
                    T(F32, [1], one, name=b"\xc3")]), "UTF8", 64 + 3 * 128 + 2)
    case("kpy-v2-duplicate-name-later", "tensors",
         directory([T(F32, [1], one, name=b"a"), T(F32, [1], one, name=b"b"),
                    T(F32, [1], one, name=b"a")]), "TYPE", D2 + 4)


def directory_descriptors():
    one = f32b(1.0)
    case("kpy-v2-dtype-4095", "tensors", poke(F32_BLOCK, D0, "H", 4095), "TYPE", D0)
    case("kpy-v2-dtype-32768", "tensors",
         directory([dict(OPAQUE_T, dtype=32768)]), "TYPE", D0)
    case("kpy-v2-dtype-65535", "tensors", poke(F32_BLOCK, D0, "H", 65535), "TYPE", D0)
    case("kpy-v2-dtype-32767", "tensors", directory([dict(OPAQUE_T, dtype=32767)]))
    case("kpy-v2-every-closed-dtype", "tensors", directory([
        T(F64, [1], p("d", 1.0)), T(F32, [1], one), T(F16, [1], b"\x00\x3c"),
        T(BF16, [1], b"\x80\x3f"), T(F8E4M3, [1], b"\x38"), T(F8E5M2, [1], b"\x3c"),
        T(BOOL, [1], b"\x01"), T(I8, [1], b"\xff"), T(U8, [1], b"\xff"),
        T(I16, [1], p("h", -2)), T(U16, [1], p("H", 2)), T(I32, [1], p("i", -3)),
        T(U32, [1], p("I", 3)), T(I64, [1], p("q", -4)), T(U64, [1], p("Q", 4)),
        T(I4, [2], b"\xf1"), T(U4, [2], b"\x21"), T(E2M1, [2], b"\x7f"),
        T(E8M0, [1], b"\x7f")]))
    case("kpy-v2-rank-9", "tensors", poke(F32_BLOCK, D0 + 2, "B", 9), "TYPE", D0 + 2)
    case("kpy-v2-rank-8", "tensors", directory([T(F32, [1] * 8, one)]))
    case("kpy-v2-rank-0-slot", "tensors", directory([T(F32, [1], one, rank=0)]), "TYPE", D0 + 48)
    case("kpy-v2-zero-dim", "tensors", directory([T(F32, [3, 0], b"")]))
    case("kpy-v2-zero-dim-after-huge", "tensors",
         directory([T(F32, [1 << 40, 1 << 40, 0], b"")]))
    case("kpy-v2-closed-block-size", "tensors",
         directory([T(F32, [1], one, block_size=4)]), "TYPE", D0 + 12)
    case("kpy-v2-closed-layout", "tensors",
         directory([T(F32, [1], one, layout=b"x")]), "TYPE", D0 + 8)
    case("kpy-v2-opaque-block-zero", "tensors",
         directory([dict(OPAQUE_T, block_size=0)]), "TYPE", D0 + 12)
    case("kpy-v2-opaque-not-multiple", "tensors",
         directory([dict(OPAQUE_T, payload=bytes(20))]), "TYPE", D0 + 40)
    case("kpy-v2-opaque-empty", "tensors", directory([dict(OPAQUE_T, payload=b"")]))
    case("kpy-v2-length-product-overflow", "tensors",
         directory([T(F64, [1 << 62], p("d", 1.0))]), "LIMIT", D0 + 40)
    case("kpy-v2-i4-length-mismatch", "tensors", directory([T(I4, [3], b"\x21\x03\x00")]),
         "TYPE", D0 + 40)
    case("kpy-v2-range-past-payload", "tensors",
         directory([T(F32, [2], f32b(1.0, -2.0))], payload_bytes=4), "TYPE", D0 + 32)
    case("kpy-v2-range-end-overflow", "tensors",
         directory([T(F32, [2], f32b(1.0, -2.0), offset=U64_MAX - 3)], payload_bytes=8),
         "LIMIT", D0 + 32)
    case("kpy-v2-overlap-zero-length", "tensors",
         directory([T(F32, [0], b""), T(F32, [0], b""), T(F32, [1], one)]))
    case("kpy-v2-zero-length-inside-range", "tensors",
         directory([T(F32, [2], f32b(1.0, 2.0)), T(F32, [0], b"", offset=4)],
                   payload_bytes=8), "TYPE", D1 + 32)
    case("kpy-v2-overlap-reports-later-index", "tensors",
         directory([T(F32, [2], f32b(1.0, 2.0), offset=64), T(F32, [32], bytes(128), offset=0)],
                   payload_bytes=128), "TYPE", D1 + 32)
    case("kpy-v2-first-offset-64", "tensors",
         directory([T(F32, [1], one, offset=64)]), "TYPE", D0 + 32)
    case("kpy-v2-payload-bytes-extra", "tensors",
         directory([T(F32, [1], one)], payload_bytes=5), "TYPE", 16)
    case("kpy-v2-gap-nonzero", "tensors",
         poke(directory([T(F8E4M3, [1], b"\x38"), T(F8E5M2, [1], b"\x3c")]), 320 + 63, "B", 1),
         "TYPE", 320 + 63)


def directory_elements():
    case("kpy-v2-bool-scalar", "tensors", directory([T(BOOL, [], b"\x01")]))
    case("kpy-v2-bool-ff", "tensors", directory([T(BOOL, [3], b"\x00\xff\x02")]), "TYPE", 193)
    case("kpy-v2-i4-odd", "tensors", directory([T(I4, [3], b"\xf7\x08")]))
    case("kpy-v2-i4-odd-high", "tensors", directory([T(I4, [1], b"\x81")]), "TYPE", 192)
    case("kpy-v2-e2m1-odd-high", "tensors", directory([T(E2M1, [5], b"\x11\x22\x13")]),
         "TYPE", 194)
    case("kpy-v2-u4-even-high", "tensors", directory([T(U4, [4], b"\xff\xff")]))


def directory_quant():
    base = SCALES[0]
    scale = SCALES[1]
    case("kpy-v2-quant-scheme-3", "tensors", directory([dict(base, scheme=3), scale]),
         "TYPE", D0 + 16)
    one = f32b(1.0)
    case("kpy-v2-quant-none-axis", "tensors", directory([T(F32, [1], one, axis=0)]),
         "TYPE", D0 + 18)
    case("kpy-v2-quant-none-group", "tensors", directory([T(F32, [1], one, group=1)]),
         "TYPE", D0 + 20)
    case("kpy-v2-quant-none-scale", "tensors",
         directory([T(F32, [1], one, scale=1), T(F32, [1], one)]), "TYPE", D0 + 24)
    case("kpy-v2-quant-none-outer", "tensors",
         directory([T(F32, [1], one, outer=1), T(F32, [1], one)]), "TYPE", D0 + 28)
    case("kpy-v2-quant-rank-0", "tensors",
         directory([T(F32, [], one, scheme=1, axis=0, group=1, scale=1), T(E8M0, [1], b"\x7f")]),
         "TYPE", D0 + 18)
    case("kpy-v2-quant-axis-rank", "tensors", directory([dict(base, axis=1), scale]),
         "TYPE", D0 + 18)
    case("kpy-v2-quant-group-zero", "tensors", directory([dict(base, group=0), scale]),
         "TYPE", D0 + 20)
    case("kpy-v2-quant-scale-range", "tensors", directory([dict(base, scale=2), scale]),
         "TYPE", D0 + 24)
    case("kpy-v2-quant-scale-self", "tensors", directory([dict(base, scale=0), scale]),
         "TYPE", D0 + 24)
    case("kpy-v2-quant-chain", "tensors",
         directory([dict(base, scale=1),
                    T(E8M0, [1], b"\x7f", scheme=1, axis=0, group=1, scale=2),
                    T(E8M0, [1], b"\x7f")]), "TYPE", D0 + 24)
    case("kpy-v2-quant-1-with-outer", "tensors",
         directory([dict(base, outer=1), scale]), "TYPE", D0 + 28)
    o0, o1, o2 = OUTER
    case("kpy-v2-quant-outer-range", "tensors", directory([dict(o0, outer=3), o1, o2]),
         "TYPE", D0 + 28)
    case("kpy-v2-quant-outer-self", "tensors", directory([dict(o0, outer=0), o1, o2]),
         "TYPE", D0 + 28)
    case("kpy-v2-quant-outer-is-scale", "tensors", directory([dict(o0, outer=1), o1, o2]),
         "TYPE", D0 + 28)
    case("kpy-v2-quant-outer-f16", "tensors",
         directory([o0, o1, T(F16, [1], b"\x00\x3c")]), "TYPE", D0 + 28)
    case("kpy-v2-quant-outer-count-2", "tensors",
         directory([o0, o1, T(F32, [2], f32b(0.5, 0.25))]), "TYPE", D0 + 28)
    case("kpy-v2-quant-outer-quantized", "tensors",
         directory([o0, o1, dict(o2, scheme=1, axis=0, group=1, scale=1)]), "TYPE", D0 + 28)
    # ceil(5 / 2) * 2 = 6 scales for a [5, 2] tensor grouped along axis 0 by 2.
    case("kpy-v2-quant-ceil-groups", "tensors",
         directory([T(U8, [5, 2], bytes(10), scheme=1, axis=0, group=2, scale=1),
                    T(F16, [6], bytes(12))]))
    case("kpy-v2-quant-floor-groups", "tensors",
         directory([T(U8, [5, 2], bytes(10), scheme=1, axis=0, group=2, scale=1),
                    T(F16, [4], bytes(8))]), "TYPE", D0 + 24)
    case("kpy-v2-quant-axis-1", "tensors",
         directory([T(E2M1, [4, 64], bytes(128), scheme=1, axis=1, group=32, scale=1),
                    T(E8M0, [4, 2], b"\x7f" * 8)]))
    case("kpy-v2-quant-scale-first", "tensors",
         directory([T(E8M0, [1], b"\x7f"), dict(base, scale=0)]))


META_TOKENS = ["list<", "struct{", "parent", ":", "u32", ",", "key", ":", "opt<", "str", ">",
               ",", "kind", ":", "u8", ",", "int", ":", "i64", ",", "float", ":", "f64", ",",
               "text", ":", "str", ",", "raw", ":", "list<", "u8", ">", ",", "}", ">"]


def meta_node(parent, key, kind, int_=0, float_=0.0, text="", raw=b""):
    """One metadata node (spec section 12), written field by field."""
    k = b"\x00" if key is None else b"\x01" + s(key)
    return (u32(parent) + k + p("Bqd", kind, int_, float_) + s(text) + u32(len(raw))
            + raw)


def tensor_files():
    # a tensor file with metadata {"model": "m", "step": 3, "ids": [5, 6]} (spec section 12):
    # an ordinary directory whose last tensor is __metadata__
    nodes = [meta_node(NO32, None, 7), meta_node(0, "model", 4, text="m"),
             meta_node(0, "step", 2, int_=3),
             meta_node(0, "ids", 8, raw=p("2q", 5, 6))]
    blob = frame(META_TOKENS, u32(len(nodes)) + b"".join(nodes))
    case("kpy-file-metadata", "tensors", directory([
        T(2, [2], f32b(1.0, 2.0), name=b"w"),
        T(9, [len(blob)], blob, name=b"__metadata__")]))


def build_cases():
    del CASES[:]
    for section in (golden, scalars, strings, lists, optionals_and_dicts, depth, frames,
                    nested_tensors, directory_header, directory_names,
                    directory_descriptors, directory_elements, directory_quant, tensor_files):
        section()
    return CASES


# --------------------------------------------------------------------------
# Verification and output
# --------------------------------------------------------------------------
GOLDEN_NAMES = [
    "kiln-v2-empty", "kiln-v2-f32", "kiln-v2-f32-scalar", "kiln-v2-f32-negzero",
    "kiln-v2-f64-nan", "kiln-v2-f16-named", "kiln-v2-bf16", "kiln-v2-i8", "kiln-v2-bool",
    "kiln-v2-u4", "kiln-v2-f8-pair", "kiln-v2-scales", "kiln-v2-scales-outer",
    "kiln-v2-opaque", "kiln-v2-in-struct", "kiln-v2-framed", "kiln-pod-list-f32",
    "kiln-v2-bad-magic", "kiln-v2-bad-version", "kiln-v2-empty-name-flag",
    "kiln-v2-le-clear", "kiln-v2-unknown-flag", "kiln-v2-reserved", "kiln-v2-directory-eof",
    "kiln-v2-count-cap", "kiln-v2-directory-mismatch", "kiln-v2-shape-overflow",
    "kiln-v2-length-mismatch", "kiln-v2-overlap", "kiln-v2-unaligned", "kiln-v2-nonzero-pad",
    "kiln-v2-duplicate-name", "kiln-v2-bad-utf8", "kiln-v2-bool-byte", "kiln-v2-scale-count",
    "kiln-v2-opaque-no-layout", "kiln-v2-trailing", "kiln-v2-high-nibble",
    "kiln-v2-shape-tail", "kiln-v2-dtype-zero", "kiln-v2-dtype-reserved",
    "kiln-v2-payload-overflow", "kiln-list-struct-hostile", "kiln-list-struct-short",
    "kiln-list-str-short", "kiln-pod-list-short",
]


def fixed_points(by_name):
    """Byte strings and hashes that the normative text states outright."""
    problems = []
    empty_hex = "4b4c4e5402020000" + "00" * 56
    if by_name["kiln-v2-empty"]["data"].hex() != empty_hex:
        problems.append("kiln-v2-empty is not the 64-byte block of the spec")
    f32 = by_name["kiln-v2-f32"]["data"]
    if len(f32) != 200 or f32[192:].hex() != "0000803f000000c0":
        problems.append("kiln-v2-f32 is not 200 bytes ending 0000803f000000c0")
    framed = by_name["kiln-v2-framed"]["data"]
    if framed[8:16] != p("Q", 0xE58AADC7552F0D82):
        problems.append("kiln-v2-framed hash is not 0xe58aadc7552f0d82 LE at offset 8")
    if kiln_ref.schema_hash(STRUCT) != 0xE58AADC7552F0D82:
        problems.append("kiln_ref.schema_hash disagrees with the spec's worked hash")
    if by_name["kiln-v2-u4"]["data"][192:].hex() != "2103":
        problems.append("kiln-v2-u4 payload is not 21 03")
    pair = by_name["kiln-v2-f8-pair"]["data"]
    if pair[320:].hex() != "38" + "00" * 63 + "3c":
        problems.append("kiln-v2-f8-pair is not 38, 63 zeros, 3c")
    return problems


def verify(cases):
    problems = []
    names = [c["name"] for c in cases]
    if len(set(names)) != len(names):
        problems.append("duplicate case names")
    for g in GOLDEN_NAMES:
        if g not in names:
            problems.append("missing golden case " + g)
    extra = [n for n in names if not n.startswith("kpy-") and n not in GOLDEN_NAMES]
    if extra:
        problems.append("unexpected non-kpy names: %s" % extra)
    by_name = {c["name"]: c for c in cases}
    for c in cases:
        try:
            kiln_ref.decode(c["data"], c["type"], c["framed"])
            got = (None, None)
        except kiln_ref.RefError as e:
            got = (e.code, e.offset)
        except Exception as e:  # a construction bug, not a wire outcome
            got = ("EXCEPTION %r" % e, None)
        if got != (c["error"], c["at"]):
            problems.append("%s: expected %s@%s, got %s@%s"
                            % (c["name"], c["error"], c["at"], got[0], got[1]))
        if c["error"] != "DEPTH":
            canon = "".join(kiln_ref.type_tokens(kiln_ref.parse_type(c["type"])))
            if canon != c["type"]:
                problems.append("%s: type text is not canonical" % c["name"])
    problems += fixed_points(by_name)
    return problems


def render(cases):
    doc = {"version": 2, "cap": CAP, "cases": [
        {"name": c["name"], "type": c["type"], "framed": c["framed"], "hex": c["data"].hex(),
         "result": "reject" if c["error"] else "accept", "error": c["error"]}
        for c in cases]}
    return json.dumps(doc, indent=1) + "\n"


def main(argv=None):
    # the cap-size cases build millions of small objects the collector need not
    # visit (a free-threaded 3.13.5 spends minutes in it)
    import gc
    gc.disable()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=DEFAULT_OUT, help="output path")
    ap.add_argument("--check", action="store_true",
                    help="exit 1 unless the file at --out is byte-identical to a fresh build")
    args = ap.parse_args(argv)
    cases = build_cases()
    problems = verify(cases)
    if problems:
        for line in problems:
            print("gen_v2_cases: " + line, file=sys.stderr)
        print("gen_v2_cases: %d problem(s); nothing written" % len(problems), file=sys.stderr)
        return 1
    text = render(cases).encode("utf-8")
    if args.check:
        try:
            with open(args.out, "rb") as fh:
                current = fh.read()
        except OSError as e:
            print("gen_v2_cases: cannot read %s: %s" % (args.out, e), file=sys.stderr)
            return 1
        if current != text:
            print("gen_v2_cases: %s is out of date" % args.out, file=sys.stderr)
            return 1
        print("gen_v2_cases: %s is up to date (%d cases)" % (args.out, len(cases)))
        return 0
    # the one copy: a wheel's kiln/data/ copy is written from it by setup.py
    tmp = args.out + ".tmp"
    with open(tmp, "wb") as fh:
        fh.write(text)
    os.replace(tmp, args.out)
    print("gen_v2_cases: wrote %d cases to %s" % (len(cases), args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
