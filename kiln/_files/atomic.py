"""Atomic replace of a file: a temporary file beside the target, then a rename.

The temporary file is made in the folder of the file that is finally
replaced, under a name no other thread or process can have chosen
(``.<name>.<pid>.<random>.kiln-tmp``, created with ``O_EXCL``; a name too
long for that within the folder's name limit is cut to its first characters
and a hash of the whole).  It never
grants more than the file it replaces:

* when the target exists, the temporary file is created ``0600`` and then
  given the target's group (where the writer may: else the group bits are
  dropped, since they would name the writer's group) and permission bits
  (``fchmod``; set-user-ID, set-group-ID and sticky bits are not copied),
  so at no moment can someone read the new bytes who could not read the
  old ones;
* a new target gets the mode any new file gets (``0666`` less the umask),
  applied by the kernel as the file is created.

A target that is a symbolic link is written through: the link's final
target is replaced (in its own folder) and the link is left as it was.  A
link that loops is refused with ``OSError`` (``ELOOP``) before anything is
written.

``commit`` flushes and fsyncs the file, renames it over the target and
fsyncs the folder; ``discard`` removes it and leaves the target as it was.
Used as a context manager (``with AtomicFile(path) as out:``), the file is
committed when the block ends and discarded when it raises (or when the
commit itself fails).  A writer killed half way leaves its temporary file; the
next writer into that folder removes those of processes that are gone (a
name is read as a writer's only when its process id is one a system can give;
other names are left alone).
"""

import errno
import os
import re
import stat
import sys
import threading
from typing import Any, List, Optional, Tuple, Union

import numpy as np

from .pagecache import drop_cached, free_later, hold_old
from .paths import bytes_path, local_path

PathLike = Union[str, "os.PathLike[str]"]

_TMP = re.compile(r"^\.(?P<base>.+)\.(?P<pid>[1-9][0-9]{0,9})\.(?P<n>[0-9a-f]{16})\.kiln-tmp$")
# the largest process id any supported system gives (a C int); a name that
# claims a larger one is not a kiln writer's and is left alone
_PID_MAX = 2 ** 31 - 1
# ".<base>.<pid>.<16 hex>.kiln-tmp" adds this much to the target's name, at most
_TMP_EXTRA = len(".." + str(_PID_MAX) + "." + "0" * 16 + ".kiln-tmp")
_TRIES = 100
_OPEN_FLAGS = os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0) | \
    getattr(os, "O_BINARY", 0) | getattr(os, "O_NOFOLLOW", 0)


def resolve_target(path: PathLike) -> str:
    """The file an atomic replace of ``path`` replaces: ``path`` itself, or the
    final target of the symbolic link it names (which may not exist yet)."""
    p = os.path.abspath(os.fspath(path))
    if not os.path.islink(p):
        return p
    target = os.path.realpath(p)
    if os.path.islink(target):   # realpath stopped at a loop
        raise OSError(errno.ELOOP, "the symbolic link loops", os.fspath(path))
    return target


def _name_max(folder: str) -> int:
    try:
        return int(os.pathconf(folder, "PC_NAME_MAX"))
    except (AttributeError, OSError, ValueError):
        return 255


def tmp_base(folder: str, base: str) -> str:
    """The part of the temporary names that stands for ``base``: ``base`` itself,
    or, where ``base`` is so long that the temporary name would pass the folder's
    name limit, its first bytes and a hash of the whole (still one per target)."""
    room = _name_max(folder) - _TMP_EXTRA
    raw = os.fsencode(base)
    if len(raw) <= room:
        return base
    import hashlib
    tag = "~" + hashlib.sha256(raw).hexdigest()[:16]
    keep, size = [], 0
    for ch in base:   # whole characters, never part of a multi-byte one
        size += len(os.fsencode(ch))
        if size > room - len(tag):
            break
        keep.append(ch)
    return "".join(keep) + tag


def _create(folder: str, base: str, mode: int, suffix: str = ".kiln-tmp"
            ) -> "tuple[int, str]":
    """A new file in ``folder`` under a name unique across threads and processes."""
    short = tmp_base(folder, base)
    for _ in range(_TRIES):
        tmp = os.path.join(folder, ".%s.%d.%s%s" % (short, os.getpid(),
                                                  os.urandom(8).hex(), suffix))
        try:
            return os.open(tmp, _OPEN_FLAGS, mode), tmp
        except FileExistsError:   # pragma: no cover - 64 random bits
            continue
        except OSError as e:   # named as the file asked for, never the temporary's name
            raise type(e)(e.errno, "cannot create a file in %s: %s"
                          % (folder or ".", e.strerror), os.path.join(folder, base)) from None
    raise FileExistsError(errno.EEXIST, "no free temporary name", folder)  # pragma: no cover


