"""Where a record file's bytes come from: a local file read with ``pread``, or
ranged remote reads.  Both give ``size``, ``read(lo, hi)`` (the bytes, in
memory this process owns) and ``close()``.
"""

import os
import threading
from array import array
from typing import Any, Dict, Optional, Tuple

from .. import _wire as W
from .._pread import SharedFd, read_exactly
from .._files.local import check_regular, open_regular_file


READ_AHEAD = 64 << 10
_SMALL_READ = 64 << 10     # LocalSource.read: below this, an array.array (see there)


class LocalSource:
    """A local file read with ``pread`` (or the bytes of a file object that has
    no descriptor, held in memory).

    Nothing is read through a mapping: every read copies its bytes into memory
    this process owns, so a file that another program truncates under the
    reader is ``EOF`` ("the file changed under the reader"), never SIGBUS, and
    the records' arrays view those private copies (a consumer that writes
    into one changes that copy only).

    The descriptor is a :class:`kiln._pread.SharedFd`: ``close()`` in one
    thread while another reads closes it once that read is done, and a read
    that starts after ``close()`` is ``ValueError``, never ``EBADF`` nor a
    read of a descriptor the system has since given to another file.

    A file object's container starts at its current position, whatever the
    object: an open file is read from ``tell()`` on, as the bytes
    ``read()`` gives from one without a descriptor (a ``BytesIO``), and as
    ``kiln.iter_records`` reads a stream; offsets count from there."""

    read_size = 4 << 20   # a read of consecutive records: up to this many bytes at once

    def __init__(self, source: Any) -> None:
        self._fd: Optional[SharedFd] = None
        self._data: Any = None    # a file object's bytes, without a descriptor
        self._at = 0   # the container's first byte in the file
        start = 0
        if hasattr(source, "read"):
            self.name = str(getattr(source, "name", "<file object>"))
            try:
                fd = source.fileno()
                start = int(source.tell())
            except (AttributeError, OSError, ValueError):
                data = source.read()
                self._data = memoryview(data).cast("B").toreadonly()
                self.size = len(self._data)
                return
            self._open(fd)
        else:
            self.name = os.fspath(source)
            with open_regular_file(self.name) as f:
                self._open(f.fileno())
        if start:
            start = min(start, self.size)
            self._at = start
            self.size -= start

    def _open(self, fd: int) -> None:
        st = check_regular(fd, self.name)
        self.size = st.st_size
        self._fd = SharedFd(os.dup(fd))

    bytes_fetched = 0

    def _closed(self) -> ValueError:
        return ValueError("I/O on a closed RecordFile (%s)" % self.name)

    def read(self, lo: int, hi: int, ahead: int = 0) -> Any:
        """Bytes ``lo..hi`` of the container, read now into memory of its own
        (``ValueError`` once closed)."""
        shared = self._fd
        if shared is None:
            data = self._data
            if data is None:
                raise self._closed()
            return data[lo:hi]
        # placed so that the file's 64-byte boundaries fall on 64-byte
        # addresses: a record's tensors stay aligned arrays
        n = hi - lo
        if n <= _SMALL_READ:    # one record, say: an array's address is one cheap call
            small = array("B", bytes(n + W.DIR_ALIGN))
            at = small.buffer_info()[0]
            buf: Any = small
        else:                   # no zeroing of a large read
            import numpy as np
            buf = np.empty(n + W.DIR_ALIGN, np.uint8)
            at = buf.__array_interface__["data"][0]
        shift = (self._at + lo - at) % W.DIR_ALIGN
        view = memoryview(buf)[shift:shift + n]
        fd = shared.hold()   # held for this read: a close() meanwhile waits for it
        if fd is None:
            raise self._closed()
        try:
            read_exactly(fd, view, self._at + lo, self.name)
        finally:
            shared.drop()
        return view

    def close(self) -> None:
        """Close the descriptor once no read holds it; records already read
        keep their bytes, and later reads are ``ValueError``."""
        self._data = None
        if self._fd is not None:
            self._fd.close()


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
