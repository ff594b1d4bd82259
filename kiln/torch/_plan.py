"""The plan of a load (see :mod:`kiln.torch._pipeline`): every payload range
known before the first read (:class:`Item`), cut into the chunks the reader
threads read (:class:`Chunk`, :func:`plan`).

Two kinds of chunk:

- *staged*: neighbouring payloads of one file read with one ``pread`` into a
  staging buffer (gaps up to :data:`_GAP` read and skipped), then copied to
  their tensors; a payload larger than a chunk is cut across chunks;
- *in place*: read straight into the destinations, contiguous host memory.
  A payload of :data:`GROUP_BYTES` (or ``chunk_bytes``) or more has chunks
  of its own; smaller ones that lie close together in one file share a chunk
  of up to that many bytes and :data:`MAX_PIECES` payloads, read with one ``preadv`` scattered into
  their tensors (the gaps between them into a scratch buffer).  A
  mixture-of-experts checkpoint of 18,867 tensors of about 90 KB is read in
  a few hundred calls, not one call and one hand-over between threads a
  tensor.
"""

from typing import Any, List, NamedTuple, Optional, Sequence, Tuple

from ._sources import FileBytes

__all__ = ["Item", "Piece", "Chunk", "plan", "IN_PLACE", "MAX_PIECES", "GROUP_BYTES"]

IN_PLACE = 64 << 10      # a host payload from this size is read in place (smaller: staged
                         # with its neighbours, one read for many, then copied out)
_GAP = 64 << 10          # payloads this close share a chunk (the gap is read and skipped)
MAX_PIECES = 256         # payloads of one in-place chunk: with the gaps between them,
                         # within any system's IOV_MAX (1024 on Linux)
GROUP_BYTES = 4 << 20    # in-place payloads under this size share chunks of up to this
                         # size (larger chunks would leave the readers unevenly loaded
                         # at the end of a load of few of them)


class Item(NamedTuple):
    """One payload to load (see the module doc)."""

    key: str            # the name errors report (the file's tensor name)
    src: FileBytes      # the open file the payload lies in
    offset: int         # the payload's first byte in that file
    nbytes: int         # its size in bytes
    crc: Optional[int]  # the CRC-32 recorded for it, None when none is
    dtype: Any          # the torch dtype of the result
    shape: Tuple[int, ...]
    target: Any         # a tensor to fill in place, or None: a new one on the device

    def untargeted(self) -> "Item":
        """This item with no target: read into a new tensor."""
        return self._replace(target=None)


class Piece(NamedTuple):
    """Bytes ``at:at+n`` of item ``item``'s payload, at ``where`` in its chunk."""

    item: int      # index into the items
    at: int        # offset in the item's payload
    where: int     # offset in the chunk
    n: int


class Chunk(NamedTuple):
    """One read: ``size`` bytes of ``src`` from ``start``."""

    src: FileBytes
    start: int      # file offset of the chunk's first byte
    size: int
    pieces: List[Piece]   # in file order
    in_place: bool  # read into the destinations themselves (no staging buffer)


class _Building:
    """A chunk under construction in :func:`plan`."""

    __slots__ = ("src", "start", "end", "pieces", "in_place")

    def __init__(self, src: FileBytes, start: int, in_place: bool) -> None:
        self.src, self.start, self.end, self.in_place = src, start, start, in_place
        self.pieces: List[Piece] = []

    def takes(self, src: FileBytes, at: int, n: int, chunk_bytes: int) -> bool:
        """Can ``n`` bytes of ``src`` from ``at`` go on in this chunk?  (A
        staged chunk takes any part of them: the caller cuts.)"""
        if src is not self.src or not 0 <= at - self.end <= _GAP:
            return False
        if self.in_place:
            return len(self.pieces) < MAX_PIECES and at + n - self.start <= chunk_bytes
        return at - self.start < chunk_bytes

    def chunk(self) -> Chunk:
        return Chunk(self.src, self.start, self.end - self.start, self.pieces, self.in_place)


def plan(items: Sequence[Item], in_place: Sequence[bool], chunk_bytes: int) -> List[Chunk]:
    """The chunks of a load (see the module doc): each kind in file order, the
    chunks of a payload cut across several in the order of its bytes.  Every
    byte of every item lies in exactly one piece, each piece non-empty and
    inside its chunk; the pieces of a chunk do not overlap and come in file
    order, an in-place chunk's gaps at most :data:`_GAP` bytes; an in-place
    payload is cut only when it is more than ``chunk_bytes``, and then its
    chunks are its own."""
    order = sorted((i for i, it in enumerate(items) if it.nbytes),
                   key=lambda i: (id(items[i].src), items[i].offset))
    out: List[Chunk] = []
    cur: Optional[_Building] = None    # staged
    near: Optional[_Building] = None   # in place, small payloads together
    group = min(chunk_bytes, GROUP_BYTES)
    for i in order:
        it = items[i]
        if in_place[i] and it.nbytes >= group:
            for a in range(0, it.nbytes, chunk_bytes):
                n = min(chunk_bytes, it.nbytes - a)
                out.append(Chunk(it.src, it.offset + a, n, [Piece(i, a, 0, n)], True))
            continue
        if in_place[i]:
            if near is None or not near.takes(it.src, it.offset, it.nbytes, group):
                if near is not None:
                    out.append(near.chunk())
                near = _Building(it.src, it.offset, True)
            near.pieces.append(Piece(i, 0, it.offset - near.start, it.nbytes))
            near.end = it.offset + it.nbytes
            continue
        done = 0
        while done < it.nbytes:
            at = it.offset + done
            if cur is None or not cur.takes(it.src, at, 0, chunk_bytes):
                if cur is not None:
                    out.append(cur.chunk())
                cur = _Building(it.src, at, False)
            n = min(it.nbytes - done, chunk_bytes - (at - cur.start))
            cur.pieces.append(Piece(i, done, at - cur.start, n))
            cur.end = at + n
            done += n
    out.extend(b.chunk() for b in (cur, near) if b is not None)
    return out
