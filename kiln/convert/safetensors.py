"""safetensors <-> Kiln, without the safetensors package.

A safetensors file is an 8-byte little-endian header length, a JSON header
(``name -> {"dtype", "shape", "data_offsets": [begin, end]}`` and an optional
``"__metadata__"`` of strings), then the payloads.  The header is checked
before anything is read past it, with the rules of the safetensors library
itself (its ``tensor.rs``), so kiln converts no file that library refuses:

* the header length is at most 100,000,000 bytes and inside the file; the
  header is strict UTF-8 JSON (no byte order mark, no NaN, no lone
  surrogate, no repeated key in any object) and a JSON object;
* ``__metadata__`` is null or maps strings to strings;
* every tensor has a known dtype, a shape of non-negative integers (not
  booleans or floats) and ``data_offsets`` of exactly two such integers;
* sorted by offsets, the ranges start at 0, each begins where the previous
  one ends, each holds exactly its shape's bytes, and the last ends at the
  end of the file (no gap, no overlap, no byte after the data).

Beyond that, kiln refuses what a Kiln directory cannot hold: an empty name,
a rank above 8, and a header of more JSON values than :data:`MAX_VALUES` or
one per :data:`VALUE_BYTES` of its bytes, whichever is more (what the parser
builds is bounded by this count).  Names may be as long as a tensor file's
(up to 2**32-1 bytes: past 65,535 the file takes the wide name fields).

Metadata: safetensors' ``__metadata__`` holds strings only.  Kiln to
safetensors writes every key as a string (a string as it is, any other value
as JSON text, bytes as hex) and, when some value is not a string, also the
reserved key :data:`TYPED_KEY` (``"kiln.metadata"``): the base64 of the
framed Kiln metadata value, as a ``.kiln`` file stores it, so safetensors
to Kiln gives the typed values back exactly (ints, floats, bytes, nested
lists and dicts).  A Kiln metadata key named ``kiln.metadata`` is refused
(it would be lost).  Reading, a ``kiln.metadata`` that is not base64 of a
valid metadata value, or that disagrees with the plain keys (a key it holds
missing from them, or whose string is not its text: the file was edited by
a tool that kept the reserved key), is ``ConvertError`` ``TYPE`` at the
key's offset; remove the key to convert such a file with string metadata.
Plain keys it does not hold (added by another tool) stay strings, and a
file without it keeps its strings as they are.
"""

import json
from typing import Any, Dict, List, Tuple

from .. import _access
from .. import _wire as W
from .._errors import KilnError
from ._common import ConvertError
from ._copy import Entry, copy_tensors

# safetensors dtype -> Kiln dtype name (every dtype both have): the one table,
# which kiln.torch.safe_open's get_dtype() names its dtypes by too.  F4 is
# e2m1 (torch's float4_e2m1fn_x2): two values a byte, the first in the low
# nibble, the shape counting values in both; safetensors holds whole bytes
# only, so an odd count of them is refused both ways
ST_TO_KILN = {
    "F64": "f64", "F32": "f32", "F16": "f16", "BF16": "bf16", "F8_E4M3": "f8e4m3",
    "F8_E5M2": "f8e5m2", "F8_E8M0": "e8m0", "BOOL": "bool", "I8": "i8", "U8": "u8",
    "I16": "i16", "U16": "u16", "I32": "i32", "U32": "u32", "I64": "i64", "U64": "u64",
    "F4": "e2m1",
}
KILN_TO_ST = {v: k for k, v in ST_TO_KILN.items()}
MAX_HEADER = 100_000_000   # safetensors' own limit on the JSON header (tensor.rs)
# the JSON values a header may hold (commas + opening brackets + 1 bound them
# from above): MAX_VALUES, or one value per VALUE_BYTES bytes of a longer
# header, so the cap follows the input's size as kiln's other caps do.  A
# tensor's entry takes at least 4.4 bytes a value (one-byte names, rank 8), so
# no header safetensors writes is refused for its count, while a header of
# denser values (``[{},{},...]``: 1.5 bytes a value) still is; the parse builds
# at most about 25 bytes per header byte at that density (docs/security.md,
# "Converters")
MAX_VALUES = 1 << 18
VALUE_BYTES = 4
TYPED_KEY = "kiln.metadata"   # __metadata__'s key for the typed Kiln metadata (module doc)


def _count(x: Any) -> bool:
    """A JSON number safetensors reads as a usize: an int (not a bool) in 0..2**64-1."""
    return type(x) is int and 0 <= x <= W.U64_MAX


