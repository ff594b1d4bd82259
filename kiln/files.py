"""Files: save and load tensors and values, open a tensor file lazily, write
one tensor at a time.

A tensor file is one standalone Kiln tensor directory, so any Kiln reader
decodes it; every payload starts at a 64-byte aligned file offset.  Metadata,
when given, is one more tensor, the last, named ``__metadata__``: a ``u8``
payload holding a framed Kiln value (see ``kiln._meta`` and spec/kiln-v2.md,
"Tensor files").

Writes are atomic: a temporary file in the target's directory, flushed and
fsynced, then ``os.replace`` and an fsync of the directory.  A reader that has
the old file mapped keeps reading the old bytes (on Windows a mapped file
cannot be replaced: close readers first).  A writer killed half way leaves
the old file intact; its temporary file is removed by the next save into that
directory.

Reading maps the file (``mmap``).  Views keep the mapping alive: closing a
file, or leaving its ``with`` block, while views live never raises and never
unmaps under them; the mapping goes when the last view goes.
"""

import builtins
import errno
import mmap
import os
import re
import sys
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np

from . import _api, _compat, _meta
from . import _wire as W
from ._errors import EncodeError, KilnError, frame_hint
from ._rows import LazyRows
from ._local import PayloadChecks, check_regular, open_regular
from ._kernels_py.dirwrite import block_head
from ._tensor import Tensor, TensorDirectory, normalize_tensors, _code_of, element_count, \
    _raw_names

PathLike = Union[str, "os.PathLike[str]"]

_TMP = re.compile(r"^\.(?P<base>.+)\.(?P<pid>\d+)\.(?P<n>\d+)\.kiln-tmp$")
_counter = [0]


# --- writing ------------------------------------------------------------------

class _AtomicFile:
    """A temporary file beside ``path`` that replaces it on commit."""

    def __init__(self, path: PathLike) -> None:
        self.path = os.fspath(path)
        folder = os.path.dirname(os.path.abspath(self.path))
        base = os.path.basename(self.path)
        _remove_stale(folder, base)
        _counter[0] += 1
        self.tmp = os.path.join(folder, ".%s.%d.%d.kiln-tmp" % (base, os.getpid(), _counter[0]))
        self.f = builtins.open(self.tmp, "xb")
        self._unsynced = 0

    def wrote(self, n: int) -> None:
        """Count bytes written; every few MiB, start their write-back without waiting,
        so the fsync of ``commit`` overlaps the writing instead of following it."""
        self._unsynced += n
        if self._unsynced >= _WRITEBACK_STEP:
            self._unsynced = 0
            self.f.flush()
            _start_writeback(self.f.fileno())

    def copy_in(self, src: int, src_offset: int, n: int, dst_offset: int, what: str) -> None:
        """``n`` bytes of the file ``src`` (a descriptor) from ``src_offset`` to our
        ``dst_offset``, inside the kernel where it can (``copy_file_range``), else
        through a bounded buffer."""
        self.f.flush()
        fd = self.f.fileno()
        copy = _copy_file_range
        while n > 0:
            step = min(n, _COPY_STEP)
            k = -1
            if copy is not None:
                try:
                    k = copy(src, fd, step, src_offset, dst_offset)
                except OSError as e:
                    if e.errno not in _NO_COPY:
                        raise
                    copy = None   # another file system or a pipe: copy through memory
            if k < 0:
                chunk = os.pread(src, min(step, 8 << 20), src_offset)
                k = len(chunk)
                _pwrite_all(fd, chunk, dst_offset)
            if k == 0:
                raise ValueError("%s: the source ended %d bytes short" % (what, n))
            n -= k
            src_offset += k
            dst_offset += k
            self.wrote(k)

    def commit(self) -> None:
        self.f.flush()
        os.fsync(self.f.fileno())
        self.f.close()
        os.replace(self.tmp, self.path)
        _fsync_dir(os.path.dirname(os.path.abspath(self.path)))

    def discard(self) -> None:
        try:
            self.f.close()
        finally:
            try:
                os.unlink(self.tmp)
            except FileNotFoundError:
                pass


def _remove_stale(folder: str, base: str) -> None:
    """Temporary files of writers that died: their process is gone."""
    try:
        names = os.listdir(folder)
    except OSError:
        return
    for name in names:
        m = _TMP.match(name)
        if m is None or m.group("base") != base:
            continue
        pid = int(m.group("pid"))
        if pid == os.getpid() or _alive(pid):
            continue
        try:
            os.unlink(os.path.join(folder, name))
        except OSError:
            pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True   # exists, not ours
    return True


_WRITEBACK_STEP = 8 << 20
_COPY_STEP = 1 << 30
_copy_file_range = getattr(os, "copy_file_range", None)
_NO_COPY = {getattr(errno, n) for n in ("EXDEV", "ENOSYS", "EINVAL", "EOPNOTSUPP", "EBADF",
                                        "ENOTSUP", "ESPIPE") if hasattr(errno, n)}
