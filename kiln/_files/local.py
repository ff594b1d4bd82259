"""Reading local files: only regular files are opened and mapped, and a lazily
opened file's payload contents are checked tensor by tensor, when each is read.

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

import builtins
import errno
import mmap
import os
import stat
import sys
from typing import Any, List, Optional, Set, Tuple

import numpy as np

from .. import _compat
from .. import _wire as W
from .._errors import KilnError
from .paths import Source, source
from .progress import STEP, Progress
from .tables import element_count, tensor_buffer, tensor_offset, tensor_row

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
    return open_regular_stat(path)[0]


def open_regular_file(path: Any, text: bool = False) -> Any:
    """``open(path, "rb")`` (``"r"`` with ``text``) of a regular file only: the
    one way kiln opens a path it reads, so a FIFO, a socket or a device is
    :class:`NotAFile` at once, never a read that waits forever."""
    fd = open_regular(os.fspath(path))
    try:
        return builtins.open(fd, "r" if text else "rb", encoding="utf-8" if text else None,
                             newline="" if text else None)
    except BaseException:
        os.close(fd)
        raise


def open_regular_stat(path: str) -> Tuple[int, os.stat_result]:
    """``open_regular(path)`` and the descriptor's ``fstat``."""
    fd = os.open(path, os.O_RDONLY | _NONBLOCK | _CLOEXEC | _BINARY)
    try:
        st = check_regular(fd, path)
        if _NONBLOCK:
            os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd, st


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

    __slots__ = ("block_end", "done", "fd", "path")

    def __init__(self, block_end: int, fd: Any = None, path: str = "") -> None:
        self.block_end = block_end
        # (byte offset, length) of the payloads checked: an empty payload may
        # share its offset with the next one, which it does not check
        self.done: Set[Tuple[int, int]] = set()
        self.fd, self.path = fd, path  # a file's SharedFd: its bytes read with pread

    def tensor(self, t: Any) -> Any:
        """``t`` (a Tensor of the directory) once its payload is checked."""
        key = _key(t)
        if key not in self.done:
            self._check(t, 0, None)
            self.done.add(key)
        return t

    def tensors(self, ts: Any) -> None:
        """``tensor`` of each of ``ts``, the short spans with rules (the
        alignment gaps after most payloads) read together: one ``pread``
        for each run of them within 1 MiB of the file, not one a tensor.  A
        run the file no longer holds whole is checked span by span, so the
        fault is the one ``tensor`` would raise for the first of them."""
        if self.fd is None:
            for t in ts:
                self.tensor(t)
            return
        spans = []   # (file offset of the span, payload offset, lo, end, code, count, nbytes)
        keys = []
        done, block_end = self.done, self.block_end
        for t in ts:
            at, row = tensor_offset(t), tensor_row(t)
            nbytes = row[W.R_BYTE_LENGTH]
            keys.append((at, nbytes))
            if (at, nbytes) in done:
                continue
            code = row[W.R_CODE]
            end = min(W.dir_align(at + nbytes), block_end)
            lo = rules_from(code, nbytes)
            if at + lo < end:
                spans.append((at + lo, at, lo, end, code, element_count(row[W.R_SHAPE]),
                              nbytes))
        if spans:
            with self.fd.held(self.path) as fd:   # a close meanwhile waits for these reads
                check_spans(fd, self.path, spans)
        done.update(keys)

    def rows(self, t: Any, start: int, stop: int) -> None:
        """Check only the payload bytes of rows ``start:stop`` of ``t`` (a
        tensor with whole-byte rows), and its gap when they reach the end."""
        if _key(t) in self.done:
            return
        row = tensor_row(t)
        shape, nbytes = row[W.R_SHAPE], row[W.R_BYTE_LENGTH]
        n = shape[0]
        a, b, _ = slice(start, stop).indices(n)
        if b <= a:
            return
        per = nbytes // n
        self._check(t, a * per, None if b == n else b * per)

    def _check(self, t: Any, lo: int, hi: Any) -> None:
        row = tensor_row(t)
        at, nbytes = tensor_offset(t), row[W.R_BYTE_LENGTH]
        end = min(W.dir_align(at + nbytes), self.block_end)   # the gap's end
        if hi is not None:
            end = at + hi
        code = row[W.R_CODE]
        if self.fd is not None:   # kiln's own read: pread, never the mapping (no SIGBUS)
            if hi is None:
                lo = max(lo, rules_from(code, nbytes))
            if at + lo >= end:   # no byte with rules (a payload with no gap after it)
                return
            with self.fd.held(self.path) as fd:   # a close meanwhile waits for this read
                check_span(fd, self.path, at, lo, end, code, element_count(row[W.R_SHAPE]),
                           nbytes)
            return
        with memoryview(tensor_buffer(t))[at + lo:end] as piece:
            _compat.kernels.check_payload(piece, lo, code, element_count(row[W.R_SHAPE]),
                                          nbytes, at)


