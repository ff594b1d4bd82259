"""The hostile-input table: named buffers, each with the exact code it must give.

Buffers are built by hand with the reference generator's byte builders
(spec/reference/gen_v2_cases.py), never by kiln's encoder.  Expected codes are
written here from the spec's rules; the reference decoder confirms them in
tests/test_hostile.py.
"""

import struct
import sys

from _util import ROOT  # noqa: F401  (puts spec/reference on sys.path)
import gen_v2_cases as G  # noqa: E402

CAP = 16_777_216
U32 = 2 ** 32 - 1
U64 = 2 ** 64 - 1
SMALL = 1000            # a small configured cap so "at the cap" inputs stay small


class H:
    __slots__ = ("name", "type", "buf", "code", "opts")

    def __init__(self, name, type_text, buf, code, **opts):
        self.name, self.type, self.buf, self.code, self.opts = name, type_text, bytes(buf), code, opts


def u32(n):
    return struct.pack("<I", n)


def table():
    out = []
    add = out.append
    counts = [0, 1, SMALL, SMALL + 1, 2 ** 31 - 1, 2 ** 31, U32]
    # (type, element bytes, per-element filler) for every u32 count/length kind
    kinds = [("list<i32>", 4), ("list<u8>", 1), ("str", 1), ("list<f64>", 8),
             ("list<struct{a:i64,b:str,}>", 12), ("dict<str,i8>", 5), ("list<opt<i8>>", 1)]
    elem = {"list<i32>": b"\1\0\0\0", "list<u8>": b"a", "str": b"a", "list<f64>": bytes(8),
            "list<struct{a:i64,b:str,}>": bytes(12), "list<opt<i8>>": b"\0"}
    for t, size in kinds:
        for c in counts:
            for cap_name, cap in (("small-cap", SMALL), ("max-cap", U32)):
                opts = dict(max_count=cap, max_bytes=cap)
                if c > cap:
                    add(H("%s-count-%d-%s" % (t, c, cap_name), t, u32(c), "LIMIT", **opts))
                    continue
                if c > SMALL:   # cannot hold the body: the count is past the buffer
                    add(H("%s-count-%d-%s-absent" % (t, c, cap_name), t, u32(c), "EOF", **opts))
                    continue
                if cap_name == "max-cap":
                    continue
                if t == "dict<str,i8>":
                    keys = sorted(("k%05d" % i).encode() for i in range(c))
                    body = b"".join(u32(len(k)) + k + b"\x01" for k in keys)
                    short = body[:-1]
                else:
                    body = elem[t] * c
                    short = body[:-1]
                add(H("%s-count-%d-exact" % (t, c), t, u32(c) + body, None, **opts))
                if c:
                    add(H("%s-count-%d-short" % (t, c), t, u32(c) + short, "EOF", **opts))
    # default caps: cap and cap+1 with nothing behind them
    for t in ("list<i32>", "str", "dict<str,i8>", "list<str>"):
        add(H("%s-default-cap-absent" % t, t, u32(CAP), "EOF"))
    for t in ("list<i32>", "list<struct{}>", "str", "dict<str,i8>", "list<str>"):
        add(H("%s-default-cap-plus-1" % t, t, u32(CAP + 1), "LIMIT"))
    # the spec's Frozen hostile shapes with rising counts
    for c in (10 ** 3, 10 ** 6, 10 ** 9, U32):
        add(H("list-struct-hostile-%d" % c, "list<struct{id:i64,name:str,}>", u32(c), "EOF",
              max_count=U32))
        add(H("string-length-%d" % c, "str", u32(c), "EOF", max_bytes=U32))
    # --- directory header fields ---------------------------------------------
    for c in (1, 1000, CAP, CAP + 1, 2 ** 31, U32):
        code = "LIMIT" if c > CAP else "EOF"
        add(H("dir-count-%d" % c, "tensors", G.header(count=c), code))
        add(H("dir-count-%d-maxcap" % c, "tensors", G.header(count=c), "EOF", max_count=U32))
    for nb in (1, CAP, CAP + 1, U32):
        code = "LIMIT" if nb > CAP else "EOF"
        add(H("dir-name-bytes-%d" % nb, "tensors", G.header(name_bytes=nb, flags=3), code))
    for pb in (1, 2 ** 63 - 1, U64 - 63, U64):
        code = "LIMIT" if 64 + pb > U64 else "EOF"
        add(H("dir-payload-bytes-%d" % pb, "tensors", G.header(payload_bytes=pb), code))
    for db in (1, 128, 2 ** 63 - 1, U64):
        add(H("dir-directory-bytes-%d" % db, "tensors", G.header(directory_bytes=db), "TYPE"))
    one = G.directory([G.T(G.F32, [2], struct.pack("<2f", 1.0, -2.0))])
    D = G.D0
    for field, at, fmt, vals in (
            ("byte_offset", D + 32, "Q", [(2 ** 63 - 1, "TYPE"), (U64, "LIMIT"), (U64 - 7, "LIMIT"),
                                         (8, "TYPE"), (64, "TYPE")]),
            ("byte_length", D + 40, "Q", [(2 ** 63 - 1, "TYPE"), (U64, "TYPE"), (0, "TYPE")]),
            ("shape0", D + 48, "Q", [(2 ** 63 - 1, "LIMIT"), (U64, "LIMIT"), (2 ** 62, "LIMIT"),
                                    (3, "TYPE")]),
            ("shape-tail", D + 56, "Q", [(1, "TYPE"), (U64, "TYPE")]),
            ("rank", D + 2, "B", [(9, "TYPE"), (255, "TYPE"), (0, "TYPE")]),
            ("dtype", D, "H", [(0, "TYPE"), (20, "TYPE"), (4095, "TYPE"), (32768, "TYPE"),
                               (65535, "TYPE")]),
            ("name_off", D + 4, "H", [(0, "TYPE")]),
            ("reserved-desc", D + 3, "B", [(1, "FRAME")]),
            ("reserved-desc-tail", D + 127, "B", [(0x80, "FRAME")]),
            ("quant_scheme", D + 16, "H", [(3, "TYPE"), (1, "TYPE")]),
            ("scale_index", D + 24, "I", [(0, "TYPE"), (5, "TYPE")]),
            ("group_size", D + 20, "I", [(1, "TYPE")])):
        for v, code in vals:
            add(H("dir-%s-%d" % (field, v), "tensors", G.poke(one, at, fmt, v), code))
    # shape products that wrap to 0 or to a small number in u64
    for shape, code in (([2 ** 32, 2 ** 32], "LIMIT"), ([2 ** 63, 2], "LIMIT"),
                        ([2 ** 32 + 1, 2 ** 32 - 1], "LIMIT"), ([2 ** 33, 2 ** 31 + 1], "LIMIT"),
                        ([2 ** 40, 2 ** 40, 0], "TYPE")):
        t = G.directory([G.T(G.F32, shape, b"\0" * 8)])
        add(H("dir-shape-wrap-%s" % "x".join(map(str, shape)), "tensors", t, code))
    for shape in ([2 ** 32, 2 ** 32], [2 ** 63, 2]):
        add(H("dir-u8-shape-wrap-%s" % "x".join(map(str, shape)), "tensors",
              G.directory([G.T(G.U8, shape, b"")]), "LIMIT"))
    # two tensors: overlapping, backward, out-of-range offsets
    two = [G.T(G.F32, [2], bytes(8)), G.T(G.F32, [2], bytes(8))]
    for nm, o1, code in (("overlap", 4, "TYPE"), ("same", 0, "TYPE"), ("backward-gap", 32, "TYPE"),
                         ("past-end", 128, "TYPE"), ("wrap", U64 - 3, "LIMIT")):
        b = G.directory([two[0], dict(two[1], offset=64)], payload_bytes=72)
        add(H("dir-two-%s" % nm, "tensors", G.poke(b, G.D1 + 32, "Q", o1), code))
    b = G.directory(two)
    add(H("dir-gap-nonzero", "tensors", G.poke(b, G.payload_start(b) + 8, "B", 1), "TYPE"))
    add(H("dir-pad-nonzero", "tensors",
          G.poke(G.directory([G.T(G.U8, [1], b"\1", name=b"x")]), 64 + 128 + 1, "B", 1), "TYPE"))
    add(H("dir-trailing", "tensors", b + b"\0", "TRAILING"))
    add(H("dir-trailing-many", "tensors", b + bytes(1000), "TRAILING"))
    add(H("dir-one-short", "tensors", b[:-1], "EOF"))
    add(H("dir-header-short", "tensors", b[:63], "EOF"))
    add(H("dir-magic-short", "tensors", b[:3], "EOF"))
    # names: holes, slices past the heap, bad UTF-8, duplicates, flag faults
    nm2 = [G.T(G.U8, [1], b"\1", name=b"ab"), G.T(G.U8, [1], b"\1", name=b"cd")]
    nb = G.directory(nm2)
    add(H("dir-name-slice-past-heap", "tensors", G.poke(nb, G.D1 + 6, "H", 3), "TYPE"))
    add(H("dir-name-slice-way-past", "tensors", G.poke(nb, G.D1 + 6, "H", 0xFFFE), "TYPE"))
    add(H("dir-name-hole", "tensors", G.directory(nm2, name_bytes=5, heap=b"abcdX"), "TYPE"))
    add(H("dir-name-reordered", "tensors", G.poke(G.poke(nb, G.D0 + 4, "H", 2), G.D1 + 4, "H", 0),
          "TYPE"))
    for bad in (b"\xff", b"\xc0\x80", b"\xed\xa0\x80", b"a\xe2\x82"):
        add(H("dir-name-utf8-%s" % bad.hex(), "tensors",
              G.directory([G.T(G.U8, [1], b"\1", name=bad)]), "UTF8"))
        add(H("dir-layout-utf8-%s" % bad.hex(), "tensors",
              G.directory([G.T(G.OPAQUE, [1], bytes(4), layout=bad, block_size=4)]), "UTF8"))
        add(H("str-utf8-%s" % bad.hex(), "str", u32(len(bad)) + bad, "UTF8"))
        add(H("dict-key-utf8-%s" % bad.hex(), "dict<str,i8>", u32(1) + u32(len(bad)) + bad + b"\0",
              "UTF8"))
    add(H("dir-duplicate-name", "tensors",
          G.directory([G.T(G.U8, [1], b"\1", name=b"a"), G.T(G.U8, [1], b"\1", name=b"a")]), "TYPE"))
    add(H("dir-name-flag-unnamed", "tensors", G.directory(two, flags=3), "TYPE"))
    # quantization links
    data = G.T(G.E2M1, [32], bytes(16), scheme=1, axis=0, group=32, scale=1)
    scale = G.T(G.E8M0, [1], b"\x7f")
    add(H("quant-ok", "tensors", G.directory([data, scale]), None))
    add(H("quant-missing", "tensors", G.directory([dict(data, scale=7), scale]), "TYPE"))
    add(H("quant-self", "tensors", G.directory([dict(data, scale=0), scale]), "TYPE"))
    add(H("quant-missing-max", "tensors", G.directory([dict(data, scale=U32 - 1), scale]), "TYPE"))
    chain = [data, G.T(G.E8M0, [1], b"\x7f", scheme=1, axis=0, group=1, scale=2),
             G.T(G.E8M0, [1], b"\x7f")]
    add(H("quant-chain", "tensors", G.directory(chain), "TYPE"))
    loop = [dict(data, scale=1), G.T(G.E2M1, [32], bytes(16), scheme=1, axis=0, group=32, scale=0)]
    add(H("quant-loop", "tensors", G.directory(loop), "TYPE"))
    outer = G.T(G.F32, [1], bytes(4))
    d2 = G.T(G.E2M1, [16], bytes(8), scheme=2, axis=0, group=16, scale=1, outer=2)
    add(H("quant-outer-ok", "tensors", G.directory([d2, G.T(G.F8E4M3, [1], b"\1"), outer]), None))
    add(H("quant-outer-is-scale", "tensors",
          G.directory([dict(d2, outer=1), G.T(G.F8E4M3, [1], b"\1"), outer]), "TYPE"))
    add(H("quant-outer-missing", "tensors",
          G.directory([dict(d2, outer=9), G.T(G.F8E4M3, [1], b"\1"), outer]), "TYPE"))
    # nesting on every container path
    for nm, pre, post, body in (("list", "list<", ">", u32(0)), ("opt", "opt<", ">", b"\0"),
                                ("dict", "dict<str,", ">", u32(0)),
                                ("struct", "struct{f:", ",}", u32(0))):
        for depth, code in ((64, None), (65, "DEPTH"), (100_000, "DEPTH")):
            add(H("nest-%s-%d" % (nm, depth), pre * depth + "i32" + post * depth, body, code))
    return out


TABLE = table()
