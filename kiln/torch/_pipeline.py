"""The loader behind ``kiln.torch``'s copies: payload ranges of one or more
open files read with ``pread`` (never through a mapping) and put into torch
tensors on any device.

Where the bytes come from: every payload is read from the very file whose
table was read, the descriptor :func:`kiln.open` opened (duplicated: the
load owns its copy), never the file's name again, so a checkpoint replaced
under the load (written to a temporary file and renamed over, as every
atomic writer does) is read whole from the generation that was opened.  A
file object without a descriptor is read from the bytes ``kiln.open`` took
from it; a remote file (``s3://``, ``https://``, ``memory://``) in ranges of
at most one chunk, through its reader (:class:`FileBytes`).

The plan (kiln/torch/_plan.py): every payload range is known before the
first read (:class:`Item`: file, offset, size, recorded CRC-32, dtype, shape,
and the tensor to fill or None to make one).  The ranges are cut into chunks
of at most ``chunk_bytes`` (adjacent payloads of one file share a chunk; a
payload larger than a chunk spans several), and a pool of reader threads
reads them (how many threads, buffers and bytes a chunk:
:func:`concurrency`, from the CPUs and the load's size):

- into the destinations themselves, when they are contiguous host memory (CPU
  tensors): an *in-place* chunk, no staging buffer, no second copy (one
  ``preadv`` scattered into the many payloads of a chunk of small ones);
- otherwise into a ring of ``slots`` staging buffers (pinned when CUDA is
  there), each chunk copied to its tensors with non-blocking copies on a
  stream of its own; a buffer is read into again only after the event
  recorded behind its copies has completed, and the load synchronizes once,
  at the end.  A payload of 1 MiB or more goes straight from the staging
  buffer to its tensor; only the spans of a chunk holding smaller payloads
  are copied to a device buffer of the ring and split there by one batched
  device-to-device copy (``torch._foreach_copy_``), so the link carries the
  payload and the padding between small neighbours, nothing else: each
  returned tensor owns its memory.  The ring (its host buffers and the
  device buffers of its slots) is kept for the next load onto the same
  device, reused when it is large enough; :func:`release` frees it.

O_DIRECT (``direct_io=True``) is another matter than in-place reads: staged
chunks read with O_DIRECT through a second descriptor of the same open file
(``/proc/self/fd``), buffered where the file system refuses it; that
descriptor is closed with the load, never while a reader may hold it.

The bytes of each payload are summed (CRC-32) on the host buffer they were
read into, by the reader thread that read them (the kernels' CRC-32, which
lets other threads run meanwhile; no second read), and the consumer joins
the sums of a payload cut across chunks with ``crc32_combine``; a mismatch is
``CHECKSUM`` naming the tensor.  A file that ends before a payload
does (truncated under the load) is ``EOF`` naming the file and the offset.
Bool payloads are read into tensors of their own and checked before any
target is written.  Whatever fails (a read, a check, a KeyboardInterrupt from
a progress callback), the reader threads are stopped and joined and the
buffers dropped before the error propagates; new tensors are not handed out,
and an error after a target was written names the targets written.
"""

import ctypes
import errno
import os
import threading
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from kiln import KilnError
from kiln._access import crc32_combine as _crc32_combine, kernel_crc32

from ._common import torch_module
from ._copy import SMALL, copy_step
from ._plan import _GAP, IN_PLACE, Chunk, Item, plan
from ._sources import FileBytes, file_bytes

__all__ = ["Item", "FileBytes", "file_bytes", "load", "load_each", "release", "concurrency",
           "SMALL"]

_MIB = 1 << 20
RING_BYTES = 1 << 30     # the staging ring's host memory, at most (slots x chunk_bytes)
_ALIGN = 4096            # O_DIRECT: offsets, lengths and addresses on this boundary


# --- the run -----------------------------------------------------------------------

class _Slot:
    """One staging buffer of the ring and what it holds."""

    __slots__ = ("host", "shift", "dev", "event")

    def __init__(self, host: Any) -> None:
        self.host = host      # the host buffer chunks are read into
        self.shift = 0        # where the chunk read last starts in it (O_DIRECT aligns)
        self.dev: Any = None  # a device buffer for the chunk's small payloads
        self.event: Any = None   # recorded behind the copies out of it


