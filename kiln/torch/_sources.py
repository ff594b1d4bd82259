"""Where the torch loader's bytes come from (:mod:`kiln.torch._pipeline`):
the very file whose table ``kiln.open`` read, never its name again.

:func:`file_bytes` gives, for an open :class:`kiln.KilnFile` or
:class:`kiln.remote.RemoteFile`, a :class:`FileBytes`: a duplicate of the
descriptor ``kiln.open`` opened (:class:`Descriptor`, read with ``pread``;
its O_DIRECT twin opened through ``/proc/self/fd`` on first use, and one the
file system refuses kept open until the file is closed, as other reader
threads may still be in a read on it), the bytes ``kiln.open`` took from a
file object without a descriptor (:class:`Memory`), or ranges fetched by a
remote file's reader, of the version it opened (:class:`Remote`)."""

import os
import threading
from typing import Any, Callable, List, Optional

from kiln import KilnError
from kiln._access import (held_descriptor, read_exactly as _read_exact, read_scattered,
                          remote_range)

__all__ = ["FileBytes", "Descriptor", "Memory", "Remote", "file_bytes", "reopen_odirect"]


class FileBytes:
    """The bytes of one open file, as the loader reads them: ``read(view, at,
    what)`` fills ``view`` from byte ``at`` or raises ``KilnError`` ``EOF``
    (the file ends first: it changed under the reader).  ``name`` is what
    messages call the file.  Made by :func:`file_bytes`; closed by whoever
    made it, after the load."""

    name = ""

    def read(self, view: memoryview, at: int, what: str) -> None:
        raise NotImplementedError

    def read_many(self, views: List[Any], at: int, what: Callable[[int], str]) -> None:
        """Fill ``views`` one after another from byte ``at`` on (one read of
        their span: a scattered ``preadv`` where there is a descriptor);
        ``what(offset)`` names what lies at an offset, for ``EOF``."""
        if len(views) == 1:
            return self.read(views[0], at, what(at))
        buf = memoryview(bytearray(sum(len(v) for v in views)))
        try:
            self.read(buf, at, what(at))
        except KilnError as e:   # named by where the file ends
            if e.code != "EOF":
                raise
            raise KilnError("EOF", e.offset, "%s: the file ends at byte %d, before the end "
                            "of %s" % (self.name, e.offset, what(e.offset))) from None
        k = 0
        for v in views:
            v[:] = buf[k:k + len(v)]
            k += len(v)

    def odirect_fd(self) -> int:
        """A descriptor of the same file opened with O_DIRECT, or -1."""
        return -1

    def read_direct(self, fd: int, view: memoryview, at: int, what: str, need: int) -> None:
        """Fill ``view`` (aligned) from byte ``at`` (aligned) through ``fd``,
        the descriptor :meth:`odirect_fd` gave; the file may end after
        ``need`` bytes.  An ``OSError`` with ``EINVAL`` is the file system
        refusing direct I/O."""
        _read_exact(fd, view, at, self.name, what, need=need)

    def refuse_odirect(self) -> None:
        """The file system refused an O_DIRECT read after all: buffered from now on."""

    def close(self) -> None:
        pass


class Descriptor(FileBytes):
    """A local file: a descriptor the load owns (a duplicate of the open
    file's), read with ``pread``; its O_DIRECT twin opened on first use."""

    def __init__(self, fd: int, name: str) -> None:
        self.fd, self.name = fd, name
        self._odirect: Optional[int] = None   # None: not tried yet; -1: none, or refused
        self._refused: List[int] = []         # O_DIRECT descriptors closed with the file
        self._lock = threading.Lock()

    def read(self, view: memoryview, at: int, what: str) -> None:
        _read_exact(self.fd, view, at, self.name, what)

    def read_many(self, views: List[Any], at: int, what: Callable[[int], str]) -> None:
        read_scattered(self.fd, views, at, self.name, what)

    def odirect_fd(self) -> int:
        with self._lock:
            if self._odirect is None:
                self._odirect = reopen_odirect(self.fd)
            return self._odirect

    def refuse_odirect(self) -> None:
        # the O_DIRECT descriptor stays open: another reader thread may be in a
        # read on it now; it is closed with the file, after the readers joined
        with self._lock:
            if self._odirect is not None and self._odirect >= 0:
                self._refused.append(self._odirect)
            self._odirect = -1

    def close(self) -> None:
        with self._lock:
            fds = [self.fd, self._odirect] + self._refused
            self.fd, self._odirect, self._refused = -1, -1, []
        for fd in fds:
            if fd is not None and fd >= 0:
                os.close(fd)


def reopen_odirect(fd: int) -> int:
    """The file of ``fd`` opened again with O_DIRECT through ``/proc/self/fd``
    (the same open file, never its name: a file renamed over it meanwhile is
    not read), checked to be the same file; -1 where that cannot be done."""
    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        return -1
    try:
        d = os.open("/proc/self/fd/%d" % fd, os.O_RDONLY | flag | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return -1
    a, b = os.fstat(d), os.fstat(fd)
    if (a.st_dev, a.st_ino) != (b.st_dev, b.st_ino):   # pragma: no cover (not Linux's procfs)
        os.close(d)
        return -1
    return d


class Memory(FileBytes):
    """A file object without a descriptor: the bytes ``kiln.open`` read from it."""

    def __init__(self, data: Any, name: str) -> None:
        self.data, self.name = memoryview(data).cast("B"), name

    def read(self, view: memoryview, at: int, what: str) -> None:
        n = len(view)
        if at + n > len(self.data):   # (at the byte where the file ends, as a descriptor's)
            raise KilnError("EOF", len(self.data), "%s: the file ends at byte %d, before the "
                            "end of %s" % (self.name, len(self.data), what))
        view[:] = self.data[at:at + n]

    def read_many(self, views: List[Any], at: int, what: Callable[[int], str]) -> None:
        end = len(self.data)
        if at + sum(len(v) for v in views) > end:
            raise KilnError("EOF", end, "%s: the file ends at byte %d, before the end of %s"
                            % (self.name, end, what(end)))
        for v in views:
            v[:] = self.data[at:at + len(v)]
            at += len(v)

    def close(self) -> None:
        self.data = memoryview(b"")


class Remote(FileBytes):
    """A remote file: ranges fetched through its reader, of the version seen
    when it was opened (``RemoteFileChanged`` otherwise)."""

    def __init__(self, f: Any) -> None:
        self.f, self.name = f, f.path

    def read(self, view: memoryview, at: int, what: str) -> None:
        view[:] = remote_range(self.f, at, at + len(view), what)


def file_bytes(f: Any) -> FileBytes:
    """The bytes of ``f``, a :class:`kiln.KilnFile` or :class:`kiln.remote.RemoteFile`
    open now, for the loader: its descriptor duplicated (the load's own,
    closed by :meth:`FileBytes.close`), the bytes of a file object without
    one, or its remote reader."""
    got = held_descriptor(f)
    if got is not None:
        kind, value = got
        if kind == "fd":
            return Descriptor(value, f.path)
        if kind == "bytes":
            return Memory(value, f.path)
    return Remote(f)
