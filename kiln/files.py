"""Files: save and load tensors and values, open a tensor file lazily, write
one tensor at a time.

A tensor file is one standalone Kiln tensor directory, so any Kiln reader
decodes it; every payload starts at a 64-byte aligned file offset.  Metadata,
when given, is one more tensor, the last, named ``__metadata__``: a ``u8``
payload holding a framed Kiln value (see ``kiln._meta`` and spec/kiln-v2.md,
"Tensor files").

Writes are atomic (``kiln._atomic``): a temporary file in the target's
directory, under a name unique across threads and processes, with the
target's permission bits, flushed and fsynced, then ``os.replace`` and an
fsync of the directory; a symbolic link is written through to its target.  A
reader that has the old file mapped keeps reading the old bytes (on Windows a
mapped file cannot be replaced: close readers first).  A writer killed half
way leaves the old file intact; its temporary file is removed by the next
save into that directory.  A tensor file is checked as a reader checks it
before it replaces anything.

Reading maps the file (``mmap``).  Views keep the mapping alive: closing a
file, or leaving its ``with`` block, while views live never raises and never
unmaps under them; the mapping goes when the last view goes.
"""

import builtins
import mmap
import os
import threading
from typing import (TYPE_CHECKING, Any, BinaryIO, Dict, List, Optional,
                    Sequence, Tuple, TypeVar, Union, overload)
from typing import Type as _ClassOf

import numpy as np

from . import _api, _checksum, _compat, _meta
from . import _wire as W
from ._atomic import _AtomicFile, _WRITEBACK_STEP
from ._declare import _check_file, _check_meta, _declaration, _desc_at
from ._errors import EncodeError, KilnError, frame_hint
from ._filemap import TensorFileMapping
from ._rows import LazyRows
from ._dirhead import block_head
from ._local import PayloadChecks, check_regular, open_regular
from ._paths import foreign_hint, local_path
from . import _progress
from ._progress import Progress as _Progress, ProgressLike as _ProgressLike
from ._tensors import Tensor, TensorDirectory, normalize_tensors
from ._tensors.directory import _raw_names
from ._tensors.dtypes import element_count

if TYPE_CHECKING:
    from ._types import Type
    from .remote import RemoteFile

PathLike = Union[str, "os.PathLike[str]"]
T = TypeVar("T")

# --- writing ------------------------------------------------------------------

def _write_payload(write: Any, payload: Any, prog: Optional[_Progress]) -> None:
    """One payload, in pieces of _progress.STEP bytes when progress is counted."""
    if prog is None:
        write(payload)
        return
    with memoryview(payload) as v:
        b = v.cast("B") if v.ndim != 1 or v.format != "B" else v
        for at in range(0, len(b), _progress.STEP):
            piece = b[at:at + _progress.STEP]
            write(piece)
            prog.add(len(piece))


def _write_block(out: "_AtomicFile", metas: Sequence[tuple], payloads: Sequence[Any],
                 prog: Optional[_Progress] = None) -> None:
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
        _write_payload(f.write, payload, prog)
        out.wrote(meta[10])
        pos = place + meta[10]
    f.truncate(base + total)   # a trailing hole or gap reads as zeros


