"""GGUF -> Kiln, without the gguf package.

GGUF (v2 and v3, little-endian): magic ``GGUF``, version u32, tensor count
u64, metadata count u64, the metadata (key string, value type u32, value),
the tensor infos (name, rank u32, dims u64 in ggml order, ggml type u32,
offset u64), then the data, aligned to ``general.alignment`` (default 32).

Every count and length is checked against the bytes left before anything is
allocated for it.  F32, F16, BF16, F64 and the integer types become typed
Kiln tensors; the block-quantized types keep their bits as an opaque dtype
(4096 + the ggml type id) with the layout ``ggml.<TYPE>`` and the block's byte
size as the block size.  Dimensions are reversed into numpy order; every
metadata key and value is kept (arrays included).
"""

import struct
from typing import Any, Dict, List, Tuple

from .. import _wire as W
from ..files import TensorWriter
from . import ConvertError, map_source, progress

# ggml type id -> (name, elements per block, bytes per block); from the ggml format
GGML_TYPES = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 40),
    10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74), 18: ("IQ3_XXS", 256, 98),
    19: ("IQ1_S", 256, 50), 20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82), 23: ("IQ4_XS", 256, 136), 24: ("I8", 1, 1), 25: ("I16", 1, 2),
    26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8), 29: ("IQ1_M", 256, 56),
    30: ("BF16", 1, 2), 34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66),
    39: ("MXFP4", 32, 17),
}
# the ggml types with a typed Kiln twin
TYPED = {0: "f32", 1: "f16", 30: "bf16", 28: "f64", 24: "i8", 25: "i16", 26: "i32", 27: "i64"}

# metadata value types: id -> (struct format or None, size)
_SCALARS = {0: ("<B", 1), 1: ("<b", 1), 2: ("<H", 2), 3: ("<h", 2), 4: ("<I", 4),
            5: ("<i", 4), 6: ("<f", 4), 7: ("<?", 1), 10: ("<Q", 8), 11: ("<q", 8),
            12: ("<d", 8)}
_STRING, _ARRAY = 8, 9


class _Reader:
    def __init__(self, path: str, mm: Any) -> None:
        self.path, self.b, self.p, self.n = path, mm, 0, len(mm)

    def fail(self, what: str) -> ConvertError:
        return ConvertError("%s: at byte %d: %s" % (self.path, self.p, what))

    def take(self, size: int) -> Any:
        if size > self.n - self.p:
            raise self.fail("needs %d bytes, %d remain" % (size, self.n - self.p))
        out = self.b[self.p:self.p + size]
        self.p += size
        return out

    def u32(self) -> int:
        return struct.unpack("<I", self.take(4))[0]

    def u64(self) -> int:
        return struct.unpack("<Q", self.take(8))[0]

    def count(self, min_size: int, what: str) -> int:
        """A u64 count whose items need at least ``min_size`` bytes each."""
        c = self.u64()
        if c * min_size > self.n - self.p:
            raise self.fail("%s count %d cannot fit in the %d bytes left"
                            % (what, c, self.n - self.p))
        return c

    def string(self) -> str:
        raw = self.take(self.count(1, "string length"))
        try:
            return bytes(raw).decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail("a string is not UTF-8") from None

    def value(self, vtype: int, depth: int = 0) -> Any:
        if vtype in _SCALARS:
            fmt, size = _SCALARS[vtype]
            v = struct.unpack(fmt, self.take(size))[0]
            if vtype == 10 and v > (1 << 63) - 1:
                raise self.fail("a uint64 value %d does not fit the metadata's i64" % v)
            return v
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            if depth > 8:
                raise self.fail("arrays nest too deep")
            item = self.u32()
            size = _SCALARS[item][1] if item in _SCALARS else (8 if item == _STRING else 12)
            if item not in _SCALARS and item not in (_STRING, _ARRAY):
                raise self.fail("unknown metadata value type %d" % item)
            return [self.value(item, depth + 1) for _ in range(self.count(size, "array"))]
        raise self.fail("unknown metadata value type %d" % vtype)


def read_gguf(path: str, mm: Any) -> Tuple[Dict[str, Any], List[Tuple], int]:
    """(metadata, [(name, dims numpy order, ggml type, offset, nbytes)], data start)."""
    r = _Reader(path, mm)
    if bytes(r.take(4)) != b"GGUF":
        raise ConvertError("%s: not a GGUF file (no GGUF magic)" % path)
    version = r.u32()
    if version not in (2, 3):
        raise ConvertError("%s: GGUF version %d (kiln reads 2 and 3)" % (path, version))
    n_tensors = r.u64()
    n_kv = r.count(8 + 4 + 1, "metadata")
    if n_tensors * (8 + 4 + 4 + 8) > r.n - r.p:
        raise r.fail("tensor count %d cannot fit in the %d bytes left" % (n_tensors, r.n - r.p))
    meta: Dict[str, Any] = {}
    for _ in range(n_kv):
        key = r.string()
        if key in meta:
            raise r.fail("metadata key %r repeats" % key)
        meta[key] = r.value(r.u32())
    infos = []
    for _ in range(n_tensors):
        name = r.string()
        rank = r.u32()
        if rank > W.MAX_RANK:
            raise r.fail("tensor %r has rank %d" % (name, rank))
        dims = [r.u64() for _ in range(rank)]
        gtype = r.u32()
        offset = r.u64()
        if gtype not in GGML_TYPES:
            raise r.fail("tensor %r has unknown ggml type %d" % (name, gtype))
        gname, block, bsize = GGML_TYPES[gtype]
        count = 1
        for d in dims:
            count *= d
        if count % block:
            raise r.fail("tensor %r: %d elements are not whole %s blocks" % (name, count, gname))
        infos.append((name, tuple(reversed(dims)), gtype, offset, count // block * bsize))
    align = meta.get("general.alignment", 32)
    if not isinstance(align, int) or align <= 0 or align & (align - 1):
        raise ConvertError("%s: general.alignment %r is not a power of two" % (path, align))
    start = (r.p + align - 1) // align * align
    for name, _, _, offset, nbytes in infos:
        if offset % align or start + offset + nbytes > r.n:
            raise ConvertError("%s: tensor %r: its %d bytes at offset %d are not inside the "
                               "file, aligned" % (path, name, nbytes, offset))
    return meta, infos, start


def gguf_to_kiln(src: str, dst: str) -> int:
    with open(src, "rb") as source:
        return _convert(src, dst, source, map_source(src, source))


def _convert(src: str, dst: str, source: Any, mm: Any) -> int:
    try:
        meta, infos, start = read_gguf(src, mm)
        names = [i[0] for i in infos]
        if len(set(names)) != len(names):
            raise ConvertError("%s: a tensor name repeats" % src)
        with TensorWriter(dst, metadata={"gguf": meta}) as w:
            for name, shape, gtype, _, nbytes in infos:
                if gtype in TYPED:
                    w.add(name, TYPED[gtype], shape)
                else:
                    w.add(name, W.OPAQUE_MIN + gtype, shape, layout="ggml." + GGML_TYPES[gtype][0],
                          nbytes=nbytes, block_size=GGML_TYPES[gtype][2])
            for name, _, _, offset, _ in progress(infos, len(infos), "gguf"):
                w.write_from(name, source, start + offset)   # file to file
        return len(infos)
    finally:
        try:
            mm.close()
        except BufferError:  # pragma: no cover
            pass