_writeback: List[Any] = []


def _start_writeback(fd: int) -> None:
    """Linux ``sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WRITE)``: start writing the
    file's dirty pages to disk and return at once.  Elsewhere nothing."""
    if not _writeback:
        fn = None
        if sys.platform.startswith("linux"):
            try:
                import ctypes
                fn = ctypes.CDLL(None, use_errno=True).sync_file_range
                fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
                fn.restype = ctypes.c_int
            except (OSError, AttributeError):  # pragma: no cover - a libc without it
                fn = None
        _writeback.append(fn)
    fn = _writeback[0]
    if fn is not None:
        fn(fd, 0, 0, 2)   # a failure only means the fsync does all the work


def _fsync_dir(folder: str) -> None:
    if os.name != "posix":  # pragma: no cover - Windows has no directory fsync
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_block(out: "_AtomicFile", metas: Sequence[tuple], payloads: Sequence[Any]) -> None:
    """Head, then each payload straight from its buffer (None: left as zeros)."""
    head, places, total = block_head(metas, 0)
    f = out.f
    f.write(head)
    base = len(head)
    pos = 0
    for place, payload, meta in zip(places, payloads, metas):
        if payload is None:
            continue
        if place > pos:
            f.seek(base + place)
        f.write(payload)
        out.wrote(meta[10])
        pos = place + meta[10]
    f.truncate(base + total)   # a trailing hole or gap reads as zeros


def _write_stream(f: Any, metas: Sequence[tuple], payloads: Sequence[Any]) -> None:
    """The block to a file object that may not seek: gaps written as zeros."""
    head, places, total = block_head(metas, 0)
    f.write(head)
    pos = 0
    for place, payload, meta in zip(places, payloads, metas):
        if place > pos:
            f.write(bytes(place - pos))
        f.write(payload)
        pos = place + meta[10]
    if total > pos:
        f.write(bytes(total - pos))


def _meta_record(metadata: Optional[Dict[str, Any]]) -> Optional[tuple]:
    if metadata is None:
        return None
    blob = _api.encode(_meta.to_nodes(metadata), _meta.META_TYPE, frame=True)
    return (W.DTYPE_CODES["u8"], (len(blob),), _meta.META_NAME.encode(), None, 0, 0,
            W.NO_AXIS, 0, W.NO_INDEX, W.NO_INDEX, memoryview(blob))


def save_tensors(path: PathLike, tensors: Any, *,
                 metadata: Optional[Dict[str, Any]] = None) -> None:
    """Write ``tensors`` (as :func:`kiln.encode_tensors` takes them) to ``path``.

    Each payload is written straight from its array: extra memory is the
    table, not the file.  The file is replaced atomically (a temporary file
    beside it, fsynced, then renamed over it).

    Args:
        path: a file path, or a binary file object (written in place from its
            current position, with no atomic replace).
        tensors: a mapping of name to array or :class:`kiln.Tensor` (sorted by
            name), a sequence, or a :class:`kiln.TensorDirectory`.
        metadata: a dict with str keys of None, bool, int, float, str, bytes,
            lists and dicts; stored as the last tensor, ``__metadata__``.

    Raises:
        EncodeError: as :func:`kiln.encode_tensors`; ``TYPE`` also for
            metadata of another kind, metadata with unnamed tensors, or a
            tensor named ``__metadata__``.
        OSError: the file cannot be written (the target is left as it was).

    Example:
        >>> kiln.save_tensors("model.kiln", {"w": np.ones((2, 3), np.float32)},
        ...                   metadata={"step": 3})
        >>> kiln.load_metadata("model.kiln")
        {'step': 3}
    """
    records = normalize_tensors(tensors)
    for rec in records:
        if rec[2] == _meta.META_NAME.encode():
            raise EncodeError("TYPE", 0, "the tensor name %r is reserved for metadata"
                              % _meta.META_NAME)
    meta = _meta_record(metadata)
    if meta is not None:
        if records and records[0][2] is None:
            raise EncodeError("TYPE", 0, "metadata needs named tensors")
        records.append(meta)
    metas = [r[:10] + (len(r[10]),) for r in records]
    if hasattr(path, "write"):
        # a binary file object: written in place, from its current position
        _write_stream(path, metas, [r[10] for r in records])
        return
    out = _AtomicFile(path)
    try:
        _write_block(out, metas, [r[10] for r in records])
        out.commit()
    except BaseException:
        out.discard()
        raise


