"""The loader behind ``kiln.torch``'s copies: payload ranges of one or more
files read with ``pread`` (never through a mapping) and put into torch
tensors on any device.

The plan: every payload range is known before the first read (:class:`Item`:
file, offset, size, recorded CRC-32, dtype, shape, and the tensor to fill or
None to make one).  The ranges are cut into chunks of at most ``chunk_bytes``
(adjacent payloads of one file share a chunk; a payload larger than a chunk
spans several), and a pool of reader threads reads them:

- into the destination itself, when it is contiguous host memory (a CPU
  tensor): no staging buffer, no second copy;
- otherwise into a ring of ``slots`` staging buffers allocated once per load
  (pinned when CUDA is there), each chunk copied to its tensors with
  non-blocking copies on a stream of its own; a buffer is read into again only
  after the event recorded behind its copies has completed, and the load
  synchronizes once, at the end.  A chunk of many small tensors is copied to
  the device whole, into a device buffer of the ring, and split there by one
  batched device-to-device copy (``torch._foreach_copy_``): each returned
  tensor owns its memory, and no buffer is kept behind it.

The bytes of each payload are summed (CRC-32) on the host buffer they were
read into, in file order, as its copies are issued (no second read); a
mismatch is ``CHECKSUM`` naming the tensor.  A file that ends before a payload
does (truncated under the load) is ``EOF`` naming the file and the offset.
Whatever fails (a read, a check, a KeyboardInterrupt from a progress
callback), the reader threads are stopped and joined and the buffers dropped
before the error propagates; new tensors are not handed out, and an error
after a target was filled says which targets were written.
"""

import errno
import os
import threading
import zlib
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

from kiln import KilnError
from kiln._access import read_exactly as _read_exact

from ._common import torch_module

__all__ = ["Item", "load", "release", "CHUNK_BYTES", "SLOTS", "THREADS", "SMALL"]

CHUNK_BYTES = 64 << 20   # a chunk: one read, one staging buffer
SLOTS = 4                # staging buffers in the ring (host memory: SLOTS x CHUNK_BYTES at most)
THREADS = 4              # reader threads
SMALL = 1 << 20          # a payload below this, staged, goes to the device with its chunk
_GAP = 64 << 10          # payloads this close share a chunk (the gap is read and skipped)
_ALIGN = 4096            # O_DIRECT: offsets, lengths and addresses on this boundary


class Item(NamedTuple):
    """One payload to load (see the module doc)."""

    key: str            # the name errors report (the file's tensor name)
    path: str           # the local file the payload lies in
    offset: int         # the payload's first byte in that file
    nbytes: int         # its size in bytes
    crc: Optional[int]  # the CRC-32 recorded for it, None when none is
    dtype: Any          # the torch dtype of the result
    shape: Tuple[int, ...]
    target: Any         # a tensor to fill in place, or None: a new one on the device


class _Piece(NamedTuple):
    item: int      # index into the items
    at: int        # offset in the item's payload
    where: int     # offset in the chunk
    n: int


class _Chunk(NamedTuple):
    path: str
    start: int     # file offset of the chunk's first byte
    size: int
    pieces: List[_Piece]
    direct: bool   # read into the destination itself (no staging)


def plan(items: Sequence[Item], direct: Sequence[bool], chunk_bytes: int) -> List[_Chunk]:
    """The chunks of a load, in file order: staged payloads coalesced (gaps up
    to 64 KiB read and skipped), each payload cut at chunk boundaries; a
    direct payload in chunks of its own."""
    order = sorted((i for i, it in enumerate(items) if it.nbytes),
                   key=lambda i: (items[i].path, items[i].offset))
    out: List[_Chunk] = []
    cur: Optional[List[Any]] = None   # [path, start, end, pieces]
    for i in order:
        it = items[i]
        if direct[i]:
            for a in range(0, it.nbytes, chunk_bytes):
                n = min(chunk_bytes, it.nbytes - a)
                out.append(_Chunk(it.path, it.offset + a, n, [_Piece(i, a, 0, n)], True))
            continue
        done = 0
        while done < it.nbytes:
            at = it.offset + done
            if cur is None or cur[0] != it.path or not 0 <= at - cur[2] <= _GAP or \
                    cur[2] - cur[1] >= chunk_bytes:
                if cur is not None:
                    out.append(_Chunk(cur[0], cur[1], cur[2] - cur[1], cur[3], False))
                cur = [it.path, at, at, []]
            n = min(it.nbytes - done, chunk_bytes - (at - cur[1]))
            cur[3].append(_Piece(i, done, at - cur[1], n))
            cur[2] = at + n
            done += n
    if cur is not None:
        out.append(_Chunk(cur[0], cur[1], cur[2] - cur[1], cur[3], False))
    return out



