"""Remote tensor files: :class:`RemoteFile` (``kiln.open`` of a URL) and
:class:`RowSource`; their public face and the full account of how a remote
read works is :mod:`kiln.remote`.  The table is checked inside a private
anonymous mapping the size of the remote file; payloads are fetched
(``kiln._files.fetch``) when first read, checked by the kernel's
``check_payload`` and written into that mapping once."""

import mmap
import operator
import sys
import threading
from typing import Any, Dict, Iterator, List, Optional, Tuple

import numpy as np

from .. import _api, _compat
from .. import _wire as W
from .._errors import KilnError, frame_hint
from . import checksum as _checksum
from .base import TensorFile, has_metadata, open_table, row_bound, split_metadata
from .padded import padded_hint
from .fetch import RemoteError, RemoteFileChanged, source
from .local import unmap as _close
from .paths import is_url
from .tables import Tensor, TensorDirectory, element_count, rows as _rows, without_last

__all__ = ["RemoteFile", "RemoteFileChanged", "RemoteError", "RowSource", "is_url", "head"]

_HEAD_GUESS = 64 << 10          # first request: the header and, usually, the whole table
_MAP_NORESERVE = 0x4000 if sys.platform.startswith("linux") else 0


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


class RemoteFile(TensorFile):
    """A Kiln tensor file behind an fsspec URL: the table checked once, payloads
    fetched on access.  Made by :func:`kiln.open` for a URL.

    A ``Mapping[str, Tensor]`` as :class:`kiln.KilnFile` is (``values()``
    and ``items()`` fetch every tensor).  It offers what
    :class:`kiln.KilnFile` offers: ``keys()``, ``f[name]``, ``get``, ``in``,
    ``metadata``, ``checksums``, ``rows(name, start, stop)``, ``tensors()``, ``len``,
    iteration, ``close()`` and the ``with`` block.  Tensors are views of a
    private mapping that holds the fetched bytes; they stay valid after the
    file is closed.

    Args:
        url: an ``http(s)://`` URL or another fsspec URL.
        storage_options: for http(s), ``headers`` (a dict of request
            headers) and ``timeout`` (seconds, default 60); for other URLs,
            passed to the fsspec filesystem (credentials, endpoint, ...).
        trusted, max_count, max_bytes: as for :class:`kiln.Decoder`.
        verify: as for :class:`kiln.KilnFile`, on by default (the metadata
            is fetched with the first tensor read whole); ``rows()`` fetches
            only those rows and is not compared.

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
                 max_bytes: Optional[int] = None, verify: Optional[bool] = None) -> None:
        _api._check_caps(max_count, W.DEFAULT_MAX_BYTES if max_bytes is None else max_bytes)
        self._verify = verify is None or bool(verify)
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
        if max_bytes is None:   # the name heap's cap follows the object's size
            max_bytes = max(W.DEFAULT_MAX_BYTES, size)
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
        self._table_rows = _rows(d)
        self._base = base
        self._names = None
        try:
            self._has_meta = has_metadata(self._table_rows, url)
        except BaseException:
            self.close()
            raise
        self._count = len(self._table_rows) - self._has_meta
        self._done: Dict[int, List[Tuple[int, int]]] = {}   # fetched byte ranges, by tensor
        self._meta: Any = _UNSET
        self._dir: Optional[TensorDirectory] = None

    def _table(self, mm: mmap.mmap, first: bytes, trusted: bool, max_count: int,
               max_bytes: int) -> Tuple[TensorDirectory, int]:
        """The header checked (steps 1 to 6) before the rest of the table is asked
        for, then the table: ``(directory, payload base)``."""
        mm[:min(len(first), W.HEADER_SIZE)] = first[:W.HEADER_SIZE]
        try:
            base = _compat.kernels.check_header(mm, 0, max_count, max_bytes, None, True)
        except KilnError as e:
            if first[:len(W.FRAME_MAGIC)] == W.FRAME_MAGIC:
                raise frame_hint(e) from None
            if first[:len(W.PADDED_MAGIC)] == W.PADDED_MAGIC:
                raise padded_hint(e) from None
            raise
        mm[:min(len(first), base)] = first[:base]
        if base > len(first):
            mm[len(first):base] = self._src.read(len(first), base, "the table")
        d, _ = open_table(mm, trusted, max_count, max_bytes)
        return d, base

    # --- fetching -----------------------------------------------------------

    def _span(self, i: int) -> Tuple[int, int, int]:
        """Payload ``i``'s start and end, and the end of the gap after it (the
        gap is fetched and checked with it)."""
        row = self._table_rows[i]
        start = self._base + row[W.R_BYTE_OFFSET]
        end = start + row[W.R_BYTE_LENGTH]
        return start, end, min(W.dir_align(end), self.size)

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
        row = self._table_rows[i]
        have = self._base + len(self._head)    # bytes [base, have) came with the table
        what = "tensor %r" % (_text(row[W.R_NAME]) if row[W.R_NAME] else i)
        if b <= have:
            data = self._head[a - self._base:b - self._base]
        elif a < have:
            data = self._head[a - self._base:] + self._src.read(have, b, what)
        else:
            data = self._src.read(a, b, what)
        try:
            _compat.kernels.check_payload(data, a - start, row[W.R_CODE],
                                          element_count(row[W.R_SHAPE]), row[W.R_BYTE_LENGTH],
                                          start)
        except KilnError as e:
            raise KilnError(e.code, e.offset, "%s: %s" % (self.path, e.reason)) from None
        assert self._mm is not None
        self._mm[a:b] = data

    def _tensors_view(self) -> TensorDirectory:
        d, view = self._all, self._dir          # read once: close() may run in another thread
        if self._mm is None or d is None:
            raise ValueError("%s is closed" % self.path)
        if view is None:
            view = without_last(d) if self._has_meta else d
            self._dir = view
        return view

    def _payload_lengths(self) -> List[int]:
        """Every payload's length, the metadata's included, from the checked
        table (nothing fetched)."""
        return [row[W.R_BYTE_LENGTH] for row in self._table_rows]

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
        i = self._index(name)
        start, _, gap_end = self._span(i)
        self._fetch(i, start, gap_end)
        t = self._tensors_view()[name]
        if self._verify and self._digests() is not None:
            _checksum.check(self._digests(), i, t.data, t.name, start,  # type: ignore[arg-type]
                            self.path)
        return t

    def tensors(self) -> TensorDirectory:
        """Every tensor, fetched (one range request each), as a directory of views."""
        for i in range(self._count):
            start, _, gap_end = self._span(i)
            self._fetch(i, start, gap_end)
        if self._verify and self._digests() is not None:
            _checksum.check_directory(self._digests(),  # type: ignore[arg-type]
                                      self._tensors_view(), self.path)
        return self._tensors_view()

    def rows(self, name: Any, start: int, stop: int) -> np.ndarray:
        """Rows ``start:stop`` of a tensor's leading axis, fetching only those rows
        (``start`` and ``stop`` read once, as integers, before any check)."""
        start, stop = row_bound(start), row_bound(stop)
        d = self._tensors_view()
        i = self._index(name)
        row = self._table_rows[i]
        code, shape = row[W.R_CODE], row[W.R_SHAPE]
        width = W.DTYPES[code][1] if code <= W.DTYPE_MAX else 0
        lo, _, gap_end = self._span(i)
        if not shape or width == 0:
            return self[name].numpy()[start:stop]     # packed or opaque: the whole payload
        n = shape[0]
        a, b, _ = slice(start, stop).indices(n)
        if b <= a:
            return d[name].numpy()[0:0]
        per = row[W.R_BYTE_LENGTH] // n if n else 0
        hi = lo + b * per if b < n else gap_end
        self._fetch(i, lo + a * per, hi)
        return d[name].numpy()[a:b]

    def row_source(self, name: Any) -> "RowSource":
        """What a worker needs to read rows of tensor ``name`` with one range
        request each, without opening the file again (see ``kiln.dask.from_kiln``)."""
        i = self._index(name)
        row = self._table_rows[i]
        code, shape = row[W.R_CODE], tuple(row[W.R_SHAPE])
        if code > W.DTYPE_MAX or W.DTYPES[code][1] == 0:
            raise TypeError("tensor %r has no rows of whole bytes" % (name,))
        n = shape[0] if shape else 1   # rank 0: one row, the value
        return RowSource(self.path, self._storage_options, self._version, self._span(i)[0],
                         row[W.R_BYTE_LENGTH] // n if n else 0, shape, code)

    def _digests(self) -> Optional[bytes]:
        """The recorded payload CRC-32s (the metadata fetched on first use), or None."""
        self.metadata
        return self._sums

    @property
    def checksums(self) -> Optional[bytes]:
        """The recorded CRC-32s (4 little-endian bytes per tensor, in file order;
        the metadata fetched on first use), or None, as ``KilnFile.checksums``."""
        return self._digests()

    @property
    def metadata(self) -> Optional[Dict[str, Any]]:
        """The metadata dict (fetched on first use), or None when the file has none."""
        if self._meta is _UNSET:
            if not self._has_meta:
                self._meta = None
            else:
                i = len(self._table_rows) - 1
                start, _, gap_end = self._span(i)
                self._fetch(i, start, gap_end)
                _, self._meta, self._sums = split_metadata(self._all, self.path)
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

    def __repr__(self) -> str:
        n = self._count
        state = "closed" if self._mm is None else "%d tensor%s" % (n, "" if n == 1 else "s")
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