def save(path: PathLike, value: Any, type: Any, *, frame: bool = True,
         round_floats: bool = False) -> None:
    """Encode ``value`` as ``type`` (framed by default) into ``path``, atomically.

    Args:
        path: a file path, or a binary file object (written in place).
        value, type, round_floats: as for :func:`kiln.encode`.
        frame: prefix the frame with the schema hash (the default here, so
            :func:`kiln.load` can check the file holds this type).

    Raises:
        EncodeError: as :func:`kiln.encode`.
        KilnError: ``TYPE``/``DEPTH`` for a bad type.
        OSError: the file cannot be written (the target is left as it was).

    Example:
        >>> kiln.save("rec.kiln", {"id": 7}, "struct{id:i64,}")
        >>> kiln.load("rec.kiln", "struct{id:i64,}")
        {'id': 7}
    """
    data = _api.encode(value, type, frame=frame, round_floats=round_floats)
    if hasattr(path, "write"):
        path.write(data)
        return
    out = _AtomicFile(path)
    try:
        with memoryview(data) as view:
            for at in range(0, len(view), _WRITEBACK_STEP):
                out.f.write(view[at:at + _WRITEBACK_STEP])
                out.wrote(min(_WRITEBACK_STEP, len(view) - at))
        out.commit()
    except BaseException:
        out.discard()
        raise