def _write_stream(f: Any, metas: Sequence[tuple], payloads: Sequence[Any],
                  prog: Optional[_Progress] = None) -> None:
    """The block to a file object that may not seek: gaps written as zeros."""
    head, places, total = block_head(metas, 0)
    f.write(head)
    pos = 0
    for place, payload, meta in zip(places, payloads, metas):
        if place > pos:
            f.write(bytes(place - pos))
        _write_payload(f.write, payload, prog)
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
                 metadata: Optional[Dict[str, Any]] = None, checksum: bool = False,
                 progress: _ProgressLike = None) -> None:
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
        checksum: also record a CRC-32 of every payload in the metadata
            (under the reserved key ``__kiln_checksum__``), which
            ``kiln check`` and ``verify=True`` compare; the tensors must be
            named.
        progress: True for a tqdm bar, or a callable ``fn(done_bytes,
            total_bytes)``, counting the payload bytes written (see
            :doc:`files`).

    Raises:
        EncodeError: as :func:`kiln.encode_tensors`; ``TYPE`` also for
            metadata of another kind, metadata with unnamed tensors, a
            tensor named ``__metadata__`` or a metadata key
            ``__kiln_checksum__``.
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
    if checksum:
        metadata = _checksum.with_entry(metadata, _checksum.digests(r[10] for r in records))
    else:
        _checksum.refuse_key(metadata)
    meta = _meta_record(metadata)
    if meta is not None:
        if records and records[0][2] is None:
            raise EncodeError("TYPE", 0, "metadata needs named tensors")
        records.append(meta)
    metas = [r[:10] + (len(r[10]),) for r in records]
    for i, m in enumerate(metas):
        _check_meta(m, i)
    with _progress.session(progress, "save") as prog:
        if prog is not None:
            prog.start(sum(m[10] for m in metas))
        if hasattr(path, "write"):
            # a binary file object: written in place, from its current position
            _write_stream(path, metas, [r[10] for r in records], prog)
            return
        out = _AtomicFile(path)
        try:
            _write_block(out, metas, [r[10] for r in records], prog)
            _check_file(out)   # never commit what a reader would refuse
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
    payload (``write(name, data)``, ``write_rows`` or ``write_from(name,
    source, offset)``) in any order, then ``close()`` (or leave the ``with``
    block) to replace the target atomically.  ``write(name, None)`` leaves
    that payload as zeros (a hole in the file where the file system allows).
    An exception inside the ``with`` block discards the file.

    The writer never commits a file kiln would refuse: ``add`` checks each
    declaration, the first write runs the decoder's directory check over the
    table just written, and ``close`` runs it again over the whole file
    before the replace.  A refusal is an :class:`kiln.EncodeError` with the
    code and the byte offset the fault has in the file; the target is then
    left as it was.

    One writer may be shared by threads: payloads go to their places with
    positional writes (``os.pwrite``), the table is written once, and
    different tensors (or different rows of one tensor, with
    ``write_rows``) may be written at the same time.  Writing one tensor
    twice raises ``ValueError`` in the second writer; ``close`` waits for the
    writes in progress.

    Args:
        path: the target file (a temporary file is written beside it, or
            beside the file a symbolic link names: see :doc:`files`).
        metadata: as for :func:`kiln.save_tensors`.
        checksum: as for :func:`kiln.save_tensors`; the digests are computed
            at ``close`` by reading the payloads back from the file (they may
            be written in any order, a row block at a time).
        progress: as for :func:`kiln.save_tensors`: the payload bytes of
            the declared tensors, counted as each write completes.

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

    def __init__(self, path: PathLike, *, metadata: Optional[Dict[str, Any]] = None,
                 checksum: bool = False, progress: _ProgressLike = None) -> None:
        self._checksum = bool(checksum)
        self._user_meta = metadata
        if checksum:   # the digests' room is reserved at the first write, filled at close
            _meta_record(_checksum.with_entry(metadata, b""))
        else:
            _checksum.refuse_key(metadata)
        self._meta = _meta_record(metadata)   # before the file: a bad value leaves nothing
        self._prog = _progress.make(progress, "write")   # (counts from the first write)
        self._decl: List[tuple] = []
        self._index: Dict[str, int] = {}
        self._state: List[int] = []   # per tensor: _TODO, _BUSY (a thread writes it), _DONE
        self._rows_done: Dict[int, List[Tuple[int, int]]] = {}   # write_rows, tensor by tensor
        self._places: Optional[List[int]] = None
        self._base = 0
        self._cv = threading.Condition()
        self._busy = 0                # writes in progress
        self._out: Optional[_AtomicFile] = _AtomicFile(path)

    def add(self, name: str, dtype: Any, shape: Sequence[int], *,
            layout: Optional[str] = None, nbytes: Optional[int] = None,
            block_size: int = 0) -> None:
        """Declare one tensor (before the first ``write``).  ``dtype`` is kiln's
        name (``"f32"``), a code, a numpy dtype (``np.float32``) or numpy's name
        (``"float32"``), as for :class:`kiln.Tensor`.  An opaque dtype (a code
        4096..32767) also needs ``layout``, ``block_size`` and ``nbytes``.

        Raises ``RuntimeError`` after the first write; :class:`kiln.EncodeError`
        (a ``ValueError``) with the code and the file offset the reader would
        report, for an empty, reserved, repeated or non-UTF-8 name, an unknown
        dtype, a rank above 8, a dimension outside 0..2**64-1, a size that
        overflows u64, an opaque dtype without ``layout``, ``block_size`` or
        ``nbytes`` (or ``nbytes`` not a multiple of ``block_size``), or a layout
        or block size on a dtype that is not opaque.
        """
        with self._cv:
            if self._places is not None:
                raise RuntimeError("declare every tensor before the first write")
            if self._out is None:
                raise ValueError("the writer is closed")
            i = len(self._decl)
            rec = _declaration(i, name, dtype, shape, layout, nbytes, block_size)
            if name in self._index:
                raise EncodeError("TYPE", _desc_at(i, W.D_NAME_OFF),
                                  "tensor name %r is declared twice" % (name,))
            self._index[name] = i
            self._decl.append(rec)
            self._state.append(_TODO)

    def _start(self) -> None:
        """The header, table and metadata, once (under the lock), checked as a
        reader checks them before any payload is written."""
        if self._checksum:
            self._meta = _meta_record(_checksum.with_entry(self._user_meta,
                                                           bytes(4 * len(self._decl))))
        metas = self._decl + ([self._meta[:10] + (len(self._meta[10]),)] if self._meta else [])
        for i, m in enumerate(metas):
            _check_meta(m, i)
        head, places, total = block_head(metas, 0)
        out = self._live()
        out.pwrite(head, 0)
        os.ftruncate(out.fd, len(head) + total)
        if self._meta is not None:
            out.pwrite(self._meta[10], len(head) + places[-1])
        _check_file(out)          # the table as the decoder would see it (payloads zero)
        self._base = len(head)
        self._places = places
        if self._prog is not None:
            self._prog.start(sum(d[10] for d in self._decl))

    def _live(self) -> _AtomicFile:
        if self._out is None:
            raise ValueError("the writer is closed")
        return self._out

    def _claim(self, name: str, rows: bool = False) -> int:
        """Under the lock: the index of a declared tensor nobody has written or is
        writing (with ``rows``: or one written in part by ``write_rows``), marked
        as being written; the file's head on first use."""
        self._live()
        if self._places is None:
            self._start()
        i = self._index.get(name) if isinstance(name, str) else None
        if i is None:
            raise KeyError("tensor %r was not declared" % (name,))
        state = self._state[i]
        if state != _TODO or (not rows and i in self._rows_done):
            raise ValueError("tensor %r was written already" % (name,)
                             if state == _DONE or i in self._rows_done else
                             "tensor %r is being written by another thread" % (name,))
        if not rows:
            self._state[i] = _BUSY
        self._busy += 1
        return i

    def _release(self, i: Optional[int], done: bool) -> None:
        with self._cv:
            if i is not None and self._state[i] == _BUSY:
                self._state[i] = _DONE if done else _TODO
            self._busy -= 1
            self._cv.notify_all()

    def write(self, name: str, data: Any) -> None:
        """Write the payload of a declared tensor (an array, a Tensor, bytes, or None).

        Raises ``KeyError`` for an undeclared name, ``ValueError`` for a tensor
        written twice (or being written by another thread) or data whose
        dtype, shape or size differs from the declaration;
        :class:`kiln.EncodeError` for a payload a reader would refuse (a bool
        byte other than 0 or 1, an odd 4-bit tail whose high nibble is set).
        """
        with self._cv:
            i = self._claim(name)
        done = False
        try:
            decl = self._decl[i]
            at = self._base + self._places[i]   # type: ignore[index]
            if data is not None:
                rec = normalize_tensors({name: data})[0]
                if rec[0] != decl[0] or tuple(rec[1]) != decl[1] or len(rec[10]) != decl[10]:
                    raise ValueError("tensor %r: data is %s %s, declared %s %s"
                                     % (name, W.DTYPES.get(rec[0], (rec[0],))[0], tuple(rec[1]),
                                        W.DTYPES.get(decl[0], (decl[0],))[0], decl[1]))
                _refuse_payload(decl, rec[10], 0, True, at)
                self._live().pwrite(rec[10], at)
            done = True
        finally:
            self._release(i, done)
        if self._prog is not None:
            self._prog.add(decl[10])

    def write_rows(self, name: str, start: int, data: Any) -> None:
        """Write rows ``start .. start + len(data)`` of a declared tensor's
        leading axis, for tensors produced a block at a time (see
        ``kiln.dask.to_kiln``); threads may write different rows at once.

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
        with self._cv:
            i = self._claim(name, rows=True)
        claimed = None
        try:
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
            per = decl[10] // shape[0] if shape[0] else 0
            at = self._base + self._places[i] + start * per   # type: ignore[index]
            _refuse_payload(decl, rec[10], start * per, False, at)
            with self._cv:   # the rows are ours from here: nobody else may write them
                claimed = self._claim_rows(i, name, start, k)
            if k:
                self._live().pwrite(rec[10], at)
            claimed = None
            if self._prog is not None:
                self._prog.add(len(rec[10]))
            with self._cv:
                rows = self._rows_done.get(i, [])
                if sum(b - a for a, b in rows) == shape[0]:
                    self._state[i] = _DONE
                    self._rows_done.pop(i, None)
        finally:
            if claimed is not None:   # the write failed: the rows are free again
                with self._cv:
                    self._rows_done[i].remove(claimed)
            self._release(None, False)

    def _claim_rows(self, i: int, name: str, start: int, k: int) -> Tuple[int, int]:
        rows = self._rows_done.setdefault(i, [])
        for a, b in rows:
            if a < start + k and start < b:
                raise ValueError("tensor %r: rows %d..%d overlap rows written before"
                                 % (name, max(a, start), min(b, start + k)))
        span = (start, start + k)
        if k:
            rows.append(span)
        elif self._decl[i][1][0] == 0:
            self._state[i] = _DONE
        return span

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
        if type(offset) is not int or offset < 0:
            raise ValueError("offset must be an int >= 0, not %r" % (offset,))
        with self._cv:
            i = self._claim(name)
        done = False
        try:
            decl = self._decl[i]
            out = self._live()
            owned = not hasattr(source, "fileno")
            fd = os.open(os.fspath(source), os.O_RDONLY) if owned else source.fileno()
            try:
                dst = self._base + self._places[i]   # type: ignore[index]
                what = "tensor %r from %s" % (name, _name(source))
                code = decl[0]
                if code == W.DTYPE_BOOL or (code < W.OPAQUE_MIN and W.DTYPES[code][1] == 0):
                    _copy_checked(out, fd, offset, decl, dst, what)
                else:
                    out.copy_in(fd, offset, decl[10], dst, what)
            finally:
                if owned:
                    os.close(fd)
            done = True
        finally:
            self._release(i, done)
        if self._prog is not None:
            self._prog.add(decl[10])

    def close(self) -> None:
        """Wait for the writes in progress, check every tensor was written and
        that a reader accepts the file, then replace the target atomically.

        Raises ``ValueError`` naming the tensors declared but not written, or
        :class:`kiln.EncodeError` for a file a reader would refuse (the target
        is then left as it was, and the temporary file removed).
        """
        with self._cv:
            if self._out is None:
                return
            while self._busy:
                self._cv.wait()
            out = self._out
            try:
                if self._places is None:
                    self._start()
                missing = [n for n, i in self._index.items() if self._state[i] != _DONE]
                if missing:
                    raise ValueError("tensors declared but not written: %s"
                                     % ", ".join(missing))
                if self._checksum:
                    self._write_digests(out)
                _check_file(out)
                out.commit()
                self._out = None
            except BaseException:
                self._out = None
                out.discard()   # the target is left as it was, and no temporary file
                raise
            finally:
                if self._prog is not None:
                    self._prog.close()

    def _write_digests(self, out: _AtomicFile) -> None:
        """The payloads' CRC-32s, read back from the file, into the metadata's room."""
        places = self._places
        assert places is not None and self._meta is not None
        sums = _checksum.file_digests(out.fd, [(self._base + places[i], d[10])
                                               for i, d in enumerate(self._decl)])
        rec = _meta_record(_checksum.with_entry(self._user_meta, sums))
        assert rec is not None and len(rec[10]) == len(self._meta[10])
        out.pwrite(rec[10], self._base + places[-1])

    def discard(self) -> None:
        """Drop the temporary file (after the writes in progress); the target is
        left as it was."""
        with self._cv:
            while self._busy:
                self._cv.wait()
            if self._out is not None:
                out, self._out = self._out, None
                out.discard()
            if self._prog is not None:
                self._prog.close()

    def __enter__(self) -> "TensorWriter":
        return self

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> None:
        if kind is None:
            self.close()
        else:
            self.discard()


_TODO, _BUSY, _DONE = 0, 1, 2


def _refuse_payload(decl: tuple, data: Any, at: int, tail: bool, where: int) -> None:
    """EncodeError for payload bytes a reader refuses (bool bytes, a packed tail);
    ``at``: where ``data`` starts in the payload, ``where``: in the file."""
    code = decl[0]
    if code == W.DTYPE_BOOL or (code < W.OPAQUE_MIN and W.DTYPES[code][1] == 0):
        fault = _payload_fault(code, element_count(decl[1]), data, tail)
        if fault is not None:
            raise EncodeError("TYPE", where + fault[0], fault[1])


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
        out.pwrite(chunk, dst)
        dst += len(chunk)


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
    p = os.fspath(local_path(path))
    fd = open_regular(p)   # FileNotFoundError, IsADirectoryError, PermissionError, NotAFile
    try:
        return _map_fd(fd, p)
    finally:
        os.close(fd)


def _map_fd(fd: int, name: str) -> "mmap.mmap":
    if check_regular(fd, name).st_size == 0:
        raise KilnError("EOF", 0, "%s is empty: a Kiln file has at least a header" % name)
    return mmap.mmap(fd, 0, access=mmap.ACCESS_READ)


def _read_owned(p: str, prog: Optional[_Progress] = None) -> np.ndarray:
    """The whole file in a read-only array this process owns."""
    with builtins.open(open_regular(p), "rb", buffering=0) as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            raise KilnError("EOF", 0, "%s is empty: a Kiln file has at least a header" % p)
        out = np.empty(size, np.uint8)
        view = memoryview(out)
        got = 0
        step = size if prog is None else _progress.STEP
        if prog is not None:
            prog.start(size)
        while got < size:
            n = f.readinto(view[got:got + step])
            if n and prog is not None:
                prog.add(n)
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


class KilnFile(TensorFileMapping):
    """An open tensor file: the table checked once, tensors viewed on access.

    A ``Mapping[str, Tensor]`` of name to tensor, as :class:`TensorDirectory`
    is: ``f.keys()`` (file order, a list), ``f["w"]`` (a :class:`Tensor`
    viewing the mapping), ``f.items()``, ``f.values()``, ``f.get("w")``,
    ``"w" in f``, ``len(f)``, iteration over names; also ``f.metadata`` and
    ``f.rows("w", start, stop)`` (a leading-axis slice that touches only
    those rows' pages).  Files compare by identity, not content.  Use as a
    context manager, or call :meth:`close`; views taken from the file stay
    valid after it is closed.  Made by :func:`kiln.open`.

    Opening checks everything the table decides; a tensor's payload
    contents (bool bytes, an odd 4-bit tail, the alignment gap after it) are
    checked when that tensor is first read (``f[name]``, ``f.rows``,
    ``f.tensors()``), so opening costs the table whatever the payloads
    claim.  A bad payload byte is then ``KilnError`` ``TYPE`` at its offset
    in the file, raised by the read.

    Args:
        path: a file path or a binary file object.
        trusted, max_count, max_bytes: as for :class:`kiln.Decoder`.
        verify: compare each tensor's payload with the CRC-32 the file
            records (``checksum=True`` when written) the first time the
            tensor is read; a mismatch raises ``KilnError`` ``CHECKSUM``
            naming the tensor.  A file that records none is read as usual.

    Attributes:
        path: the file's name.
        metadata: the metadata dict, or None when the file has none (the
            checksum entry is not part of it).
        checksums: the recorded CRC-32s (4 little-endian bytes per tensor, in
            file order), or None.

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
                 max_bytes: int = W.DEFAULT_MAX_BYTES, verify: bool = False) -> None:
        self.path = _name(path)
        mm = _map(path)
        try:
            d, end = _open_table(mm, trusted, max_count, max_bytes)
            self._dir, self.metadata, self.checksums = _split_metadata(d, mm, self.path)
        except BaseException:
            _unmap(mm)
            raise
        self._checks = PayloadChecks(end)
        self._mm: Any = mm
        self._verify = bool(verify)
        self._verified: set = set()

    def _checked(self, name: Any) -> Tensor:
        """Tensor ``name``; with ``verify=True`` its payload's CRC-32 compared first."""
        d = self._d()
        t = d[name]
        if isinstance(t, list):   # a slice
            return [self._checked(i) for i in range(*name.indices(len(d)))]  # type: ignore
        self._checks.tensor(t)   # its payload's contents, the first time it is read
        sums = self.checksums
        if self._verify and sums is not None:
            i = _position(d, name, self.__dict__)
            if i not in self._verified:
                at = d._pb + d._rows[i][10]
                _checksum.check(sums, i, t.data, t.name, at, self.path)
                self._verified.add(i)
        return t

    def __getitem__(self, name: Any) -> Tensor:
        return self._checked(name)

    def verify(self) -> None:
        """Compare every payload with the CRC-32 the file records (``CHECKSUM``
        naming the first tensor that differs); ``KilnError`` ``CHECKSUM`` at
        byte 0 when the file records none."""
        if self.checksums is None:
            raise KilnError("CHECKSUM", 0, "%s records no checksums (written without "
                            "checksum=True)" % self.path)
        _checksum.check_directory(self.checksums, self._d(), self.path, self._verified)

    def _d(self) -> TensorDirectory:
        d = self._dir   # read once: another thread may close the file meanwhile
        if d is None:
            raise ValueError("%s is closed" % self.path)
        return d

    def _view(self) -> TensorDirectory:
        return self._d()

    def values(self) -> List[Tensor]:  # type: ignore[override]
        vals = self._d().values()
        for t in vals:
            self._checks.tensor(t)
        if self._verify and self.checksums is not None:
            self.verify()
        return vals

    def tensors(self) -> TensorDirectory:
        """The tensors as a :class:`TensorDirectory` of views (metadata left out),
        every payload checked; with ``verify=True`` every payload is also
        compared with its CRC-32."""
        d = self._d()
        for t in d.values():
            self._checks.tensor(t)
        if self._verify and self.checksums is not None:
            self.verify()
        return d

    def _tensors_view(self) -> TensorDirectory:
        """The table as tensors whose payloads are not checked: for listing
        names, dtypes and shapes (``kiln inspect``), never for reading them."""
        return self._d()

    def rows(self, name: Any, start: int, stop: int) -> np.ndarray:
        """Rows ``start:stop`` of a tensor's leading axis, as a read-only view
        (only those rows' payload bytes are read and checked; with
        ``verify=True`` the whole tensor is read to compare its CRC-32)."""
        if self._verify and self.checksums is not None:
            return self._checked(name).numpy()[start:stop]
        t = self._d()[name]
        row = t._row
        if row[0] <= W.DTYPE_MAX and W.DTYPES[row[0]][1] and row[1] and row[1][0]:
            self._checks.rows(t, start, stop)
        else:
            self._checks.tensor(t)   # packed, opaque, rank 0 or empty: the whole payload
        return t.numpy()[start:stop]

    def close(self) -> None:
        """Stop using the file; views already taken stay valid (see the module doc).

        Safe while other threads read: a read that starts after the close raises
        ``ValueError``; an array or tensor already handed out keeps the mapping,
        which is unmapped when the last of them goes."""
        self._dir = None  # type: ignore[assignment]  # first: no new reads
        mm, self._mm = self._mm, None
        if mm is not None:
            _unmap(mm)

    def __enter__(self) -> "KilnFile":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        d = self._dir
        state = "closed" if d is None else "%d tensors" % len(d)
        return "<kiln.KilnFile %r, %s>" % (self.path, state)


