"""Reading local files: only regular files are opened, and a lazily opened
file's payload contents are checked tensor by tensor, when each is read.

``kiln.open`` checks everything the table decides (spec/kiln-v2.md, "When
the checks run"), but not the payload contents: each bool byte 0 or 1, an
odd 4-bit tail's high nibble 0, the alignment gap after a payload all zeros.
Those are checked here, by the kernel's ``check_payload``, for one tensor
the first time it is handed out, so an open and one small tensor cost the
same whatever the other tensors claim.  ``kiln.decode_tensors``,
``kiln.load_tensors`` and ``kiln check`` check every payload up front, in
the kernel's own step order.

A path that names a FIFO, a socket or a device is refused before anything
waits on it: the file is opened without blocking (``O_NONBLOCK``) and its
kind read from the open descriptor, so there is no moment between the check
and the open where another file could be put in its place.
"""

import os
import stat
from typing import Any, Set

from . import _compat
from . import _wire as W
from ._tensors.dtypes import element_count

_ALIGN = W.DIR_ALIGN - 1
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_BINARY = getattr(os, "O_BINARY", 0)


class NotAFile(OSError):
    """The path names something other than a regular file (a FIFO, a socket,
    a device): kiln reads only regular files and URLs."""


def kind_of(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISDIR, "a directory")):
        if test(mode):
            return name
    return "not a regular file"


def check_regular(fd: int, name: str) -> os.stat_result:
    """``fstat(fd)``, or :class:`NotAFile` when it is not a regular file
    (``IsADirectoryError`` for a directory)."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        kind = kind_of(st.st_mode)
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError("%s is a directory, not a Kiln file" % name)
        raise NotAFile("%s is %s, not a regular file: kiln reads regular files and URLs"
                       % (name, kind))
    return st


def open_regular(path: str) -> int:
    """A read-only descriptor of the regular file ``path`` (the caller closes
    it).  Never blocks on a FIFO: opened with ``O_NONBLOCK``, then checked."""
    fd = os.open(path, os.O_RDONLY | _NONBLOCK | _CLOEXEC | _BINARY)
    try:
        check_regular(fd, path)
        if _NONBLOCK:
            os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_head(path: str, n: int) -> bytes:
    """The first ``n`` bytes of the regular file ``path``."""
    fd = open_regular(path)
    try:
        return os.pread(fd, n, 0) if hasattr(os, "pread") else os.read(fd, n)
    finally:
        os.close(fd)


def file_size(path: str) -> int:
    fd = open_regular(path)
    try:
        return os.fstat(fd).st_size
    finally:
        os.close(fd)


class PayloadChecks:
    """Which payloads of one lazily opened directory were checked; checks a
    tensor's payload and the alignment gap after it once, the first time it
    is read.  ``block_end``: where the directory's block ends in its buffer."""

    __slots__ = ("block_end", "done")

    def __init__(self, block_end: int) -> None:
        self.block_end = block_end
        self.done: Set[int] = set()   # byte offsets of the payloads checked

    def tensor(self, t: Any) -> Any:
        """``t`` (a Tensor of the directory) once its payload is checked."""
        at = t._off
        if at not in self.done:
            self._check(t, 0, None)
            self.done.add(at)
        return t

    def rows(self, t: Any, start: int, stop: int) -> None:
        """Check only the payload bytes of rows ``start:stop`` of ``t`` (a
        tensor with whole-byte rows), and its gap when they reach the end."""
        if t._off in self.done:
            return
        row = t._row
        shape, nbytes = row[1], row[11]
        n = shape[0]
        a, b, _ = slice(start, stop).indices(n)
        if b <= a:
            return
        per = nbytes // n
        self._check(t, a * per, None if b == n else b * per)

    def _check(self, t: Any, lo: int, hi: Any) -> None:
        row = t._row
        at, nbytes = t._off, row[11]
        end = min((at + nbytes + _ALIGN) & ~_ALIGN, self.block_end)   # the gap's end
        if hi is not None:
            end = at + hi
        with memoryview(t._buf)[at + lo:end] as piece:
            _compat.kernels.check_payload(piece, lo, row[0], element_count(row[1]), nbytes, at)