class TensorWriter:
    """Write a tensor file one tensor at a time, in constant memory.

    Declare every tensor first (``add(name, dtype, shape)``), then write each
    payload (``write(name, data)`` or ``write_from(name, source, offset)``)
    in any order, then ``close()`` (or leave the ``with`` block) to replace
    the target atomically.  ``write(name, None)`` leaves that payload as
    zeros (a hole in the file where the file system allows).  An exception
    inside the ``with`` block discards the file.

    Args:
        path: the target file (a temporary file is written beside it).
        metadata: as for :func:`kiln.save_tensors`.

    Raises:
        EncodeError: bad metadata (before any file is created).
        OSError: the temporary file cannot be created.

    Example:
        >>> with kiln.TensorWriter("big.kiln", metadata={"layers": 2}) as w:
        ...     w.add("layer0", "f32", (4, 8))
        ...     w.add("layer1", "f32", (4, 8))
        ...     for name in ("layer0", "layer1"):
        ...         w.write(name, np.ones((4, 8), np.float32))
        >>> kiln.load_tensors("big.kiln").keys()
        ['layer0', 'layer1']
    """

    def __init__(self, path: PathLike, *, metadata: Optional[Dict[str, Any]] = None) -> None:
        self._meta = _meta_record(metadata)   # before the file: a bad value leaves nothing
        self._decl: List[tuple] = []
        self._index: Dict[str, int] = {}
        self._written: List[bool] = []
        self._rows_done: Dict[int, List[Tuple[int, int]]] = {}   # write_rows, tensor by tensor
        self._places: Optional[List[int]] = None
        self._base = 0
        self._out: Optional[_AtomicFile] = _AtomicFile(path)

    def add(self, name: str, dtype: Union[str, int], shape: Sequence[int], *,
            layout: Optional[str] = None, nbytes: Optional[int] = None,
            block_size: int = 0) -> None:
        """Declare one tensor (before the first ``write``).  An opaque dtype (a code
        4096..32767) also needs ``layout``, ``block_size`` and ``nbytes``.

        Raises ``RuntimeError`` after the first write, ``ValueError`` for an empty,
        reserved or repeated name, an unknown dtype or an opaque one without
        ``nbytes``.
        """
        if self._places is not None:
            raise RuntimeError("declare every tensor before the first write")
        if not isinstance(name, str) or not name or name == _meta.META_NAME \
                or name in self._index:
            raise ValueError("tensor name %r is empty, reserved or declared twice" % (name,))
        code = _code_of(dtype)
        shape = tuple(int(d) for d in shape)
        if code < W.OPAQUE_MIN:
            w = W.DTYPES[code][1]
            n = element_count(shape)
            need = (n + 1) // 2 if w == 0 else n * w
        elif nbytes is None:
            raise ValueError("an opaque dtype needs nbytes")
        else:
            need = nbytes
        self._index[name] = len(self._decl)
        self._decl.append((code, shape, name.encode("utf-8"),
                           None if layout is None else layout.encode("utf-8"), int(block_size),
                           0, W.NO_AXIS, 0, W.NO_INDEX, W.NO_INDEX, need))
        self._written.append(False)

    def _start(self) -> None:
        metas = self._decl + ([self._meta[:10] + (len(self._meta[10]),)] if self._meta else [])
        head, places, total = block_head(metas, 0)
        f = self._file()
        f.write(head)
        self._base = len(head)
        self._places = places
        f.truncate(self._base + total)
        if self._meta is not None:
            f.seek(self._base + places[-1])
            f.write(self._meta[10])

    def _file(self) -> Any:
        if self._out is None:
            raise ValueError("the writer is closed")
        return self._out.f

    def _unwritten(self, name: str, rows: bool = False) -> int:
        """The index of a declared tensor not written yet (with ``rows``: or
        written in part by ``write_rows``); the file's head on first use."""
        if self._places is None:
            self._start()
        i = self._index.get(name)
        if i is None:
            raise KeyError("tensor %r was not declared" % (name,))
        if self._written[i] or (not rows and i in self._rows_done):
            raise ValueError("tensor %r was written already" % (name,))
        return i

    def write(self, name: str, data: Any) -> None:
        """Write the payload of a declared tensor (an array, a Tensor, bytes, or None).

        Raises ``KeyError`` for an undeclared name, ``ValueError`` for a tensor
        written twice or data whose dtype, shape or size differs from the
        declaration.
        """
        i = self._unwritten(name)
        decl = self._decl[i]
        if data is not None:
            rec = normalize_tensors({name: data})[0]
            if rec[0] != decl[0] or tuple(rec[1]) != decl[1] or len(rec[10]) != decl[10]:
                raise ValueError("tensor %r: data is %s %s, declared %s %s"
                                 % (name, W.DTYPES.get(rec[0], (rec[0],))[0], tuple(rec[1]),
                                    W.DTYPES.get(decl[0], (decl[0],))[0], decl[1]))
            f = self._file()
            assert self._places is not None
            f.seek(self._base + self._places[i])
            f.write(rec[10])
            assert self._out is not None
            self._out.wrote(decl[10])
        self._written[i] = True

    def write_rows(self, name: str, start: int, data: Any) -> None:
        """Write rows ``start .. start + len(data)`` of a declared tensor's
        leading axis, for tensors produced a block at a time (see
        ``kiln.dask.to_kiln``).

        ``data`` is an array of the declared dtype whose shape is the declared
        shape with a leading axis of any length that fits.  A row may be
        written once; the tensor counts as written when every row is.

        Raises ``KeyError`` for an undeclared name, ``ValueError`` for a
        tensor without whole-byte rows (packed 4-bit, opaque or rank 0), a
        dtype or trailing shape that differs from the declaration, rows past
        the end, or rows written before.

        Example:
            >>> with kiln.TensorWriter("rows.kiln") as w:
            ...     w.add("x", "i32", (4, 2))
            ...     w.write_rows("x", 2, np.full((2, 2), 7, np.int32))
            ...     w.write_rows("x", 0, np.zeros((2, 2), np.int32))
            >>> kiln.load_tensors("rows.kiln")["x"].numpy().tolist()
            [[0, 0], [0, 0], [7, 7], [7, 7]]
        """
        i = self._unwritten(name, rows=True)
        decl = self._decl[i]
        code, shape = decl[0], decl[1]
        if code >= W.OPAQUE_MIN or W.DTYPES[code][1] == 0 or not shape:
            raise ValueError("tensor %r has no whole-byte rows: use write()" % (name,))
        if type(start) is not int or start < 0:
            raise ValueError("start must be an int >= 0, not %r" % (start,))
        arr = np.asarray(data)
        rec = normalize_tensors({name: arr})[0] if arr.ndim else None
        if rec is None or rec[0] != code or tuple(rec[1][1:]) != shape[1:]:
            raise ValueError("tensor %r: rows must be %s with trailing shape %s, not %s %s"
                             % (name, W.DTYPES[code][0], shape[1:], arr.dtype, arr.shape))
        k = rec[1][0]
        if start + k > shape[0]:
            raise ValueError("tensor %r: rows %d..%d are past its %d rows"
                             % (name, start, start + k, shape[0]))
        rows = self._rows_done.setdefault(i, [])
        for a, b in rows:
            if a < start + k and start < b:
                raise ValueError("tensor %r: rows %d..%d overlap rows written before"
                                 % (name, max(a, start), min(b, start + k)))
        if k == 0:
            if shape[0] == 0:
                self._written[i] = True
            return
        per = decl[10] // shape[0]
        f = self._file()
        assert self._places is not None and self._out is not None
        f.seek(self._base + self._places[i] + start * per)
        f.write(rec[10])
        self._out.wrote(len(rec[10]))
        rows.append((start, start + k))
        if sum(b - a for a, b in rows) == shape[0]:
            self._written[i] = True
            del self._rows_done[i]

    def write_from(self, name: str, source: Any, offset: int) -> None:
        """Write the payload of a declared tensor by copying its bytes from
        ``source`` (a path or a binary file object with a descriptor), starting
        at byte ``offset`` of it.

        The bytes go file to file inside the kernel where the OS allows it
        (``copy_file_range``), else through a bounded buffer: nothing the size
        of the tensor is held in memory.  Bool and 4-bit payloads are checked
        on the way (each bool byte 0 or 1; an odd 4-bit tail's high nibble 0)
        and raise ``ValueError`` otherwise; so does a source that ends early.

        Example:
            >>> np.arange(4, dtype=np.float32).tofile("raw.bin")
            >>> with kiln.TensorWriter("copied.kiln") as w:
            ...     w.add("x", "f32", (4,))
            ...     w.write_from("x", "raw.bin", 0)
            >>> kiln.load_tensors("copied.kiln")["x"].numpy().tolist()
            [0.0, 1.0, 2.0, 3.0]
        """
        i = self._unwritten(name)
        if type(offset) is not int or offset < 0:
            raise ValueError("offset must be an int >= 0, not %r" % (offset,))
        decl = self._decl[i]
        self._file()
        assert self._out is not None and self._places is not None
        owned = not hasattr(source, "fileno")
        fd = os.open(os.fspath(source), os.O_RDONLY) if owned else source.fileno()
        try:
            dst = self._base + self._places[i]
            what = "tensor %r from %s" % (name, _name(source))
            code = decl[0]
            if code == W.DTYPE_BOOL or (code < W.OPAQUE_MIN and W.DTYPES[code][1] == 0):
                _copy_checked(self._out, fd, offset, decl, dst, what)
            else:
                self._out.copy_in(fd, offset, decl[10], dst, what)
        finally:
            if owned:
                os.close(fd)
        self._written[i] = True

    def close(self) -> None:
        """Check every tensor was written, then replace the target atomically.

        Raises ``ValueError`` naming the tensors declared but not written (the
        target is then left as it was, and the temporary file removed).
        """
        if self._out is None:
            return
        try:
            if self._places is None:
                self._start()
            missing = [n for n, i in self._index.items() if not self._written[i]]
            if missing:
                raise ValueError("tensors declared but not written: %s" % ", ".join(missing))
            self._out.commit()
            self._out = None
        except BaseException:
            self.discard()   # the target is left as it was, and no temporary file
            raise

    def discard(self) -> None:
        """Drop the temporary file; the target is left as it was."""
        if self._out is not None:
            out, self._out = self._out, None
            out.discard()

    def __enter__(self) -> "TensorWriter":
        return self

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> None:
        if kind is None:
            self.close()
        else:
            self.discard()


