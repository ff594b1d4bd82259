"""``kiln.RecordFile``: a record container read at random through its index.

Opening reads the header, the trailer and the index and checks every
entry, the same checks on the same bytes for a local file and a remote one
(whose open fetches a first block of 64 KiB, the trailer and the index
record).  ``rf[i]`` reads the bytes between entries ``i`` and ``i + 1``,
which must be exactly one record: its head, padding, value and checksum.
Values are decoded by the same :class:`kiln.Decoder` as :func:`kiln.decode`
with ``frame=True`` from bytes read into memory this process owns (``pread``
for a local file, range requests for a URL): arrays and tensors in them view
that copy, never the file, and stay valid after ``close``.
"""

import importlib
import os
from itertools import chain
from array import array
from typing import (Any, Dict, Iterator, List, NamedTuple, Optional, Sequence, TypeVar, Union,
                    overload)
from typing import Type as _ClassOf

from .. import _compat
from .._api import Annotation, Decoder
from .._errors import KilnError
from .._types import Type, as_type
from . import _format as F
from ._source import READ_AHEAD, LocalSource, open_source

R = TypeVar("R")
_INDEX_DECODERS: Dict[Any, Decoder] = {}


class Recovery(NamedTuple):
    """Where and why a ``recover=True`` scan stopped.

    ``offset``: the end of the last complete record (where the damaged or
    missing part begins); ``error``: the :class:`kiln.KilnError` that ended
    the scan (its own offset is where the fault was seen)."""
    offset: int
    error: KilnError


def _index_decoder(kernels: Any) -> Decoder:
    kernels = kernels or _compat.kernels
    dec = _INDEX_DECODERS.get(kernels)
    if dec is None:
        dec = _INDEX_DECODERS[kernels] = Decoder(F.INDEX_TYPE, True, kernels=kernels)
    return dec


def _reopen(source: Any, type: Any, recover: bool, verify: bool,
            storage_options: Any, options: Dict[str, Any],
            version: Any = None) -> "RecordFile[Any]":
    """A pickled RecordFile opened again; a remote one at ``version`` only
    (another is :class:`kiln.remote.RemoteFileChanged`)."""
    options = dict(options)
    if isinstance(options.get("kernels"), str):
        options["kernels"] = importlib.import_module(options["kernels"])
    rf: RecordFile[Any] = RecordFile.__new__(RecordFile)
    rf._known = version
    rf.__init__(source, type, recover=recover, verify=verify,  # type: ignore[misc]
                storage_options=storage_options, **options)
    return rf


