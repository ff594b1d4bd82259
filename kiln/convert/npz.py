"""npz <-> Kiln, one array at a time, each streamed from the zip in chunks.

An npz file is a zip archive of ``.npy`` members.  Reading one, kiln checks
the zip's table (stored or deflated members only, each named ``*.npy`` once,
a size deflate can reach from the compressed size), parses each ``.npy``
header itself with bounds (at most :data:`MAX_NPY_HEADER` bytes, a literal
dict of exactly ``descr``, ``fortran_order`` and ``shape``), and checks that
the array's bytes are the member's size before anything is decompressed.
The payload is then decompressed :data:`kiln.convert.CHUNK` bytes at a time
straight into the writer: memory stays one chunk whatever the compression
ratio (a Fortran-ordered member of 2 or more dimensions is the exception: it
is read whole, one tensor's bytes, to be reordered).
"""

import ast
import struct
import tempfile
import zipfile
import zlib
from typing import Any, List, Tuple

import numpy as np

from .. import _access
from .. import _wire as W
from ..files import TensorWriter
from ._common import CHUNK, ConvertError

MAGIC = b"\x93NUMPY"
MAX_NPY_HEADER = 10000     # numpy's own default cap (read_array_header's max_header_size)
DEFLATE_RATIO = 1032       # the most deflate can expand a stream (258 bytes from 2 bits)
# what zipfile and zlib raise for a broken archive or stream
_ZIP_ERRORS = (zipfile.BadZipFile, zipfile.LargeZipFile, zlib.error, struct.error, EOFError,
               OSError, ValueError, NotImplementedError, OverflowError)


class _Member:
    """One checked ``.npy`` member: its zip entry and its array's description."""

    __slots__ = ("info", "name", "shape", "dtype", "fortran", "header_end")

    def __init__(self, info: Any, name: str, shape: Tuple[int, ...], dtype: Any,
                 fortran: bool, header_end: int) -> None:
        self.info, self.name, self.shape, self.dtype = info, name, shape, dtype
        self.fortran, self.header_end = fortran, header_end


def npz_to_kiln(src: str, dst: str, checksum: bool = False, progress: Any = None) -> int:
    with _access.open_regular_file(src) as f:
        if f.read(6) == MAGIC:
            raise ConvertError(src, 0, "a single .npy array, not an .npz archive")
        try:
            zf = zipfile.ZipFile(f)
        except _ZIP_ERRORS as e:
            raise ConvertError(src, 0, "not a readable npz file (%s)" % e) from None
        with zf:
            members = [_member(zf, info, src) for info in _entries(zf, src)]
            with TensorWriter(dst, checksum=checksum, progress=progress) as w:
                for m in members:   # the table first, from each member's .npy header
                    try:
                        w.add(m.name, _kiln_dtype(m.dtype, src, m.name), m.shape)
                    except ValueError as e:
                        if isinstance(e, ConvertError):
                            raise
                        # what Kiln cannot hold of this member, said once (not the writer's
                        # own "CODE at byte N" of a file not written yet)
                        raise ConvertError(src, m.info.header_offset, "member %r cannot be "
                                           "stored in Kiln: %s" % (m.name, getattr(
                                               e, "reason", None) or e), "TYPE") from None
                for m in members:
                    _stream(zf, m, w, src)
    return len(members)


def _entries(zf: Any, src: str) -> List[Any]:
    """The zip's members, checked: each a stored or deflated ``NAME.npy``, once,
    not encrypted, with a size its compressed bytes can hold."""
    out, seen = [], set()
    for info in zf.infolist():
        at = info.header_offset
        if not info.filename.endswith(".npy") or info.filename in seen:
            raise ConvertError(src, at, "member %r is not a .npy array, or repeats"
                               % info.filename, "TYPE")
        seen.add(info.filename)
        if info.flag_bits & 1:
            raise ConvertError(src, at, "member %r is encrypted" % info.filename, "TYPE")
        if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            raise ConvertError(src, at, "member %r uses zip compression method %d (npz "
                               "files are stored or deflated)"
                               % (info.filename, info.compress_type), "TYPE")
        most = info.compress_size if info.compress_type == zipfile.ZIP_STORED else \
            info.compress_size * DEFLATE_RATIO + 1024
        if info.file_size > most:
            raise ConvertError(src, at, "member %r claims %d bytes, more than its %d "
                               "compressed bytes can hold" % (info.filename, info.file_size,
                                                              info.compress_size), "LIMIT")
        out.append(info)
    return out


