"""Record containers read as a stream: ``kiln.StreamDecoder`` and ``kiln.iter_records``.

The decoder is fed bytes in any chunking and hands back each record the
moment its last byte arrives.  It holds at most one record's bytes plus the
chunk being fed: offsets of past records are not kept; the index at the
stream's end is checked against a running checksum of them instead.  A
record length above ``max_record_bytes`` is ``LIMIT`` as soon as its head
arrives, before any of its bytes are kept.  The index's entries are checked
by the rules a file's reader applies, as they arrive (the first fault is
raised after the index's checksum, in a file's order).
"""

import zlib
from typing import Any, Generic, Iterator, List, Optional, TypeVar, Union, overload
from typing import Type as _ClassOf

from .. import _compat
from .._api import Annotation, Decoder
from .._errors import KilnError
from .._types import Type, as_type
from . import _format as F

R = TypeVar("R")
_HEADER, _HEAD, _INDEX, _TRAILER, _DONE = range(5)
_CHUNK = 64 << 10


class StreamDecoder(Generic[R]):
    """Decode a record container fed in pieces (a socket, an asyncio protocol).

    Args:
        type: the record type (as for :class:`kiln.RecordFile`); None: the
            type text the stream's head stores (``self.type`` is set when the
            head arrives; ``TypeError`` from ``feed`` for a head without one).
        verify: check each record's value checksum (the index's is always
            checked, as a local file's is).
        max_record_bytes: the cap on one record's value length (default
            256 MiB): a longer one is ``LIMIT`` when its head arrives.
        name: what error messages call the stream.
        decode_options: as for :class:`kiln.Decoder`.

    ``feed(data)`` returns the records that ``data`` completes (a list,
    maybe empty); records completed before a fault in the same ``data`` are
    returned and the fault is raised by the next ``feed`` or ``eof``, so
    every chunking gives the same records and the same error; ``eof()``
    says the stream ended: ``EOF`` when it ended inside the header or a
    record.  A stream may end after any complete
    record; when the writer closed it, its index and trailer are checked
    too, and nothing may follow them (``TRAILING``).  ``done`` is true once
    the trailer was read.

    Example:
        >>> import io
        >>> out = io.BytesIO()
        >>> with kiln.RecordWriter(out, "i32") as w:
        ...     _ = [w.write(v) for v in (5, 6, 7)]
        >>> d = kiln.StreamDecoder("i32")
        >>> data = out.getvalue()
        >>> d.feed(data[:80]), d.feed(data[80:])
        ([5], [6, 7])
        >>> d.eof()
    """

    @overload
    def __init__(self: "StreamDecoder[R]", type: _ClassOf[R], *, verify: bool = ...,
                 max_record_bytes: int = ..., name: str = ..., **decode_options: Any) -> None:
        ...

    @overload
    def __init__(self: "StreamDecoder[Any]", type: Union[Type, str, Annotation, None] = ..., *,
                 verify: bool = ..., max_record_bytes: int = ..., name: str = ...,
                 **decode_options: Any) -> None:
        ...

    def __init__(self, type: Any = None, *, verify: bool = True,
                 max_record_bytes: int = F.DEFAULT_MAX_RECORD, name: str = "stream",
                 **decode_options: Any) -> None:
        if isinstance(max_record_bytes, bool) or not isinstance(max_record_bytes, int) or \
                max_record_bytes < 0:
            raise ValueError("max_record_bytes must be a non-negative int")
        self._options = decode_options
        self.type_text: Optional[str] = None
        self._start = F.HEADER_SIZE
        self.type: Any = None
        self._hash = 0
        self._typed = type is not None
        if self._typed:
            self._setup(type)
        self._k: Any = decode_options.get("kernels") or _compat.kernels
        self._verify = bool(verify)
        self._cap = max_record_bytes
        self.name = name
        self._buf = bytearray()
        self._pos = 0                 # container offset of self._buf[0]
        self._state = _HEADER
        self.count = 0                # records completed so far
        self._ocrc = 0                # running CRC of the record offsets (the index check)
        self._rec = (0, 0, 0, 0)      # the index record: offset, kind, pad, length
        self._icrc = self._vcrc = 0
        self._left = 0
        self._index_pos = 0
        self._error: Optional[KilnError] = None

    def _setup(self, type: Any) -> None:
        self.type = as_type(type)
        self._hash = self.type.schema_hash
        dec = Decoder(self.type, True, **self._options)
        self._prog = dec._prog
        self._budget = [dec.max_count]   # one zero-size budget for the whole stream

    @property
    def done(self) -> bool:
        return self._state == _DONE

    def feed(self, data: Any) -> List[R]:
        """The records completed by ``data``."""
        if self._error is not None:
            raise self._error
        buf = self._buf
        buf += data
        out: List[R] = []
        at = 0
        try:
            while True:
                if self._state == _HEAD:     # whole records: the kernel's loop
                    before = len(out)
                    try:
                        at, self.count, self._ocrc = self._k.decode_stream(
                            self._prog, buf, at, self._pos, self.count, self._verify,
                            self._cap, self._ocrc, out, self._budget)
                    except KilnError:
                        # the records the kernel took before the fault are handed
                        # out: count them, as a byte-by-byte feed would have
                        self.count += len(out) - before
                        raise
                used = self._step(buf, at, out)
                if used < 0:
                    break
                at += used
        except KilnError as e:
            self._error = e
            if not out:
                raise
        finally:
            if at:
                del buf[:at]
                self._pos += at
        return out

    def _step(self, buf: bytearray, at: int, out: List[Any]) -> int:
        """Consume one part at ``buf[at:]``; returns its length, or -1 when
        more bytes are needed."""
        have = len(buf) - at
        pos = self._pos + at
        st = self._state
        if st == _HEAD:
            if have < F.HEAD_SIZE:
                return -1
            length, kind, pad = F.parse_head(buf, at, pos, self.count)
            if kind == F.KIND_INDEX:
                seed = zlib.crc32(buf[at:at + F.HEAD_SIZE])
                return self._index_head(pos, length, pad, seed)
            if length > self._cap:
                raise KilnError("LIMIT", pos, "%s: record %d: value length %d is above "
                                "max_record_bytes=%d" % (self.name, self.count, length,
                                                         self._cap))
            # not all here yet: the kernel's loop takes the record (every check,
            # the decode, the shared zero-size budget) once its last byte arrives
            return -1
        if st == _INDEX:
            return self._index_body(buf, at, have, pos)
        if st == _HEADER:
            if have < F.HEADER_SIZE:
                return -1
            size = F.check_header(buf[at:at + min(have, F.TYPE_TEXT_AT)],
                                  self._hash if self._typed else None, self.name)
            if size > have or size == F.TYPE_TEXT_AT:
                return -1           # the type text's length, or the text, is still to come
            if size > F.HEADER_SIZE:
                self.type_text = F.read_type_text(buf[at:at + size], size, self.name)
            if not self._typed:
                if self.type_text is None:
                    raise TypeError("%s: the stream stores its records' type hash only "
                                    "(written with store_type=False, or by an earlier kiln): "
                                    "pass the type" % self.name)
                self._setup(self.type_text)
            self._start = size
            self._state = _HEAD
            return size
        if st == _TRAILER:
            if have < F.TRAILER_SIZE:
                return -1
            ip, n = F.parse_trailer(buf, at, pos, self._hash, self.name, self._start)
            if ip != self._index_pos or n != self.count:
                raise KilnError("FRAME", pos, "%s: the trailer names the index at byte %d and "
                                "%d records; the stream had them at byte %d and %d records"
                                % (self.name, ip, n, self._index_pos, self.count))
            self._state = _DONE
            return F.TRAILER_SIZE
        if have:
            raise KilnError("TRAILING", pos, "%s: bytes after the trailer" % self.name)
        return -1

    def _index_head(self, pos: int, length: int, pad: int, seed: int) -> int:
        if length != F.index_length(self.count):
            raise KilnError("FRAME", pos, "%s: an index of %d bytes after %d records (%d "
                            "expected)" % (self.name, length, self.count,
                                           F.index_length(self.count)))
        self._index_pos = pos
        self._rec = (pos, F.KIND_INDEX, pad, length)
        self._left = pad + length + F.CRC_SIZE
        self._icrc, self._vcrc = 0, seed
        self._ent = (0, 0, b"", None)   # entries checked, the last one, a partial one, a fault
        self._state = _INDEX
        return F.HEAD_SIZE

    def _entries(self, piece: bytes, first: int) -> None:
        """Check the index entries in ``piece`` as a file's reader does
        (``check_offsets``: entry 0 at the first record, each at least one
        record after the one before, none past the index), keeping only the
        last entry; the first fault is kept for the end of the index, where
        the index's checksum is checked before it, as a file's is."""
        k, prev, part, bad = self._ent
        least = F.OVERHEAD + F.MIN_VALUE
        raw = part + piece
        whole = len(raw) // 8 * 8
        if bad is None and whole:
            import numpy as np
            o = np.frombuffer(raw, dtype="<u8", count=whole // 8)
            j = F.first_bad_entry(o, prev, k, self._start, self._index_pos)
            if j is not None:
                bad = (k + j, int(o[j]))
            prev = int(o[-1])
        k += whole // 8
        if bad is None and k == self.count and k and self._index_pos < prev + least:
            bad = (k - 1, prev)                    # the last record runs into the index
        if bad is not None and not isinstance(bad, KilnError):
            bad = KilnError("FRAME", first + 8 * bad[0], "%s: index entry %d (%d) is out of "
                            "order or outside the records (%d..%d)"
                            % (self.name, bad[0], bad[1], self._start, self._index_pos))
        self._ent = (k, prev, raw[whole:], bad)

    def _index_body(self, buf: bytearray, at: int, have: int, pos: int) -> int:
        """The index, checked piece by piece: pad, frame and count, entries, CRC."""
        start, _, pad, length = self._rec
        total = pad + length + F.CRC_SIZE
        done = total - self._left             # bytes of the index body already consumed
        fixed = pad + F.INDEX_ENTRIES
        if done < fixed:                       # pad, frame and count come whole
            if have < fixed:
                return -1
            v = at + pad
            F.check_index_frame(buf, v, pos + pad, self.count, self.name)   # as a file: first
            F.check_body(buf, at, pos, pad, length, self.count, False, 0)
            self._vcrc = zlib.crc32(buf[at:v + F.INDEX_ENTRIES], self._vcrc)
            self._left -= fixed
            return fixed
        entries_left = self._left - F.CRC_SIZE
        if entries_left:
            take = min(have, entries_left)
            if not take:
                return -1
            piece = bytes(buf[at:at + take])
            self._vcrc = zlib.crc32(piece, self._vcrc)
            self._icrc = zlib.crc32(piece, self._icrc)
            self._entries(piece, start + F.HEAD_SIZE + pad + F.INDEX_ENTRIES)
            self._left -= take
            return take
        if have < F.CRC_SIZE:
            return -1
        first = start + F.HEAD_SIZE + pad + F.INDEX_ENTRIES
        # a file's order: the index's checksum (always, as a local file's), its
        # entries' rules, then the entries against the records the stream had
        if F.CRC.unpack_from(buf, at)[0] != self._vcrc:
            raise KilnError("CHECKSUM", pos, "%s: index checksum mismatch" % self.name)
        if self._ent[3] is not None:
            raise self._ent[3]
        if self._icrc != self._ocrc:
            raise KilnError("FRAME", first, "%s: the index entries do not match the offsets "
                            "of the records in the stream" % self.name)
        self._state = _TRAILER
        return F.CRC_SIZE

    def eof(self, recover: bool = False) -> None:
        """The stream ended: ``EOF`` if it ended inside the header, a record,
        the index or the trailer, or before the index (the writer was killed
        or never closed: a crash must not pass for a clean end).  With
        ``recover``, an end after a complete record is accepted: the records
        handed out are the stream's complete records."""
        if self._error is not None:
            raise self._error
        have = len(self._buf)
        st = self._state
        if st == _DONE or (st == _HEAD and not have and recover):
            return
        if st == _HEAD and not have:
            raise KilnError("EOF", self._pos, "%s: the stream ended after %d complete "
                            "record%s with no index and no trailer (its writer was killed or "
                            "never closed; recover=True accepts the complete records)"
                            % (self.name, self.count, "" if self.count == 1 else "s"))
        if st == _HEADER:
            raise KilnError("EOF", self._pos + have, "%s: ended after %d bytes, inside the "
                            "record container's head (its 16-byte header and any type text)"
                            % (self.name, have))
        if st == _HEAD:
            start = self._pos
            raise KilnError("EOF", self._pos + have, "%s: record %d (from byte %d) is cut "
                            "short: the stream ended at byte %d"
                            % (self.name, self.count, start, self._pos + have))
        what = "index" if st == _INDEX else "trailer"
        raise KilnError("EOF", self._pos + have, "%s: the stream ended inside the %s, at byte "
                        "%d" % (self.name, what, self._pos + have))


@overload
def iter_records(fileobj: Any, type: _ClassOf[R], *, verify: bool = ...,
                 max_record_bytes: int = ..., chunk_size: int = ...,
                 recover: bool = ..., **decode_options: Any) -> Iterator[R]: ...


@overload
def iter_records(fileobj: Any, type: Union[Type, str, Annotation, None] = ..., *,
                 verify: bool = ..., max_record_bytes: int = ..., chunk_size: int = ...,
                 recover: bool = ..., **decode_options: Any) -> Iterator[Any]: ...


def iter_records(fileobj: Any, type: Any = None, *, verify: bool = True,
                 max_record_bytes: int = F.DEFAULT_MAX_RECORD, chunk_size: int = _CHUNK,
                 recover: bool = False, **decode_options: Any) -> Iterator[Any]:
    """Yield the records of a container read from a binary stream, in order.

    ``fileobj`` needs only ``read`` (``read1`` is used when it has one, so a
    socket's records come as they arrive); it is never seeked.  Memory holds
    one record plus one chunk, whatever the stream's length.

    Args:
        fileobj: a readable binary stream (a pipe, ``socket.makefile("rb")``,
            ``sys.stdin.buffer``, an open file).
        type: the record type (as for :class:`kiln.RecordFile`; None: the
            stream's stored type text).
        verify, max_record_bytes: as for :class:`kiln.StreamDecoder`.
        chunk_size: the most bytes asked of ``fileobj`` at once.
        recover: accept a stream that ends after a complete record with no
            index and trailer (a killed writer's file): its complete records
            come out and the iteration ends; without it that end raises
            ``EOF`` after the complete records, so a crash never looks like
            a clean end.
        decode_options: as for :class:`kiln.Decoder`.

    Raises:
        KilnError: as :class:`kiln.StreamDecoder`; ``EOF`` for a stream that
            ends inside a record, naming the record's number and the byte, or
            (unless ``recover``) before its index and trailer.

    Example:
        >>> import io
        >>> out = io.BytesIO()
        >>> with kiln.RecordWriter(out, "str") as w:
        ...     _ = w.write("a"), w.write("b")
        >>> list(kiln.iter_records(io.BytesIO(out.getvalue()), "str"))
        ['a', 'b']
    """
    dec: StreamDecoder[Any] = StreamDecoder(
        type, verify=verify, max_record_bytes=max_record_bytes,
        name=str(getattr(fileobj, "name", "stream")), **decode_options)
    read = getattr(fileobj, "read1", None) or fileobj.read
    while True:
        data = read(chunk_size)
        if not data:
            break
        yield from dec.feed(data)
    dec.eof(recover)


__all__ = ["StreamDecoder", "iter_records"]