class RecordFile(Sequence[R]):
    """A record container opened for reading: a typed, read-only sequence.

    Args:
        source: a path, a binary file object, or an fsspec URL (``s3://``,
            ``https://``, ``memory://``...), read with range requests.
        type: the record type: a :class:`kiln.Type`, type text, or a bound
            dataclass / NamedTuple (then ``rf[i]`` is an instance of it, and
            type checkers know it: ``RecordFile[Sample]``).  Omitted (None):
            the type text the file's head stores (files written with the
            default ``store_type=True``); records then decode as with that
            type text, structs as dicts; ``rf.type`` is the type.  A file
            with no type text then raises ``TypeError``.  Given, the file's
            hash must match it (and a stored text is checked all the same).
        recover: for a file without a valid trailer or index (a writer that
            was killed), keep every complete record, found by a scan from
            the start; ``rf.recovery`` says where and why the scan stopped.
        verify: check each record's value checksum when it is read (the head
            checksum and the framing are always checked).
        storage_options: for an ``http(s)`` URL, ``headers`` and
            ``timeout`` (read by kiln's own range client, as
            :func:`kiln.open` reads one); for another URL, the fsspec
            filesystem's options.
        decode_options: ``trusted``, ``max_count``, ``max_bytes``, ``copy``,
            ``max_copy_bytes``, ``kernels``: as for :class:`kiln.Decoder`.

    ``rf.type_text`` is the type text the file's head stores, or None.
    ``len(rf)``, ``rf[i]`` (negative too, constant time), ``rf[a:b]`` (a
    list), iteration, ``close()`` and ``with``.  Several threads may read
    one ``RecordFile`` at once.  A ``RecordFile`` opened from
    a path or URL pickles by reopening it, so it can be handed to worker
    processes as a map-style dataset; a URL's pickle carries the version
    (size, ETag or modification time) it was opened at, and the copy raises
    :class:`kiln.remote.RemoteFileChanged` if the object is another one.

    Raises:
        KilnError: ``FRAME`` for a damaged header, trailer, index or record,
            ``CHECKSUM`` for a head, record, index or trailer checksum that
            does not match, ``SCHEMA`` for records of another type,
            ``EOF`` for a file cut short, ``LIMIT`` for a count the file
            cannot hold, and the codes of :func:`kiln.decode` for a bad
            value; ``.offset`` is the byte in the file.
        OSError: the file cannot be opened; for a URL,
            :class:`kiln.remote.RemoteError` (a transport fault, or an answer
            that does not match its question: a server that ignored the
            range request, sent more or other bytes) and
            :class:`kiln.remote.RemoteFileChanged` (the object changed after
            it was opened).

    Example:
        >>> t = "struct{id:i64,w:list<f32>,}"
        >>> with kiln.RecordWriter("data.kilnr", t) as w:
        ...     for i in range(3):
        ...         _ = w.write({"id": i, "w": [i / 2]})
        >>> rf = kiln.RecordFile("data.kilnr", t)
        >>> len(rf), rf[-1]["id"], [r["id"] for r in rf[:2]]
        (3, 2, [0, 1])
        >>> rf.close()
    """

    _known: Any = None     # a remote file's version its pickle was made at (_reopen)

    @overload
    def __init__(self: "RecordFile[R]", source: Any, type: _ClassOf[R], *, recover: bool = ...,
                 verify: bool = ..., storage_options: Optional[Dict[str, Any]] = ...,
                 **decode_options: Any) -> None: ...

    @overload
    def __init__(self: "RecordFile[Any]", source: Any,
                 type: Union[Type, str, Annotation, None] = ..., *,
                 recover: bool = ..., verify: bool = ...,
                 storage_options: Optional[Dict[str, Any]] = ...,
                 **decode_options: Any) -> None: ...

    def __init__(self, source: Any, type: Any = None, *, recover: bool = False, verify: bool = True,
                 storage_options: Optional[Dict[str, Any]] = None,
                 **decode_options: Any) -> None:
        self._args = (source, type, bool(recover), bool(verify), storage_options,
                      decode_options)
        self._kernels = decode_options.get("kernels")
        self._k: Any = self._kernels or _compat.kernels
        self._verify = bool(verify)
        self.recovery: Optional[Recovery] = None
        self._offs: Optional["array[int]"] = None
        self._local: Optional[Any] = None        # the offsets, while open and local
        self._pending: Dict[int, List[Any]] = {}  # each iteration's chunk being handed out
        self._closed = False
        self._options = decode_options
        self._start = F.HEADER_SIZE              # where the records start (after the head)
        self.type_text: Optional[str] = None
        self._typed = type is not None
        self.type: Type = None  # type: ignore[assignment]  # a Type once open
        self._hash = 0
        if self._typed:
            self._setup(type, decode_options)
        self._src = open_source(source, storage_options, self._known)
        self.path = self._src.name
        if isinstance(source, (str, os.PathLike)) and isinstance(self._src, LocalSource):
            # a pickle reopens the same file from another working directory
            self._args = (os.path.abspath(self._src.name),) + self._args[1:]
        try:
            self._open(bool(recover))
        except BaseException:
            self._src.close()
            raise
        if isinstance(self._src, LocalSource) and self._offs is not None:
            self._local = self._offs   # read with pread: rf[i] reads its one record

    def _setup(self, type: Any, decode_options: Dict[str, Any]) -> None:
        """The record type: ``self.type``, its hash and the value decoder."""
        self.type = as_type(type)
        self._hash = self.type.schema_hash
        dec = Decoder(self.type, True, **decode_options)
        self._prog: Any = dec._prog
        self._max_count = dec.max_count   # the zero-size budget of one read

    # --- opening ----------------------------------------------------------------

    def _open(self, recover: bool) -> None:
        src, size = self._src, self._src.size
        self._start, self.type_text = F.open_head(src.read, size,
                                                  self._hash if self._typed else None, self.path)
        if not self._typed:
            if self.type_text is None:
                raise TypeError("%s: the file stores its records' type hash only (written "
                                "with store_type=False, or by an earlier kiln): pass the "
                                "type" % self.path)
            self._setup(self.type_text, self._options)
        try:
            if size < self._start + F.TRAILER_SIZE:
                raise KilnError("EOF", size, "%s: %d bytes, too short for the 40-byte "
                                "trailer (a file not closed: recover=True reads its complete "
                                "records)" % (self.path, size))
            tail = src.read(size - F.TRAILER_SIZE, size)
            ip, n = F.parse_trailer(tail, 0, size - F.TRAILER_SIZE, self._hash,
                                    self.path, self._start)
            self._count = n
            self._index(ip, n, size - F.TRAILER_SIZE)
        except KilnError as e:
            if not recover or e.code == "SCHEMA":
                raise
            self._scan(e)

    def _index(self, ip: int, n: int, trailer_at: int) -> None:
        """Check the index record at ``ip`` and every entry: the same checks on
        the same bytes for a local file (one ``pread``) and a remote one (one
        range request for the index record, 8 bytes an entry)."""
        rec = self._src.read(ip, trailer_at)
        head = rec[:F.HEAD_SIZE]
        length, kind, pad = F.parse_head(head, 0, ip, n)
        if kind != F.KIND_INDEX:
            raise KilnError("FRAME", ip + 8, "%s: the trailer's index position %d holds a "
                            "record, not the index" % (self.path, ip))
        if length != F.index_length(n) or ip + F.OVERHEAD + pad + length != trailer_at:
            raise KilnError("FRAME", ip, "%s: the index record (%d bytes for %d entries) does "
                            "not end where the trailer begins (byte %d)"
                            % (self.path, length, n, trailer_at))
        v = F.HEAD_SIZE + pad
        self._ip, self._entries = ip, ip + v + F.INDEX_ENTRIES
        F.check_index_frame(rec, v, ip + v, n, self.path)
        F.check_body(rec, F.HEAD_SIZE, ip + F.HEAD_SIZE, pad, length, n, True, F.crc(head))
        try:
            offs = _index_decoder(self._kernels).decode(rec[v:v + length])
        except KilnError as e:
            raise F.rewrap(e, ip + v, n)
        self._offs = check_offsets(offs, ip, self._entries, self.path, self._start)

    def _scan(self, why: KilnError) -> None:
        """``recover=True``: every complete record from the start, in order."""
        src, size = self._src, self._src.size
        offs = array("Q")
        pos = self._start
        while True:
            n = len(offs)
            if pos == size:
                err = KilnError("EOF", pos, "the file ends after record %d, without its index "
                                "and trailer (%s)" % (n - 1, why))
                break
            if pos + F.HEAD_SIZE > size:
                err = KilnError("EOF", pos, "record %d: the file ends inside its head" % n)
                break
            try:
                head = src.read(pos, pos + F.HEAD_SIZE, READ_AHEAD)
                length, kind, pad = F.parse_head(head, 0, pos, n)
                if kind == F.KIND_INDEX:
                    raise KilnError("FRAME", pos, "the index begins here but %s" % why.reason)
                end = pos + F.OVERHEAD + pad + length
                if end > size:
                    raise KilnError("EOF", pos, "record %d: %d value bytes run past the end "
                                    "of the file (%d bytes)" % (n, length, size))
                body = src.read(pos + F.HEAD_SIZE, end, READ_AHEAD)
                F.check_body(body, 0, pos + F.HEAD_SIZE, pad, length, n, True, F.crc(head))
            except KilnError as e:
                err = e
                break
            offs.append(pos)
            pos = end
        offs.append(pos)
        self._offs, self._count, self._ip = offs, len(offs) - 1, pos
        self.recovery = Recovery(pos, err)

    # --- reading ------------------------------------------------------------------

    def __len__(self) -> int:
        return self._count

    def _records(self, first: int, last: int, out: List[Any],
                 budget: Optional[List[int]] = None) -> None:
        """Append records ``first..last`` to ``out``: the kernel's record loop
        checks each one (head, kind, length against the index, padding, CRC)
        and decodes it; after a fault ``out`` holds the records before it.
        ``budget`` (``[left]``): the zero-size budget of the whole read these
        records belong to (an iteration); None: one for this call."""
        if self._closed:
            raise ValueError("I/O on a closed RecordFile")
        offs = self._offs
        assert offs is not None
        # consecutive records in reads of up to the source's read_size (one
        # record when it is longer), each byte of a record fetched once; the
        # reads of one call share one zero-size budget
        if budget is None:
            budget = [self._max_count]
        i = first
        step = getattr(self._src, "read_size", _REMOTE_READ)
        while i < last:
            j = i + 1
            while j < last and offs[j + 1] - offs[i] <= step:
                j += 1
            lo = offs[i]
            self._k.decode_records(self._prog, self._src.read(lo, offs[j]), lo, offs, i, j,
                                   self._verify, out, budget)
            i = j

    def _get(self, i: int, budget: Optional[List[int]] = None) -> Any:
        out: List[Any] = []
        self._records(i, i + 1, out, budget)
        return out[0]

    @overload
    def __getitem__(self, i: int) -> R: ...

    @overload
    def __getitem__(self, i: slice) -> List[R]: ...

    def __getitem__(self, i: Union[int, slice]) -> Union[R, List[R]]:
        out: List[R] = []
        offs = self._local   # read once: close() in another thread clears it
        if type(i) is int and offs is not None:     # the common case: one kernel call
            n = self._count
            if -n <= i < n:
                i %= n
                lo = offs[i]
                self._k.decode_records(self._prog, self._src.read(lo, offs[i + 1]), lo, offs,
                                       i, i + 1, self._verify, out)
                return out[0]
        if isinstance(i, slice):
            start, stop, step = i.indices(self._count)
            if step == 1:
                self._records(start, max(start, stop), out)
                return out
            budget = [self._max_count]      # one read: one zero-size budget
            return [self._get(k, budget) for k in range(start, stop, step)]
        i = i.__index__()
        if i < 0:
            i += self._count
        if not 0 <= i < self._count:
            raise IndexError("record %d of a file of %d records" % (i, self._count))
        value: R = self._get(i)
        return value

    def __iter__(self) -> Iterator[R]:
        # the chunks' lists are walked in C: no generator step per record
        return chain.from_iterable(self._chunks())

    def _chunks(self) -> Iterator[Iterator[R]]:
        """The records in lists of a few (the first value comes quickly) up
        to _CHUNK.  close() empties the lists not yet walked, so iteration
        stops at once with the ValueError of a closed file."""
        step = _FIRST_CHUNK
        a = 0
        key = object()
        budget = [self._max_count]   # one zero-size budget for the whole iteration
        try:
            while a < self._count:
                b = min(self._count, a + step)
                out: List[R] = []
                walk = iter(out)
                live = self._pending[id(key)] = [out, walk, False]
                try:
                    self._records(a, b, out, budget)
                except KilnError:
                    yield walk         # the records before the fault come out first
                    raise
                yield walk
                if live[2]:            # close() cut this list short
                    raise ValueError("I/O on a closed RecordFile")
                a = b
                step = min(_CHUNK, 2 * step)
        finally:
            self._pending.pop(id(key), None)

    # --- lifetime -------------------------------------------------------------------

    @property
    def bytes_fetched(self) -> int:
        """Bytes moved from a remote source so far (0 for a local file)."""
        return self._src.bytes_fetched

    def close(self) -> None:
        """Release the file: its descriptor is closed once no read in another
        thread holds it, and every later read is ``ValueError``; values
        already read stay valid (they hold copies of their bytes)."""
        if not self._closed:
            self._closed = True
            self._local = None
            for live in list(self._pending.values()):
                live[2] = live[1].__length_hint__() > 0
                live[0].clear()
            self._src.close()

    def __enter__(self) -> "RecordFile[R]":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __reduce__(self) -> Any:
        source, type, recover, verify, so, options = self._args
        if not isinstance(source, (str, os.PathLike)):
            raise TypeError("a RecordFile opened from a file object cannot be pickled: "
                            "open it by path or URL")
        options = dict(options)
        if options.get("kernels") is not None:
            options["kernels"] = options["kernels"].__name__
        # a remote file's copy reads only the version this one was opened at
        version = getattr(self._src, "version", None)
        return (_reopen, (os.fspath(source), type, recover, verify, so, options, version))

    def __repr__(self) -> str:
        return "kiln.RecordFile(%r, %r, %d records)" % (self.path, getattr(self.type, "text", None),
                                                         self._count)