def create_beside(path: PathLike, suffix: str) -> "tuple[int, str, str]":
    """(descriptor, name, target): a new file beside the file ``path`` names
    (``.<name>.<pid>.<random><suffix>``, the old file's group and mode when
    there is one), which the caller renames over ``target`` when it is done.
    A suffix other than ``.kiln-tmp`` is never cleaned up as a stale
    temporary: a killed writer's file stays for whoever recovers it."""
    path = local_path(path)
    target = resolve_target(path)
    folder, base = os.path.split(target)
    try:
        old: Optional[os.stat_result] = os.stat(target)
    except FileNotFoundError:
        old = None
    fd, tmp = _create(folder, base, 0o600 if old is not None else 0o666, suffix)
    try:
        if old is not None:
            _keep_mode(fd, tmp, old)
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    return fd, tmp, target


def fsync_dir(folder: str) -> None:
    """fsync a folder (a rename in it made durable); nothing where that fails."""
    _fsync_dir(folder)


class AtomicFile:
    """A temporary file beside the file ``path`` names that replaces it on commit.

    ``f`` is a buffered binary file for sequential writers; ``fd`` its
    descriptor, for positional writes (``pwrite``) that several threads may
    make at once (then nothing may be written through ``f``)."""

    def __init__(self, path: PathLike) -> None:
        path = local_path(bytes_path(path, "a writer", "kiln.encode_tensors"))   # a file:// URL names a local file
        self.path = os.fspath(path)
        self.target = resolve_target(path)
        folder, base = os.path.split(self.target)
        _remove_stale(folder, base)
        try:
            old: Optional[os.stat_result] = os.stat(self.target)
        except FileNotFoundError:
            old = None
        # an existing target: 0600 first, its group and bits once the file is
        # ours; a new one: what any new file gets (the umask applies)
        if old is not None:
            drop_cached([self.target])   # its pages serve the new bytes
        fd, self.tmp = _create(folder, base, 0o600 if old is not None else 0o666)
        try:
            if old is not None:
                _keep_mode(fd, self.tmp, old)
            self.f = os.fdopen(fd, "wb")
        except BaseException:
            os.close(fd)
            os.unlink(self.tmp)
            raise
        self.fd = fd
        self._unsynced = 0
        self._seek_lock = threading.Lock()   # where os.pwrite is missing (Windows)

    def _put(self, data: Any, at: int) -> int:
        if _pwrite is not None:
            return pwrite_all(self.fd, data, at)
        with self._seek_lock:  # pragma: no cover - Windows
            os.lseek(self.fd, at, os.SEEK_SET)
            view = _bytes_view(data)
            n = len(view)
            while view:
                view = view[os.write(self.fd, view):]
            return n

    def wrote(self, n: int) -> None:
        """Count bytes written; every few MiB, start their write-back without waiting,
        so the fsync of ``commit`` overlaps the writing instead of following it."""
        self._unsynced += n
        if self._unsynced >= WRITEBACK_STEP:
            self._unsynced = 0
            self.f.flush()
            _start_writeback(self.fd)

    def pwrite(self, data: Any, at: int) -> None:
        """All of ``data`` at byte ``at`` (no file position: safe from several threads)."""
        n = self._put(data, at)
        self._unsynced += n
        if self._unsynced >= WRITEBACK_STEP:
            self._unsynced = 0
            _start_writeback(self.fd)

    def copy_in(self, src: int, src_offset: int, n: int, dst_offset: int, what: str) -> None:
        """``n`` bytes of the file ``src`` (a descriptor) from ``src_offset`` to our
        ``dst_offset``, inside the kernel where it can (``copy_file_range``), else
        through a bounded buffer."""
        fd = self.fd
        copy = _copy_file_range
        while n > 0:
            step = min(n, _COPY_STEP)
            k = -1
            if copy is not None:
                try:
                    k = copy(src, fd, step, src_offset, dst_offset)
                except OSError as e:
                    if e.errno not in _NO_COPY:
                        raise
                    copy = None   # another file system or a pipe: copy through memory
            if k < 0:
                chunk = os.pread(src, min(step, 8 << 20), src_offset)
                k = len(chunk)
                self._put(chunk, dst_offset)
            if k == 0:
                raise ValueError("%s: the source ended %d bytes short" % (what, n))
            n -= k
            src_offset += k
            dst_offset += k
            self._unsynced += k
            if self._unsynced >= WRITEBACK_STEP:
                self._unsynced = 0
                _start_writeback(fd)

    def __enter__(self) -> "AtomicFile":
        return self

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> None:
        """Commit after a block that ended normally; discard after one that raised,
        or when the commit fails (the target is then left as it was)."""
        if kind is not None:
            self.discard()
            return
        try:
            self.commit()
        except BaseException:
            self.discard()
            raise

    def commit(self) -> None:
        """Flush, fsync, rename over the target, fsync the folder.  A large
        file replaced is freed after the call returns (:func:`hold_old`)."""
        self.f.flush()
        os.fsync(self.fd)
        self.f.close()
        old = hold_old(self.target)
        try:
            os.replace(self.tmp, self.target)
        finally:
            free_later(old)
        _fsync_dir(os.path.dirname(self.target))

    def discard(self) -> None:
        """Remove the temporary file; the target is left as it was."""
        try:
            self.f.close()
        finally:
            try:
                os.unlink(self.tmp)
            except FileNotFoundError:
                pass


