"""What a local and a remote tensor file share: the table checked and opened
(``open_table``), the metadata tensor split off and its name reserved
(``split_metadata``), and the base class of :class:`kiln.KilnFile` and
:class:`kiln.remote.RemoteFile`: a ``Mapping[str, Tensor]`` whose tensors
come from the directory ``_view()`` returns (what a subclass must give,
raising ``ValueError`` once the file is closed), with one lookup of a name
or a position."""

from typing import (Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, TypeVar,
                    Union, overload)

from .. import _api, _compat, _meta
from .. import _wire as W
from .._errors import KilnError, frame_hint
from .._rows import LazyRows
from . import checksum
from .padded import padded_hint
from .paths import FOREIGN_HEAD, foreign_hint
from .tables import Tensor, TensorDirectory, directory, payload, raw_names, rows, without_last

T = TypeVar("T")
F = TypeVar("F", bound="TensorFile")


class TensorFileMapping(Mapping[str, Tensor]):
    """``keys()``, ``values()`` and ``items()`` are lists in file order, as a
    :class:`kiln.TensorDirectory`'s are; a file compares by identity (it is a
    handle), not by content."""

    __slots__ = ()

    def _view(self) -> TensorDirectory:  # pragma: no cover - every subclass gives it
        raise NotImplementedError

    def __getitem__(self, name: Any) -> Tensor:
        return self._view()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._view())

    def __len__(self) -> int:
        return len(self._view())

    def __contains__(self, name: object) -> bool:
        return name in self._view()

    def keys(self) -> List[str]:  # type: ignore[override]  # a list, as a directory's
        return list(self)

    def values(self) -> List[Tensor]:  # type: ignore[override]
        return [self[k] for k in self]

    def items(self) -> List[Tuple[str, Tensor]]:  # type: ignore[override]
        return [(k, self[k]) for k in self]

    @overload
    def get(self, name: str) -> Optional[Tensor]: ...

    @overload
    def get(self, name: str, default: Union[Tensor, T]) -> Union[Tensor, T]: ...

    def get(self, name: Any, default: Any = None) -> Any:
        """``f[name]``, or ``default`` when there is no such name (or position)."""
        try:
            return self[name]
        except (KeyError, IndexError):
            return default

    def __eq__(self, other: object) -> bool:
        return self is other

    def __hash__(self) -> int:
        return id(self)


class TensorFile(TensorFileMapping):
    """The base of :class:`kiln.KilnFile` and :class:`kiln.remote.RemoteFile`:
    ``path``, and the lookup of a tensor's index by name or position.  A
    subclass sets ``_names = None`` before the first lookup."""

    path: str
    _names: Optional[Dict[str, int]]

    def close(self) -> None:
        raise NotImplementedError

    @property
    def shards(self) -> List[str]:
        """The files the tensors are in: this one file's name (a
        :class:`kiln.ShardedFile` lists its shards), so code that opens a file
        or a set alike reads ``f.shards`` of either."""
        return [self.path.replace("\\", "/").rsplit("/", 1)[-1]]

    def __enter__(self: F) -> F:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _index(self, name: Any) -> int:
        """The index of tensor ``name`` (a name or a position) among the tensors
        ``_view()`` holds: ``KeyError`` for an unknown name or a key that is
        neither, ``IndexError`` for a position out of range (as a directory)."""
        d = self._view()
        if isinstance(name, str):
            names = self._names
            if names is None:
                names = {}
                for i, n in enumerate(d.names):
                    if n is not None:
                        names.setdefault(n, i)   # the first of a name, as a directory's
                self._names = names
            try:
                return names[name]
            except KeyError:
                raise KeyError(name) from None
        index = getattr(name, "__index__", None)
        if index is None or isinstance(name, bool):
            raise KeyError(name)
        k, n = index(), len(d)
        if not -n <= k < n:
            raise IndexError("tensor index %d out of range for %d tensors" % (k, n))
        return k % n


