"""``kiln.RecordWriter``: append framed values to a record container.

A record is written with one ``write`` call on the target (for records under
64 KiB), after its bytes are complete, so a writer killed at any moment
leaves whole records followed by at most one torn one, which every reader
detects by its head or value checksum (see ``spec/records.md``).
"""

import errno
import os
import threading
from array import array
from typing import Any, Dict, Generic, Iterable, Iterator, Optional, TypeVar, Union, overload
from typing import Type as _ClassOf

from .. import _compat
from .._api import Annotation, Encoder
from .._errors import EncodeError
from .._wire import U32_MAX
from .._types import Type, as_type
from . import _format as F

T = TypeVar("T")
_ONE_WRITE = 64 << 10
_INDEX_ENCODERS: Dict[Any, Encoder] = {}


def _index_encoder(kernels: Any) -> Encoder:
    kernels = kernels or _compat.kernels
    enc = _INDEX_ENCODERS.get(kernels)
    if enc is None:
        enc = _INDEX_ENCODERS[kernels] = Encoder(F.INDEX_TYPE, True, kernels=kernels)
    return enc


def _write_all(f: Any, data: Any) -> None:
    """Write every byte (a raw file object may write fewer than asked)."""
    n = f.write(data)
    if n is None or n >= len(data):
        return
    view = memoryview(data)
    while n < len(view):
        m = f.write(view[n:])
        if not m:
            raise OSError("the target accepted no more bytes (%d of %d written)"
                          % (n, len(view)))
        n += m


def _fsync_dir(folder: str) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:          # pragma: no cover - Windows, or a folder we cannot open
        return
    try:
        os.fsync(fd)
    except OSError:          # pragma: no cover - file systems without directory fsync
        pass
    finally:
        os.close(fd)


WRITING = ".kilnr-writing"   # the suffix of a file a RecordWriter is writing


def unfinished(path: Any) -> "list[str]":
    """The files beside ``path`` (beside the file it links to, for a symbolic
    link, as the writer puts them) that a :class:`RecordWriter` of ``path`` was
    writing when it stopped (killed, or closed after an error) and never put
    in place, newest first: ``kiln.RecordFile(name, type, recover=True)``
    reads their records.

    Example:
        >>> kiln.records.unfinished("log.kilnr")
        []
    """
    from .._files.atomic import local_path, resolve_target, tmp_base
    try:   # where the writer writes: beside the file a link names, as create_beside does
        target = resolve_target(local_path(path))
    except OSError:   # a loop of links: no writer could write beside it
        return []
    folder, base = os.path.split(target)
    start = ".%s." % tmp_base(folder, base)
    try:
        names = [n for n in os.listdir(folder) if n.startswith(start) and n.endswith(WRITING)]
    except OSError:
        return []
    found = [os.path.join(folder, n) for n in names]
    return sorted(found, key=lambda p: os.stat(p).st_mtime, reverse=True)


def _keep(it: Iterator[Any], saved: "list[Any]") -> Iterator[Any]:
    for v in it:
        saved.append(v)
        yield v


