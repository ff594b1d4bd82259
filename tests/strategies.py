"""Hypothesis strategies: Kiln types, values of a type, tensor lists."""

import struct

import numpy as np
from hypothesis import strategies as st

import kiln

SCALARS = ["bool", "i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64", "int", "uint",
           "f32", "f64", "str"]
POD = {"bool": "|b1", "i8": "|i1", "i16": "<i2", "i32": "<i4", "i64": "<i8", "u16": "<u2",
       "u32": "<u4", "u64": "<u8", "int": "<i8", "uint": "<u8", "f32": "<f4", "f64": "<f8"}
IDENT = st.from_regex(r"[a-z_][a-z0-9_]{0,6}", fullmatch=True)


def type_texts(max_leaves=8):
    base = st.sampled_from(SCALARS + ["tensors"])

    def extend(children):
        fields = st.lists(st.tuples(IDENT, children), max_size=4,
                          unique_by=lambda f: f[0])
        return st.one_of(
            children.map(lambda c: "list<%s>" % c),
            children.map(lambda c: "opt<%s>" % c),
            children.map(lambda c: "dict<str,%s>" % c),
            fields.map(lambda fs: "struct{" + "".join("%s:%s," % f for f in fs) + "}"),
        )
    return st.recursive(base, extend, max_leaves=max_leaves)


def _int_range(name):
    if name in ("int", "i64"):
        return -(1 << 63), (1 << 63) - 1
    if name in ("uint", "u64"):
        return 0, (1 << 64) - 1
    bits = int(name[1:])
    if name[0] == "i":
        return -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    return 0, (1 << bits) - 1


def f32_values():
    return st.integers(0, 0xFFFFFFFF).map(lambda b: struct.unpack("<f", struct.pack("<I", b))[0]) \
        .filter(lambda x: x == x or struct.pack("<f", x)[2] & 0x40)  # signalling NaN -> quiet


def f64_values():
    return st.integers(0, (1 << 64) - 1).map(lambda b: struct.unpack("<d", struct.pack("<Q", b))[0])


def tensors_values():
    dts = ["f64", "f32", "f16", "i8", "u8", "i16", "u16", "i32", "u32", "i64", "u64", "bool",
           "bf16", "f8e4m3", "f8e5m2", "e8m0", "i4", "u4", "e2m1"]

    @st.composite
    def one(draw, name):
        dt = draw(st.sampled_from(dts))
        shape = tuple(draw(st.lists(st.integers(0, 4), max_size=3)))
        n = 1
        for d in shape:
            n *= d
        width = {"f64": 8, "i64": 8, "u64": 8, "f32": 4, "i32": 4, "u32": 4, "f16": 2,
                 "bf16": 2, "i16": 2, "u16": 2}.get(dt, 1)
        if dt in ("i4", "u4", "e2m1"):
            vals = draw(st.lists(st.integers(0, 15), min_size=n, max_size=n))
            data = kiln.pack_nibbles(vals) if n else b""
        elif dt == "bool":
            data = bytes(draw(st.lists(st.integers(0, 1), min_size=n, max_size=n)))
        else:
            data = draw(st.binary(min_size=n * width, max_size=n * width))
        return kiln.Tensor(data, dtype=dt, shape=shape, name=name)

    @st.composite
    def many(draw):
        named = draw(st.booleans())
        k = draw(st.integers(0, 4))
        if named:
            names = draw(st.lists(st.text(min_size=1, max_size=5), min_size=k, max_size=k,
                                  unique_by=lambda s: s.encode("utf-8", "surrogatepass"))
                         .filter(lambda ns: all(_utf8_ok(x) for x in ns)))
        else:
            names = [None] * k
        return [draw(one(nm)) for nm in names]
    return many()


def _utf8_ok(s):
    try:
        s.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


def values_of(text):
    t = kiln.parse_type(text)
    return _values(t)


def _values(t):
    from kiln import _types as T
    if isinstance(t, T.Scalar):
        n = t.name
        if n == "bool":
            return st.booleans()
        if n == "f32":
            return f32_values()
        if n == "f64":
            return f64_values()
        lo, hi = _int_range(n)
        return st.integers(lo, hi)
    if isinstance(t, T.Str):
        return st.text(max_size=8).filter(_utf8_ok)
    if isinstance(t, T.Tensors):
        return tensors_values()
    if isinstance(t, T.List):
        e = t.elem
        if isinstance(e, T.Scalar):
            if e.name == "u8":
                return st.binary(max_size=8)
            return st.lists(_values(e), max_size=6).map(
                lambda xs, dt=POD[e.name]: np.array(xs, dtype=np.dtype(dt).newbyteorder("="))
                if xs else np.empty(0, np.dtype(dt).newbyteorder("=")))
        return st.lists(_values(e), max_size=4)
    if isinstance(t, T.Opt):
        if isinstance(t.elem, T.Opt):
            return st.one_of(st.none(), _values(t.elem), st.builds(kiln.Some, _values(t.elem)))
        return st.one_of(st.none(), _values(t.elem))
    if isinstance(t, T.Dict):
        return st.dictionaries(st.text(max_size=4).filter(_utf8_ok), _values(t.value), max_size=4)
    if isinstance(t, T.Struct):
        return st.fixed_dictionaries({n: _values(ft) for n, ft in t.fields})
    raise AssertionError(t)