class _Run:
    """One load's state: the readers, the ring, the copies (see :func:`load`)."""

    def __init__(self, torch: Any, items: Sequence[Item], outs: List[Any], chunks: List[_Chunk],
                 slots: int, threads: int, chunk_bytes: int, device: Any,
                 progress: Optional[Callable[[int], None]], direct_io: bool = False) -> None:
        self.torch, self.items, self.outs, self.chunks = torch, items, outs, chunks
        self.direct_io = direct_io and hasattr(os, "O_DIRECT")
        self.dfds: Dict[str, int] = {}   # path -> its O_DIRECT descriptor, -1: refused
        self.device, self.progress = device, progress
        self.stop = threading.Event()
        self.fds: Dict[str, int] = {}
        self.fd_lock = threading.Lock()
        staged = any(not c.direct for c in chunks)
        self.cuda = device.type == "cuda"
        ring = min(slots, sum(1 for c in chunks if not c.direct)) if staged else 0
        size = min(chunk_bytes, max([c.size for c in chunks if not c.direct] or [0]))
        if self.direct_io:   # room to widen a chunk to whole aligned blocks at both ends
            size += 3 * _ALIGN
        self.pin = self.cuda and torch.cuda.is_available()
        self.free: List[int] = []   # staging buffers no chunk holds (under self.cv)
        self.host = _pinned_ring(ring, size) if self.pin else []
        if not self.host:
            self.host = [torch.empty(size, dtype=torch.uint8, pin_memory=self.pin)
                         for _ in range(ring)]
        self.shift = [0] * ring                     # where a slot's chunk starts in it
        self.dev_ring: List[Any] = [None] * ring    # device buffers for chunks of small tensors
        self.events: List[Any] = [None] * ring
        self.free.extend(range(ring))
        self.stream = torch.cuda.Stream(device) if self.cuda else None
        if self.stream is not None:   # targets the model's own work may still be writing
            self.stream.wait_stream(torch.cuda.current_stream(device))
        self.ready: Dict[int, Any] = {}             # chunk index -> slot (or None: direct)
        self.cv = threading.Condition()
        self.error: Optional[BaseException] = None
        self.next = 0
        self.n_threads = max(1, min(threads, len(chunks)))
        self.workers: List[threading.Thread] = []

    # --- the readers -------------------------------------------------------------

    def fd(self, path: str) -> int:
        with self.fd_lock:
            fd = self.fds.get(path)
            if fd is None:
                from kiln._access import open_regular_file
                f = open_regular_file(path)
                fd = self.fds[path] = os.dup(f.fileno())
                f.close()
            return fd

    def reader(self) -> None:
        try:
            while True:
                claimed = self.claim()
                if claimed is None:
                    return
                j, slot = claimed
                c = self.chunks[j]
                what = "the payload of tensor %r" % self.items[c.pieces[0].item].key
                if slot is not None:
                    self.wait_slot(slot)
                    if not (self.direct_io and self.read_direct(slot, c, what)):
                        self.shift[slot] = 0
                        buf = memoryview(self.host[slot].numpy())[:c.size]
                        _read_exact(self.fd(c.path), buf, c.start, c.path, what)
                else:
                    p = c.pieces[0]
                    buf = self.dest(p.item)[p.at:p.at + p.n]
                    _read_exact(self.fd(c.path), buf, c.start, c.path, what)
                with self.cv:
                    self.ready[j] = slot
                    self.cv.notify_all()
        except BaseException as e:   # handed to the consumer, which raises it
            with self.cv:
                if self.error is None:
                    self.error = e
                self.cv.notify_all()

    def direct_fd(self, path: str) -> int:
        """``path`` opened with O_DIRECT (after the regular-file check of its
        buffered open, and only if it is the same file), or -1 where the
        file system refuses direct I/O."""
        buffered = self.fd(path)
        with self.fd_lock:
            fd = self.dfds.get(path)
            if fd is None:
                try:
                    fd = os.open(path, os.O_RDONLY | os.O_DIRECT | getattr(os, "O_CLOEXEC", 0))
                    a, b = os.fstat(fd), os.fstat(buffered)
                    if (a.st_dev, a.st_ino) != (b.st_dev, b.st_ino):
                        os.close(fd)
                        fd = -1
                except OSError:
                    fd = -1
                self.dfds[path] = fd
            return fd

    def read_direct(self, slot: int, c: _Chunk, what: str) -> bool:
        """Chunk ``c`` into ``slot`` with O_DIRECT: whole aligned blocks read
        into an aligned place of the slot, the chunk's bytes found at
        ``shift[slot]``; False where direct I/O is refused (read buffered)."""
        fd = self.direct_fd(c.path)
        if fd < 0:
            return False
        a0 = c.start - c.start % _ALIGN
        need = c.start + c.size - a0
        span = -(-need // _ALIGN) * _ALIGN
        raw = self.host[slot]
        base = -raw.data_ptr() % _ALIGN
        buf = memoryview(raw.numpy())[base:base + span]
        done = 0
        while done < need:
            try:
                n = os.preadv(fd, [buf[done:]], a0 + done)
            except OSError as e:
                if e.errno != errno.EINVAL:
                    raise
                with self.fd_lock:   # refused after all: buffered reads for this file
                    self.dfds[c.path] = -1
                os.close(fd)
                return False
            if n <= 0:
                end = min(a0 + done, os.fstat(fd).st_size)
                raise KilnError("EOF", end, "%s: the file changed under the reader: it ends "
                                "at byte %d, before the end of %s" % (c.path, end, what))
            done += n
        self.shift[slot] = base + c.start - a0
        return True

    def claim(self) -> Optional[Tuple[int, Optional[int]]]:
        """The next chunk and, for a staged one, the buffer it is read into:
        taken together, in chunk order, so the consumer (which takes chunks in
        order) never waits on a chunk whose reader waits on a buffer."""
        with self.cv:
            while not self.stop.is_set() and self.error is None:
                j = self.next
                if j >= len(self.chunks):
                    return None
                if self.chunks[j].direct or self.free:
                    self.next += 1
                    return j, (None if self.chunks[j].direct else self.free.pop())
                self.cv.wait(0.05)
            return None

    def release(self, slot: int) -> None:
        with self.cv:
            self.free.append(slot)
            self.cv.notify_all()

    def wait_slot(self, slot: int) -> None:
        ev = self.events[slot]
        if ev is not None:
            ev.synchronize()   # the copies out of this buffer are done
            self.events[slot] = None

    def dest(self, i: int) -> memoryview:
        """The host destination of item ``i`` as writable bytes."""
        t = self.outs[i].detach()
        return memoryview(t.reshape(-1).view(self.torch.uint8).numpy())

    # --- the consumer ------------------------------------------------------------

    def run(self) -> None:
        for _ in range(self.n_threads):
            w = threading.Thread(target=self.reader, name="kiln-torch-reader", daemon=True)
            self.workers.append(w)
            w.start()
        crcs = [0] * len(self.items)
        for j, c in enumerate(self.chunks):
            with self.cv:
                while j not in self.ready and self.error is None:
                    self.cv.wait(0.1)
                if self.error is not None:
                    raise self.error
                slot = self.ready.pop(j)
            if slot is None:
                p = c.pieces[0]
                if self.items[p.item].crc is not None:
                    crcs[p.item] = zlib.crc32(self.dest(p.item)[p.at:p.at + p.n], crcs[p.item])
            else:
                self.copy_out(c, slot, crcs)
            self.checks(c, crcs)
            if self.progress is not None:
                self.progress(c.size)
        if self.stream is not None:
            self.stream.synchronize()

    def copy_out(self, c: _Chunk, slot: int, crcs: List[int]) -> None:
        torch = self.torch
        host = self.host[slot][self.shift[slot]:]
        raw = memoryview(host.numpy())
        for p in c.pieces:
            if self.items[p.item].crc is not None:
                crcs[p.item] = zlib.crc32(raw[p.where:p.where + p.n], crcs[p.item])
        if not self.cuda:   # a host destination standing in for the device
            for p in c.pieces:
                flat = self.outs[p.item].detach().reshape(-1).view(torch.uint8)
                flat[p.at:p.at + p.n].copy_(host[p.where:p.where + p.n])
            self.release(slot)
            return
        small = [p for p in c.pieces if self.items[p.item].nbytes < SMALL]
        with torch.cuda.stream(self.stream):
            for p in c.pieces:
                if self.items[p.item].nbytes >= SMALL:
                    flat = self.outs[p.item].detach().reshape(-1).view(torch.uint8)
                    flat[p.at:p.at + p.n].copy_(host[p.where:p.where + p.n], non_blocking=True)
            if small:
                dev = self.dev_ring[slot]
                if dev is None or dev.numel() < c.size:
                    dev = self.dev_ring[slot] = torch.empty(host.numel(), dtype=torch.uint8,
                                                            device=self.device)
                dev[:c.size].copy_(host[:c.size], non_blocking=True)
                dsts = [self.outs[p.item].detach().reshape(-1).view(torch.uint8)[p.at:p.at + p.n]
                        for p in small]
                # one batched device copy for the run of small tensors (torch's
                # multi-tensor copy; its name is torch's, not one of kiln's private ones)
                foreach_copy = getattr(torch, "_foreach_copy_")
                foreach_copy(dsts, [dev[p.where:p.where + p.n] for p in small])
            ev = torch.cuda.Event()
            ev.record(self.stream)
        self.events[slot] = ev
        self.release(slot)

    def checks(self, c: _Chunk, crcs: List[int]) -> None:
        """The CRC-32 of each payload that ends in this chunk."""
        for p in c.pieces:
            it = self.items[p.item]
            if it.crc is not None and p.at + p.n == it.nbytes and crcs[p.item] != it.crc:
                raise KilnError("CHECKSUM", it.offset, "%s: tensor %r: payload crc32 is %08x, "
                                "the file records %08x (the payload bytes changed after they "
                                "were written)" % (it.path, it.key, crcs[p.item], it.crc))

    def close(self, keep: bool = True) -> None:
        """Stop and join the readers, wait for the copies, close the files; the
        pinned ring is kept for the next load only after a load that succeeded."""
        self.stop.set()
        with self.cv:
            self.cv.notify_all()
        for w in self.workers:
            w.join()
        if self.stream is not None:
            try:
                self.stream.synchronize()   # no copy may still read a buffer dropped here
            except Exception:   # pragma: no cover (a device fault: the error already raised)
                pass
        for fd in list(self.fds.values()) + [d for d in self.dfds.values() if d >= 0]:
            try:
                os.close(fd)
            except OSError:   # a direct descriptor a reader closed when refused
                pass
        self.fds.clear()
        self.dfds.clear()
        if keep and self.pin and self.host:
            _keep_pinned(self.host)
        self.host, self.dev_ring, self.events = [], [], []


# The pinned ring of the last device load, kept for the next one: pinning
# memory (cudaHostAlloc) costs about as much as copying it, so a ring made per
# load would cost a fifth of a 7.8 GiB load at 45 GB/s.  At most one ring
# (SLOTS x CHUNK_BYTES, 256 MiB by default) stays pinned; release() frees it.
_PINNED: Dict[Tuple[int, int], List[Any]] = {}
_PINNED_LOCK = threading.Lock()


def _pinned_ring(slots: int, size: int) -> List[Any]:
    with _PINNED_LOCK:
        return _PINNED.pop((slots, size), [])


def _keep_pinned(host: List[Any]) -> None:
    with _PINNED_LOCK:
        _PINNED.clear()
        _PINNED[(len(host), int(host[0].numel()))] = host


def release() -> None:
    """Free the pinned staging ring kept from the last device load."""
    with _PINNED_LOCK:
        _PINNED.clear()


def _new_tensor(torch: Any, it: Item, device: Any) -> Any:
    return torch.empty(it.shape, dtype=it.dtype, device=device)


def _writable_host(torch: Any, t: Any) -> bool:
    return t.device.type == "cpu" and t.is_contiguous() and not t.is_neg() and \
        not t.is_conj() and t.layout == torch.strided


def load(items: Sequence[Item], device: Any, *, progress: Any = None,
         chunk_bytes: int = CHUNK_BYTES, slots: int = SLOTS, threads: int = THREADS,
         stage: Optional[bool] = None, direct_io: bool = False) -> List[Any]:
    """The tensors of ``items`` (see the module doc), in their order: each
    ``target`` filled in place, or a new tensor on ``device``.

    Args:
        items: what to load.
        device: where new tensors are made.
        progress: as kiln's ``progress=`` (True for tqdm, or ``fn(done, total)``).
        chunk_bytes, slots, threads: the chunk size, the staging buffers in
            the ring and the reader threads.
        stage: read through the staging ring even into host memory (the path
            a device takes, with the host standing in for it); by default
            only destinations that are not host memory are staged.
        direct_io: read the staged chunks with O_DIRECT (whole 4 KiB blocks
            into aligned buffers; for cold loads, where the page cache only
            costs a copy), falling back to buffered reads for a file whose
            file system refuses it.  Off by default: warm loads read the page
            cache, which direct I/O would bypass.

    Raises:
        KilnError: ``EOF`` (a file shorter than its table says: changed under
            the load), ``CHECKSUM`` (a payload that differs from its recorded
            CRC-32), ``TYPE`` (a bool byte other than 0 or 1); when targets
            had been filled, the message names them.
    """
    from kiln._access import progress_session
    torch = torch_module()
    if chunk_bytes < 1 or slots < 1 or threads < 1:
        raise ValueError("chunk_bytes, slots and threads must be at least 1")
    device = torch.device(device)
    outs = [it.target if it.target is not None else _new_tensor(torch, it, device)
            for it in items]
    if all(t.is_meta for t in outs):
        return outs   # shapes and dtypes only: nothing to read
    late = {}   # a strided target is read into a contiguous tensor, then copied into
    for i, (it, t) in enumerate(zip(items, outs)):
        if t.numel() * t.element_size() != it.nbytes:
            raise ValueError("tensor %r: its destination holds %d bytes, the file %d"
                             % (it.key, t.numel() * t.element_size(), it.nbytes))
        if not t.is_contiguous() or t.is_neg() or t.is_conj():
            late[i] = t
            outs[i] = torch.empty(it.shape, dtype=it.dtype, device=t.device)
    direct = [not stage and _writable_host(torch, t) for t in outs]
    chunks = plan(items, direct, chunk_bytes)
    total = sum(c.size for c in chunks)
    with progress_session(progress, "kiln.torch load") as prog:
        if prog is not None:
            prog.start(total)
        run = _Run(torch, items, outs, chunks, slots, threads, chunk_bytes, device,
                   None if prog is None else prog.add, direct_io)
        try:
            run.run()
        except BaseException as e:
            run.close(keep=False)
            filled = [it.key for it in items if it.target is not None]
            if filled and isinstance(e, KilnError):
                raise KilnError(e.code, e.offset, "%s (the model's tensors may be partly "
                                "written: %s)" % (e.reason, ", ".join(filled[:20]) +
                                                  (", ..." if len(filled) > 20 else ""))) \
                    from None
            raise
        run.close()
    _check_bools(torch, items, outs)
    for i, t in late.items():
        t.copy_(outs[i])
        outs[i] = t
    return outs


def _check_bools(torch: Any, items: Sequence[Item], outs: List[Any]) -> None:
    """A Kiln bool is one byte, 0 or 1: ``TYPE`` at the first other byte."""
    for it, t in zip(items, outs):
        if it.dtype == torch.bool and it.nbytes:
            raw = t.detach().reshape(-1).view(torch.uint8)
            bad = raw > 1
            if bool(bad.any()):
                k = int(bad.nonzero()[0][0])
                raise KilnError("TYPE", it.offset + k, "%s: tensor %r: bool byte is %d, not "
                                "0 or 1" % (it.path, it.key, int(raw[k])))
