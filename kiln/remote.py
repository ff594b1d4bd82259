"""Kiln tensor files on web servers and in object stores, read lazily.

``kiln.open("https://host/model.kiln")`` or ``kiln.open("s3://bucket/model.kiln")``
(any fsspec URL: ``s3://``, ``gs://``, ``memory://``...) returns a
:class:`RemoteFile`.  Opening costs one range request for the first 64 KiB
(for an fsspec URL also a metadata request for the size and version), whose
header is checked before anything more is asked for, and, when the table is
longer, one more request for the rest of the table; the table is then
checked by the same kernel that checks a local file.  A tensor's bytes are
fetched when it is first accessed, and a leading-axis slice
(:meth:`RemoteFile.rows`) fetches only its rows.

``http(s)://`` URLs are read by kiln's own client (``kiln._fetch``): every
answer is compared with its question (status, ``Content-Range``,
``Content-Length``, ``Content-Encoding``, size and version) before its body
is read, and no more than the bytes asked for are ever read.  Other URLs are
read through fsspec and its filesystem's package (``s3fs``, ``gcsfs``...).

How it works: the table is checked inside a private anonymous mapping the
size of the remote file, whose untouched pages cost no memory.  The open
checks everything the table decides, not the payload contents.  Fetched
payloads are checked by the kernel's ``check_payload`` (bool bytes 0 or 1,
an odd 4-bit tail's high nibble 0, the alignment gap after a payload all
zeros), the check a lazily opened local file runs when a tensor is read, and
then written into that mapping once, before any view of them is handed
out, so tensors are the same zero-copy views a local file gives and keep
the mapping alive the same way.  Bytes of tensors never accessed are never
fetched, never checked and never touched.

A remote file that changes after it was opened is detected: each answer's
size and version (for HTTP the ``Content-Range`` total, ``ETag`` and
``Last-Modified``; for fsspec the size and whatever version the store
reports, read again after each fetch) are compared with those seen at open,
and a difference is :class:`RemoteFileChanged`, never bytes of two versions
decoded together.  An object shorter than its table claims is a
``KilnError`` ``EOF``, as for a local file.  Every transport fault, and
every answer that does not match its question, is :class:`RemoteError`.
"""

import mmap
import operator
import sys
import threading
from typing import Any, Dict, Iterator, List, Optional, Tuple

import numpy as np

from . import _api, _compat, _meta
from . import _wire as W
from ._errors import KilnError, frame_hint
from ._fetch import RemoteError, RemoteFileChanged, source
from ._filemap import TensorFileMapping
from .files import _open_table
from ._tensors import Tensor, TensorDirectory
from ._tensors.directory import _raw_names
from ._tensors.dtypes import element_count

__all__ = ["RemoteFile", "RemoteFileChanged", "RemoteError", "RowSource", "is_url", "head"]

_HEAD_GUESS = 64 << 10          # first request: the header and, usually, the whole table
_MAP_NORESERVE = 0x4000 if sys.platform.startswith("linux") else 0
_ALIGN = W.DIR_ALIGN - 1


def is_url(path: Any) -> bool:
    """True for a string naming an fsspec URL other than a plain local path."""
    if not isinstance(path, str) or "://" not in path:
        return False
    scheme = path.split("://", 1)[0]
    return scheme.replace("+", "").replace("-", "").replace(".", "").isalnum() and \
        scheme != "file"


def head(url: str, n: int, storage_options: Optional[Dict[str, Any]] = None
         ) -> Tuple[int, bytes]:
    """The object's size and its first ``n`` bytes (fewer when it is shorter),
    with one range request (``kiln inspect`` and ``kiln check`` of a URL)."""
    src = source(url, storage_options)
    try:
        data = src.first(max(n, 1))[:n]   # a range is at least one byte
        return int(src.size or 0), data
    finally:
        src.close()


