"""The copy step of the torch loader (:mod:`kiln.torch._pipeline`): how the
pieces of a staged chunk reach their tensors, behind one small interface
(:class:`CopyStep`).

* :class:`HostCopy`: host destinations, each piece copied with ``memmove``
  (small CPU payloads staged with their neighbours).
* :class:`CudaCopy`: the device path.  A piece of a payload of :data:`SMALL`
  bytes or more goes straight from the staging buffer to its tensor; only
  the spans of a chunk that hold smaller payloads (:func:`spans`: neighbours
  and their alignment padding, never a large payload) are copied into a
  device buffer of its slot, at their place in the chunk, and split there by
  one batched device-to-device copy; the copies are issued in order on a
  stream of the load's own (which first waits for the work already queued
  on the device: the model's own may still be writing the targets), and an
  event is recorded behind the copies out of a slot, on which a reader
  waits (a blocking event: the thread sleeps, no core spins) before reading
  into that slot again.  ``link_bytes`` counts the bytes that cross from
  host to device.

Every call :class:`CudaCopy` makes to the device goes through its ``api``:
:class:`CudaDevice` (``torch.cuda``: a stream, blocking events,
non-blocking copies, pinned host memory) or :class:`HostDevice`, host memory
standing in for the device (copies made at once, an event that is done when
recorded).  :class:`StandInCopy` is :class:`CudaCopy` on a
:class:`HostDevice`: the very lines of the CUDA path run on a CPU, so the
suite runs its planning, splitting and ordering, counts what would cross the
link, and checks that every line of :class:`CudaCopy` runs
(tests/test_pipeline.py).  The two device classes are each a line a call.
"""

import ctypes
from typing import Any, List, Sequence, Tuple

__all__ = ["SMALL", "JOIN", "spans", "CopyStep", "HostCopy", "CudaCopy", "StandInCopy",
           "CudaDevice", "HostDevice", "copy_step"]

SMALL = 1 << 20          # a payload below this, staged, goes to the device with its neighbours
JOIN = 256               # small payloads this close cross in one copy (the gap with them)
_memmove = ctypes.memmove


class CopyStep:
    """Moves the pieces of a staged chunk out of its slot (a ``_Slot``: the
    host buffer ``host``, the chunk's bytes from ``shift``, and ``dev`` and
    ``event`` for the copy step's own use)."""

    link_bytes = 0   # bytes copied from host to device
    kind = "host"    # which kept ring this step's buffers belong to

    def host_buffer(self, n: int) -> Any:
        """A staging buffer of ``n`` bytes (pinned memory for a device)."""
        raise NotImplementedError

    def wait(self, s: Any) -> None:
        """Before slot ``s`` is read into again: the copies out of it are done."""

    def copy(self, c: Any, s: Any, items: Sequence[Any], outs: List[Any]) -> None:
        """Issue the copies of chunk ``c``'s pieces out of slot ``s``."""
        raise NotImplementedError

    def finish(self) -> None:
        """Every copy issued is done (before the load returns or its buffers go)."""


class HostCopy(CopyStep):
    """Host destinations: ``memmove`` into each contiguous destination (in
    bounds: a destination holds its payload's bytes, checked by the load)."""

    def __init__(self, torch: Any) -> None:
        self.torch = torch

    def host_buffer(self, n: int) -> Any:
        return self.torch.empty(n, dtype=self.torch.uint8)

    def copy(self, c: Any, s: Any, items: Sequence[Any], outs: List[Any]) -> None:
        base = s.host.data_ptr() + s.shift
        for p in c.pieces:
            _memmove(outs[p.item].data_ptr() + p.at, base + p.where, p.n)


def spans(pieces: Sequence[Any], items: Sequence[Any]) -> List[Tuple[int, int]]:
    """The byte ranges ``(start, end)`` of a chunk that cross to the device
    buffer: each run of small pieces with no large one between them and
    gaps of at most :data:`JOIN` bytes (the file's alignment padding) is one
    range; the large pieces and the gaps around them stay on the host."""
    out: List[Tuple[int, int]] = []
    joined = False   # may the next small piece extend the last range?
    for p in pieces:
        if items[p.item].nbytes >= SMALL:
            joined = False
            continue
        if joined and p.where - out[-1][1] <= JOIN:
            out[-1] = (out[-1][0], p.where + p.n)
        else:
            out.append((p.where, p.where + p.n))
        joined = True
    return out