def open_table(buf: Any, trusted: bool, max_count: int,
               max_bytes: int, head: Any = None) -> Tuple[TensorDirectory, int]:
    """The file's tensors as views, and where the block ends: the table checked
    in full now (the payload contents are left to kiln._files.local.PayloadChecks,
    tensor by tensor) but its rows built when a tensor is asked for (see
    kiln._rows): opening a file of thousands of tensors to read one builds
    one row, not thousands.  ``head``: the file's first bytes (through the
    payload base at least, read by :func:`read_table_head`), checked in place of
    ``buf`` so that the check reads no page of ``buf``."""
    _api._check_caps(max_count, max_bytes)
    try:
        if head is None:
            end, base, count, named, blob, names = _compat.kernels.validate_directory_copy(
                buf, 0, True, trusted, max_count, max_bytes, None, True)
        else:
            end, base, count, named, blob, names = _compat.kernels.validate_directory_copy(
                head, 0, True, trusted, max_count, max_bytes, len(buf), True)
    except KilnError as e:
        first = buf if head is None else head
        magic = bytes(memoryview(first)[:len(W.FRAME_MAGIC)])
        if magic == W.FRAME_MAGIC:
            raise frame_hint(e) from None
        if magic == W.PADDED_MAGIC:
            raise padded_hint(e) from None
        add_foreign_hint(e, first)
        raise
    mv = memoryview(buf)
    if mv.ndim != 1 or mv.format != "B":
        mv = mv.cast("B")
    first = buf if head is None else head   # (the flags byte the check passed)
    table = LazyRows(blob, count, named, names, wide=bool(memoryview(first)[W.H_FLAGS] & W.FLAG_WIDE))
    return directory(table, mv.toreadonly(), base,
                     "surrogateescape" if trusted else "strict"), end


def name_fault(e: KilnError, name: str) -> KilnError:
    """``e``, a fault found in the file ``name``, saying so: its reason starts
    with the file's name unless it names it already, and an ``EOF`` says in
    plain words that the file is truncated (it ends before what its own
    header or table says it holds).  Record-file errors read the same way."""
    if name and name not in e.reason:
        if e.code == "EOF":
            e.reason = "%s is truncated (it ends before the bytes its header and table "\
                "describe): %s" % (name, e.reason)
        else:
            e.reason = "%s: %s" % (name, e.reason)
    return e


def add_foreign_hint(e: KilnError, buf: Any, own: bytes = W.DIR_MAGIC) -> None:
    """A fault at byte 0 of a file in another format: say which, and how to
    convert or read it (``own``: the asking reader's magic, which gets none)."""
    if e.offset == 0 and e.code in ("FRAME", "EOF", "SCHEMA"):
        hint = foreign_hint(bytes(memoryview(buf)[:FOREIGN_HEAD]), own)
        if hint is not None:
            e.reason += " (%s)" % hint


def has_metadata(table: Sequence[tuple], path: str) -> bool:
    """Is the last tensor of ``table`` the metadata?  ``TYPE`` at the name's
    descriptor field when another tensor has the reserved name."""
    reserved = _meta.META_NAME.encode()
    if not table or (isinstance(table, LazyRows) and not table.heap_has(reserved)):
        return False   # the name is nowhere in the heap
    names = raw_names(table)
    for i, raw in enumerate(names[:-1]):
        if raw == reserved:
            raise KilnError("TYPE", W.HEADER_SIZE + W.DESC_SIZE * i + name_field(table),
                            "%s: the name %r is reserved for the metadata, the last tensor"
                            % (path, _meta.META_NAME))
    return names[-1] == reserved