class RecordWriter(Generic[T]):
    """Write values of one type as records of a Kiln record container.

    Args:
        target: a path or a writable binary file object (a pipe,
            ``socket.makefile("wb")``, ``sys.stdout.buffer``); a file object
            is not closed by ``close``.  A path is never truncated: the
            records go to a new file beside it
            (``.<name>.<pid>.<random>.kilnr-writing``), which replaces the
            path at ``close()`` (``replace="close"``, the default: readers of
            the old file, this process's own records read from it included,
            keep reading it; new readers see the old file or the complete new
            one), or at once (``replace="open"``: the path shows the records
            as they are flushed, as a log does, still a new file).  A writer
            killed, or closed after an error in its ``with`` block, leaves
            its records in that file: :func:`kiln.records.unfinished` names
            it, and ``RecordFile(name, type, recover=True)`` reads them.
        type: a :class:`kiln.Type`, type text, or a bound dataclass /
            NamedTuple.
        align: pad records so that the first tensor directory of each record
            that holds payload bytes has its payloads 64-byte aligned in the
            file (the kernel notes where it writes that directory; a record
            costs one move of its bytes by the pad).
        store_type: store the canonical type text in the file's head, so that
            ``kiln.RecordFile(path)`` and the command line read it with no
            type given (``spec/records.md``, "Type text").  ``False`` writes
            the type's hash alone (a 16-byte header, the layout of files
            written before the type text existed, which every reader reads).
        replace: ``"close"`` or ``"open"``: when a path's new file takes
            its name (see ``target``).
        round_floats, kernels: as for :class:`kiln.Encoder`.

    ``write(value)`` returns the record's index; ``write_many(values)``
    writes many with one kernel call for each 64 KiB; ``flush()`` makes every
    record written so far recoverable (for a path: written and fsynced);
    ``close()`` writes the index and the trailer (and for a path puts the
    file in place).  One writer may be used by several threads (writes are
    serialized; no lock is held while ``write_many`` runs the caller's
    iterator).

    Raises:
        EncodeError: from ``write``, as :func:`kiln.encode`; nothing is
            written for that value.

    Example:
        >>> with kiln.RecordWriter("log.kilnr", "struct{id:i64,msg:str,}") as w:
        ...     w.write({"id": 1, "msg": "hello"}), w.write({"id": 2, "msg": "bye"})
        (0, 1)
        >>> len(kiln.RecordFile("log.kilnr", "struct{id:i64,msg:str,}"))
        2
    """

    @overload
    def __init__(self: "RecordWriter[T]", target: Any, type: _ClassOf[T], *, align: bool = ...,
                 store_type: bool = ..., round_floats: bool = ..., kernels: Any = ...,
                 replace: str = ...) -> None: ...

    @overload
    def __init__(self: "RecordWriter[Any]", target: Any, type: Union[Type, str, Annotation], *,
                 align: bool = ..., store_type: bool = ..., round_floats: bool = ...,
                 kernels: Any = ..., replace: str = ...) -> None: ...

    def __init__(self, target: Any, type: Any, *, align: bool = True, store_type: bool = True,
                 round_floats: bool = False, kernels: Any = None, replace: str = "close") -> None:
        if replace not in ("close", "open"):
            raise ValueError("replace must be \"close\" or \"open\", not %r" % (replace,))
        self.type = as_type(type)
        head = F.make_header(self.type.schema_hash, self.type.text if store_type else None)
        self._kernels = kernels
        self._enc = Encoder(self.type, True, round_floats=round_floats, kernels=kernels)
        self._encode = self._enc.encode
        k: Any = kernels or _compat.kernels
        self._prog = self._enc._prog
        self._record = k.encode_record
        self._records = k.encode_records
        # the kernels pad each record so that its first directory with payload
        # bytes starts 64-aligned in the file (kiln/_kernels_py/records.py)
        self._align = bool(align) and "tensors" in self.type.text
        self._lock = threading.RLock()
        self._dir_synced = False
        self._offsets = array("Q")
        self._closed = False
        self._broken = False
        self._tmp: Optional[str] = None   # the new file, until it takes the path's name
        if hasattr(target, "write"):
            self.path: Optional[str] = None
            self._f = target
            self._own = False
        else:
            from .._files.atomic import create_beside
            from .._files.paths import bytes_path
            self.path = os.fspath(bytes_path(target, "RecordWriter",
                                             "a binary file object (io.BytesIO())"))
            if os.path.isdir(self.path):   # refused now, not at close() after every record
                raise IsADirectoryError(errno.EISDIR, "RecordWriter writes a file, and this "
                                        "path is a folder (name a file inside it)", self.path)
            fd, self._tmp, self._target = create_beside(self.path, WRITING)
            # its own file: a 64 KiB buffer, so a write loop makes a system
            # call per 64 KiB, as write_many does (flush() and close() empty it)
            self._f = os.fdopen(fd, "wb", buffering=_ONE_WRITE)
            self._own = True
            if replace == "open":
                self._put_in_place()
        try:
            self._base = int(self._f.tell())
        except (AttributeError, OSError, ValueError):
            self._base = 0          # a pipe or a socket: alignment counted from the header
        self._pos = 0
        self._put(head)

    def _put(self, data: Any) -> None:
        _write_all(self._f, data)
        self._pos += len(data)

    def _put_in_place(self) -> None:
        """The new file takes the path's name (one rename: never a truncation)."""
        if self._tmp is not None:
            os.replace(self._tmp, self._target)
            self._tmp = None
            self._dir_synced = False

    def _usable(self) -> None:
        if self._closed:
            raise ValueError("write to a closed RecordWriter")
        if self._broken:
            raise ValueError("an earlier write to this RecordWriter failed: the file ends "
                             "in a torn record (read it with recover=True)")

    def _limit(self) -> None:
        raise EncodeError("LIMIT", self._pos, "a record file holds at most %d records "
                          "(the index is one Kiln list)" % U32_MAX)

    def _emit(self, data: Any) -> None:
        try:
            self._put(data)
        except BaseException:
            # the record may be torn: no index is written for this file (recover=True
            # reads the records before it), and no more records
            self._broken = True
            raise

    def write(self, value: T) -> int:
        """Append one record; returns its index (0, 1, ...)."""
        # head, framed value and CRC: one kernel call.  Aligned, the pad
        # depends on where the record lands: framed for the position now,
        # again in the rare case another thread wrote first
        at = self._pos
        rec = self._record(self._prog, value, self._base + at if self._align else -1)
        with self._lock:
            if self._closed or self._broken:
                self._usable()
            offsets = self._offsets
            k = len(offsets)
            if k >= U32_MAX:
                self._limit()
            start = self._pos
            if start != at and self._align:
                rec = self._record(self._prog, value, self._base + start)
            try:
                n = self._f.write(rec)
                if n is not None and n < len(rec):
                    _write_all(self._f, memoryview(rec)[n:])
            except BaseException:
                self._broken = True     # as _emit
                raise
            self._pos = start + len(rec)
            offsets.append(start)
            return k

    def write_many(self, values: Iterable[T]) -> int:
        """Append a record for each value of ``values`` (any iterable, consumed
        once); returns the number written.

        The records are framed by the kernel and written in blocks of about
        64 KiB (one ``write`` call each), so a writer killed meanwhile leaves
        complete records and at most one torn one, as with ``write``.

        Raises:
            EncodeError: for a value that does not encode; the records of the
                values before it are written (``len(writer)`` counts them),
                that value and the ones after it are not, and the writer stays
                usable.  An exception of the iterable itself likewise comes
                after the records of the values it gave.
        """
        with self._lock:
            self._usable()
        return self._many(iter(values))

    def _many(self, it: Iterator[Any]) -> int:
        """Blocks of records framed by the kernel from ``it`` with no lock held
        (the caller's iterator may wait on a thread that calls ``write``),
        each written under the lock: a ``write`` from another thread lands
        between two blocks, never inside one."""
        import numpy as np
        offsets = self._offsets
        n = 0
        more = True
        align = self._align
        saved: "list[Any]" = []
        while more:
            with self._lock:
                self._usable()
                room = U32_MAX - len(offsets)
                at = self._pos
            rel: "array[int]" = array("Q")
            if align:
                # padded for the position now; the values kept in case another
                # thread writes first (the block is then framed again)
                saved.clear()
                data, more, error = self._records(self._prog, _keep(it, saved), room,
                                                  _ONE_WRITE, rel, self._base + at)
            else:
                data, more, error = self._records(self._prog, it, room, _ONE_WRITE, rel)
            if data:
                with self._lock:
                    self._usable()
                    if len(offsets) + len(rel) > U32_MAX:
                        self._limit()
                    start = self._pos
                    if align and start != at:
                        keep = saved[:len(rel)]
                        rel = array("Q")
                        data, _, again = self._records(self._prog, iter(keep), len(keep),
                                                       1 << 62, rel, self._base + start)
                        if again is not None and error is None:   # a value changed meanwhile
                            error, more = again, False
                    self._emit(data)
                    offsets.frombytes((np.frombuffer(rel, np.uint64) +
                                       np.uint64(start)).tobytes())
                n += len(rel)
            if error is not None:
                raise error
            if more and len(offsets) >= U32_MAX:
                for _ in it:
                    self._limit()
                more = False
        return n

    def __len__(self) -> int:
        return len(self._offsets)

    def flush(self) -> None:
        """Every record written so far reaches the target (for a path: the disk)."""
        with self._lock:
            if self._closed:
                return
            self._sync()

    def _sync(self) -> None:
        flush = getattr(self._f, "flush", None)    # an asyncio StreamWriter has none
        if flush is not None:
            flush()
        if self._own:
            os.fsync(self._f.fileno())
            if not self._dir_synced:              # the new file's name, once
                _fsync_dir(os.path.dirname(os.path.abspath(self._tmp or self._target)))
                self._dir_synced = True

    def close(self) -> None:
        """Write the index and the trailer; close the file if ``target`` was a path."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                if self._broken:
                    return
                import numpy as np
                offsets = np.frombuffer(self._offsets, np.uint64) if len(self._offsets) \
                    else np.zeros(0, np.uint64)
                buf = _index_encoder(self._kernels).encode(offsets.astype("<u8"))
                index_pos = self._pos
                # the entries 8-byte aligned in the file
                pad = -(self._base + index_pos + F.HEAD_SIZE + F.INDEX_ENTRIES) % 8
                first = F.make_head(len(buf), F.KIND_INDEX, pad) + bytes(pad)
                self._put(b"".join((first, buf, F.CRC.pack(F.crc(buf, F.crc(first))))))
                self._put(F.make_trailer(index_pos, len(self._offsets),
                                         self.type.schema_hash))
                self._sync()
                if self._own and self._tmp is not None:
                    self._put_in_place()   # complete: it takes the path's name
                    self._sync_name()
            finally:
                if self._own:
                    self._f.close()

    def _sync_name(self) -> None:
        _fsync_dir(os.path.dirname(os.path.abspath(self._target)))

    def __enter__(self) -> "RecordWriter[T]":
        return self

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> None:
        if kind is not None:
            # an exception inside the block: no index and no trailer, so the
            # file never passes for complete; the records written so far are
            # there for recover=True
            with self._lock:
                self._broken = True
        self.close()

    def __repr__(self) -> str:
        return "kiln.RecordWriter(%r, %r, %d records)" % (
            self.path or self._f, self.type.text, len(self._offsets))


__all__ = ["RecordWriter", "unfinished", "WRITING"]