def _position(d: TensorDirectory, name: Any, cache: Dict[str, Any]) -> int:
    """The index of tensor ``name`` (a name or a position) in ``d``, which has it."""
    if isinstance(name, str):
        pos = cache.get("_positions")
        if pos is None:
            pos = cache["_positions"] = {n: i for i, n in enumerate(d.names)}
        return int(pos[name])
    return int(name) % len(d)


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
        _foreign_hint(e, buf)
        raise
    mv = memoryview(buf)
    if mv.ndim != 1 or mv.format != "B":
        mv = mv.cast("B")
    rows = LazyRows(blob, count, named, names)
    return TensorDirectory._from_table(rows, mv.toreadonly(), base,
                                       "surrogateescape" if trusted else "strict"), end


def _foreign_hint(e: KilnError, buf: Any) -> None:
    """A fault at byte 0 of a file in another format: say which, and how to convert."""
    if e.offset == 0 and e.code in ("FRAME", "EOF", "SCHEMA"):
        hint = foreign_hint(bytes(memoryview(buf)[:16]))
        if hint is not None:
            e.reason += " (%s)" % hint


def _check_reserved(rows: Any, reserved: bytes, path: str) -> None:
    for i, raw in enumerate(_raw_names(rows[:-1])):
        if raw == reserved:
            raise KilnError("TYPE", W.HEADER_SIZE + W.DESC_SIZE * i + W.D_NAME_OFF,
                            "%s: the name %r is reserved for the metadata, the last tensor"
                            % (path, _meta.META_NAME))