class _Run:
    """One load's state: the readers, the ring, the copies (see :func:`load`)."""

    def __init__(self, torch: Any, items: Sequence[Item], outs: List[Any], chunks: List[Chunk],
                 slots: int, threads: int, chunk_bytes: int, device: Any,
                 progress: Optional[Callable[[int], None]], direct_io: bool = False,
                 stand_in: bool = False) -> None:
        self.torch, self.items, self.outs, self.chunks = torch, items, outs, chunks
        self.odirect = direct_io and hasattr(os, "O_DIRECT")
        self.device, self.progress = device, progress
        self.stop = threading.Event()
        staged = [c for c in chunks if not c.in_place]
        ring = min(slots, len(staged))
        size = min(chunk_bytes, max([c.size for c in staged] or [0]))
        if self.odirect:   # room to widen a chunk to whole aligned blocks at both ends
            size += 3 * _ALIGN
        self.copier = copy_step(torch, device, stand_in)   # (kiln/torch/_copy.py)
        self.key = (self.copier.kind, str(device))   # the kept ring this load may reuse
        self.slots = _take_ring(self.key, ring, size) if ring else []
        if not self.slots:
            self.slots = [_Slot(self.copier.host_buffer(size)) for _ in range(ring)]
        self.free: List[int] = list(range(ring))    # slots no chunk holds (under self.lock)
        # chunk index -> (its slot, None in place; the CRC-32 of each of its pieces)
        self.ready: Dict[int, Tuple[Optional[int], List[int]]] = {}
        self.crc32: Callable[[Any], int] = kernel_crc32   # compiled: carry-less multiply
        # targeted wake-ups: a released slot wakes one reader waiting for a
        # slot, a chunk read wakes the consumer only when it waits for that one
        self.lock = threading.Lock()
        self.slot_cv = threading.Condition(self.lock)    # readers waiting for a slot
        self.ready_cv = threading.Condition(self.lock)   # the consumer, for chunk self.want
        self.want = -1
        self.error: Optional[BaseException] = None
        self.next = 0
        self.n_threads = max(1, min(threads, len(chunks)))
        self.workers: List[threading.Thread] = []
        self.written: set = set()   # items whose destination took bytes (for the error note)

    # --- the readers -------------------------------------------------------------

    def reader(self) -> None:
        scratch = memoryview(bytearray(_GAP))   # the gaps between in-place payloads
        try:
            while True:
                claimed = self.claim()
                if claimed is None:
                    return
                j, slot = claimed
                c = self.chunks[j]
                if slot is not None:
                    what = "the payload of tensor %r" % self.items[c.pieces[0].item].key
                    s = self.slots[slot]
                    self.copier.wait(s)
                    if not (self.odirect and self.read_odirect(s, c, what)):
                        s.shift = 0
                        c.src.read(memoryview(s.host.numpy())[:c.size], c.start, what)
                    sums = self.piece_crcs(c, memoryview(s.host.numpy())[s.shift:])
                else:
                    sums = self.read_in_place(c, scratch)
                with self.lock:
                    self.ready[j] = (slot, sums)
                    if j == self.want:
                        self.ready_cv.notify()
        except BaseException as e:   # handed to the consumer, which raises it
            with self.lock:
                if self.error is None:
                    self.error = e
                self.wake_all()

    def read_in_place(self, c: Chunk, scratch: memoryview) -> List[int]:
        """In-place chunk ``c`` read straight into its destinations (one
        ``preadv`` for all its payloads); the CRC-32 of each piece."""
        views: List[Any] = []   # the destinations, and the gaps between them
        got: List[Any] = []
        pos = 0
        for p in c.pieces:
            self.written.add(p.item)
            gap = p.where - pos
            while gap > 0:   # (the plan keeps a gap within one scratch buffer)
                views.append(scratch[:gap])
                gap -= len(views[-1])
            v = self.dest(p.item)[p.at:p.at + p.n]
            views.append(v)
            got.append(v)
            pos = p.where + p.n
        c.src.read_many(views, c.start, lambda end: self.what(c, end))
        items, crc = self.items, self.crc32
        return [crc(v) if items[p.item].crc is not None else 0 for p, v in zip(c.pieces, got)]

    def what(self, c: Chunk, at: int) -> str:
        """What chunk ``c`` holds at file offset ``at`` (for an ``EOF``)."""
        p = next((p for p in c.pieces if c.start + p.where + p.n > at), c.pieces[-1])
        return "the payload of tensor %r" % self.items[p.item].key

    def piece_crcs(self, c: Chunk, raw: memoryview) -> List[int]:
        """The CRC-32 of each piece of chunk ``c`` (its bytes in ``raw``, at
        each piece's ``where``) whose payload has one recorded, else 0;
        computed here, in the reader thread, with the kernel's CRC-32 (which
        lets other threads run meanwhile), so that checksums cost the
        consumer nothing but a combine for a payload cut across chunks."""
        items, crc = self.items, self.crc32
        return [crc(raw[p.where:p.where + p.n]) if items[p.item].crc is not None else 0
                for p in c.pieces]

    def read_odirect(self, s: _Slot, c: Chunk, what: str) -> bool:
        """Chunk ``c`` into slot ``s`` with O_DIRECT: whole aligned blocks read
        into an aligned place of the slot, the chunk's bytes found at
        ``s.shift``; False where direct I/O is refused (read buffered)."""
        fd = c.src.odirect_fd()   # (taken once: another reader may refuse it meanwhile)
        if fd < 0:
            return False
        a0 = c.start - c.start % _ALIGN
        need = c.start + c.size - a0
        span = -(-need // _ALIGN) * _ALIGN
        base = -s.host.data_ptr() % _ALIGN
        buf = memoryview(s.host.numpy())[base:base + span]
        try:
            c.src.read_direct(fd, buf, a0, what, need)
        except OSError as e:
            if e.errno != errno.EINVAL:
                raise
            c.src.refuse_odirect()   # refused after all: buffered reads for this file
            return False
        s.shift = base + c.start - a0
        return True

    def claim(self) -> Optional[Tuple[int, Optional[int]]]:
        """The next chunk and, for a staged one, the slot it is read into:
        taken together, in chunk order, so the consumer (which takes chunks in
        order) never waits on a chunk whose reader waits on a slot."""
        got = None   # (None: the load stops, or every chunk is taken)
        with self.lock:
            while got is None and not self.stop.is_set() and self.error is None:
                j = self.next
                if j >= len(self.chunks):
                    self.slot_cv.notify_all()   # the readers waiting for a slot: no more chunks
                    break
                if self.chunks[j].in_place or self.free:
                    self.next += 1
                    got = j, (None if self.chunks[j].in_place else self.free.pop())
                else:
                    self.slot_cv.wait()
        return got

    def release(self, slot: int) -> None:
        with self.lock:
            self.free.append(slot)
            self.slot_cv.notify()   # one reader waiting for a slot

    def wake_all(self) -> None:
        """Every thread waiting (the load stops; under ``self.lock``)."""
        self.slot_cv.notify_all()
        self.ready_cv.notify_all()

    def dest(self, i: int) -> memoryview:
        """The host destination of item ``i`` as writable bytes: its
        ``nbytes`` from its first byte (contiguous host memory, of the
        payload's size, checked by :func:`load`; kept alive by ``outs``)."""
        n = self.items[i].nbytes
        return memoryview((ctypes.c_ubyte * n).from_address(self.outs[i].data_ptr())).cast("B")

    # --- the consumer ------------------------------------------------------------

    def run(self) -> None:
        with self.lock:   # every reader started before any reads (they claim under the
            for _ in range(self.n_threads):   # lock): a thread started while another is
                w = threading.Thread(target=self.reader, name="kiln-torch-reader",
                                     daemon=True)   # in a long pread took 1-4 ms to start
                self.workers.append(w)
                w.start()
        crcs = [0] * len(self.items)
        for j, c in enumerate(self.chunks):
            with self.lock:
                self.want = j
                while j not in self.ready and self.error is None:
                    self.ready_cv.wait()
                if self.error is not None:
                    raise self.error
                slot, sums = self.ready.pop(j)
            for p, x in zip(c.pieces, sums):   # the readers' CRCs, joined piece by piece
                if self.items[p.item].crc is not None:
                    crcs[p.item] = x if p.at == 0 else _crc32_combine(crcs[p.item], x, p.n)
            if slot is not None:
                self.copy_out(c, slot)
            self.checks(c, crcs)
            if self.progress is not None:
                self.progress(c.size)
        self.copier.finish()

    def copy_out(self, c: Chunk, slot: int) -> None:
        self.written.update(p.item for p in c.pieces)
        self.copier.copy(c, self.slots[slot], self.items, self.outs)
        self.release(slot)

    def checks(self, c: Chunk, crcs: List[int]) -> None:
        """The CRC-32 of each payload that ends in this chunk."""
        for p in c.pieces:
            it = self.items[p.item]
            if it.crc is not None and p.at + p.n == it.nbytes and crcs[p.item] != it.crc:
                raise KilnError("CHECKSUM", it.offset, "%s: tensor %r: payload crc32 is %08x, "
                                "the file records %08x (the payload bytes changed after they "
                                "were written)" % (it.src.name, it.key, crcs[p.item], it.crc))

    def close(self, keep: bool = True) -> None:
        """Stop and join the readers, wait for the copies; the pinned ring is
        kept for the next load only after a load that succeeded (the files
        are their owner's to close)."""
        self.stop.set()
        with self.lock:
            self.wake_all()
        for w in self.workers:
            w.join()
        try:
            self.copier.finish()   # no copy may still read a buffer dropped here
        except Exception:   # pragma: no cover (a device fault: the error already raised)
            pass
        if keep and self.copier.kind != "host" and self.slots:
            _keep_ring(self.key, self.slots)
        self.slots = []


# The ring of the last device load onto each device, kept for the next one:
# its pinned host buffers (pinning, cudaHostAlloc, costs about as much as
# copying the memory, so a ring made per load would cost a fifth of a 7.8 GiB
# load at 45 GB/s) and the device buffers its small payloads were split in.
# A load reuses the kept ring when it has at least the slots and the buffer
# size the load needs; release() frees them all.
_KEPT: Dict[Tuple[str, str], List[_Slot]] = {}
_KEPT_LOCK = threading.Lock()


def _take_ring(key: Tuple[str, str], ring: int, size: int) -> List[_Slot]:
    """The kept ring of ``key`` when it has ``ring`` slots of ``size`` bytes
    or more (all its slots: more of them cost nothing now), else none."""
    with _KEPT_LOCK:
        kept = _KEPT.pop(key, [])
    if len(kept) < ring or int(kept[0].host.numel()) < size:
        return []   # (dropped: a new ring is made and kept in its place)
    for s in kept:
        s.shift, s.event = 0, None
    return kept


def _keep_ring(key: Tuple[str, str], slots: List[_Slot]) -> None:
    with _KEPT_LOCK:
        _KEPT[key] = slots


def release() -> None:
    """Free what the device loads keep between loads: for each device, the
    staging ring of its last load (pinned host memory, ``slots x chunk_bytes``
    bytes) and the device buffers of that ring (up to one chunk a slot, made
    where a chunk held payloads under 1 MiB).  The next load makes them anew."""
    with _KEPT_LOCK:
        _KEPT.clear()


def _new_tensor(torch: Any, it: Item, device: Any) -> Any:
    return torch.empty(it.shape, dtype=it.dtype, device=device)


def _writable_host(torch: Any, t: Any) -> bool:
    return t.device.type == "cpu" and t.is_contiguous() and not t.is_neg() and \
        not t.is_conj() and t.layout == torch.strided


def concurrency(cpus: int, total: int, host: bool = False) -> Tuple[int, int, int]:
    """``(threads, slots, chunk_bytes)`` for a load of ``total`` payload bytes
    on a machine of ``cpus`` CPUs: readers ``cpus - 4`` (leaving cores to
    the consumer, the copies and the caller) up to 16, half the CPUs on a
    machine of 6 or fewer, at least 1; a ``host`` load (into host memory,
    its large payloads read in place: the consumer has only the small ones
    to copy) one reader a CPU, up to 16.  Slots half as many again as
    readers (at least 2 more: a reader never waits for the copy of a chunk
    another has read); chunks of 8 to 32 MiB, about a quarter of a reader's
    share of the load, within :data:`RING_BYTES` of ring."""
    threads = max(1, min(16, cpus if host else cpus - 4 if cpus > 6 else cpus // 2))
    slots = threads + max(2, threads // 2)
    chunk = min(max(8 * _MIB, total // (4 * threads) // _MIB * _MIB), 32 * _MIB,
                RING_BYTES // slots // _MIB * _MIB)
    return threads, slots, chunk


def _cpus() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):   # pragma: no cover (not Linux)
        return os.cpu_count() or 1


def load(items: Sequence[Item], device: Any, *, progress: Any = None,
         chunk_bytes: Optional[int] = None, slots: Optional[int] = None,
         threads: Optional[int] = None,
         stage: Optional[bool] = None, direct_io: bool = False,
         counts: Optional[Dict[str, int]] = None) -> List[Any]:
    """The tensors of ``items`` (see the module doc), in their order: each
    ``target`` filled in place, or a new tensor on ``device``.

    Args:
        items: what to load.
        device: where new tensors are made.
        progress: as kiln's ``progress=`` (True for tqdm, or ``fn(done, total)``).
        chunk_bytes, slots, threads: the chunk size, the staging buffers in
            the ring and the reader threads; each by default chosen from the
            machine's CPUs and the load's size (:func:`concurrency`).
        stage: read through the staging ring even into host memory (the path
            a device takes, with the host standing in for it: the same copy
            step, see kiln/torch/_copy.py); by default only destinations
            that are not host memory, and small payloads, are staged.
        direct_io: read the staged chunks with O_DIRECT (whole 4 KiB blocks
            into aligned buffers; for cold loads, where the page cache only
            costs a copy), falling back to buffered reads for a file whose
            file system refuses it.  Off by default: warm loads read the page
            cache, which direct I/O would bypass.
        counts: a dict that gains ``link_bytes``, the bytes copied from host
            to device (or that would be, on the host stand-in), and
            ``payload_bytes``, the payload bytes read through the staging
            ring (a device load's link carries ``link_bytes / payload_bytes``
            times its payload).

    Raises:
        KilnError: ``EOF`` (a file shorter than its table says: changed under
            the load), ``CHECKSUM`` (a payload that differs from its recorded
            CRC-32), ``TYPE`` (a bool byte other than 0 or 1, found before
            any target is written); when targets had been written, the
            message names them.
    """
    from kiln._access import progress_session
    torch = torch_module()
    device = torch.device(device)
    auto = concurrency(_cpus(), sum(it.nbytes for it in items),
                       host=device.type == "cpu" and not stage)
    threads = auto[0] if threads is None else threads
    slots = auto[1] if slots is None else slots
    chunk_bytes = auto[2] if chunk_bytes is None else chunk_bytes
    if chunk_bytes < 1 or slots < 1 or threads < 1:
        raise ValueError("chunk_bytes, slots and threads must be at least 1")
    outs = [it.target if it.target is not None else _new_tensor(torch, it, device)
            for it in items]
    if all(t.is_meta for t in outs):
        return outs   # shapes and dtypes only: nothing to read
    late = {}   # read into a tensor of its own, then copied into the target
    for i, (it, t) in enumerate(zip(items, outs)):
        if t.numel() * t.element_size() != it.nbytes:
            raise ValueError("tensor %r: its destination holds %d bytes, the file %d"
                             % (it.key, t.numel() * t.element_size(), it.nbytes))
        if it.target is None:
            continue   # made here: contiguous, never visible before the load returns
        if not t.is_contiguous() or t.is_neg() or t.is_conj() or \
                (it.target is not None and it.dtype == torch.bool and it.nbytes):
            late[i] = t   # strided, or a bool payload: checked before it becomes visible
            outs[i] = torch.empty(it.shape, dtype=it.dtype, device=t.device)
    bools = [i for i, it in enumerate(items) if it.dtype == torch.bool and it.nbytes]
    others = [i for i, it in enumerate(items) if not (it.dtype == torch.bool and it.nbytes)]
    parts = [bools, others] if bools and others else [list(range(len(items)))]
    with progress_session(progress, "kiln.torch load") as prog:
        plans = []
        for part in parts:   # the bool payloads first: checked before any other is read
            sub = [outs[i] for i in part]
            plans.append((part, plan([items[i] for i in part],
                                     [not stage and items[i].nbytes >= IN_PLACE and
                                      _writable_host(torch, t) for i, t in zip(part, sub)],
                                     chunk_bytes)))
        if prog is not None:
            prog.start(sum(c.size for _, chunks in plans for c in chunks))
        shown = [it.untargeted() if i in late else it   # (late: not yet visible)
                 for i, it in enumerate(items)]
        for part, chunks in plans:
            sub_items = [shown[i] for i in part]
            sub = _run(torch, sub_items, [outs[i] for i in part], chunks, device,
                       None if prog is None else prog.add, chunk_bytes, slots, threads,
                       direct_io, bool(stage), counts)
            _check_bools(torch, sub_items, sub)
    for i, t in late.items():
        t.copy_(outs[i])
        outs[i] = t
    return outs


def load_each(parts: Dict[Any, List[Item]], *, threads: Optional[int] = None,
              **options: Any) -> Dict[Any, List[Any]]:
    """:func:`load` of each device's items (``parts``: device -> items), one
    pipelined load a device, all at once, the reader threads shared out
    between them (``threads``, by default :func:`concurrency`'s for the whole
    load, divided by the devices, at least one each); the other options as
    :func:`load`.  The first error of any load is raised once all have ended."""
    if len(parts) == 1:
        (dev, items), = parts.items()
        return {dev: load(items, dev, threads=threads, **options)}
    if threads is None:
        threads = concurrency(_cpus(), sum(it.nbytes for v in parts.values() for it in v))[0]
    each = max(1, threads // len(parts))
    done: Dict[Any, List[Any]] = {}
    errors: List[BaseException] = []

    def one(dev: Any, items: List[Item]) -> None:
        try:
            done[dev] = load(items, dev, threads=each, **options)
        except BaseException as e:   # raised below, after every load has ended
            errors.append(e)
    runs = [threading.Thread(target=one, args=kv, name="kiln-torch-device")
            for kv in parts.items()]
    for t in runs:
        t.start()
    for t in runs:
        t.join()
    if errors:
        raise errors[0]
    return done


def _run(torch: Any, items: List[Item], outs: List[Any], chunks: List[Chunk], device: Any,
         progress: Optional[Callable[[int], None]], chunk_bytes: int, slots: int, threads: int,
         direct_io: bool, stand_in: bool, counts: Optional[Dict[str, int]]) -> List[Any]:
    """One pipelined run over ``items`` into ``outs`` (filled in place)."""
    run = _Run(torch, items, outs, chunks, slots, threads, chunk_bytes, device, progress,
               direct_io, stand_in)
    try:
        run.run()
    except BaseException as e:
        run.close(keep=False)
        filled = [items[i].key for i in sorted(run.written) if items[i].target is not None]
        if filled and isinstance(e, KilnError):
            raise KilnError(e.code, e.offset, "%s (the model's tensors may be partly "
                            "written: %s)" % (e.reason, ", ".join(filled[:20]) +
                                              (", ..." if len(filled) > 20 else ""))) \
                from None
        raise
    run.close()
    if counts is not None:
        counts["link_bytes"] = counts.get("link_bytes", 0) + run.copier.link_bytes
        counts["payload_bytes"] = counts.get("payload_bytes", 0) + sum(
            p.n for c in chunks if not c.in_place for p in c.pieces)
    return outs


def _check_bools(torch: Any, items: Sequence[Item], outs: List[Any]) -> None:
    """A Kiln bool is one byte, 0 or 1: ``TYPE`` at the first other byte."""
    for it, t in zip(items, outs):
        if it.dtype == torch.bool and it.nbytes and not t.is_meta:
            raw = t.detach().reshape(-1).view(torch.uint8)
            bad = raw > 1
            if bool(bad.any()):
                k = int(bad.nonzero()[0][0])
                raise KilnError("TYPE", it.offset + k, "%s: tensor %r: bool byte is %d, not "
                                "0 or 1" % (it.src.name, it.key, int(raw[k])))
