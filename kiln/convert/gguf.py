"""GGUF -> Kiln, without the gguf package.

GGUF (v2 and v3, little-endian): magic ``GGUF``, version u32, tensor count
u64, metadata count u64, the metadata (key string, value type u32, value),
the tensor infos (name, rank u32, dims u64 in ggml order, ggml type u32,
offset u64), then the data, aligned to ``general.alignment`` (default 32).

Every count and length is checked against the bytes left before anything is
allocated for it, and the tensors' byte ranges must lie inside the data
section without overlapping (so the output is never larger than the input
plus its table).  A metadata array of numbers is read in one step from its
bytes (a bool array becomes 0/1 integers, so it is stored compactly), and
costs memory in proportion to those bytes.  F32, F16, BF16, F64 and the integer types become typed
Kiln tensors; the block-quantized types keep their bits as an opaque dtype
(4096 + the ggml type id) with the layout ``ggml.<TYPE>`` and the block's byte
size as the block size.  Dimensions are reversed into numpy order; every
metadata key and value is kept (arrays included).
"""

import struct
from typing import Any, Dict, List, Tuple

import numpy as np

from .. import _wire as W
from ._common import ConvertError
from ._copy import Entry, copy_tensors

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

# metadata value types: id -> (struct format, size)
_SCALARS = {0: ("<B", 1), 1: ("<b", 1), 2: ("<H", 2), 3: ("<h", 2), 4: ("<I", 4),
            5: ("<i", 4), 6: ("<f", 4), 7: ("<?", 1), 10: ("<Q", 8), 11: ("<q", 8),
            12: ("<d", 8)}
_STRING, _ARRAY = 8, 9


class _Reader:
    def __init__(self, path: str, mm: Any) -> None:
        self.path, self.b, self.p, self.n = path, mm, 0, len(mm)

    def fail(self, what: str, code: str = "TYPE") -> ConvertError:
        return ConvertError(self.path, self.p, what, code)

    def take(self, size: int) -> Any:
        if size > self.n - self.p:
            raise self.fail("needs %d bytes, %d remain" % (size, self.n - self.p), "EOF")
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
                            % (what, c, self.n - self.p), "EOF")
        return c

    def string(self) -> str:
        raw = self.take(self.count(1, "string length"))
        try:
            return bytes(raw).decode("utf-8")
        except UnicodeDecodeError as e:
            self.p -= len(raw) - e.start
            raise self.fail("a string is not UTF-8", "UTF8") from None

    def value(self, vtype: int, depth: int = 0) -> Any:
        if vtype in _SCALARS:
            fmt, size = _SCALARS[vtype]
            v = struct.unpack(fmt, self.take(size))[0]
            if vtype == 7 and self.b[self.p - 1] > 1:
                self.p -= 1
                raise self.fail("a bool is %d, not 0 or 1" % self.b[self.p])
            if vtype == 10 and v > (1 << 63) - 1:
                raise self.fail("a uint64 value %d does not fit the metadata's i64" % v)
            return v
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            if depth > 8:
                raise self.fail("arrays nest too deep", "DEPTH")
            item = self.u32()
            if item not in _SCALARS and item not in (_STRING, _ARRAY):
                raise self.fail("unknown metadata value type %d" % item)
            size = _SCALARS[item][1] if item in _SCALARS else (8 if item == _STRING else 12)
            n = self.count(size, "array")
            if item in _SCALARS:
                return self.numbers(item, n)
            return [self.value(item, depth + 1) for _ in range(n)]
        raise self.fail("unknown metadata value type %d" % vtype)

    def numbers(self, item: int, n: int) -> List[Any]:
        """An array of ``n`` scalars, from its bytes in one step (no object per
        item while reading): ints, floats, or 0/1 ints for bools."""
        at = self.p
        fmt = _SCALARS[item][0]
        arr = np.frombuffer(self.take(n * _SCALARS[item][1]),
                            "|u1" if item == 7 else fmt.replace("?", "u1"))
        if item == 7 and n and int(arr.max()) > 1:
            self.p = at + int(np.argmax(arr > 1))
            raise self.fail("a bool is %d, not 0 or 1" % arr[self.p - at])
        if item == 10 and n and int(arr.max()) > (1 << 63) - 1:
            self.p = at + 8 * int(np.argmax(arr > (1 << 63) - 1))
            raise self.fail("a uint64 value does not fit the metadata's i64")
        return arr.tolist()