def _pwrite_all(fd: int, data: bytes, at: int) -> None:
    view = memoryview(data)
    while view:
        k = os.pwrite(fd, view, at)
        view, at = view[k:], at + k


def _payload_fault(code: int, count: int, data: Any, tail: bool) -> Optional[Tuple[int, str]]:
    """The first byte of a piece of a payload that the directory check refuses
    (a bool byte other than 0 or 1; with ``tail``, the piece ending the
    payload, an odd 4-bit tail's high nibble), as (index in ``data``, reason);
    None when there is none.  For payload bytes that reach kiln without the
    directory check: copies between files.  The check is the kernel's own
    ``check_payload``, the one a lazy open runs when a tensor is read."""
    n = memoryview(data).nbytes
    try:   # a piece that does not end the payload: its last byte is not the tail
        _compat.kernels.check_payload(data, 0, code, count, n if tail else n + 1, 0)
    except KilnError as e:
        return e.offset, e.reason
    return None


def _copy_checked(out: _AtomicFile, fd: int, offset: int, decl: tuple, dst: int,
                  what: str) -> None:
    """Bool and 4-bit payloads through memory, 8 MiB at a time, checked as the
    directory check would check them."""
    n, done, code = decl[10], 0, decl[0]
    while done < n:
        chunk = os.pread(fd, min(n - done, 8 << 20), offset + done)
        if not chunk:
            raise ValueError("%s: the source ended %d bytes short" % (what, n - done))
        fault = _payload_fault(code, element_count(decl[1]), chunk, done + len(chunk) == n)
        if fault is not None:
            raise ValueError("%s: payload byte %d: %s" % (what, done + fault[0], fault[1]))
        done += len(chunk)
        out.f.flush()
        _pwrite_all(out.f.fileno(), chunk, dst)
        dst += len(chunk)
        out.wrote(len(chunk))


# --- reading ------------------------------------------------------------------

def _name(path: Any) -> str:
    return str(getattr(path, "name", "<file object>")) if hasattr(path, "read") \
        else os.fspath(path)


def _map(path: Any) -> Any:
    """A read-only mapping of ``path`` (or of a binary file object's file; a
    file object without one is read into memory); clear errors naming the path."""
    if hasattr(path, "read"):
        try:
            fd = path.fileno()
        except (AttributeError, OSError, ValueError):
            data = path.read()
            if not data:
                raise KilnError("EOF", 0, "%s is empty" % _name(path))
            return data
        return _map_fd(fd, _name(path))
    p = os.fspath(path)
    fd = open_regular(p)   # FileNotFoundError, IsADirectoryError, PermissionError, NotAFile
    try:
        return _map_fd(fd, p)
    finally:
        os.close(fd)