def _blank(size: int) -> mmap.mmap:
    """A private, zero-filled, writable mapping of ``size`` bytes that costs
    memory only for the pages written (or read, on systems without a shared
    zero page)."""
    if hasattr(mmap, "MAP_PRIVATE"):
        flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_NORESERVE
        return mmap.mmap(-1, size, flags=flags, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    return mmap.mmap(-1, size)  # pragma: no cover - Windows


class RemoteFile(TensorFileMapping):
    """A Kiln tensor file behind an fsspec URL: the table checked once, payloads
    fetched on access.  Made by :func:`kiln.open` for a URL.

    A ``Mapping[str, Tensor]`` as :class:`kiln.KilnFile` is (``values()``
    and ``items()`` fetch every tensor).  It offers what
    :class:`kiln.KilnFile` offers: ``keys()``, ``f[name]``, ``get``, ``in``,
    ``metadata``, ``rows(name, start, stop)``, ``tensors()``, ``len``,
    iteration, ``close()`` and the ``with`` block.  Tensors are views of a
    private mapping that holds the fetched bytes; they stay valid after the
    file is closed.

    Args:
        url: an ``http(s)://`` URL or another fsspec URL.
        storage_options: for http(s), ``headers`` (a dict of request
            headers) and ``timeout`` (seconds, default 60); for other URLs,
            passed to the fsspec filesystem (credentials, endpoint, ...).
        trusted, max_count, max_bytes: as for :class:`kiln.Decoder`.
        verify: as for :class:`kiln.KilnFile` (the metadata is fetched with
            the first tensor read).

    Raises:
        KilnError: an invalid table (any code :func:`kiln.decode_tensors`
            raises, at its offset in the file); ``EOF`` for an empty object
            or one shorter than its table claims, ``TYPE`` for a fetched
            payload byte the directory check refuses (raised by the read).
        RemoteFileChanged: the object changed after it was opened.
        RemoteError: a transport fault, or an answer that does not match
            its question (see the module doc).
        OSError: ``FileNotFoundError``, ``PermissionError``...
    """

    def __init__(self, url: str, *, storage_options: Optional[Dict[str, Any]] = None,
                 trusted: bool = False, max_count: int = W.DEFAULT_MAX_COUNT,
                 max_bytes: int = W.DEFAULT_MAX_BYTES, verify: bool = False) -> None:
        _api._check_caps(max_count, max_bytes)
        self._verify = bool(verify)
        self._sums: Optional[bytes] = None
        self.path = url
        self._storage_options = dict(storage_options or {})
        self._src = source(url, self._storage_options)
        self._lock = threading.Lock()
        self._mm: Optional[mmap.mmap] = None
        try:
            first = self._src.first(_HEAD_GUESS)
        except BaseException:
            self._src.close()
            raise
        size = self.size = int(self._src.size or 0)
        self._version = self._src.version
        if size == 0:
            self._src.close()
            raise KilnError("EOF", 0, "%s is empty: a Kiln file has at least a header" % url)
        try:
            mm = _blank(size)
        except (OSError, OverflowError, ValueError) as e:
            self._src.close()
            raise KilnError("LIMIT", 0, "%s: the store reports %d bytes, which cannot be mapped "
                            "here (%s)" % (url, size, e)) from None
        try:
            d, base = self._table(mm, first, trusted, max_count, max_bytes)
        except BaseException:
            _close(mm)
            self._src.close()
            raise
        # a server without ranges sent the whole (small) object at once: payloads are
        # taken from that answer (checked when read); else each read is a request
        self._head = first[base:] if self._src.whole else b""
        self._mm = mm
        self._all = d
        self._base = base
        names = _raw_names(d._rows)
        reserved = _meta.META_NAME.encode()
        self._has_meta = bool(names) and names[-1] == reserved
        for i, name in enumerate(names[:-1]):
            if name == reserved:
                self.close()
                raise KilnError("TYPE", W.HEADER_SIZE + W.DESC_SIZE * i + W.D_NAME_OFF,
                                "%s: the name %r is reserved for the metadata, the last tensor"
                                % (url, reserved.decode()))
        self._count = len(names) - self._has_meta
        self._done: Dict[int, List[Tuple[int, int]]] = {}   # fetched byte ranges, by tensor
        self._meta: Any = _UNSET
        self._dir: Optional[TensorDirectory] = None
        self._names: Optional[Dict[Any, int]] = None

    def _table(self, mm: mmap.mmap, first: bytes, trusted: bool, max_count: int,
               max_bytes: int) -> Tuple[TensorDirectory, int]:
        """The header checked (steps 1 to 6) before the rest of the table is asked
        for, then the table: ``(directory, payload base)``."""
        mm[:min(len(first), W.HEADER_SIZE)] = first[:W.HEADER_SIZE]
        try:
            base = _compat.kernels.check_header(mm, 0, max_count, max_bytes)
        except KilnError as e:
            if first[:4] == W.FRAME_MAGIC:
                raise frame_hint(e) from None
            raise
        mm[:min(len(first), base)] = first[:base]
        if base > len(first):
            mm[len(first):base] = self._src.read(len(first), base, "the table")
        d, _ = _open_table(mm, trusted, max_count, max_bytes)
        return d, base

    # --- fetching -----------------------------------------------------------

    def _span(self, i: int) -> Tuple[int, int, int]:
        """Payload ``i``'s start and end, and the end of the gap after it (the
        gap is fetched and checked with it)."""
        row = self._all._rows[i]
        start = self._base + row[10]
        end = start + row[11]
        return start, end, min((end + _ALIGN) & ~_ALIGN, self.size)

    def _fetch(self, i: int, lo: int, hi: int) -> None:
        """Make bytes [lo, hi) of payload span ``i`` present (absolute offsets)."""
        with self._lock:
            if self._mm is None:
                raise ValueError("%s is closed" % self.path)
            done = self._done.setdefault(i, [])
            for a, b in _missing(done, lo, hi):
                self._fill(i, a, b)
                done.append((a, b))
                done.sort()
                _merge(done)

    def _fill(self, i: int, a: int, b: int) -> None:
        start, end, _ = self._span(i)
        row = self._all._rows[i]
        have = self._base + len(self._head)    # bytes [base, have) came with the table
        what = "tensor %r" % (_text(row[2]) if row[2] else i)
        if b <= have:
            data = self._head[a - self._base:b - self._base]
        elif a < have:
            data = self._head[a - self._base:] + self._src.read(have, b, what)
        else:
            data = self._src.read(a, b, what)
        try:
            _compat.kernels.check_payload(data, a - start, row[0], element_count(row[1]),
                                          row[11], start)
        except KilnError as e:
            raise KilnError(e.code, e.offset, "%s: %s" % (self.path, e.reason)) from None
        assert self._mm is not None
        self._mm[a:b] = data

    def _tensors_view(self) -> TensorDirectory:
        d, view = self._all, self._dir          # read once: close() may run in another thread
        if self._mm is None or d is None:
            raise ValueError("%s is closed" % self.path)
        if view is None:
            view = d if not self._has_meta else TensorDirectory._from_table(
                d._rows[:-1], d._buf, d._pb, d._errors)
            self._dir = view
        return view

    def _position(self, name: Any) -> int:
        d = self._tensors_view()
        if isinstance(name, str):
            if self._names is None:
                self._names = {n: i for i, n in enumerate(d.names) if n is not None}
            try:
                return self._names[name]
            except KeyError:
                raise KeyError(name) from None
        index = getattr(name, "__index__", None)
        if index is None or isinstance(name, bool):
            raise KeyError(name)
        k, n = index(), self._count
        if not -n <= k < n:
            raise IndexError("tensor index %d out of range for %d tensors" % (k, n))
        return k % n

    # --- the KilnFile interface -----------------------------------------------

    def _view(self) -> TensorDirectory:
        return self._tensors_view()

    def keys(self) -> List[str]:  # type: ignore[override]  # a list, as a directory's
        return self._tensors_view().keys()

    def __iter__(self) -> Iterator[str]:
        return iter(self._tensors_view())

    def __len__(self) -> int:
        self._tensors_view()                    # a closed file says so
        return self._count

    def __contains__(self, name: object) -> bool:
        return name in self._tensors_view()

    def __getitem__(self, name: Any) -> Tensor:
        if isinstance(name, slice):             # as a directory slices: a list of tensors
            return [self[i] for i in range(*name.indices(len(self)))]  # type: ignore[return-value]
        i = self._position(name)
        start, _, gap_end = self._span(i)
        self._fetch(i, start, gap_end)
        t = self._tensors_view()[name]
        if self._verify and self._digests() is not None:
            from ._checksum import check
            check(self._digests(), i, t.data, t.name, start, self.path)  # type: ignore[arg-type]
        return t

    def tensors(self) -> TensorDirectory:
        """Every tensor, fetched (one range request each), as a directory of views."""
        for i in range(self._count):
            start, _, gap_end = self._span(i)
            self._fetch(i, start, gap_end)
        if self._verify and self._digests() is not None:
            from ._checksum import check_directory
            check_directory(self._digests(), self._tensors_view(), self.path)  # type: ignore[arg-type]
        return self._tensors_view()

    def rows(self, name: Any, start: int, stop: int) -> np.ndarray:
        """Rows ``start:stop`` of a tensor's leading axis, fetching only those rows."""
        d = self._tensors_view()
        i = self._position(name)
        row = d._rows[i]
        shape = row[1]
        width = W.DTYPES[row[0]][1] if row[0] <= W.DTYPE_MAX else 0
        lo, _, gap_end = self._span(i)
        if not shape or width == 0:
            return self[name].numpy()[start:stop]     # packed or opaque: the whole payload
        n = shape[0]
        a, b, _ = slice(start, stop).indices(n)
        if b <= a:
            return d[name].numpy()[0:0]
        per = row[11] // n if n else 0
        hi = lo + b * per if b < n else gap_end
        self._fetch(i, lo + a * per, hi)
        return d[name].numpy()[a:b]

    def row_source(self, name: Any) -> "RowSource":
        """What a worker needs to read rows of tensor ``name`` with one range
        request each, without opening the file again (see ``kiln.dask.from_kiln``)."""
        d = self._tensors_view()
        i = self._position(name)
        row = d._rows[i]
        if row[0] > W.DTYPE_MAX or W.DTYPES[row[0]][1] == 0:
            raise TypeError("tensor %r has no rows of whole bytes" % (name,))
        n = row[1][0] if row[1] else 1   # rank 0: one row, the value
        return RowSource(self.path, self._storage_options, self._version, self._span(i)[0],
                         row[11] // n if n else 0, tuple(row[1]), row[0])

    def _digests(self) -> Optional[bytes]:
        """The recorded payload CRC-32s (the metadata fetched on first use), or None."""
        self.metadata
        return self._sums

    @property
    def metadata(self) -> Optional[Dict[str, Any]]:
        """The metadata dict (fetched on first use), or None when the file has none."""
        if self._meta is _UNSET:
            if not self._has_meta:
                self._meta = None
            else:
                from .files import _split_metadata
                i = len(self._all._rows) - 1
                start, _, gap_end = self._span(i)
                self._fetch(i, start, gap_end)
                _, self._meta, self._sums = _split_metadata(self._all, self._mm, self.path)
        return self._meta

    def close(self) -> None:
        """Stop using the file; views already taken stay valid."""
        with self._lock:
            mm, self._mm = self._mm, None
            self._src.close()
        self._dir = None
        if mm is not None:
            self._all = None  # type: ignore[assignment]
            _close(mm)

    def __enter__(self) -> "RemoteFile":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._mm is None else "%d tensors" % self._count
        return "<kiln.RemoteFile %s, %s>" % (self.path, state)


_UNSET = object()


class RowSource:
    """Rows of one tensor of a remote file, read with one range request each
    and checked against the version the file had when it was opened."""

    def __init__(self, url: str, storage_options: Dict[str, Any], version: Tuple[Any, ...],
                 offset: int, row_bytes: int, shape: Tuple[int, ...], code: int) -> None:
        self.url, self.storage_options, self.version = url, storage_options, version
        self.offset, self.row_bytes, self.shape, self.code = offset, row_bytes, shape, code

    def read(self, start: int, stop: int) -> bytes:
        """The bytes of rows [start, stop) (bool bytes checked); ``IndexError``
        unless ``0 <= start <= stop <= rows`` (a rank-0 tensor is one row).
        An empty range makes no request."""
        start, stop = operator.index(start), operator.index(stop)
        n = self.shape[0] if self.shape else 1
        if not 0 <= start <= stop <= n:
            raise IndexError("rows %d..%d are not a range of the %d rows of %s"
                             % (start, stop, n, self.url))
        if start == stop or self.row_bytes == 0:
            # nothing to fetch: and a store may read the empty range bytes=N-(N-1)
            # as no range at all (S3: the whole object) or refuse it (416)
            return b""
        src = source(self.url, self.storage_options, self.version)
        try:
            a = self.offset + start * self.row_bytes
            data = src.read(a, self.offset + stop * self.row_bytes, "rows %d..%d" % (start, stop))
        finally:
            src.close()
        n_bytes = self.row_bytes * n
        try:
            _compat.kernels.check_payload(data, a - self.offset, self.code,
                                          element_count(self.shape), n_bytes, self.offset)
        except KilnError as e:
            raise KilnError(e.code, e.offset, "%s: %s" % (self.url, e.reason)) from None
        return data


def _missing(done: List[Tuple[int, int]], lo: int, hi: int) -> List[Tuple[int, int]]:
    out, at = [], lo
    for a, b in done:
        if b <= at or a >= hi:
            continue
        if a > at:
            out.append((at, a))
        at = max(at, b)
    if at < hi:
        out.append((at, hi))
    return out


def _merge(done: List[Tuple[int, int]]) -> None:
    k = 0
    while k + 1 < len(done):
        if done[k][1] >= done[k + 1][0]:
            done[k] = (done[k][0], max(done[k][1], done[k + 1][1]))
            del done[k + 1]
        else:
            k += 1


def _text(name: bytes) -> str:
    return name.decode("utf-8", "replace")


def _close(mm: mmap.mmap) -> None:
    try:
        mm.close()
    except BufferError:
        pass   # views live: the mapping goes with the last of them
