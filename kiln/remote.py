"""Kiln tensor files in object stores and on web servers, read lazily through fsspec.

``kiln.open("s3://bucket/model.kiln")`` (any fsspec URL: ``s3://``, ``gs://``,
``http(s)://``, ``memory://``...) returns a :class:`RemoteFile`.  Opening
costs one metadata request (size and version) and one range request for the
header and table, which are then checked by the same kernel that checks a
local file.  A tensor's bytes are fetched when it is first accessed, and a
leading-axis slice (:meth:`RemoteFile.rows`) fetches only its rows.

How it works: the table is checked inside a private anonymous mapping the
size of the remote file, whose untouched pages cost no memory.  Fetched
payloads are checked the way the directory check checks them (bool bytes 0
or 1, an odd 4-bit tail's high nibble 0, the alignment gap after a payload
all zeros) and then written into that mapping once, before any view of them
is handed out, so tensors are the same zero-copy views a local file gives
and keep the mapping alive the same way.  Bytes of tensors never accessed
are never fetched, and so never checked.

A remote file that changes after it was opened is detected: after each
fetch the object's size and version (ETag, Last-Modified, version id or
checksum, whichever the store reports) are read again and compared with
those seen at open, and a difference is :class:`RemoteFileChanged`, never
bytes of two versions decoded together.  A store that reports only a size
can only be checked by its size.  An object shorter than its table claims
is a ``KilnError`` ``EOF``, as for a local file.

Needs ``fsspec`` and the filesystem's own package (``s3fs``, ``gcsfs``,
``aiohttp`` for HTTP).
"""

import mmap
import operator
import sys
import threading
from typing import Any, Dict, Iterator, List, Optional, Tuple

import numpy as np

from . import _api, _meta
from . import _wire as W
from ._errors import KilnError
from ._filemap import TensorFileMapping
from ._tensor import Tensor, TensorDirectory, element_count
from .files import _payload_fault

__all__ = ["RemoteFile", "RemoteFileChanged", "RowSource", "is_url"]

_HEAD_GUESS = 64 << 10          # first request: the header and, usually, the whole table
_VERSION_KEYS = ("ETag", "etag", "VersionId", "version_id", "generation", "LastModified",
                 "Last-Modified", "last_modified", "mtime", "created", "Content-MD5", "md5Hash",
                 "Digest", "crc32c")
_MAP_NORESERVE = 0x4000 if sys.platform.startswith("linux") else 0


class RemoteFileChanged(OSError):
    """The remote file changed after it was opened: its size or version differs."""


def is_url(path: Any) -> bool:
    """True for a string naming an fsspec URL other than a plain local path."""
    if not isinstance(path, str) or "://" not in path:
        return False
    scheme = path.split("://", 1)[0]
    return scheme.replace("+", "").replace("-", "").replace(".", "").isalnum() and \
        scheme != "file"


