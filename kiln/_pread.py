"""Reading a file's bytes with ``pread`` into memory kiln owns: the one loop
behind every read of an open file that must never touch its mapping (the
table and metadata, payload checks and CRC-32s, ``copy_into``, record files,
the torch loaders' buffered and ``O_DIRECT`` reads)."""

import contextlib
import os
import threading
from typing import Any, Callable, Iterator, List, Optional

from ._errors import KilnError

__all__ = ["read_exactly", "read_scattered", "read_bytes", "SharedFd"]


def read_exactly(fd: int, view: Any, at: int, path: str, what: Optional[str] = None,
                 need: Optional[int] = None) -> int:
    """Fill ``view`` (a writable byte memoryview) from ``fd`` at ``at``, or its
    first ``need`` bytes at least (an ``O_DIRECT`` read asks for whole blocks,
    past the bytes it needs); returns the bytes read.  ``KilnError`` ``EOF``
    at the byte where the file now ends when it ends first: it changed under
    the reader (``what`` names what was being read; by default the bytes).
    An ``OSError`` of ``preadv`` (``EINVAL`` of a direct read) is raised as it
    is."""
    n = len(view) if need is None else need
    done = 0
    while done < n:
        got = os.preadv(fd, [view[done:] if done else view], at + done)
        if got <= 0:
            end = min(at + done, os.fstat(fd).st_size)
            raise KilnError("EOF", end, "%s: the file changed under the reader: it ends at "
                            "byte %d, before the end of %s" % (
                                path, end, what or "bytes %d..%d" % (at, at + n)))
        done += got
    return done


def read_scattered(fd: int, views: List[Any], at: int, path: str,
                   what: Callable[[int], str]) -> None:
    """Fill ``views`` (writable byte memoryviews, at most ``IOV_MAX``) from
    ``fd``'s bytes at ``at`` on, one after another, with ``preadv``; ``EOF``
    as :func:`read_exactly` when the file ends first, ``what(offset)``
    naming what was being read at the offset where it ends."""
    total = sum(len(v) for v in views)
    done, k = 0, 0
    while done < total:
        got = os.preadv(fd, views[k:], at + done)
        if got <= 0:
            end = min(at + done, os.fstat(fd).st_size)
            raise KilnError("EOF", end, "%s: the file changed under the reader: it ends at "
                            "byte %d, before the end of %s" % (path, end, what(end)))
        done += got
        while got and got >= len(views[k]):   # the views filled; then the rest of one
            got -= len(views[k])
            k += 1
        if got:
            views[k] = views[k][got:]


def read_bytes(fd: int, n: int, at: int, path: str, what: Optional[str] = None) -> bytes:
    """``n`` bytes of ``fd`` at ``at`` as ``bytes`` (immutable: the kernels
    decode strings from it without a defensive copy); ``EOF`` as
    :func:`read_exactly` when the file now ends first."""
    got = os.pread(fd, n, at)
    if len(got) == n:
        return got
    buf = bytearray(n)
    buf[:len(got)] = got
    read_exactly(fd, memoryview(buf)[len(got):], at + len(got), path,
                 what or "bytes %d..%d" % (at, at + n))
    return bytes(buf)


class SharedFd:
    """A file's descriptor shared by its readers: ``close()`` closes it only
    once the reads that hold it are done, so a read in one thread never
    meets a descriptor another thread closed (``EBADF``), nor one the system
    has since handed to another file (a read of the wrong bytes)."""

    __slots__ = ("_fd", "_users", "_closing", "_lock", "__weakref__")

    def __init__(self, fd: int) -> None:
        self._fd: Optional[int] = fd
        self._users = 0
        self._closing = False
        self._lock = threading.Lock()

    def hold(self) -> Optional[int]:
        """The descriptor, held until :meth:`drop` (None once closing)."""
        with self._lock:
            if self._closing:
                return None
            self._users += 1
            return self._fd

    def drop(self) -> None:
        with self._lock:
            self._users -= 1
            fd = self._fd if self._closing and not self._users else None
            if fd is not None:
                self._fd = None
        if fd is not None:
            os.close(fd)

    @contextlib.contextmanager
    def held(self, path: str) -> Iterator[int]:
        """The descriptor for one read (``ValueError`` once the file is closed)."""
        fd = self.hold()
        if fd is None:
            raise ValueError("%s is closed" % path)
        try:
            yield fd
        finally:
            self.drop()

    def close(self) -> None:
        """Close now, or when the last read that holds it is done (once)."""
        with self._lock:
            self._closing = True
            fd = self._fd if not self._users else None
            if fd is not None:
                self._fd = None
        if fd is not None:
            os.close(fd)
