"""The copy step of the torch loader (:mod:`kiln.torch._pipeline`): how the
pieces of a staged chunk reach their tensors, behind one small interface
(:class:`CopyStep`).

* :class:`HostCopy`: host destinations, each piece copied with ``memmove``
  (small CPU payloads staged with their neighbours).
* :class:`DeviceCopy`: the device path, planned the same whatever the
  device.  A piece of a payload of :data:`SMALL` bytes or more goes straight
  from the staging buffer to its tensor; only the spans of a chunk that hold
  smaller payloads (:func:`spans`: neighbours and their alignment padding,
  never a large payload) are copied into a device buffer of its slot, at
  their place in the chunk, and split there by one batched device-to-device
  copy; an event is recorded behind the copies out
  of a slot, and a reader waits on it before reading into that slot again.
  ``link_bytes`` counts the bytes that cross from host to device.
  :class:`CudaCopy` runs it with non-blocking copies on a CUDA stream of its
  own; :class:`StandInCopy` runs the very same steps with host memory
  standing in for the device (copies made at once, an event that is already
  done), so the suite runs the device path's planning, splitting and
  ordering on a CPU and counts what would cross the link.
"""

import ctypes
from typing import Any, List, Sequence, Tuple

__all__ = ["SMALL", "JOIN", "spans", "CopyStep", "HostCopy", "DeviceCopy", "CudaCopy", "StandInCopy",
           "copy_step"]

SMALL = 1 << 20          # a payload below this, staged, goes to the device with its neighbours
JOIN = 256               # small payloads this close cross in one copy (the gap with them)
_memmove = ctypes.memmove


class CopyStep:
    """Moves the pieces of a staged chunk out of its slot (a ``_Slot``: the
    host buffer ``host``, the chunk's bytes from ``shift``, and ``dev`` and
    ``event`` for the copy step's own use)."""

    link_bytes = 0   # bytes copied from host to device

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

    def copy(self, c: Any, s: Any, items: Sequence[Any], outs: List[Any]) -> None:
        base = s.host.data_ptr() + s.shift
        for p in c.pieces:
            _memmove(outs[p.item].data_ptr() + p.at, base + p.where, p.n)


class DeviceCopy(CopyStep):
    """The device path (see the module doc); the device's primitives are
    :meth:`to_device`, :meth:`split`, :meth:`buffer`, :meth:`mark`."""

    def __init__(self, torch: Any, device: Any) -> None:
        self.torch, self.device = torch, device
        self.link_bytes = 0

    def copy(self, c: Any, s: Any, items: Sequence[Any], outs: List[Any]) -> None:
        u8 = self.torch.uint8
        host = s.host[s.shift:]
        small = [p for p in c.pieces if items[p.item].nbytes < SMALL]
        with self.ordered():
            for p in c.pieces:   # large payloads: straight to their tensors
                if items[p.item].nbytes >= SMALL:
                    flat = outs[p.item].detach().reshape(-1).view(u8)
                    self.to_device(flat[p.at:p.at + p.n], host[p.where:p.where + p.n])
            if small:   # only the spans holding small payloads, split on the device
                if s.dev is None or s.dev.numel() < c.size:
                    s.dev = self.buffer(host.numel())
                for a, b in spans(c.pieces, items):
                    self.to_device(s.dev[a:b], host[a:b])
                self.split([outs[p.item].detach().reshape(-1).view(u8)[p.at:p.at + p.n]
                            for p in small], [s.dev[p.where:p.where + p.n] for p in small])
            s.event = self.mark()

    def wait(self, s: Any) -> None:
        ev = s.event
        if ev is not None:
            ev.synchronize()   # the copies out of this buffer are done
            s.event = None

    # --- the device's primitives ----------------------------------------------------

    def ordered(self) -> Any:
        """A context in which the copies are issued in order (a stream)."""
        raise NotImplementedError

    def to_device(self, dst: Any, src: Any) -> None:
        self.link_bytes += src.numel()

    def split(self, dsts: List[Any], srcs: List[Any]) -> None:
        raise NotImplementedError

    def buffer(self, n: int) -> Any:
        return self.torch.empty(n, dtype=self.torch.uint8, device=self.device)

    def mark(self) -> Any:
        raise NotImplementedError


class CudaCopy(DeviceCopy):
    """:class:`DeviceCopy` on a CUDA device: non-blocking copies on a stream
    of the load's own, which first waits for the work already queued on the
    device (the model's own may still be writing the targets)."""

    def __init__(self, torch: Any, device: Any) -> None:
        super().__init__(torch, device)
        self.stream = torch.cuda.Stream(device)
        self.stream.wait_stream(torch.cuda.current_stream(device))

    def ordered(self) -> Any:
        return self.torch.cuda.stream(self.stream)

    def to_device(self, dst: Any, src: Any) -> None:
        super().to_device(dst, src)
        dst.copy_(src, non_blocking=True)

    def split(self, dsts: List[Any], srcs: List[Any]) -> None:
        # one batched device copy for the run of small tensors (torch's
        # multi-tensor copy; its name is torch's, not one of kiln's private ones)
        getattr(self.torch, "_foreach_copy_")(dsts, srcs)

    def mark(self) -> Any:
        ev = self.torch.cuda.Event()
        ev.record(self.stream)
        return ev

    def finish(self) -> None:
        self.stream.synchronize()


class _Done:
    """An event that has already happened (the stand-in's copies are made at once)."""

    def synchronize(self) -> None:
        pass


class _InOrder:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


class StandInCopy(DeviceCopy):
    """:class:`DeviceCopy` with host memory standing in for the device: the
    same steps, each copy made at once with ``memmove`` (every source and
    destination here is a slice of a contiguous byte view)."""

    def ordered(self) -> Any:
        return _InOrder()

    def to_device(self, dst: Any, src: Any) -> None:
        super().to_device(dst, src)
        _memmove(dst.data_ptr(), src.data_ptr(), src.numel())   # contiguous bytes, both

    def split(self, dsts: List[Any], srcs: List[Any]) -> None:
        for dst, src in zip(dsts, srcs):
            _memmove(dst.data_ptr(), src.data_ptr(), src.numel())

    def buffer(self, n: int) -> Any:
        return self.torch.empty(n, dtype=self.torch.uint8)

    def mark(self) -> Any:
        return _Done()


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


def copy_step(torch: Any, device: Any, stand_in: bool) -> CopyStep:
    """The copy step for a load onto ``device``: CUDA's, the host stand-in's
    (``stand_in``: a host load staged as a device load would be), or plain
    host copies."""
    if device.type == "cuda":
        return CudaCopy(torch, device)
    return StandInCopy(torch, device) if stand_in else HostCopy()