def _version(info: Dict[str, Any]) -> Tuple[Any, ...]:
    return (info.get("size"),) + tuple((k, str(info[k])) for k in _VERSION_KEYS
                                       if info.get(k) is not None)


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
        url: an fsspec URL.
        storage_options: passed to the fsspec filesystem (credentials,
            endpoint, ...).
        trusted, max_count, max_bytes: as for :class:`kiln.Decoder`.
        verify: as for :class:`kiln.KilnFile` (the metadata is fetched with
            the first tensor read).

    Raises:
        KilnError: an invalid table (any code :func:`kiln.decode_tensors`
            raises, at its offset in the file); ``EOF`` for an empty object
            or one shorter than its table claims, ``TYPE`` for a fetched
            payload byte the directory check refuses.
        RemoteFileChanged: the object changed after it was opened.
        OSError: what the filesystem raises (``FileNotFoundError``,
            ``PermissionError``...); a store that answers a range request
            with more bytes than asked (it ignored the range).
    """

    def __init__(self, url: str, *, storage_options: Optional[Dict[str, Any]] = None,
                 trusted: bool = False, max_count: int = W.DEFAULT_MAX_COUNT,
                 max_bytes: int = W.DEFAULT_MAX_BYTES, verify: bool = False) -> None:
        self._verify = bool(verify)
        self._sums: Optional[bytes] = None
        try:
            import fsspec
        except ImportError as e:  # pragma: no cover - depends on the environment
            raise ImportError("kiln.open of a URL needs fsspec: pip install fsspec") from e
        self.path = url
        self._storage_options = dict(storage_options or {})
        self._fs, self._key = fsspec.core.url_to_fs(url, **self._storage_options)
        info = self._fs.info(self._key)
        if info.get("type") == "directory":
            raise IsADirectoryError("%s is a directory" % url)
        size = info.get("size")
        if not isinstance(size, int):
            raise OSError("%s: the store does not report the object's size" % url)
        self._version = _version(info)
        self.size = size
        if size == 0:
            raise KilnError("EOF", 0, "%s is empty: a Kiln file has at least a header" % url)
        self._lock = threading.Lock()
        self._mm: Optional[mmap.mmap] = None
        try:
            mm = _blank(size)
        except (OSError, OverflowError, ValueError) as e:
            raise KilnError("LIMIT", 0, "%s: the store reports %d bytes, which cannot be mapped "
                            "here (%s)" % (url, size, e)) from None
        try:
            head = self._read(0, min(size, _HEAD_GUESS), "the header")
            need = _table_end(head, size, max_count, max_bytes)
            if need > len(head):
                head += self._read(len(head), need, "the table")
            mm[:len(head)] = head
            d = _api.decode_tensors(mm, trusted=trusted, max_count=max_count,
                                    max_bytes=max_bytes)
        except BaseException:
            _close(mm)
            raise
        self._mm = mm
        self._all = d
        self._base = d._pb
        rows = d._rows
        reserved = _meta.META_NAME.encode()
        self._has_meta = bool(rows) and rows[-1][2] == reserved
        for i, row in enumerate(rows[:-1]):
            if row[2] == reserved:
                _close(mm)
                raise KilnError("TYPE", W.HEADER_SIZE + W.DESC_SIZE * i + W.D_NAME_OFF,
                                "%s: the name %r is reserved for the metadata, the last tensor"
                                % (url, reserved.decode()))
        self._count = len(rows) - self._has_meta
        # payload i's span [start, end of its gap): the gap is fetched and checked with it
        ends = [self._base + r[10] for r in rows[1:]] + [size]
        self._spans = [(self._base + r[10], self._base + r[10] + r[11], ends[i])
                       for i, r in enumerate(rows)]
        self._done: List[List[Tuple[int, int]]] = [[] for _ in rows]   # fetched byte ranges
        self._meta: Any = _UNSET
        self._dir: Optional[TensorDirectory] = None
        self._names: Optional[Dict[Any, int]] = None

    # --- fetching -----------------------------------------------------------

    def _read(self, start: int, end: int, what: str) -> bytes:
        return _read(self._fs, self._key, self.path, self._version, start, end, what)

    def _fetch(self, i: int, lo: int, hi: int) -> None:
        """Make bytes [lo, hi) of payload span ``i`` present (absolute offsets)."""
        with self._lock:
            if self._mm is None:
                raise ValueError("%s is closed" % self.path)
            done = self._done[i]
            for a, b in _missing(done, lo, hi):
                self._fill(i, a, b)
                done.append((a, b))
                done.sort()
                _merge(done)

    def _fill(self, i: int, a: int, b: int) -> None:
        start, end, gap_end = self._spans[i]
        row = self._all._rows[i]
        data = self._read(a, b, "tensor %r" % (_text(row[2]) if row[2] else i))
        body = memoryview(data)[:max(0, min(b, end) - a)]
        fault = _payload_fault(row[0], element_count(row[1]), body, b >= end > a)
        if fault is not None:
            raise KilnError("TYPE", a + fault[0], "%s: %s" % (self.path, fault[1]))
        if b > end:
            tail = memoryview(data)[max(end, a) - a:]
            if any(tail):
                at = next(k for k, v in enumerate(tail) if v)
                raise KilnError("TYPE", max(end, a) + at, "%s: alignment gap byte is not 0"
                                % self.path)
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
        start, _, gap_end = self._spans[i]
        self._fetch(i, start, gap_end)
        t = self._tensors_view()[name]
        if self._verify and self._digests() is not None:
            from ._checksum import check
            check(self._digests(), i, t.data, t.name, start, self.path)  # type: ignore[arg-type]
        return t

    def tensors(self) -> TensorDirectory:
        """Every tensor, fetched (one range request each), as a directory of views."""
        for i in range(self._count):
            start, _, gap_end = self._spans[i]
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
        lo, _, gap_end = self._spans[i]
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
        return RowSource(self.path, self._storage_options, self._version, self._spans[i][0],
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
                start, _, gap_end = self._spans[i]
                self._fetch(i, start, gap_end)
                _, self._meta, self._sums = _split_metadata(self._all, self._mm, self.path)
        return self._meta

    def close(self) -> None:
        """Stop using the file; views already taken stay valid."""
        with self._lock:
            mm, self._mm = self._mm, None
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
        import fsspec
        fs, key = fsspec.core.url_to_fs(self.url, **self.storage_options)
        a = self.offset + start * self.row_bytes
        data = _read(fs, key, self.url, self.version, a, self.offset + stop * self.row_bytes,
                     "rows %d..%d" % (start, stop))
        fault = _payload_fault(self.code, 0, data, False)   # whole-byte rows: bools only
        if fault is not None:
            raise KilnError("TYPE", a + fault[0], "%s: %s" % (self.url, fault[1]))
        return data


def _read(fs: Any, key: str, url: str, version: Tuple[Any, ...], start: int, end: int,
          what: str) -> bytes:
    """Bytes [start, end) of the object, then a check that it is still the
    version that was opened."""
    data = fs.cat_file(key, start=start, end=end)
    now = _version(fs.info(key))
    if now != version:
        raise RemoteFileChanged("%s changed after it was opened (was %s, now %s): reopen it"
                                % (url, _show(version), _show(now)))
    if len(data) > end - start:
        raise OSError("%s: the store sent %d bytes for bytes %d..%d (%s): it ignored the range "
                      "request" % (url, len(data), start, end, what))
    if len(data) != end - start:
        raise KilnError("EOF", start + len(data), "%s: the object ended at byte %d while "
                        "reading %s (bytes %d..%d)" % (url, start + len(data), what, start, end))
    return bytes(data)


def _table_end(head: bytes, size: int, max_count: int, max_bytes: int) -> int:
    """Where the payloads begin, from the header's counts (bounded by the file
    size; a header too short or malformed, or counts above the caps, are left
    to the directory check: nothing more is fetched for them)."""
    if len(head) < W.HEADER_SIZE or head[:4] != W.DIR_MAGIC:
        return len(head)
    count = int.from_bytes(head[W.H_COUNT:W.H_COUNT + 4], "little")
    names = int.from_bytes(head[W.H_NAME_BYTES:W.H_NAME_BYTES + 4], "little")
    if count > max_count or names > max_bytes:
        return len(head)
    want = W.HEADER_SIZE + W.DESC_SIZE * count + names
    want = (want + W.DIR_ALIGN - 1) & ~(W.DIR_ALIGN - 1)
    return min(want, size)


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


def _show(version: Tuple[Any, ...]) -> str:
    return ", ".join(["size %s" % version[0]] + ["%s %s" % kv for kv in version[1:]])


def _close(mm: mmap.mmap) -> None:
    try:
        mm.close()
    except BufferError:
        pass   # views live: the mapping goes with the last of them
