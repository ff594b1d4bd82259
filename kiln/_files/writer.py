"""The streaming writer: ``TensorWriter`` declares every tensor, writes each
payload at its place (from memory, by rows, or copied file to file) from any
thread, and replaces the target atomically on ``close``, never committing a
file kiln would refuse (``kiln._files.declare``)."""

import os
import threading
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from .. import _compat
from .. import _wire as W
from .._dirhead import block_head
from .._errors import EncodeError, KilnError
from . import checksum as _checksum, progress as _progress
from .atomic import AtomicFile
from .declare import _check_file, _check_meta, _declaration, _desc_at
from .local import file_name, open_regular
from .progress import ProgressLike
from .save import meta_record
from .tables import element_count, normalize_tensors

PathLike = Union[str, "os.PathLike[str]"]
_CODE, _SHAPE, _P = W.R_CODE, W.R_SHAPE, W.R_PAYLOAD   # a write record's fields
_RUN_PIECE = 64 << 10   # write_from_many: payloads this small may share one read and write
_RUN_SPAN = 1 << 20     # ... and the source bytes of one run


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
                 checksum: bool = False, progress: ProgressLike = None) -> None:
        self._checksum = bool(checksum)
        self._user_meta = metadata
        if checksum:   # the digests' room is reserved at the first write, filled at close
            meta_record(_checksum.with_entry(metadata, b""))
        else:
            _checksum.refuse_key(metadata)
        self._meta = meta_record(metadata)   # before the file: a bad value leaves nothing
        self._prog = _progress.make(progress, "write")   # (counts from the first write)
        self._decl: List[tuple] = []
        self._index: Dict[str, int] = {}
        self._state: List[int] = []   # per tensor: _TODO, _BUSY (a thread writes it), _DONE
        self._rows_done: Dict[int, List[Tuple[int, int]]] = {}   # write_rows, tensor by tensor
        self._places: Optional[List[int]] = None
        self._base = 0
        self._cv = threading.Condition()
        self._busy = 0                # writes in progress
        self._out: Optional[AtomicFile] = AtomicFile(path)

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
            self._meta = meta_record(_checksum.with_entry(self._user_meta,
                                                           bytes(4 * len(self._decl))))
        metas = self._decl + ([self._meta[:_P] + (len(self._meta[_P]),)] if self._meta else [])
        for i, m in enumerate(metas):
            _check_meta(m, i)
        head, places, total = block_head(metas, 0, True)
        out = self._live()
        out.pwrite(head, 0)
        os.ftruncate(out.fd, len(head) + total)
        if self._meta is not None:
            out.pwrite(self._meta[_P], len(head) + places[-1])
        _check_file(out, False)   # the table as the decoder would see it (payloads zero)
        self._base = len(head)
        self._places = places
        if self._prog is not None:
            self._prog.start(sum(d[_P] for d in self._decl))

    def _live(self) -> AtomicFile:
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
                if rec[_CODE] != decl[_CODE] or tuple(rec[_SHAPE]) != decl[_SHAPE] or \
                        len(rec[_P]) != decl[_P]:
                    raise ValueError("tensor %r: data is %s %s, declared %s %s"
                                     % (name, _dtype_name(rec[_CODE]), tuple(rec[_SHAPE]),
                                        _dtype_name(decl[_CODE]), decl[_SHAPE]))
                _refuse_payload(decl, rec[_P], 0, True, at)
                self._live().pwrite(rec[_P], at)
            done = True
        finally:
            self._release(i, done)
        if self._prog is not None:
            self._prog.add(decl[_P])

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
            code, shape = decl[_CODE], decl[_SHAPE]
            if code >= W.OPAQUE_MIN or W.DTYPES[code][1] == 0 or not shape:
                raise ValueError("tensor %r has no whole-byte rows: use write()" % (name,))
            if type(start) is not int or start < 0:
                raise ValueError("start must be an int >= 0, not %r" % (start,))
            arr = np.asarray(data)
            rec = normalize_tensors({name: arr})[0] if arr.ndim else None
            if rec is None or rec[_CODE] != code or tuple(rec[_SHAPE][1:]) != shape[1:]:
                raise ValueError("tensor %r: rows must be %s with trailing shape %s, not %s %s"
                                 % (name, W.DTYPES[code][0], shape[1:], arr.dtype, arr.shape))
            k = rec[_SHAPE][0]
            if start + k > shape[0]:
                raise ValueError("tensor %r: rows %d..%d are past its %d rows"
                                 % (name, start, start + k, shape[0]))
            per = decl[_P] // shape[0] if shape[0] else 0
            at = self._base + self._places[i] + start * per   # type: ignore[index]
            _refuse_payload(decl, rec[_P], start * per, False, at)
            with self._cv:   # the rows are ours from here: nobody else may write them
                claimed = self._claim_rows(i, name, start, k)
            if k:
                self._live().pwrite(rec[_P], at)
            claimed = None
            self._rows_written(i, len(rec[_P]))
        finally:
            self._rows_end(i, claimed)

    def _rows_written(self, i: int, nbytes: int) -> None:
        """Rows of tensor ``i`` written (``nbytes``): counted; done once all are."""
        if self._prog is not None:
            self._prog.add(nbytes)
        with self._cv:
            rows = self._rows_done.get(i, [])
            if sum(b - a for a, b in rows) == self._decl[i][_SHAPE][0]:
                self._state[i] = _DONE
                self._rows_done.pop(i, None)

    def _rows_end(self, i: int, claimed: Optional[Tuple[int, int]]) -> None:
        """After a rows write: the rows it ``claimed`` if it failed freed, the writer released."""
        if claimed is not None:
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
        elif self._decl[i][_SHAPE][0] == 0:
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
            fd = open_regular(os.fspath(source)) if owned else source.fileno()
            try:
                dst = self._base + self._places[i]   # type: ignore[index]
                what = "tensor %r from %s" % (name, file_name(source))
                code = decl[_CODE]
                if code == W.DTYPE_BOOL or (code < W.OPAQUE_MIN and W.DTYPES[code][1] == 0):
                    _copy_checked(out, fd, offset, decl, dst, what)
                else:
                    out.copy_in(fd, offset, decl[_P], dst, what)
            finally:
                if owned:
                    os.close(fd)
            done = True
        finally:
            self._release(i, done)
        if self._prog is not None:
            self._prog.add(decl[_P])

    def write_from_many(self, pairs: Sequence[Tuple[str, int]], source: Any) -> None:
        """``write_from(name, source, offset)`` for each ``(name, offset)``, in
        order; a run of tensors declared one after another, each at most 64 KiB
        with no rules for its bytes (not bool, not 4-bit), at ascending offsets
        within 1 MiB of ``source``, in one ``pread`` and one ``pwrite``.  Errors are
        ``write_from``'s (a run that fails is left unwritten).

        Example:
            >>> np.arange(6, dtype=np.int16).tofile("raw2.bin")
            >>> with kiln.TensorWriter("many.kiln") as w:
            ...     w.add("a", "i16", (2,))
            ...     w.add("b", "i16", (4,))
            ...     w.write_from_many([("a", 0), ("b", 4)], "raw2.bin")
            >>> [t.numpy().tolist() for t in kiln.load_tensors("many.kiln").values()]
            [[0, 1], [2, 3, 4, 5]]
        """
        if not hasattr(source, "fileno"):   # a path: opened once, every tensor read from it
            path = os.fspath(source)
            with os.fdopen(open_regular(path), "rb", buffering=0) as f:
                f.name = path
                return self.write_from_many(pairs, f)
        run: List[Tuple[str, int, int]] = []   # (name, offset, index) of a run
        for name, offset in pairs:
            i = self._batchable(name, offset)
            if i is not None and run and not (
                    i == run[-1][2] + 1 and offset >= run[-1][1] + self._decl[run[-1][2]][_P]
                    and offset + self._decl[i][_P] - run[0][1] <= _RUN_SPAN):
                self._write_run(run, source)
                run = []
            if i is not None:
                run.append((name, offset, i))
                continue
            if run:
                self._write_run(run, source)
                run = []
            self.write_from(name, source, offset)
        if run:
            self._write_run(run, source)

    def _batchable(self, name: Any, offset: Any) -> Optional[int]:
        """``name``'s index if its payload may go in a run, else None."""
        i = self._index.get(name) if isinstance(name, str) else None
        if i is None or type(offset) is not int or offset < 0 or self._state[i] != _TODO \
                or i in self._rows_done or self._places is None:
            return None
        code, n = self._decl[i][_CODE], self._decl[i][_P]
        if code == W.DTYPE_BOOL or (code < W.OPAQUE_MIN and W.DTYPES[code][1] == 0) or \
                n > _RUN_PIECE:
            return None
        return i

    def _write_run(self, run: List[Tuple[str, int, int]], source: Any) -> None:
        """The payloads of ``run``: one read of their span, one write of their places."""
        if len(run) == 1:
            self.write_from(run[0][0], source, run[0][1])
            return
        claimed: List[int] = []
        with self._cv:
            try:
                for name, _, _ in run:
                    claimed.append(self._claim(name))
            except BaseException:
                for i in claimed:   # unclaimed again
                    self._state[i], self._busy = _TODO, self._busy - 1
                raise
        done = False
        try:
            (_, src0, i0), (_, at1, i1) = run[0], run[-1]
            src1 = at1 + self._decl[i1][_P]
            data = os.pread(source.fileno(), src1 - src0, src0)
            for name, offset, i in run:
                short = offset + self._decl[i][_P] - src0 - len(data)
                if short > 0:
                    raise ValueError("tensor %r from %s: the source ended %d bytes short"
                                     % (name, file_name(source), short))
            places = self._places   # type: ignore[assignment]
            dst0 = places[i0]
            buf = bytearray(places[i1] + self._decl[i1][_P] - dst0)
            for _, offset, i in run:
                n = self._decl[i][_P]
                at = places[i] - dst0
                buf[at:at + n] = data[offset - src0:offset - src0 + n]
            self._live().pwrite(buf, self._base + dst0)
            done = True
        finally:
            for i in claimed:
                self._release(i, done)
        if self._prog is not None:
            self._prog.add(sum(self._decl[i][_P] for i in claimed))

    def write_rows_from(self, name: str, start: int, rows: int, source: Any,
                        offset: int) -> None:
        """Write rows ``start .. start + rows`` of a declared tensor's leading
        axis by copying their bytes from ``source`` (a path or a binary file
        object with a descriptor) at byte ``offset``, file to file as
        :meth:`write_from` copies; threads may copy different rows at once,
        and rows may come from ``write_rows`` too.  For tensors whose row
        blocks sit in other files (the chunks of a distributed checkpoint).

        Raises ``KeyError`` for an undeclared name, ``ValueError`` for a
        tensor without whole-byte rows or of dtype bool (whose bytes
        ``write_rows`` checks), rows past the end or written before, or a
        source that ends early.

        Example:
            >>> np.arange(6, dtype=np.float32).tofile("rows.bin")
            >>> with kiln.TensorWriter("stacked.kiln") as w:
            ...     w.add("x", "f32", (3, 2))
            ...     w.write_rows_from("x", 1, 2, "rows.bin", 8)   # rows 1, 2: values 2..5
            ...     w.write_rows("x", 0, np.zeros((1, 2), np.float32))
            >>> kiln.load_tensors("stacked.kiln")["x"].numpy().tolist()
            [[0.0, 0.0], [2.0, 3.0], [4.0, 5.0]]
        """
        for what, v in (("start", start), ("rows", rows), ("offset", offset)):
            if type(v) is not int or v < 0:
                raise ValueError("%s must be an int >= 0, not %r" % (what, v))
        with self._cv:
            i = self._claim(name, rows=True)
        claimed = None
        try:
            decl = self._decl[i]
            code, shape = decl[_CODE], decl[_SHAPE]
            if code >= W.OPAQUE_MIN or W.DTYPES[code][1] == 0 or not shape or \
                    code == W.DTYPE_BOOL:
                raise ValueError("tensor %r has no whole-byte rows to copy unchecked: use "
                                 "write_rows or write_from" % (name,))
            if start + rows > shape[0]:
                raise ValueError("tensor %r: rows %d..%d are past its %d rows"
                                 % (name, start, start + rows, shape[0]))
            per = decl[_P] // shape[0] if shape[0] else 0
            at = self._base + self._places[i] + start * per   # type: ignore[index]
            with self._cv:
                claimed = self._claim_rows(i, name, start, rows)
            if rows:
                owned = not hasattr(source, "fileno")
                fd = open_regular(os.fspath(source)) if owned else source.fileno()
                try:
                    self._live().copy_in(fd, offset, rows * per, at, "tensor %r from %s"
                                         % (name, file_name(source)))
                finally:
                    if owned:
                        os.close(fd)
            claimed = None
            self._rows_written(i, rows * per)
        finally:
            self._rows_end(i, claimed)

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
                with out:   # committed when the checks pass, else discarded (no temporary file)
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
                    finally:
                        self._out = None   # closed either way
            finally:
                if self._prog is not None:
                    self._prog.close()

    def _write_digests(self, out: AtomicFile) -> None:
        """The payloads' CRC-32s, read back from the file, into the metadata's room."""
        places = self._places
        assert places is not None and self._meta is not None
        sums = _checksum.file_digests(out.fd, [(self._base + places[i], d[_P])
                                               for i, d in enumerate(self._decl)])
        rec = meta_record(_checksum.with_entry(self._user_meta, sums))
        assert rec is not None and len(rec[_P]) == len(self._meta[_P])
        out.pwrite(rec[_P], self._base + places[-1])

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