def _map_fd(fd: int, name: str) -> "mmap.mmap":
    if check_regular(fd, name).st_size == 0:
        raise KilnError("EOF", 0, "%s is empty: a Kiln file has at least a header" % name)
    return mmap.mmap(fd, 0, access=mmap.ACCESS_READ)


def _read_owned(p: str) -> np.ndarray:
    """The whole file in a read-only array this process owns."""
    with builtins.open(open_regular(p), "rb", buffering=0) as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            raise KilnError("EOF", 0, "%s is empty: a Kiln file has at least a header" % p)
        out = np.empty(size, np.uint8)
        view = memoryview(out)
        got = 0
        while got < size:
            n = f.readinto(view[got:])
            if not n:
                raise KilnError("EOF", got, "%s: the file ended at byte %d while being read"
                                % (p, got))
            got += n
        view.release()
    out.flags.writeable = False
    return out


def _unmap(mm: Any) -> None:
    """Close the mapping now if nothing views it, else when the last view goes."""
    if isinstance(mm, mmap.mmap):
        try:
            mm.close()
        except BufferError:
            pass


class KilnFile:
    """An open tensor file: the table checked once, tensors viewed on access.

    ``f.keys()`` (file order), ``f["w"]`` (a :class:`Tensor` viewing the
    mapping), ``f.metadata``, ``f.rows("w", start, stop)`` (a leading-axis
    slice that touches only those rows' pages), ``len(f)``, iteration over
    names.  Use as a context manager, or call :meth:`close`; views taken
    from the file stay valid after it is closed.  Made by :func:`kiln.open`.

    Opening checks everything the table decides; a tensor's payload
    contents (bool bytes, an odd 4-bit tail, the alignment gap after it) are
    checked when that tensor is first read (``f[name]``, ``f.rows``,
    ``f.tensors()``), so opening costs the table whatever the payloads
    claim.  A bad payload byte is then ``KilnError`` ``TYPE`` at its offset
    in the file, raised by the read.

    Args:
        path: a file path or a binary file object.
        trusted, max_count, max_bytes: as for :class:`kiln.Decoder`.

    Attributes:
        path: the file's name.
        metadata: the metadata dict, or None when the file has none.

    Raises:
        KilnError: any code :func:`kiln.decode_tensors` raises, at its file
            offset (``EOF`` also for an empty or short file); ``TYPE`` for a
            misplaced or malformed ``__metadata__`` tensor.
        OSError: a missing file, a directory, no permission;
            ``kiln._local.NotAFile`` for a FIFO, a socket or a device
            (refused without waiting on it).

    Example:
        >>> kiln.save_tensors("model.kiln", {"w": np.arange(6, dtype=np.int32).reshape(3, 2)})
        >>> with kiln.open("model.kiln") as f:
        ...     f.keys(), f.rows("w", 1, 3).tolist()
        (['w'], [[2, 3], [4, 5]])
    """

    def __init__(self, path: PathLike, *, trusted: bool = False,
                 max_count: int = W.DEFAULT_MAX_COUNT,
                 max_bytes: int = W.DEFAULT_MAX_BYTES) -> None:
        self.path = _name(path)
        mm = _map(path)
        try:
            d, end = _open_table(mm, trusted, max_count, max_bytes)
            self._dir, self.metadata = _split_metadata(d, mm, self.path)
        except BaseException:
            _unmap(mm)
            raise
        self._checks = PayloadChecks(end)
        self._mm: Any = mm

    def _d(self) -> TensorDirectory:
        if self._mm is None:
            raise ValueError("%s is closed" % self.path)
        return self._dir

    def keys(self) -> List[Any]:
        return self._d().keys()

    def __iter__(self) -> Iterator[Any]:
        return iter(self._d())

    def __len__(self) -> int:
        return len(self._d())

    def __contains__(self, name: object) -> bool:
        return name in self._d()

    def __getitem__(self, name: Any) -> Tensor:
        got = self._d()[name]
        if isinstance(got, list):   # a slice
            return [self._checks.tensor(t) for t in got]  # type: ignore[return-value]
        return self._checks.tensor(got)

    def tensors(self) -> TensorDirectory:
        """The tensors as a :class:`TensorDirectory` of views (metadata left out),
        every payload checked."""
        d = self._d()
        for t in d.values():
            self._checks.tensor(t)
        return d

    def _tensors_view(self) -> TensorDirectory:
        """The table as tensors whose payloads are not checked: for listing
        names, dtypes and shapes (``kiln inspect``), never for reading them."""
        return self._d()

    def rows(self, name: Any, start: int, stop: int) -> np.ndarray:
        """Rows ``start:stop`` of a tensor's leading axis, as a read-only view
        (only those rows' payload bytes are read and checked)."""
        t = self._d()[name]
        row = t._row
        if row[0] <= W.DTYPE_MAX and W.DTYPES[row[0]][1] and row[1] and row[1][0]:
            self._checks.rows(t, start, stop)
        else:
            self._checks.tensor(t)   # packed, opaque, rank 0 or empty: the whole payload
        return t.numpy()[start:stop]

    def close(self) -> None:
        """Stop using the file; views already taken stay valid (see the module doc)."""
        mm, self._mm = self._mm, None
        if mm is not None:
            self._dir = None  # type: ignore[assignment]
            _unmap(mm)

    def __enter__(self) -> "KilnFile":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._mm is None else "%d tensors" % len(self._dir)
        return "<kiln.KilnFile %r, %s>" % (self.path, state)