def _member(zf: Any, info: Any, src: str) -> _Member:
    name = info.filename[:-4]
    try:
        with zf.open(info) as fh:
            shape, fortran, dtype, header_end = read_npy_header(fh, src, name)
    except _ZIP_ERRORS as e:
        if isinstance(e, ConvertError):
            raise
        raise ConvertError(src, info.header_offset, "member %r cannot be read (%s)"
                           % (info.filename, e)) from None
    count = 1
    for d in shape:
        count *= d
    need, holds = count * dtype.itemsize, info.file_size - header_end
    if need != holds:
        raise ConvertError(src, header_end, "member %r: %s %s needs %d bytes, the member "
                           "holds %d" % (name, dtype, shape, need, holds),
                           "EOF" if need > holds else "TRAILING")
    return _Member(info, name, shape, dtype, fortran, header_end)


def read_npy_header(fh: Any, src: str, name: str) -> Tuple[Tuple[int, ...], bool, Any, int]:
    """``(shape, fortran_order, dtype, header end)`` of a ``.npy`` stream, read
    with bounds: the offsets in errors are of the member's bytes."""
    head = fh.read(10)
    if len(head) < 10 or head[:6] != MAGIC:
        raise ConvertError(src, 0, "member %r has no .npy magic" % name)
    major, minor = head[6], head[7]
    if (major, minor) not in ((1, 0), (2, 0), (3, 0)):
        raise ConvertError(src, 6, "member %r: .npy version %d.%d" % (name, major, minor))
    if major == 1:
        n, at = struct.unpack("<H", head[8:10])[0], 10
    else:
        more = fh.read(2)
        if len(more) < 2:
            raise ConvertError(src, 8, "member %r ends in its .npy header" % name, "EOF")
        n, at = struct.unpack("<I", head[8:10] + more)[0], 12
    if n > MAX_NPY_HEADER:
        raise ConvertError(src, 8, "member %r: a .npy header of %d bytes (kiln reads up to %d)"
                           % (name, n, MAX_NPY_HEADER), "LIMIT")
    raw = fh.read(n)
    if len(raw) < n:
        raise ConvertError(src, at, "member %r ends in its .npy header" % name, "EOF")
    try:
        text = raw.decode("utf-8" if major == 3 else "latin1")
        d = ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError,
            UnicodeDecodeError) as e:
        raise ConvertError(src, at, "member %r: the .npy header is not a literal (%s)"
                           % (name, type(e).__name__)) from None
    if not isinstance(d, dict) or sorted(d) != ["descr", "fortran_order", "shape"]:
        raise ConvertError(src, at, "member %r: the .npy header is not a dict of descr, "
                           "fortran_order and shape" % name, "TYPE")
    shape, fortran, descr = d["shape"], d["fortran_order"], d["descr"]
    if not isinstance(shape, tuple) or len(shape) > W.MAX_RANK or \
            not all(type(x) is int and 0 <= x <= W.U64_MAX for x in shape) or \
            type(fortran) is not bool or not isinstance(descr, str):
        raise ConvertError(src, at, "member %r: shape %r, fortran_order %r or descr %r is "
                           "not what Kiln can hold" % (name, shape, fortran, descr), "TYPE")
    try:
        dtype = np.dtype(descr)
    except (TypeError, ValueError, SyntaxError) as e:
        raise ConvertError(src, at, "member %r: descr %r is not a dtype (%s)"
                           % (name, descr, e), "TYPE") from None
    return shape, fortran, dtype, at + n


def _kiln_dtype(dtype: Any, src: str, name: str) -> str:
    try:
        if dtype.hasobject or dtype.fields is not None or dtype.subdtype is not None:
            raise TypeError
        return W.DTYPES[_access.dtype_code(dtype.newbyteorder("<"))][0]
    except (TypeError, KeyError):
        raise ConvertError(src, 0, "array %r has dtype %s, which Kiln has no twin for"
                           % (name, dtype), "TYPE") from None


