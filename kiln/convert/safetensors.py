"""safetensors <-> Kiln, without the safetensors package.

A safetensors file is an 8-byte little-endian header length, a JSON header
(``name -> {"dtype", "shape", "data_offsets": [begin, end]}`` and an optional
``"__metadata__"`` of strings), then the payloads.  The header is checked
before anything is read past it: its length against the file, every range
inside the data and not overlapping, every length equal to the shape's.
"""

import json
from typing import Any, Dict, List, Tuple

from .. import _wire as W
from ..files import KilnFile, TensorWriter
from . import ConvertError, map_source, progress

# safetensors dtype -> Kiln dtype name (every dtype both have)
ST_TO_KILN = {
    "F64": "f64", "F32": "f32", "F16": "f16", "BF16": "bf16", "F8_E4M3": "f8e4m3",
    "F8_E5M2": "f8e5m2", "F8_E8M0": "e8m0", "BOOL": "bool", "I8": "i8", "U8": "u8",
    "I16": "i16", "U16": "u16", "I32": "i32", "U32": "u32", "I64": "i64", "U64": "u64",
}
KILN_TO_ST = {v: k for k, v in ST_TO_KILN.items()}
MAX_HEADER = 100 << 20   # safetensors' own limit on the JSON header


def read_header(path: str, mm: Any) -> Tuple[int, List[Tuple[str, str, Tuple[int, ...], int, int]],
                                             Dict[str, str]]:
    """(data start, [(name, kiln dtype, shape, begin, end)] in file order, metadata)."""
    size = len(mm)
    if size < 8:
        raise ConvertError("%s: %d bytes, too short for a safetensors header" % (path, size))
    n = int.from_bytes(mm[:8], "little")
    if n > size - 8 or n > MAX_HEADER:
        raise ConvertError("%s: header length %d is past the file's %d bytes" % (path, n, size))
    try:
        header = json.loads(bytes(mm[8:8 + n]))
    except (ValueError, UnicodeDecodeError) as e:
        raise ConvertError("%s: the header is not JSON (%s)" % (path, e)) from None
    if not isinstance(header, dict):
        raise ConvertError("%s: the header is not a JSON object" % path)
    start = 8 + n
    meta = header.pop("__metadata__", {})
    if not isinstance(meta, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                             for k, v in meta.items()):
        raise ConvertError("%s: __metadata__ must map strings to strings" % path)
    out = []
    for name, info in header.items():
        try:
            st_dtype, shape, (b, e) = info["dtype"], tuple(info["shape"]), info["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise ConvertError("%s: tensor %r has no dtype, shape and data_offsets"
                               % (path, name)) from None
        if st_dtype not in ST_TO_KILN:
            raise ConvertError("%s: tensor %r has dtype %s, which Kiln has no twin for"
                               % (path, name, st_dtype))
        if not isinstance(st_dtype, str) or not isinstance(name, str) or not name:
            raise ConvertError("%s: tensor %r has a bad name or dtype" % (path, name))
        if not all(type(d) is int and 0 <= d <= W.U64_MAX for d in shape) or \
                len(shape) > W.MAX_RANK or not all(isinstance(x, int) for x in (b, e)):
            raise ConvertError("%s: tensor %r has a bad shape or offsets" % (path, name))
        kd = ST_TO_KILN[st_dtype]
        count = 1
        for d in shape:
            count *= d
        need = count * W.DTYPES[W.DTYPE_CODES[kd]][1]
        if not 0 <= b <= e <= size - start or e - b != need:
            raise ConvertError("%s: tensor %r: data_offsets [%d, %d) do not hold its %d bytes "
                               "inside the file" % (path, name, b, e, need))
        out.append((name, kd, shape, b, e))
    ordered = sorted(out, key=lambda t: (t[3], t[4]))
    top, owner = 0, None
    for cur in ordered:   # against the furthest end so far, not only the neighbour
        if cur[4] > cur[3]:
            if cur[3] < top:
                raise ConvertError("%s: tensors %r and %r overlap" % (path, owner, cur[0]))
            if cur[4] > top:
                top, owner = cur[4], cur[0]
    return start, ordered, meta


def safetensors_to_kiln(src: str, dst: str) -> int:
    """Convert tensor by tensor; metadata (strings) is kept."""
    with open(src, "rb") as source:
        return _convert(src, dst, source, map_source(src, source))


def _convert(src: str, dst: str, source: Any, mm: Any) -> int:
    try:
        start, table, meta = read_header(src, mm)
        with TensorWriter(dst, metadata=dict(meta) if meta else None) as w:
            for name, kd, shape, _, _ in table:
                w.add(name, kd, shape)
            for name, kd, shape, b, e in progress(table, len(table), "safetensors"):
                w.write_from(name, source, start + b)   # file to file, not through memory
        return len(table)
    finally:
        try:
            mm.close()
        except BufferError:  # pragma: no cover - a failing write's traceback holds a view
            pass


def kiln_to_safetensors(src: str, dst: str) -> int:
    """Convert a Kiln tensor file; metadata values that are not strings become JSON text."""
    from ..files import _AtomicFile
    with KilnFile(src) as f:
        names = f.keys()
        header: Dict[str, Any] = {}
        if f.metadata:
            header["__metadata__"] = {k: v if isinstance(v, str) else json.dumps(
                v, default=lambda x: x.hex() if isinstance(x, bytes) else str(x))
                for k, v in f.metadata.items()}
        off = 0
        for name in names:
            t = f[name]
            if not isinstance(t.dtype, str) or t.dtype not in KILN_TO_ST:
                raise ConvertError("%s: tensor %r is %s, which safetensors has no dtype for"
                                   % (src, name, t.dtype))
            header[name] = {"dtype": KILN_TO_ST[t.dtype], "shape": list(t.shape),
                            "data_offsets": [off, off + t.nbytes]}
            off += t.nbytes
        blob = json.dumps(header, separators=(",", ":")).encode()
        blob += b" " * (-len(blob) % 8)   # payloads 8-byte aligned, as safetensors writes
        out = _AtomicFile(dst)
        try:
            out.f.write(len(blob).to_bytes(8, "little"))
            out.f.write(blob)
            for name in progress(names, len(names), "safetensors"):
                t = f[name]
                out.f.write(t.data)
                out.wrote(t.nbytes)
            out.commit()
        except BaseException:
            out.discard()
            raise
        return len(names)