def _open_table(buf: Any, trusted: bool, max_count: int,
                max_bytes: int) -> Tuple[TensorDirectory, int]:
    """The file's tensors as views, and where the block ends: the table checked
    in full now (the payload contents are left to kiln._local.PayloadChecks,
    tensor by tensor) but its rows built when a tensor is asked for (see
    kiln._rows): opening a file of thousands of tensors to read one builds
    one row, not thousands."""
    _api._check_caps(max_count, max_bytes)
    try:
        end, base, count, named, blob, names = _compat.kernels.validate_directory_copy(
            buf, 0, True, trusted, max_count, max_bytes)
    except KilnError as e:
        if bytes(memoryview(buf)[:4]) == W.FRAME_MAGIC:
            raise frame_hint(e) from None
        raise
    mv = memoryview(buf)
    if mv.ndim != 1 or mv.format != "B":
        mv = mv.cast("B")
    rows = LazyRows(blob, count, named, names)
    return TensorDirectory._from_table(rows, mv.toreadonly(), base,
                                       "surrogateescape" if trusted else "strict"), end


def _check_reserved(rows: Any, reserved: bytes, path: str) -> None:
    for i, raw in enumerate(_raw_names(rows[:-1])):
        if raw == reserved:
            raise KilnError("TYPE", W.HEADER_SIZE + W.DESC_SIZE * i + W.D_NAME_OFF,
                            "%s: the name %r is reserved for the metadata, the last tensor"
                            % (path, _meta.META_NAME))


def _split_metadata(d: TensorDirectory, mm: Any, path: str) -> Any:
    """The directory without the metadata tensor, and the metadata dict (or None)."""
    rows = d._rows
    reserved = _meta.META_NAME.encode()
    if not isinstance(rows, LazyRows) or rows.heap_has(reserved):
        _check_reserved(rows, reserved, path)   # else the name is nowhere in the heap
    if not rows or rows[-1][2] != reserved:
        return d, None
    row = rows[-1]
    if row[0] != W.DTYPE_CODES["u8"] or len(row[1]) != 1:
        raise KilnError("TYPE", 0, "%s: the metadata tensor is not a u8 vector" % path)
    here = d._pb + row[10]   # in the directory's own buffer: the mapping, or its copy
    heap = rows.heap_bytes() if isinstance(rows, LazyRows) else \
        sum(len(r[2] or b"") + len(r[3] or b"") for r in rows)
    align = W.DIR_ALIGN - 1
    at = ((W.HEADER_SIZE + W.DESC_SIZE * len(rows) + heap + align) & ~align) + row[10]
    try:   # straight from the buffer: a claimed length costs what the decode reads
        with d._buf[here:here + row[11]] as blob:
            nodes = _api.decode(blob, _meta.META_TYPE, frame=True)
    except KilnError as e:   # reported at its offset in the file
        raise KilnError(e.code, at + e.offset, "%s: metadata: %s" % (path, e.reason)) from None
    meta = _meta.from_nodes(nodes, at)
    return TensorDirectory._from_table(rows[:-1], d._buf, d._pb, d._errors), meta


def open(path: PathLike, **options: Any) -> Any:  # noqa: A001  (kiln.open)
    """Open a tensor file lazily: the table is checked once, tensors are read on access.

    Args:
        path: a file path, a binary file object, or an fsspec URL
            (``s3://...``, ``https://...``; see :mod:`kiln.remote`), whose
            table is read with one range request and each tensor's bytes
            only when it is accessed.
        options: ``trusted``, ``max_count``, ``max_bytes`` (as for
            :class:`kiln.Decoder`); for a URL also ``storage_options`` (a
            dict for the fsspec filesystem).

    Returns:
        KilnFile, or :class:`kiln.remote.RemoteFile` for a URL: use it as a
        context manager.

    Raises:
        KilnError: an invalid file (see :class:`KilnFile`).
        OSError: the file cannot be opened;
            :class:`kiln.remote.RemoteFileChanged` when a remote file changes
            after it was opened.

    Example:
        >>> kiln.save_tensors("model.kiln", {"w": np.ones(4, np.float16)})
        >>> with kiln.open("model.kiln") as f:
        ...     w = f["w"].numpy()
        >>> w.tolist()
        [1.0, 1.0, 1.0, 1.0]
    """
    remote = _remote(path, options)
    if remote is not None:
        return remote
    if isinstance(path, str) and path.startswith("file://"):
        path = path[len("file://"):]
    return KilnFile(path, **options)