def _chunks(fh: Any, n: int, m: _Member, src: str) -> Any:
    """The payload's ``n`` bytes, CHUNK at a time (whole items), checked as the
    directory check would (bools 0 or 1) and made little-endian."""
    step = max(CHUNK // m.dtype.itemsize, 1) * m.dtype.itemsize
    le = m.dtype.newbyteorder("<")
    done = 0
    while done < n:
        piece = fh.read(min(step, n - done))
        if not piece:
            raise ConvertError(src, m.header_end + done, "member %r ends %d bytes early"
                               % (m.name, n - done), "EOF")
        arr = np.frombuffer(piece, m.dtype)
        if m.dtype.kind == "b" and piece.translate(None, b"\0\1"):
            bad = np.frombuffer(piece, np.uint8) > 1
            raise ConvertError(src, m.header_end + done + int(np.argmax(bad)),
                               "member %r: a bool byte is not 0 or 1" % m.name, "TYPE")
        if m.dtype.byteorder == ">":
            arr = arr.astype(le)
        done += len(piece)
        yield arr


def _stream(zf: Any, m: _Member, w: Any, src: str) -> None:
    """Decompress one member's payload into the writer, a chunk at a time."""
    n = m.info.file_size - m.header_end
    try:
        with zf.open(m.info) as fh:
            fh.read(m.header_end)
            if m.fortran and len(m.shape) > 1:
                whole = np.concatenate(list(_chunks(fh, n, m, src)) or [np.empty(0, m.dtype)])
                _write_rows(w, m, whole.reshape(m.shape, order="F"))
            elif len(m.shape) and m.shape[0] and n // m.shape[0] <= CHUNK:
                _rows_from(w, m, _chunks(fh, n, m, src))
            elif not n or not len(m.shape):
                w.write(m.name, np.concatenate(list(_chunks(fh, n, m, src))
                                               or [np.empty(0, m.dtype)]).reshape(m.shape))
            else:   # rows above a chunk: through a temporary file, then file to file
                with tempfile.TemporaryFile() as tmp:
                    for arr in _chunks(fh, n, m, src):
                        tmp.write(memoryview(arr).cast("B"))
                    tmp.flush()
                    w.write_from(m.name, tmp, 0)
    except _ZIP_ERRORS as e:
        if isinstance(e, ConvertError):
            raise
        raise ConvertError(src, m.info.header_offset, "member %r cannot be read (%s)"
                           % (m.info.filename, e)) from None


def _rows_from(w: Any, m: _Member, chunks: Any) -> None:
    """Whole rows to ``write_rows`` as the chunks arrive (a partial row waits)."""
    per = 1
    for d in m.shape[1:]:
        per *= d
    row, pending = 0, np.empty(0, m.dtype.newbyteorder("<"))
    for arr in chunks:
        if len(pending):
            arr = np.concatenate([pending, arr])
        k = len(arr) // per if per else m.shape[0] - row
        if k:
            w.write_rows(m.name, row, arr[:k * per].reshape((k,) + m.shape[1:]))
            row += k
        pending = arr[k * per:]
    if row < m.shape[0]:   # rows of zero items
        w.write_rows(m.name, row, np.empty((m.shape[0] - row,) + m.shape[1:], pending.dtype))


def _write_rows(w: Any, m: _Member, arr: Any) -> None:
    per = max(arr[0].nbytes, 1) if arr.shape[0] else 1
    step = max(CHUNK // per, 1)
    for i in range(0, arr.shape[0], step):
        w.write_rows(m.name, i, np.ascontiguousarray(arr[i:i + step]))
    if not arr.shape[0]:
        w.write(m.name, np.ascontiguousarray(arr))


# Kiln dtypes with no numpy dtype that np.load reads back
_NO_NPY = frozenset(d[0] for c, d in W.DTYPES.items() if c in W.PACKED or d[3])   # packed, ml


def kiln_to_npz(src: str, dst: str, progress: Any = None) -> int:
    with _access.progress_session(progress, "convert") as prog:
        return _to_npz(src, dst, prog)


def _to_npz(src: str, dst: str, prog: Any) -> int:
    with _access.open_kiln_file(src) as f:
        names = f.keys()
        for name in names:
            t = f[name]
            if not isinstance(name, str):
                raise ConvertError(src, 0, "the tensors are unnamed; npz members need names",
                                   "TYPE")
            if t.dtype in _NO_NPY or not isinstance(t.dtype, str):
                # (ml_dtypes' bf16/float8 would be written as void '|V2'/'|V1'
                # members, which np.load and npz_to_kiln cannot read as numbers)
                label = _access.dtype_label(t.dtype, t.layout)
                keeps = "" if label != str(t.dtype) else \
                    "; convert to .safetensors, which keeps it"
                raise ConvertError(src, 0, "tensor %r is %s, which npz cannot hold (numpy has "
                                   "no dtype for it)%s" % (name, label, keeps), "TYPE")
        if prog is not None:
            prog.start(sum(f[name].nbytes for name in names))
        with _access.AtomicFile(dst) as out, \
                zipfile.ZipFile(out.f, "w", zipfile.ZIP_STORED, allowZip64=True) as zf:
            for name in names:
                with zf.open(name + ".npy", "w", force_zip64=True) as member:
                    np.lib.format.write_array(member, f[name].numpy(), allow_pickle=False)
                if prog is not None:
                    prog.add(f[name].nbytes)
    return len(names)


__all__ = ["npz_to_kiln", "kiln_to_npz", "read_npy_header"]
