"""Where a record file's bytes come from: a local mapping or ranged remote reads.

Both give ``size`` and ``read(lo, hi)``; a local source also gives ``view``,
a memoryview of the whole mapping, for the zero-copy fast path.
"""

import os
import threading
from typing import Any, Dict, Optional, Tuple

from .._files.local import map_fd, open_regular_file


READ_AHEAD = 64 << 10


class LocalSource:
    """A file mapped copy-on-write and viewed read-only (or the bytes of a file object
    that has none).

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
            with open_regular_file(self.name) as f:
                self._map(f.fileno())
        # read-only views of a copy-on-write mapping (kiln._files.local.map_fd):
        # a consumer that writes through a tensor's DLPack pointer anyway
        # (torch.from_dlpack) changes private pages, never the file
        self.view = memoryview(self.mm).toreadonly() if self.mm is not None \
            else memoryview(b"")
        if start:
            start = min(start, self.size)
            self.view = self.view[start:]
            self.size -= start

    def _map(self, fd: int) -> None:
        self.size = os.fstat(fd).st_size
        self.mm = map_fd(fd, self.name) if self.size else None

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
    """Range reads of a URL through the byte sources of remote tensor files
    (:mod:`kiln._files.fetch`): kiln's own HTTP client for ``http(s)://``,
    which reads at most the bytes it asked for (a server that ignores the
    range, sends another one or more bytes is a
    :class:`kiln.remote.RemoteError` before or while its body is read), and
    fsspec for other URLs, each answer's length checked.

    The first read asks for ``READ_AHEAD`` bytes from the start (a smaller
    object, or a whole one from a server without ranges, comes in that one
    answer and is read from memory after it); the block of the last read
    asked with ``ahead`` is kept.  ``bytes_fetched`` counts every byte moved.
    ``version`` is the object's size and version seen at open (or ``known``,
    the one a pickled file was opened at); every answer is checked against
    it, a change is :class:`kiln.remote.RemoteFileChanged`.
    """

    def __init__(self, url: str, storage_options: Optional[Dict[str, Any]] = None,
                 known: Optional[Tuple[Any, ...]] = None) -> None:
        from .._files.fetch import source
        self.name = url
        self._lock = threading.Lock()
        self._src = source(url, storage_options, known)
        try:
            first = self._src.first(READ_AHEAD)
        except BaseException:
            self._src.close()
            raise
        self.size = int(self._src.size or 0)
        self.version = self._src.version
        self.bytes_fetched = len(first)
        self._block: Tuple[int, bytes] = (0, first)

    def read(self, lo: int, hi: int, ahead: int = 0) -> bytes:
        """Bytes ``lo..hi`` (inside the size seen at open); with ``ahead``,
        fetch up to that many more and keep them for the next read."""
        start, blk = self._block
        if start <= lo and hi <= start + len(blk):
            return blk[lo - start:hi - start]
        end = min(self.size, max(hi, lo + ahead))
        with self._lock:
            data = self._src.read(lo, end, "bytes %d..%d of the record file" % (lo, end))
            self.bytes_fetched += len(data)
        if ahead:
            self._block = (lo, data)
        return data[:hi - lo]

    @property
    def view(self) -> None:
        return None

    def close(self) -> None:
        self._block = (0, b"")
        self._src.close()


def open_source(source: Any, storage_options: Optional[Dict[str, Any]],
                known: Optional[Tuple[Any, ...]] = None) -> Any:
    if isinstance(source, str) and source.startswith("file://"):
        source = source[len("file://"):]
    if isinstance(source, str) and "://" in source:
        from .._files.paths import is_url
        if is_url(source):
            return RemoteSource(source, storage_options, known)
    return LocalSource(source)