def _dtype_name(code: int) -> Any:
    return W.DTYPES[code][0] if code in W.DTYPES else code


def _refuse_payload(decl: tuple, data: Any, at: int, tail: bool, where: int) -> None:
    """EncodeError for payload bytes a reader refuses (bool bytes, a packed tail);
    ``at``: where ``data`` starts in the payload, ``where``: in the file."""
    code = decl[_CODE]
    if code == W.DTYPE_BOOL or (code < W.OPAQUE_MIN and W.DTYPES[code][1] == 0):
        fault = _payload_fault(code, element_count(decl[_SHAPE]), data, tail)
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


def _copy_checked(out: AtomicFile, fd: int, offset: int, decl: tuple, dst: int,
                  what: str) -> None:
    """Bool and 4-bit payloads through memory, 8 MiB at a time, checked as the
    directory check would check them."""
    n, done, code = decl[_P], 0, decl[_CODE]
    while done < n:
        chunk = os.pread(fd, min(n - done, 8 << 20), offset + done)
        if not chunk:
            raise ValueError("%s: the source ended %d bytes short" % (what, n - done))
        fault = _payload_fault(code, element_count(decl[_SHAPE]), chunk, done + len(chunk) == n)
        if fault is not None:
            raise ValueError("%s: payload byte %d: %s" % (what, done + fault[0], fault[1]))
        done += len(chunk)
        out.pwrite(chunk, dst)
        dst += len(chunk)