def load_tensors(path: PathLike, *, copy: bool = False, **options: Any) -> TensorDirectory:
    """The tensors of a file: views of its mapping, or (``copy=True``) owned copies.

    A copy is read straight into one block the directory owns (one copy, no
    mapping); ``max_copy_bytes`` and the other options are as for
    :func:`kiln.decode_tensors`.

    Args:
        path: a file path or a binary file object.
        copy: read the payloads into memory the directory owns.
        options: ``trusted``, ``max_count``, ``max_bytes``, ``max_copy_bytes``
            (for a URL, whose payloads are all fetched, the cap applies with
            or without ``copy``).

    Returns:
        TensorDirectory: the tensors, without the metadata (see
        :func:`kiln.load_metadata`).

    Raises:
        KilnError: an invalid file (see :class:`KilnFile`).
        OSError: the file cannot be opened.

    Example:
        >>> kiln.save_tensors("model.kiln", [np.zeros(2, np.uint8)])
        >>> kiln.load_tensors("model.kiln", copy=True)[0].numpy().tolist()
        [0, 0]
    """
    cap = options.get("max_copy_bytes")
    remote = _remote(path, options)
    if remote is not None:
        with remote as f:   # every payload fetched into memory the directory owns
            if cap is not None:
                _copy_cap(f, cap)
            return f.tensors()
    if copy and not hasattr(path, "read") and options.get("max_copy_bytes") is None:
        owned = _read_owned(os.fspath(path))
        d = _api.decode_tensors(owned, **options)
        d, _ = _split_metadata(d, owned, _name(path))
        return d
    mm = _map(path)
    try:
        d = _api.decode_tensors(mm, copy=copy, **options)
        d, _ = _split_metadata(d, mm, _name(path))
        return d
    finally:
        _unmap(mm)   # unmapped now when copied; with views, when the last view goes


def load_metadata(path: PathLike) -> Optional[Dict[str, Any]]:
    """The metadata of a tensor file (None when it has none).

    Reads and checks the table and the metadata only, not the payloads.

    Raises:
        KilnError: an invalid file or metadata (see :class:`KilnFile`).
        OSError: the file cannot be opened.

    Example:
        >>> kiln.save_tensors("model.kiln", {"w": np.ones(1)}, metadata={"lr": 0.5})
        >>> kiln.load_metadata("model.kiln")
        {'lr': 0.5}
    """
    remote = _remote(path, {})
    with remote if remote is not None else KilnFile(path) as f:
        return f.metadata


def _copy_cap(f: Any, cap: Any) -> None:
    """``max_copy_bytes`` for a URL, whose payloads are all fetched into memory:
    ``LIMIT`` at the first longer payload's byte_length field, as for a local
    copy, before anything past the table is fetched."""
    _api._check_caps(0, cap)
    for i, row in enumerate(f._all._rows):
        if row[11] > cap:
            raise KilnError("LIMIT", W.HEADER_SIZE + W.DESC_SIZE * i + W.D_BYTE_LENGTH,
                            "%s: payload of %d bytes is above the copy cap max_copy_bytes=%d"
                            % (f.path, row[11], cap))


def _remote(path: Any, options: Dict[str, Any]) -> Any:
    """A :class:`kiln.remote.RemoteFile` when ``path`` is an fsspec URL, else None."""
    if isinstance(path, str) and "://" in path:
        from .remote import RemoteFile, is_url
        if is_url(path):
            options = dict(options)
            options.pop("max_copy_bytes", None)
            return RemoteFile(path, **options)
    return None


def load(path: PathLike, type: Any, *, frame: bool = True, copy: bool = False,
         **options: Any) -> Any:
    """Decode the file at ``path`` as one value of ``type`` (framed by default).

    The file is mapped; tensors in the value view the mapping unless
    ``copy=True``.

    Args:
        path: a file path or a binary file object.
        type: as for :func:`kiln.decode`.
        frame: the file starts with a frame (as :func:`kiln.save` writes).
        copy, options: as for :func:`kiln.decode`.

    Raises:
        KilnError: as :func:`kiln.decode` (``SCHEMA`` when the file holds
            another type); ``EOF`` for an empty file.
        OSError: the file cannot be opened.

    Example:
        >>> kiln.save("rec.kiln", [1.5, 2.5], "list<f64>")
        >>> kiln.load("rec.kiln", "list<f64>").tolist()
        [1.5, 2.5]
    """
    mm = _map(path)
    try:
        return _api.decode(mm, type, frame=frame, copy=copy, **options)
    finally:
        _unmap(mm)


__all__ = ["save_tensors", "load_tensors", "load_metadata", "save", "load", "open", "KilnFile",
           "TensorWriter"]
