"""The page cache of the files a write replaces.

A write that replaces a large file (an atomic save over it, a set whose old
shards go) lets go of the old file's cached pages twice over: before it
writes, :func:`drop_cached` gives them back so that the new bytes take
those pages rather than fresh ones; after the rename, :func:`hold_old` and
:func:`free_later` keep the freeing of what is left (and of the file's
blocks) off the caller's path.
"""

import os
import stat
import threading
from typing import List, Optional

FREE_LATER = 16 << 20   # a replaced file this large is freed off the caller's path


def hold_old(target: str) -> Optional[int]:
    """A descriptor of the regular file ``target`` when it is at least
    ``FREE_LATER`` bytes, else None.  Held across the rename, it keeps the
    old file's pages and blocks alive, so the rename does not free them (for
    a checkpoint of 400 MB that is about 0.1 s of page-cache and extent work
    inside ``rename``); :func:`free_later` drops it on another thread.
    Not on Windows, where an open file cannot be replaced."""
    if os.name != "posix":  # pragma: no cover - Windows
        return None
    try:
        fd = os.open(target, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)
                     | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None   # no target, a symlink (resolve_target followed it already), no access
    try:
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode) and st.st_size >= FREE_LATER:
            return fd
    except OSError:
        pass
    os.close(fd)
    return None


def free_later(fd: Optional[int]) -> None:
    """Close ``fd`` (the replaced file's last reference) on a daemon thread."""
    if fd is None:
        return
    try:
        threading.Thread(target=os.close, args=(fd,), name="kiln-free-replaced",
                         daemon=True).start()
    except RuntimeError:   # no new threads (interpreter shutting down): close here
        os.close(fd)


def drop_cached(paths: List[str]) -> None:
    """Let the page cache go of each file of ``paths`` (files a write is
    about to replace) that is at least ``FREE_LATER`` bytes, before the new
    bytes are written: the new file then takes the pages the old one gave
    back, where it would otherwise need as many more.  Fresh pages are the
    slow ones on a virtual machine whose host backs guest memory as it is
    first touched (1.7 GB saved over its old file: 1.2-1.5 s after this, 2.4-4.7 s
    without; see docs/benchmarks.md).  The old file stays whole and
    readable (a reader may find it on disk rather than in memory); pages a
    process has mapped are never dropped, and a file this process maps or
    has open is left alone (its tensors may be the bytes being saved, a
    reader here may be copying from it).  Best effort: where it cannot tell
    which files this process uses, nothing is dropped."""
    fadvise = getattr(os, "posix_fadvise", None)
    big = []
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode) and st.st_size >= FREE_LATER:
            big.append((path, (st.st_dev, st.st_ino)))
    used = _used_files() if big and fadvise is not None else None
    if used is None:
        return
    for path, key in big:
        if key in used:
            continue
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)
                         | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            continue
        try:
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) == key:   # not a file put there since
                fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        except OSError:
            pass
        finally:
            os.close(fd)


def _used_files() -> Optional[set]:
    """``{(st_dev, st_ino)}`` of the files this process maps or has open
    (Linux's ``/proc/self/maps`` and ``/proc/self/fd``), or None where that
    cannot be read."""
    try:
        with open("/proc/self/maps", "rb") as f:
            lines = f.read().splitlines()
        fds = os.listdir("/proc/self/fd")
    except OSError:
        return None
    out = set()
    for line in lines:
        parts = line.split(None, 5)
        if len(parts) >= 5 and parts[4] != b"0":
            major, _, minor = parts[3].partition(b":")
            try:
                out.add((os.makedev(int(major, 16), int(minor, 16)), int(parts[4])))
            except ValueError:
                return None
    for fd in fds:
        try:
            st = os.stat("/proc/self/fd/" + fd)
        except OSError:   # closed meanwhile (the listing's own descriptor is)
            continue
        out.add((st.st_dev, st.st_ino))
    return out