def _parse(path: str, raw: Any) -> Dict[str, Any]:
    """The header object from its bytes ``raw`` (a view), or ConvertError
    (offsets are of the whole file)."""
    try:
        text = str(raw, "utf-8")   # one copy: the decoded text
    except UnicodeDecodeError as e:
        raise ConvertError(path, 8 + e.start, "the header is not UTF-8", "UTF8") from None
    values = text.count(",") + text.count("[") + text.count("{") + 1
    cap = max(MAX_VALUES, len(raw) // VALUE_BYTES)
    if values > cap:
        raise ConvertError(path, 8, "the header may hold %d JSON values, above kiln's cap of "
                           "%d (one per %d header bytes, at least %d)"
                           % (values, cap, VALUE_BYTES, MAX_VALUES), "LIMIT")
    try:
        header = _access.strict_json(text)
    except json.JSONDecodeError as e:
        raise ConvertError(path, 8 + len(text[:e.pos].encode("utf-8")),
                           "the header is not JSON (%s)" % e.msg) from None
    except (ValueError, RecursionError) as e:
        raise ConvertError(path, 8, "the header is not safetensors JSON (%s)"
                           % (e if isinstance(e, ValueError) else "nested too deep")) from None
    if not isinstance(header, dict):
        raise ConvertError(path, 8, "the header is not a JSON object", "TYPE")
    try:   # a lone surrogate escape (\ud800) decodes in Python, not in safetensors
        if "\\u" in text:
            json.dumps(header, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise ConvertError(path, 8, "the header holds a lone surrogate escape", "UTF8") from None
    return header


def read_header(path: str, mm: Any) -> Tuple[int, List[Tuple[str, str, Tuple[int, ...], int, int]],
                                             Dict[str, str]]:
    """(data start, [(name, kiln dtype, shape, begin, end)] in file order, metadata)."""
    size = len(mm)
    if size < 8:
        raise ConvertError(path, 0, "%d bytes, too short for a safetensors header" % size, "EOF")
    n = int.from_bytes(mm[:8], "little")
    if n > MAX_HEADER:
        raise ConvertError(path, 0, "header length %d is above safetensors' limit of %d"
                           % (n, MAX_HEADER), "LIMIT")
    if n > size - 8:
        raise ConvertError(path, 0, "header length %d is past the file's %d bytes" % (n, size),
                           "EOF")
    with memoryview(mm) as view:
        with view[8:8 + n] as raw:
            header = _parse(path, raw)
    start = 8 + n
    meta = header.pop("__metadata__", None)
    if meta is None:
        meta = {}
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise ConvertError(path, 8, "__metadata__ must map strings to strings", "TYPE")
    out = []
    for name, info in header.items():
        if not isinstance(info, dict) or not all(k in info for k in
                                                 ("dtype", "shape", "data_offsets")):
            raise ConvertError(path, 8, "tensor %r has no dtype, shape and data_offsets"
                               % name, "TYPE")
        st_dtype, shape, offs = info["dtype"], info["shape"], info["data_offsets"]
        if not isinstance(st_dtype, str) or st_dtype not in ST_TO_KILN:
            raise ConvertError(path, 8, "tensor %r has dtype %r, which Kiln has no twin for"
                               % (name, st_dtype), "TYPE")
        if not name:
            raise ConvertError(path, 8, "a tensor has an empty name (Kiln names are not "
                               "empty)", "TYPE")
        if not isinstance(shape, list) or not all(_count(d) for d in shape) or \
                len(shape) > W.MAX_RANK:
            raise ConvertError(path, 8, "tensor %r: shape %r is not at most 8 integers >= 0"
                               % (name, shape), "TYPE")
        if not isinstance(offs, list) or len(offs) != 2 or not all(_count(x) for x in offs):
            raise ConvertError(path, 8, "tensor %r: data_offsets %r are not two integers >= 0"
                               % (name, offs), "TYPE")
        kd = ST_TO_KILN[st_dtype]
        count = 1
        for d in shape:
            count *= d
        width = W.DTYPES[W.DTYPE_CODES[kd]][1]
        if width == 0 and count % 2:   # F4: two values a byte
            raise ConvertError(path, 8, "tensor %r: %s with shape %r holds an odd count of "
                               "4-bit values, not whole bytes" % (name, st_dtype, shape), "TYPE")
        need = count // 2 if width == 0 else count * width
        if need > W.U64_MAX:
            raise ConvertError(path, 8, "tensor %r: the byte size of shape %r overflows"
                               % (name, shape), "LIMIT")
        out.append((name, kd, tuple(shape), offs[0], offs[1], need))
    ordered = sorted(out, key=lambda t: (t[3], t[4]))
    at = 0
    for name, kd, shape, b, e, need in ordered:   # contiguous from 0, as safetensors wants
        if b != at or e < b:
            raise ConvertError(path, start + min(b, size - start), "tensor %r: data_offsets "
                               "[%d, %d) do not begin where the data before them ends (%d)"
                               % (name, b, e, at), "TYPE")
        if e - b != need:
            raise ConvertError(path, start + b, "tensor %r: data_offsets [%d, %d) hold %d "
                               "bytes, its dtype and shape need %d" % (name, b, e, e - b, need),
                               "TYPE")
        if e > size - start:
            raise ConvertError(path, size, "tensor %r: data_offsets [%d, %d) end past the "
                               "file's %d data bytes" % (name, b, e, size - start), "EOF")
        at = e
    if at != size - start:
        raise ConvertError(path, start + at, "%d bytes follow the last tensor's data"
                           % (size - start - at), "TRAILING")
    return start, [t[:5] for t in ordered], meta


def safetensors_to_kiln(src: str, dst: str, checksum: bool = False, progress: Any = None) -> int:
    """Convert tensor by tensor, file to file; metadata (strings) is kept."""
    return copy_tensors(src, dst, _entries, checksum, progress)


def _entries(src: str, mm: Any) -> Tuple[Any, List[Entry]]:
    start, table, meta = read_header(src, mm)
    if TYPED_KEY in meta:
        meta = _typed(src, mm, meta)
    return (dict(meta) if meta else None,
            [Entry(name, kd, shape, start + b, e - b) for name, kd, shape, b, e in table])


def _text(v: Any) -> str:
    """A metadata value as safetensors holds it: a string, or JSON text (bytes as hex)."""
    return v if isinstance(v, str) else json.dumps(
        v, default=lambda x: x.hex() if isinstance(x, bytes) else str(x))


def _typed(src: str, mm: Any, meta: Dict[str, str]) -> Dict[str, Any]:
    """The metadata with the typed values :data:`TYPED_KEY` records (module doc)."""
    import base64
    import binascii
    n = int.from_bytes(mm[:8], "little")
    k = bytes(mm[8:8 + n]).find(json.dumps(TYPED_KEY).encode())
    at = 8 + max(k, 0)
    try:
        blob = base64.b64decode(meta[TYPED_KEY].encode("ascii"), validate=True)
        typed = _access.metadata_of_blob(blob)
    except (UnicodeEncodeError, binascii.Error) as e:
        raise ConvertError(src, at, "__metadata__[%r] is not base64 (%s)" % (TYPED_KEY, e),
                           "TYPE") from None
    except KilnError as e:
        raise ConvertError(src, at, "__metadata__[%r] is not a Kiln metadata value (%s at "
                           "byte %d of it: %s)" % (TYPED_KEY, e.code, e.offset, e.reason),
                           "TYPE") from None
    if not isinstance(typed, dict):
        raise ConvertError(src, at, "__metadata__[%r] is not a dict" % TYPED_KEY, "TYPE")
    for key, v in typed.items():
        if meta.get(key) != _text(v):
            raise ConvertError(src, at, "__metadata__[%r] disagrees with the key %r (%s): the "
                               "file was edited after kiln wrote it; remove %r to convert its "
                               "metadata as strings" % (TYPED_KEY, key, "missing" if key not in
                                                        meta else "another value", TYPED_KEY),
                               "TYPE")
    return {key: typed.get(key, v) for key, v in meta.items() if key != TYPED_KEY}


def _metadata(src: str, meta: Dict[str, Any]) -> Dict[str, str]:
    """``__metadata__`` for Kiln metadata: strings, plus the typed form (module doc)."""
    if TYPED_KEY in meta:
        raise ConvertError(src, 0, "the metadata key %r is reserved for the typed metadata in "
                           "a safetensors file: rename it" % TYPED_KEY, "TYPE")
    out = {k: _text(v) for k, v in meta.items()}
    if not all(isinstance(v, str) for v in meta.values()):
        import base64
        blob = _access.metadata_blob(meta)
        out[TYPED_KEY] = base64.b64encode(blob).decode("ascii")
    return out


def _count_of(shape: Any) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def kiln_to_safetensors(src: str, dst: str, progress: Any = None) -> int:
    """Convert a Kiln tensor file; metadata values that are not strings become JSON
    text, and come back typed from the reserved key (module doc)."""
    with _access.progress_session(progress, "convert") as prog:
        return _to_safetensors(src, dst, prog)


def _to_safetensors(src: str, dst: str, prog: Any) -> int:
    with _access.open_kiln_file(src) as f:
        names = f.keys()
        header: Dict[str, Any] = {}
        if f.metadata:
            header["__metadata__"] = _metadata(src, f.metadata)
        off = 0
        for name in names:
            t = f[name]
            if not isinstance(t.dtype, str) or t.dtype not in KILN_TO_ST:
                raise ConvertError(src, 0, "tensor %r is %s, which safetensors has no dtype "
                                   "for" % (name, _access.dtype_label(t.dtype, t.layout)),
                                   "TYPE")
            if t.dtype == "e2m1" and t.nbytes * 2 != _count_of(t.shape):
                raise ConvertError(src, 0, "tensor %r: e2m1 with shape %s holds an odd count "
                                   "of values, which safetensors' F4 (whole bytes) cannot hold"
                                   % (name, list(t.shape)), "TYPE")
            header[name] = {"dtype": KILN_TO_ST[t.dtype], "shape": list(t.shape),
                            "data_offsets": [off, off + t.nbytes]}
            off += t.nbytes
        blob = json.dumps(header, separators=(",", ":")).encode()
        blob += b" " * (-len(blob) % 8)   # payloads 8-byte aligned, as safetensors writes
        if prog is not None:
            prog.start(off)
        with _access.AtomicFile(dst) as out:   # replaced at the end, or left as it was
            out.f.write(len(blob).to_bytes(8, "little"))
            out.f.write(blob)
            for name in names:
                t = f[name]
                _access.write_payload(out.f.write, t.data, prog)
                out.wrote(t.nbytes)
        return len(names)