def _keep_mode(fd: int, path: str, old: os.stat_result) -> None:
    """The old file's group (where the writer may set it) and permission bits."""
    mode = stat.S_IMODE(old.st_mode) & 0o777
    fchown = getattr(os, "fchown", None)
    if fchown is not None and old.st_gid != os.fstat(fd).st_gid:
        try:
            fchown(fd, -1, old.st_gid)
        except OSError:   # not a member of that group: the group bits then
            mode &= ~0o070   # name the writer's group, so they are left out
    fchmod = getattr(os, "fchmod", None)
    if fchmod is not None:
        fchmod(fd, mode)
    else:  # pragma: no cover - Windows before 3.13: only the read-only bit exists
        os.chmod(path, mode)


def _remove_stale(folder: str, base: str) -> None:
    """Temporary files of writers that died: their process is gone."""
    try:
        names = os.listdir(folder)
    except OSError:
        return
    short = tmp_base(folder, base)
    for name in names:
        m = _TMP.match(name)
        if m is None or m.group("base") != short:
            continue
        pid = int(m.group("pid"))
        if pid > _PID_MAX or pid == os.getpid() or _alive(pid):
            continue
        try:
            os.unlink(os.path.join(folder, name))
        except OSError:
            pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (OSError, OverflowError):
        return True   # exists, not ours (or not a process id this system has)
    return True


WRITEBACK_STEP = 8 << 20
_COPY_STEP = 1 << 30
_copy_file_range = getattr(os, "copy_file_range", None)
_NO_COPY = {getattr(errno, n) for n in ("EXDEV", "ENOSYS", "EINVAL", "EOPNOTSUPP", "EBADF",
                                        "ENOTSUP", "ESPIPE") if hasattr(errno, n)}
_writeback: List[Any] = []


def _start_writeback(fd: int) -> None:
    """Linux ``sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WRITE)``: start writing the
    file's dirty pages to disk and return at once.  Elsewhere nothing."""
    if not _writeback:
        fn = None
        if sys.platform.startswith("linux"):
            try:
                import ctypes
                fn = ctypes.CDLL(None, use_errno=True).sync_file_range
                fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
                fn.restype = ctypes.c_int
            except (OSError, AttributeError):  # pragma: no cover - a libc without it
                fn = None
        _writeback.append(fn)
    fn = _writeback[0]
    if fn is not None:
        fn(fd, 0, 0, 2)   # a failure only means the fsync does all the work


def _fsync_dir(folder: str) -> None:
    if os.name != "posix":  # pragma: no cover - Windows has no directory fsync
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_pwrite = getattr(os, "pwrite", None)


def _bytes_view(data: Any) -> memoryview:
    view = memoryview(data)
    return view if view.ndim == 1 and view.itemsize == 1 else view.cast("B")


def _pending_view(data: Any) -> Any:
    """``data`` to keep in a writer's pending list: a C-ordered 1-D byte array
    as it is (its slices are views too, and unlike a memoryview it is not an
    object the cyclic collector tracks: a save of many tensors keeps one
    pending entry a tensor), anything else as :func:`_bytes_view`."""
    if type(data) is np.ndarray and data.ndim == 1 and data.itemsize == 1 and \
            data.flags.c_contiguous:
        return data
    return _bytes_view(data)


HUGE_PAGE = 2 << 20   # the runs of a file Linux's page cache can map with one entry
_pwritev: Any = getattr(os, "pwritev", None)


