"""Where a record file's bytes come from: a local mapping or ranged remote reads.

Both give ``size`` and ``read(lo, hi)``; a local source also gives ``view``,
a memoryview of the whole mapping, for the zero-copy fast path.
"""

import builtins
import mmap
import os
from typing import Any, Dict, Optional, Tuple

from .._errors import KilnError

READ_AHEAD = 64 << 10


class LocalSource:
    """A read-only mapping of a file (or the bytes of a file object that has none).

    A file object's container starts at its current position, whatever the
    object: an open file is mapped and read from ``tell()`` on, as the bytes
    ``read()`` gives from one without a descriptor (a ``BytesIO``), and as
    ``kiln.iter_records`` reads a stream; offsets count from there."""

    def __init__(self, source: Any) -> None:
        self.mm: Any = None
        start = 0
        if hasattr(source, "read"):
            self.name = str(getattr(source, "name", "<file object>"))
            try:
                fd = source.fileno()
                start = int(source.tell())
            except (AttributeError, OSError, ValueError):
                data = source.read()
                self.view = memoryview(data).cast("B")
                self.size = len(self.view)
                return
            self._map(fd)
        else:
            self.name = os.fspath(source)
            with builtins.open(self.name, "rb") as f:
                self._map(f.fileno())
        self.view = memoryview(self.mm) if self.mm is not None else memoryview(b"")
        if start:
            start = min(start, self.size)
            self.view = self.view[start:]
            self.size -= start

    def _map(self, fd: int) -> None:
        self.size = os.fstat(fd).st_size
        self.mm = mmap.mmap(fd, 0, access=mmap.ACCESS_READ) if self.size else None

    bytes_fetched = 0

    def read(self, lo: int, hi: int, ahead: int = 0) -> Any:
        return self.view[lo:hi]

    def close(self) -> None:
        """Release the mapping now, or when the last view of it goes."""
        try:
            self.view.release()
        except BufferError:
            return
        if self.mm is not None:
            try:
                self.mm.close()
            except BufferError:
                pass


class RemoteSource:
    """Range reads of an fsspec URL, with one read-ahead block kept.

    ``bytes_fetched`` counts every byte moved.  The object's size and version
    are read at open and again after every fetch: a change is
    :class:`kiln.remote.RemoteFileChanged`, never bytes of two versions read
    together; a store that ignores the range request is an ``OSError``.
    """

    def __init__(self, url: str, storage_options: Optional[Dict[str, Any]] = None) -> None:
        import fsspec
        self.name = url
        self.fs, self.key = fsspec.core.url_to_fs(url, **(storage_options or {}))
        info = self.fs.info(self.key)
        if info.get("type") == "directory":
            raise IsADirectoryError("%s is a directory" % url)
        if not isinstance(info.get("size"), int):
            raise OSError("%s: the store does not report the object's size" % url)
        self.size = info["size"]
        self._version = _version(info)
        self.bytes_fetched = 0
        self._block: Tuple[int, bytes] = (0, b"")

    def read(self, lo: int, hi: int, ahead: int = 0) -> bytes:
        """Bytes ``lo..hi``; with ``ahead``, fetch up to that many more and keep
        them for the next read."""
        start, blk = self._block
        if start <= lo and hi <= start + len(blk):
            return blk[lo - start:hi - start]
        end = min(self.size, max(hi, lo + ahead))
        data = bytes(self.fs.cat_file(self.key, start=lo, end=end))
        self.bytes_fetched += len(data)
        now = _version(self.fs.info(self.key))
        if now != self._version:
            from ..remote import RemoteFileChanged
            raise RemoteFileChanged("%s changed after it was opened: reopen it" % self.name)
        if len(data) > end - lo:
            raise OSError("%s: the store sent %d bytes for bytes %d..%d: it ignored the range "
                          "request" % (self.name, len(data), lo, end))
        if len(data) != end - lo:
            raise KilnError("EOF", lo + len(data), "%s: the object ended at byte %d, inside "
                            "bytes %d..%d" % (self.name, lo + len(data), lo, end))
        if ahead:
            self._block = (lo, data)
        return data[:hi - lo]

    @property
    def view(self) -> None:
        return None

    def close(self) -> None:
        self._block = (0, b"")


def _version(info: Dict[str, Any]) -> Tuple[Any, ...]:
    """What identifies one version of a remote object (as :mod:`kiln.remote` reads it)."""
    keys = ("ETag", "etag", "VersionId", "version_id", "generation", "LastModified",
            "Last-Modified", "last_modified", "mtime", "created", "Content-MD5", "md5Hash",
            "crc32c")
    return (info.get("size"),) + tuple((k, str(info[k])) for k in keys
                                       if info.get(k) is not None)


def open_source(source: Any, storage_options: Optional[Dict[str, Any]]) -> Any:
    if isinstance(source, str) and source.startswith("file://"):
        source = source[len("file://"):]
    if isinstance(source, str) and "://" in source:
        from ..remote import is_url
        if is_url(source):
            return RemoteSource(source, storage_options)
    return LocalSource(source)
