"""``kiln.RecordWriter``: append framed values to a record container.

A record is written with one ``write`` call on the target (for records under
64 KiB), after its bytes are complete, so a writer killed at any moment
leaves whole records followed by at most one torn one, which every reader
detects by its head or value checksum (see ``spec/records.md``).
"""

import builtins
import os
import threading
from array import array
from typing import Any, Dict, Generic, Optional, TypeVar, Union, overload
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


def _first_payload(value: Any, base: int, depth: int = 0) -> Optional[int]:
    """The offset in the encoded buffer (whose address is ``base``) of the first
    non-empty tensor payload in ``value``, found in field order."""
    import kiln
    if depth > 80:
        return None
    if isinstance(value, kiln.TensorDirectory):
        import numpy as np
        for t in value.values():
            if t.nbytes:     # the payload's raw bytes: no dtype support needed
                return np.frombuffer(t.data, np.uint8).__array_interface__["data"][0] - base
        return None
    items: Any
    if isinstance(value, dict):
        items = value.values()
    elif isinstance(value, (list, tuple)):
        items = value
    elif isinstance(value, kiln.Some):
        items = (value.value,)
    elif hasattr(value, "__dataclass_fields__"):
        items = [getattr(value, k) for k in value.__dataclass_fields__]
    else:
        return None
    for x in items:
        at = _first_payload(x, base, depth + 1)
        if at is not None:
            return at
    return None


class RecordWriter(Generic[T]):
    """Write values of one type as records of a Kiln record container.

    Args:
        target: a path (the file is created or truncated) or a writable
            binary file object (a pipe, ``socket.makefile("wb")``,
            ``sys.stdout.buffer``); a file object is not closed by ``close``.
        type: a :class:`kiln.Type`, type text, or a bound dataclass /
            NamedTuple.
        align: pad records so that the first tensor directory of each record
            has its payloads 64-byte aligned in the file (costs one lazy
            decode of each record whose type holds ``tensors``).
        round_floats, kernels: as for :class:`kiln.Encoder`.

    ``write(value)`` returns the record's index; ``flush()`` makes every
    record written so far recoverable (for a path: written and fsynced);
    ``close()`` writes the index and the trailer.  One writer may be used by
    several threads (writes are serialized).

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
                 round_floats: bool = ..., kernels: Any = ...) -> None: ...

    @overload
    def __init__(self: "RecordWriter[Any]", target: Any, type: Union[Type, str, Annotation], *,
                 align: bool = ..., round_floats: bool = ..., kernels: Any = ...) -> None: ...

    def __init__(self, target: Any, type: Any, *, align: bool = True, round_floats: bool = False,
                 kernels: Any = None) -> None:
        self.type = as_type(type)
        self._kernels = kernels
        self._enc = Encoder(self.type, True, round_floats=round_floats, kernels=kernels)
        self._encode = self._enc.encode
        self._align_dec = None
        if align and "tensors" in self.type.text:
            from .._api import Decoder
            self._align_dec = Decoder(self.type, True, trusted=True, kernels=kernels)
        self._lock = threading.Lock()
        self._dir_synced = False
        self._offsets = array("Q")
        self._closed = False
        self._broken = False
        if hasattr(target, "write"):
            self.path: Optional[str] = None
            self._f = target
            self._own = False
        else:
            self.path = os.fspath(target)
            self._f = builtins.open(self.path, "wb")
            self._own = True
        try:
            self._base = int(self._f.tell())
        except (AttributeError, OSError, ValueError):
            self._base = 0          # a pipe or a socket: alignment counted from the header
        self._pos = 0
        self._put(F.make_header(self.type.schema_hash))

    def _put(self, data: Any) -> None:
        _write_all(self._f, data)
        self._pos += len(data)

    def _pad(self, buf: bytes) -> int:
        if self._align_dec is None:
            return 0
        value = self._align_dec.decode(buf)
        import numpy as np
        base = np.frombuffer(buf, np.uint8).__array_interface__["data"][0]
        at = _first_payload(value, base)
        if at is None or not 0 <= at < len(buf):
            return 0
        return F.pad_for(self._base + self._pos + F.HEAD_SIZE, at)

    def write(self, value: T) -> int:
        """Append one record; returns its index (0, 1, ...)."""
        buf = self._encode(value)
        with self._lock:
            if self._closed:
                raise ValueError("write to a closed RecordWriter")
            if self._broken:
                raise ValueError("an earlier write to this RecordWriter failed: the file ends "
                                 "in a torn record (read it with recover=True)")
            pad = self._pad(buf)
            head = F.make_head(len(buf), F.KIND_RECORD, pad)
            if len(self._offsets) >= U32_MAX:
                raise EncodeError("LIMIT", self._pos, "a record file holds at most %d records "
                                  "(the index is one Kiln list)" % U32_MAX)
            start = self._pos
            first = head + bytes(pad)
            tail = F.CRC.pack(F.crc(buf, F.crc(first)))
            try:
                if len(buf) < _ONE_WRITE:
                    self._put(b"".join((first, buf, tail)))
                else:
                    for part in (first, buf, tail):
                        self._put(part)
            except BaseException:
                # the record may be torn: no index is written for this file (recover=True
                # reads the records before it), and no more records
                self._broken = True
                raise
            self._offsets.append(start)
            return len(self._offsets) - 1

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
                _fsync_dir(os.path.dirname(os.path.abspath(self.path or ".")))
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
            finally:
                if self._own:
                    self._f.close()

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


__all__ = ["RecordWriter"]