def _split_metadata(d: TensorDirectory, mm: Any, path: str) -> Any:
    """The directory without the metadata tensor, the metadata dict (or None), and
    the payload digests its checksum entry holds (or None; see kiln._checksum)."""
    rows = d._rows
    reserved = _meta.META_NAME.encode()
    if not isinstance(rows, LazyRows) or rows.heap_has(reserved):
        _check_reserved(rows, reserved, path)   # else the name is nowhere in the heap
    if not rows or rows[-1][2] != reserved:
        return d, None, None
    row = rows[-1]
    if row[0] != W.DTYPE_CODES["u8"] or len(row[1]) != 1:
        raise KilnError("TYPE", 0, "%s: the metadata tensor is not a u8 vector" % path)
    here = d._pb + row[10]   # in the directory's own buffer: the mapping, or its copy
    at = _file_base(rows) + row[10]
    try:   # straight from the buffer: a claimed length costs what the decode reads
        with memoryview(d._buf)[here:here + row[11]] as blob:
            nodes = _api.decode(blob, _meta.META_TYPE, frame=True)
    except KilnError as e:   # reported at its offset in the file
        raise KilnError(e.code, at + e.offset, "%s: metadata: %s" % (path, e.reason)) from None
    meta, sums = _checksum.split(_meta.from_nodes(nodes, at), len(rows) - 1, at, path)
    return TensorDirectory._from_table(rows[:-1], d._buf, d._pb, d._errors), meta, sums