def _iov_max() -> int:
    try:
        n = os.sysconf("SC_IOV_MAX")
    except (AttributeError, ValueError, OSError):
        n = -1
    return n if n > 0 else 16   # POSIX's least


_IOV_MAX = _iov_max()  # buffers in one pwritev (1024 on Linux)
_SMALL_GAP = 4096     # a gap this short is written as zeros, not left as a hole


class AlignedWriter:
    """Bytes written at increasing offsets of an :class:`AtomicFile`, gathered as
    views (no copy) so that every write but the last ends on a 2 MiB boundary
    of the file (``os.pwritev`` of the pieces).

    Linux (ext4, XFS, tmpfs) caches a file written in large runs in large
    folios, but a write gets a 2 MiB folio only for a whole aligned run it
    covers: the run two writes share stays in small ones.  A file whose
    payloads were written one ``write`` each then maps, in a reader's mapping,
    half in 2 MiB pages and half in 4 KiB pages faulted 16 at a time; written
    in aligned runs it maps with one fault per 2 MiB.  Gaps of at most 4 KiB
    (alignment padding) are written as zeros; a longer one ends the run and
    is left as a hole.  Where ``os.pwritev`` is missing, each piece is
    written as it comes.  ``prog`` (a :class:`kiln._files.progress.Progress`)
    is told of each piece written with ``counted=True`` once its last byte is
    in the file."""

    def __init__(self, out: "AtomicFile", prog: Any = None) -> None:
        self._out = out
        self._prog = prog
        self._start = 0            # the file offset of the first pending byte
        self._views: List[Any] = []
        self._n = 0                # pending bytes
        self._counted: List[Tuple[int, int]] = []   # (end offset, bytes) not yet reported

    def seek(self, at: int) -> None:
        """Go on at byte ``at`` (never backwards): zeros up to it, or a hole."""
        end = self._start + self._n
        if at == end:
            return
        if at < end:
            raise ValueError("AlignedWriter: offset %d is behind %d" % (at, end))
        if _pwritev is None:   # Windows: each piece at its offset, gaps left as holes
            self._start = at
        elif at - end <= _SMALL_GAP:
            self._views.append(bytes(at - end))
            self._n += at - end
        else:
            self.flush()
            self._start = at

    def write(self, data: Any, counted: bool = False) -> None:
        """``data`` after what was written or skipped so far (``counted``: its
        length reported to ``prog`` once it is written)."""
        view = _pending_view(data)
        if _pwritev is None:  # Windows
            self._out._put(view, self._start)
            self._start += len(view)
            self._out.wrote(len(view))
            if counted:
                self._prog.add(len(view))
            return
        self._views.append(view)
        self._n += len(view)
        stop = self._start + self._n
        if counted:
            self._counted.append((stop, len(view)))
        cut = stop - stop % HUGE_PAGE
        if cut > self._start:
            self._write(cut - self._start)

    def flush(self) -> None:
        """Write what is pending (at the end, or before a hole)."""
        if self._n:
            self._write(self._n)

    def _write(self, k: int) -> None:
        """Write the first ``k`` pending bytes."""
        take: List[Any] = []
        left = k
        views = self._views
        i = 0
        while left:
            v = views[i]
            if len(v) <= left:
                take.append(v)
                left -= len(v)
                i += 1
            else:
                take.append(v[:left])
                views[i] = v[left:]
                left = 0
        del views[:i]
        at = self._start
        for j in range(0, len(take), _IOV_MAX):
            part = take[j:j + _IOV_MAX]
            want = sum(len(v) for v in part)
            while want:
                got = _pwritev(self._out.fd, part, at)
                if got <= 0:
                    raise OSError(errno.EIO, "pwritev wrote nothing", self._out.path)
                at, want = at + got, want - got
                if not want:
                    break
                n = 0   # a short write: on from where it stopped
                while got >= len(part[n]):
                    got -= len(part[n])
                    n += 1
                part = part[n:]
                if got:
                    part[0] = part[0][got:]
        self._start += k
        self._n -= k
        self._out.wrote(k)
        done = 0
        for end, n in self._counted:
            if end > self._start:
                break
            done += 1
            self._prog.add(n)
        del self._counted[:done]


def pwrite_all(fd: int, data: Any, at: int) -> int:
    """All of ``data`` at byte ``at`` of ``fd``; returns its length."""
    view = _bytes_view(data)
    n = len(view)
    while view:
        k = os.pwrite(fd, view, at)
        view, at = view[k:], at + k
    return n