# iteration decodes records in chunks, from a few (the first value comes
# quickly) up to _CHUNK at a time
_FIRST_CHUNK = 16
_CHUNK = 1024
_REMOTE_READ = READ_AHEAD  # a remote file's records are fetched up to this many bytes at once


def check_offsets(offs: Any, ip: int, entries_at: int, name: str,
                  start: int = F.HEADER_SIZE) -> "array[int]":
    """The index entries as an array with ``ip`` appended, after checking
    that they start at the first record, rise by at least one record each and
    stay before the index (FRAME at the first bad entry)."""
    import numpy as np
    o = np.asarray(offs, dtype=np.uint64)
    bad = None
    if len(o):
        bad = F.first_bad_entry(o, 0, 0, start, ip)
        if bad is None and ip < int(o[-1]) + F.OVERHEAD + F.MIN_VALUE:
            bad = len(o) - 1                   # the last record runs into the index
    elif ip != start:
        raise KilnError("FRAME", ip, "%s: an empty index but the records end at byte %d"
                        % (name, ip))
    if bad is not None:
        raise KilnError("FRAME", entries_at + 8 * bad, "%s: index entry %d (%d) is out of "
                        "order or outside the records (%d..%d)"
                        % (name, bad, int(o[bad]), start, ip))
    out = array("Q")
    out.frombytes(np.ascontiguousarray(o, dtype=np.uint64).tobytes())
    out.append(ip)
    return out


__all__ = ["RecordFile", "Recovery"]