@overload
def open(path: Union["os.PathLike[str]", BinaryIO], *, trusted: bool = ...,  # noqa: A001
         max_count: int = ..., max_bytes: int = ..., verify: bool = ...) -> KilnFile: ...


@overload
def open(path: str, *, trusted: bool = ..., max_count: int = ...,  # noqa: A001
         max_bytes: int = ..., verify: bool = ...,
         storage_options: Optional[Dict[str, Any]] = ...) -> Union[KilnFile, "RemoteFile"]: ...


def open(path: Any, **options: Any) -> Any:  # noqa: A001  (kiln.open)
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
        context manager.  Both are ``Mapping[str, Tensor]``; type checkers
        see a ``KilnFile`` for a ``pathlib.Path`` or a file object and
        ``KilnFile | RemoteFile`` for a ``str`` (which may be a URL).

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
    return KilnFile(local_path(path), **options)


def load_tensors(path: PathLike, *, copy: bool = False, into: Optional[Any] = None,
                 verify: bool = False, progress: _ProgressLike = None,
                 **options: Any) -> TensorDirectory:
    """The tensors of a file: views of its mapping, or (``copy=True``) owned copies.

    A copy is read straight into one block the directory owns (one copy, no
    mapping); ``max_copy_bytes`` and the other options are as for
    :func:`kiln.decode_tensors`.

    Args:
        path: a file path or a binary file object.
        copy: read the payloads into memory the directory owns.
        into: a mapping of tensor name to a writable array the caller owns
            (see :meth:`kiln.TensorDirectory.copy_into`): every target is
            checked first, then each payload is written once into its
            target, straight from the file's mapping.
        verify: compare every payload with the CRC-32 the file records
            (written with ``checksum=True``) before returning;
            ``KilnError`` ``CHECKSUM`` names the first tensor that differs.
        progress: with ``copy=True``: True for a tqdm bar, or a callable
            ``fn(done_bytes, total_bytes)``, counting the file's bytes read
            (a ValueError without ``copy``: views read nothing).
        options: ``trusted``, ``max_count``, ``max_bytes``, ``max_copy_bytes``
            (for a URL, whose payloads are all fetched, the cap applies with
            or without ``copy``).

    Returns:
        TensorDirectory: the tensors, without the metadata (see
        :func:`kiln.load_metadata`); with ``into``, views of the file.

    Raises:
        KilnError: an invalid file (see :class:`KilnFile`); ``CHECKSUM``.
        TypeError, ValueError, KeyError: a bad ``into`` target (nothing
            written).
        OSError: the file cannot be opened.

    Example:
        >>> kiln.save_tensors("model.kiln", [np.zeros(2, np.uint8)])
        >>> kiln.load_tensors("model.kiln", copy=True)[0].numpy().tolist()
        [0, 0]
    """
    if progress is not None and progress is not False and not copy:
        raise ValueError("progress= counts the bytes a copy reads: it needs copy=True "
                         "(views read nothing)")
    if into is not None:
        if copy:
            raise ValueError("pass copy=True or into=..., not both")
        with open(path, verify=verify, **options) as f:
            d = f.tensors()
            d.copy_into(into)
            return d
    with _progress.session(progress, "load") as prog:
        return _load_tensors(path, copy, verify, prog, options)


