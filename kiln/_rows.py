"""A tensor table whose rows are built when asked for.

``kiln.open`` checks a file's whole table once, but a caller usually reads a
few tensors of it.  Building every row up front costs two Python objects per
tensor (the row and its shape), which in a fresh process is enough to set
off a garbage collection of everything the imports left behind.  The
kernels' ``validate_directory_copy`` returns instead the checked private copy
of the descriptors and the name heap as one ``bytes``; this sequence builds a
row from it on demand, in the layout ``validate_directory``'s table has, and
the names (which the kernel gives as a list) without building rows.

The bytes are the kernel's checked copy, never the caller's buffer again, so
a file changed while it is open cannot change a row after its check.
"""

from typing import Any, Iterator, List, Optional, Tuple

from . import _wire as W

_D = W.DESC_SIZE
_unpack = W.DESC.unpack_from
_WIDE = W.WIDE_FIELDS.unpack


class LazyRows:
    """Rows ``start .. stop`` of a checked table (a read-only sequence)."""

    __slots__ = ("_blob", "_count", "_named", "_names", "_start", "_stop", "wide")

    def __init__(self, blob: bytes, count: int, named: bool, names: List[Optional[bytes]],
                 start: int = 0, stop: Optional[int] = None, wide: bool = False) -> None:
        #: the table's name fields are the wide ones (u32 at d+112, spec 12.3)
        self.wide = wide
        self._blob = blob
        self._count = count
        self._named = named
        self._names = names
        self._start = start
        self._stop = count if stop is None else stop

    def __len__(self) -> int:
        return self._stop - self._start

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            a, b, step = i.indices(len(self))
            if step != 1:
                return [self[k] for k in range(a, b, step)]
            return LazyRows(self._blob, self._count, self._named, self._names,
                            self._start + a, self._start + max(a, b), self.wide)
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("row index out of range")
        return self._row(self._start + i)

    def __iter__(self) -> Iterator[Tuple[Any, ...]]:
        for j in range(self._start, self._stop):
            yield self._row(j)

    def _row(self, j: int) -> Tuple[Any, ...]:
        dsc = _unpack(self._blob, _D * j)
        heap = _D * self._count
        name = self._names[j]   # (the kernel's bytes of the same heap slice)
        layout = None
        _, _, loff, llen = _WIDE(dsc[W.I_RESERVED16]) if self.wide else dsc[W.I_NAME_OFF:W.I_BLOCK_SIZE]
        if llen:
            a = heap + loff
            layout = self._blob[a:a + llen]
        return (dsc[W.I_DTYPE], dsc[W.I_SHAPE:W.I_SHAPE + dsc[W.I_RANK]], name, layout,
                dsc[W.I_BLOCK_SIZE], dsc[W.I_QUANT_SCHEME], dsc[W.I_QUANT_AXIS],
                dsc[W.I_GROUP_SIZE], dsc[W.I_SCALE_INDEX], dsc[W.I_OUTER_INDEX],
                dsc[W.I_BYTE_OFFSET], dsc[W.I_BYTE_LENGTH])

    def raw_names(self) -> List[Optional[bytes]]:
        """Every row's raw name (or None), without building the rows."""
        return self._names[self._start:self._stop]

    def heap_has(self, text: bytes) -> bool:
        """Does ``text`` occur anywhere in the name heap (a quick test before a
        row by row search)?"""
        return self._blob.find(text, _D * self._count) >= 0

    def heap_bytes(self) -> int:
        """The name heap's length."""
        return len(self._blob) - _D * self._count