class CudaCopy(CopyStep):
    """The device path (see the module doc), its device calls through ``api``."""

    def __init__(self, torch: Any, device: Any, api: Any) -> None:
        self.torch, self.device, self.api = torch, device, api
        self.kind = api.kind
        self.link_bytes = 0
        self.stream = api.stream()

    def host_buffer(self, n: int) -> Any:
        return self.api.pinned(n)

    def copy(self, c: Any, s: Any, items: Sequence[Any], outs: List[Any]) -> None:
        u8, api = self.torch.uint8, self.api
        host = s.host[s.shift:]
        small = [p for p in c.pieces if items[p.item].nbytes < SMALL]
        with api.use(self.stream):
            for p in c.pieces:   # large payloads: straight to their tensors
                if items[p.item].nbytes >= SMALL:
                    flat = outs[p.item].detach().reshape(-1).view(u8)
                    self.to_device(flat[p.at:p.at + p.n], host[p.where:p.where + p.n])
            if small:   # only the spans holding small payloads, split on the device
                if s.dev is None or s.dev.numel() < c.size:
                    s.dev = api.buffer(host.numel())
                for a, b in spans(c.pieces, items):
                    self.to_device(s.dev[a:b], host[a:b])
                # one batched device copy for the run of small tensors
                api.split([outs[p.item].detach().reshape(-1).view(u8)[p.at:p.at + p.n]
                           for p in small], [s.dev[p.where:p.where + p.n] for p in small])
            s.event = api.event()
            s.event.record(self.stream)

    def to_device(self, dst: Any, src: Any) -> None:
        self.link_bytes += src.numel()
        self.api.copy(dst, src)

    def wait(self, s: Any) -> None:
        ev = s.event
        if ev is not None:
            ev.synchronize()   # the copies out of this buffer are done (the thread sleeps)
            s.event = None

    def finish(self) -> None:   # waited on as an event, blocking: the thread sleeps
        done = self.api.event()
        done.record(self.stream)
        done.synchronize()


class CudaDevice:
    """The CUDA calls of :class:`CudaCopy` on ``device``."""

    kind = "cuda"

    def __init__(self, torch: Any, device: Any) -> None:
        self.torch, self.cuda, self.device = torch, torch.cuda, device

    def stream(self) -> Any:   # the load's own, behind the work already queued
        s = self.cuda.Stream(self.device)
        s.wait_stream(self.cuda.current_stream(self.device))
        return s

    def use(self, stream: Any) -> Any:
        return self.cuda.stream(stream)

    def event(self) -> Any:   # blocking: synchronize() sleeps instead of spinning
        return self.cuda.Event(blocking=True)

    def copy(self, dst: Any, src: Any) -> None:
        dst.copy_(src, non_blocking=True)

    def split(self, dsts: List[Any], srcs: List[Any]) -> None:
        # torch's multi-tensor copy (its name is torch's, not one of kiln's private ones)
        getattr(self.torch, "_foreach_copy_")(dsts, srcs)

    def buffer(self, n: int) -> Any:
        return self.torch.empty(n, dtype=self.torch.uint8, device=self.device)

    def pinned(self, n: int) -> Any:
        return self.torch.empty(n, dtype=self.torch.uint8, pin_memory=True)


class _HostStream:
    """A stream whose work is done when issued (the host stand-in copies at once)."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


class _HostEvent:
    """An event that has happened when it is recorded."""

    def record(self, stream: Any) -> None:
        pass

    def synchronize(self) -> None:
        pass


class HostDevice:
    """:class:`CudaDevice`'s calls with host memory standing in for the
    device: each copy made at once with ``memmove`` (every source and
    destination here is a slice of a contiguous byte view)."""

    kind = "stand-in"

    def __init__(self, torch: Any) -> None:
        self.torch = torch

    def stream(self) -> Any:
        return _HostStream()

    def use(self, stream: Any) -> Any:
        return stream

    def event(self) -> Any:
        return _HostEvent()

    def copy(self, dst: Any, src: Any) -> None:
        _memmove(dst.data_ptr(), src.data_ptr(), src.numel())

    def split(self, dsts: List[Any], srcs: List[Any]) -> None:
        for dst, src in zip(dsts, srcs):
            _memmove(dst.data_ptr(), src.data_ptr(), src.numel())

    def buffer(self, n: int) -> Any:
        return self.torch.empty(n, dtype=self.torch.uint8)

    def pinned(self, n: int) -> Any:
        return self.torch.empty(n, dtype=self.torch.uint8)


class StandInCopy(CudaCopy):
    """:class:`CudaCopy` with host memory standing in for the device."""

    def __init__(self, torch: Any, device: Any) -> None:
        super().__init__(torch, device, HostDevice(torch))


def copy_step(torch: Any, device: Any, stand_in: bool) -> CopyStep:
    """The copy step for a load onto ``device``: CUDA's, the host stand-in's
    (``stand_in``: a host load staged as a device load would be), or plain
    host copies."""
    if device.type == "cuda":   # pragma: no cover (no GPU: the suite runs StandInCopy)
        return CudaCopy(torch, device, CudaDevice(torch, device))
    return StandInCopy(torch, device) if stand_in else HostCopy(torch)