def _load_tensors(path: Any, copy: bool, verify: bool, prog: Optional[_Progress],
                  options: Dict[str, Any]) -> TensorDirectory:
    cap = options.get("max_copy_bytes")
    remote = _remote(path, dict(options, verify=verify) if verify else options)
    if remote is not None:
        with remote as f:   # every payload fetched into memory the directory owns
            if cap is not None:
                _copy_cap(f, cap)
            d = f.tensors()
            if prog is not None:   # fetched in one go: reported once
                n = sum(t.nbytes for t in d.values())
                prog.start(n)
                prog.add(n)
            return d
    if copy and not hasattr(path, "read") and options.get("max_copy_bytes") is None:
        owned = _read_owned(os.fspath(local_path(path)), prog)
        return _tensors_of(_api.decode_tensors(owned, **options), owned, _name(path), verify)
    mm = _map(path)
    try:
        d = _tensors_of(_api.decode_tensors(mm, copy=copy, **options), mm, _name(path), verify)
        if prog is not None:   # copied by the kernel in one go: reported once
            prog.start(len(mm))
            prog.add(len(mm))
        return d
    finally:
        _unmap(mm)   # unmapped now when copied; with views, when the last view goes


def _tensors_of(d: TensorDirectory, buf: Any, path: str, verify: bool) -> TensorDirectory:
    base = _file_base(d._rows)   # before the split: the metadata's name is in the heap
    d, _, sums = _split_metadata(d, buf, path)
    if verify and sums is not None:   # offsets in the file, whichever buffer d copied into
        _checksum.check_directory(sums, d, path, base=base)
    return d