def _key(t: Any) -> Tuple[int, int]:
    return tensor_offset(t), tensor_row(t)[W.R_BYTE_LENGTH]


_SPAN_CHUNK = 1 << 20   # payload bytes read and checked at a time
_SPAN_SKIP = 16 << 10   # bytes a window of spans reads past between two of them, at most


def rules_from(code: int, nbytes: int) -> int:
    """Where a payload's bytes with rules start: 0 for bool and 4-bit
    payloads, else ``nbytes`` (only the alignment gap after it has rules)."""
    return 0 if code == W.DTYPE_BOOL or code in W.PACKED else nbytes


def check_span(fd: int, path: str, at: int, lo: int, end: int, code: int, count: int,
               nbytes: int) -> None:
    """Check bytes ``at + lo .. end`` of the payload at file offset ``at`` (and
    its gap), read with ``pread`` 1 MiB at a time, as ``check_payload`` does
    (``TYPE`` at the first bad byte's file offset; ``EOF`` if the file ends)."""
    from .._pread import read_bytes
    check = _compat.kernels.check_payload
    while at + lo < end:
        k = min(_SPAN_CHUNK, end - at - lo)
        check(read_bytes(fd, k, at + lo, path), lo, code, count, nbytes, at)
        lo += k


def check_spans(fd: int, path: str, spans: List[Tuple[int, int, int, int, int, int, int]]
                ) -> None:
    """Check each span ``(first, at, lo, end, code, count, nbytes)``: bytes
    ``first .. end`` of the file, from byte ``lo`` of the payload at ``at``
    (and its gap), as :func:`check_span` does.  Spans that lie within one
    1 MiB window, each at most 16 KiB past the one before (a ``pread`` costs
    about what copying that many bytes does), are read together, one
    ``pread``; a longer span a chunk at a time; a window the file no longer
    holds whole span by span, so that the fault is the one the first bad
    span gives alone (the writers' last check and a lazy open's check of
    many tensors share it)."""
    spans.sort()
    check = _compat.kernels.check_payload
    from .._pread import read_bytes
    i = 0
    while i < len(spans):
        start, stop, j = spans[i][0], spans[i][3], i
        while j < len(spans) and spans[j][3] - start <= _SPAN_CHUNK and \
                (j == i or spans[j][0] - stop <= _SPAN_SKIP):
            stop = max(stop, spans[j][3])
            j += 1
        if j == i:   # one span longer than the window
            _, at, lo, end, code, n, nbytes = spans[i]
            check_span(fd, path, at, lo, end, code, n, nbytes)
            i += 1
            continue
        try:
            window: Optional[memoryview] = memoryview(read_bytes(fd, stop - start, start, path))
        except KilnError:
            window = None   # the file ends early: each span as check_span reads it
        for first, at, lo, end, code, n, nbytes in spans[i:j]:
            if window is None:
                check_span(fd, path, at, lo, end, code, n, nbytes)
            else:
                check(window[first - start:end - start], lo, code, n, nbytes, at)
        i = j


# --- mapping a file ------------------------------------------------------------

def file_name(path: Any) -> str:
    if type(path) is Source:
        return path.name
    return str(getattr(path, "name", "<file object>")) if hasattr(path, "read") \
        else os.fspath(path)


def map_file_fd(path: Any) -> Tuple[Any, Optional[int]]:
    """``map_file(path)`` and a descriptor of the same file for reads with
    ``pread`` (the caller closes it), None for a file object without one.
    ``path``: a :class:`Source` (taken as resolved), or what it resolves."""
    src = path if type(path) is Source else source(path)
    if src.kind == "object":
        try:
            fd = src.given.fileno()
        except (AttributeError, OSError, ValueError):
            return map_file(src), None
        mm = map_fd(fd, src.name)
        return mm, os.dup(fd)
    p = src.local if src.local is not None else src.given
    fd = open_regular(p)
    try:
        return map_fd(fd, p), fd
    except BaseException:
        os.close(fd)
        raise