def read_gguf(path: str, mm: Any) -> Tuple[Dict[str, Any], List[Tuple], int]:
    """(metadata, [(name, dims numpy order, ggml type, offset, nbytes)], data start)."""
    r = _Reader(path, mm)
    if bytes(r.take(4)) != b"GGUF":
        raise ConvertError(path, 0, "not a GGUF file (no GGUF magic)")
    version = r.u32()
    if version not in (2, 3):
        raise ConvertError(path, 4, "GGUF version %d (kiln reads 2 and 3)" % version)
    n_tensors = r.u64()
    n_kv = r.count(8 + 4 + 1, "metadata")
    if n_tensors * (8 + 4 + 4 + 8) > r.n - r.p:
        raise r.fail("tensor count %d cannot fit in the %d bytes left"
                     % (n_tensors, r.n - r.p), "EOF")
    meta: Dict[str, Any] = {}
    for _ in range(n_kv):
        key = r.string()
        if key in meta:
            raise r.fail("metadata key %r repeats" % key)
        meta[key] = r.value(r.u32())
    infos, places, seen = [], [], set()
    for _ in range(n_tensors):
        places.append(r.p)
        name = r.string()
        if name in seen:
            r.p = places[-1]
            raise r.fail("tensor name %r repeats" % name)
        seen.add(name)
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
    if type(align) is not int or align <= 0 or align & (align - 1):
        raise ConvertError(path, 0, "general.alignment %r is not a power of two" % (align,),
                           "TYPE")
    start = (r.p + align - 1) // align * align
    _check_ranges(path, infos, places, start, align, r.n)
    return meta, infos, start


def _check_ranges(path: str, infos: List[Tuple], places: List[int], start: int, align: int,
                  n: int) -> None:
    """Every tensor's bytes aligned, inside the data section, and apart from
    every other tensor's (the output is then no larger than the input)."""
    for (name, _, _, offset, nbytes), at in zip(infos, places):
        if offset % align or start + offset + nbytes > n:
            raise ConvertError(path, at, "tensor %r: its %d bytes at data offset %d are not "
                               "inside the data section's %d bytes, aligned to %d"
                               % (name, nbytes, offset, max(n - start, 0), align), "TYPE")
    order = sorted((infos[i][3], i) for i in range(len(infos)) if infos[i][4])
    top, owner = 0, -1
    for offset, i in order:   # against the furthest end so far, not only the neighbour
        if offset < top:
            raise ConvertError(path, places[i], "tensors %r and %r overlap in the data section"
                               % (infos[owner][0], infos[i][0]), "TYPE")
        if offset + infos[i][4] > top:
            top, owner = offset + infos[i][4], i


def gguf_to_kiln(src: str, dst: str, checksum: bool = False, progress: Any = None) -> int:
    """Convert tensor by tensor, file to file; every metadata key is kept under ``gguf``."""
    return copy_tensors(src, dst, _entries, checksum, progress)


def _entries(src: str, mm: Any) -> Tuple[Dict[str, Any], List[Entry]]:
    meta, infos, start = read_gguf(src, mm)
    out = []
    for name, shape, gtype, offset, nbytes in infos:
        if gtype in TYPED:
            out.append(Entry(name, TYPED[gtype], shape, start + offset, nbytes))
        else:   # the block's bits, as an opaque dtype
            out.append(Entry(name, W.OPAQUE_MIN + gtype, shape, start + offset, nbytes,
                             {"layout": "ggml." + GGML_TYPES[gtype][0], "nbytes": nbytes,
                              "block_size": GGML_TYPES[gtype][2]}))
    return {"gguf": meta}, out