def name_field(table: Sequence[tuple]) -> int:
    """Where a descriptor's name offset is in the file of ``table``: d+4, or
    d+112 when its names need the wide fields (spec/kiln-v2.md 12.3)."""
    if isinstance(table, LazyRows):
        return W.D_WNAME_OFF if table.wide else W.D_NAME_OFF
    at = 0
    for field in (W.R_NAME, W.R_LAYOUT):   # names first, then layouts: the heap's order
        for row in table:
            b = row[field]
            if b:
                if at > W.U16_MAX or len(b) > W.U16_MAX:
                    return W.D_WNAME_OFF
                at += len(b)
    return W.D_NAME_OFF


def read_table_head(fd: int, size: int, max_count: int, max_bytes: int, path: str) -> bytes:
    """A file's header, table, name heap and padding (through its payload
    base, or its whole length if shorter), read with ``pread``: the header's
    caps and arithmetic checked first (``check_header`` against the file's
    length), so a claimed table costs no more than the file can hold."""
    from .._pread import read_bytes
    head = read_bytes(fd, min(size, W.HEADER_SIZE), 0, path)
    if len(head) < W.HEADER_SIZE:
        return head   # the table check says EOF (or names the foreign format)
    try:
        base = _compat.kernels.check_header(head, 0, max_count, max_bytes, size, True)
    except KilnError:
        return head   # open_table's check reports it, with its hints
    return head + read_bytes(fd, base - W.HEADER_SIZE, W.HEADER_SIZE, path)


def metadata_place(d: TensorDirectory, path: str) -> Optional[Tuple[int, int]]:
    """The metadata tensor's payload (file offset, length) when ``d`` has one
    (its last tensor, a ``u8`` vector: ``TYPE`` otherwise, and for another
    tensor holding the reserved name); None when it has none."""
    table = rows(d)
    if not has_metadata(table, path):
        return None
    row = table[len(table) - 1]
    if row[W.R_CODE] != W.DTYPE_CODES["u8"] or len(row[W.R_SHAPE]) != 1:
        raise KilnError("TYPE", 0, "%s: the metadata tensor is not a u8 vector" % path)
    return file_base(table) + row[W.R_BYTE_OFFSET], row[W.R_BYTE_LENGTH]


def decode_metadata(source: Any, size: int, at: int, count: int, path: str) -> Any:
    """The metadata dict (or None) and the digests (or None) of the metadata
    payload of ``size`` bytes at file offset ``at`` of a file of ``count``
    tensors, its bytes from ``source(start, n)`` (a window at a time: see
    kiln._meta.read); faults at their file offsets."""
    try:
        meta = _meta.read(source, size, at, _compat.kernels)
    except _meta.WireError as e:   # reported at its offset in the file
        raise KilnError(e.code, at + e.offset, "%s: metadata: %s" % (path, e.reason)) from None
    return checksum.split(meta, count, at, path)


def split_metadata(d: TensorDirectory, path: str) -> Any:
    """The directory without the metadata tensor, the metadata dict (or None), and
    the payload digests its checksum entry holds (or None; see kiln._files.checksum).
    The metadata's payload must be present in ``d``'s buffer."""
    place = metadata_place(d, path)
    if place is None:
        return d, None, None
    last = len(rows(d)) - 1
    with payload(d, last) as blob:   # straight from the buffer, a window at a time
        meta, sums = decode_metadata(lambda a, n: blob[a:a + n], len(blob), place[0], last,
                                     path)
    return without_last(d), meta, sums


def file_base(table: Sequence[tuple]) -> int:
    """The payload base's file offset for a directory of ``table`` at offset 0."""
    heap = table.heap_bytes() if isinstance(table, LazyRows) else \
        sum(len(r[W.R_NAME] or b"") + len(r[W.R_LAYOUT] or b"") for r in table)
    return W.dir_align(W.HEADER_SIZE + W.DESC_SIZE * len(table) + heap)


def row_bound(i: Any) -> Any:
    """A ``rows()`` bound read once (``operator.index``), so that what is
    checked is what is sliced (a drifting ``__index__`` cannot differ between
    the two); None stays None."""
    import operator
    return None if i is None else operator.index(i)