def map_file(path: Any) -> Any:
    """A copy-on-write mapping of ``path`` (or of a binary file object's file;
    a file object without one is read into memory); clear errors naming the
    path.  Everything kiln hands out over it is read-only (see map_fd).
    ``path``: a :class:`Source` (taken as resolved), or what it resolves."""
    src = path if type(path) is Source else source(path)
    if src.kind == "object":
        try:
            fd = src.given.fileno()
        except (AttributeError, OSError, ValueError):
            data = src.given.read()
            if not data:
                raise KilnError("EOF", 0, "%s is empty" % src.name)
            return data
        return map_fd(fd, src.name)
    p = src.local if src.local is not None else src.given
    fd = open_regular(p)   # FileNotFoundError, IsADirectoryError, PermissionError, NotAFile
    try:
        return map_fd(fd, p)
    finally:
        os.close(fd)


# MAP_NORESERVE: a private writable mapping is charged to the commit limit
# unless it says so, and a file larger than memory would then not map at all
# (Python exposes the flag from 3.13; its value on Linux's common machines)
_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000 if sys.platform.startswith("linux") and
                     os.uname().machine in ("x86_64", "aarch64", "arm64", "riscv64", "s390x",
                                            "i686", "i386", "armv7l") else 0)


def map_fd(fd: int, name: str) -> "mmap.mmap":
    """The file of ``fd`` mapped copy-on-write: MAP_PRIVATE with write
    permission and no commit charge (MAP_NORESERVE) on Unix, FILE_MAP_COPY on
    Windows, from a read-only descriptor.  kiln's own views of it are
    read-only, but a consumer that ignores DLPack's read-only flag
    (torch.from_dlpack) and writes into a tensor changes this process's
    private copy of those pages, never the file, another open of it or
    another process, and never faults as a write to a read-only mapping would.

    Where the system refuses such a mapping for its size (strict overcommit,
    ``vm.overcommit_memory=2``, or Windows' commit limit, for a file larger
    than the memory it may commit) the file is mapped read-only instead, as
    before: reading is the same; a write through such a consumer then faults
    (docs/integrations.md says so)."""
    if check_regular(fd, name).st_size == 0:
        raise KilnError("EOF", 0, "%s is empty: a Kiln file has at least a header" % name)
    try:
        return _map(fd)
    except ValueError:   # emptied between the fstat and the mmap: changed under the reader
        raise KilnError("EOF", 0, "%s: the file changed under the reader: it is empty now"
                        % name) from None


def _map(fd: int) -> "mmap.mmap":
    try:
        if hasattr(mmap, "MAP_PRIVATE"):
            return mmap.mmap(fd, 0, flags=mmap.MAP_PRIVATE | _NORESERVE,
                             prot=mmap.PROT_READ | mmap.PROT_WRITE)
        return mmap.mmap(fd, 0, access=mmap.ACCESS_COPY)  # pragma: no cover - Windows
    except OSError as e:
        if e.errno != errno.ENOMEM and getattr(e, "winerror", None) not in _NO_COMMIT:
            raise
    return mmap.mmap(fd, 0, access=mmap.ACCESS_READ)


# Windows: ERROR_NOT_ENOUGH_MEMORY, ERROR_OUTOFMEMORY, ERROR_COMMITMENT_LIMIT
_NO_COMMIT = (8, 14, 1455)


def read_owned(p: str, prog: Optional[Progress] = None, follower: Any = None) -> np.ndarray:
    """The whole file in a read-only array this process owns.

    ``follower`` (an object with ``start(array, fd)``, ``advance(n)`` and
    ``finish()``, such as :class:`kiln._files.overlap.Overlapped`) is told
    each time more of the array holds the file's bytes, so that a second
    thread can work on the first bytes while the rest is read; ``finish()``
    runs whatever happens, before this returns or raises."""
    with builtins.open(open_regular(p), "rb", buffering=0) as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            raise KilnError("EOF", 0, "%s is empty: a Kiln file has at least a header" % p)
        out = np.empty(size, np.uint8)
        view = memoryview(out)
        got = 0
        step = STEP if prog is not None or follower is not None else size
        if prog is not None:
            prog.start(size)
        if follower is not None:
            follower.start(out, f.fileno())
        try:
            while got < size:
                n = f.readinto(view[got:got + step])
                if n and prog is not None:
                    prog.add(n)
                if not n:
                    raise KilnError("EOF", got, "%s: the file ended at byte %d while being read"
                                    % (p, got))
                got += n
                if follower is not None:
                    follower.advance(got)
        finally:
            if follower is not None:
                follower.finish()
        view.release()
    out.flags.writeable = False
    return out


def unmap(mm: Any) -> None:
    """Close the mapping now if nothing views it, else when the last view goes."""
    if isinstance(mm, mmap.mmap):
        try:
            mm.close()
        except BufferError:
            pass