def _file_base(rows: Any) -> int:
    """The payload base's file offset for a directory of ``rows`` at offset 0."""
    heap = rows.heap_bytes() if isinstance(rows, LazyRows) else \
        sum(len(r[2] or b"") + len(r[3] or b"") for r in rows)
    align = W.DIR_ALIGN - 1
    return (W.HEADER_SIZE + W.DESC_SIZE * len(rows) + heap + align) & ~align


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


@overload
def load(path: Union[PathLike, BinaryIO], type: _ClassOf[T], *, frame: bool = ...,
         copy: bool = ..., trusted: bool = ..., max_count: int = ..., max_bytes: int = ...,
         max_copy_bytes: Optional[int] = ...) -> T: ...


@overload
def load(path: Union[PathLike, BinaryIO], type: Union["Type", str], *, frame: bool = ...,
         copy: bool = ..., trusted: bool = ..., max_count: int = ..., max_bytes: int = ...,
         max_copy_bytes: Optional[int] = ...) -> Any: ...


def load(path: Any, type: Any, *, frame: bool = True, copy: bool = False,
         **options: Any) -> Any:
    """Decode the file at ``path`` as one value of ``type`` (framed by default).

    The file is mapped; tensors in the value view the mapping unless
    ``copy=True``.

    Args:
        path: a file path or a binary file object.
        type: as for :func:`kiln.decode`; with a class the result is an
            instance of it, and type checkers know it.
        frame: the file starts with a frame (as :func:`kiln.save` writes).
        copy, options: as for :func:`kiln.decode`.  ``max_count`` and
            ``max_bytes`` left unset grow to the file's size, so what
            :func:`kiln.save` wrote loads back (``max_count`` keeps its
            default for a type with zero-size elements, see the README's caps).

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
        # caps the caller left unset grow to the file's size (_api._file_caps)
        options = _api._file_caps(len(mm), type, options)
        try:
            return _api.decode(mm, type, frame=frame, copy=copy, **options)
        except KilnError as e:
            _foreign_hint(e, mm)
            raise
    finally:
        _unmap(mm)


__all__ = ["save_tensors", "load_tensors", "load_metadata", "save", "load", "open", "KilnFile",
           "TensorWriter"]
