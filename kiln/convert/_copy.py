"""The one copy loop of the converters whose source holds its payloads as
plain byte ranges (safetensors, GGUF): the source is opened and mapped once,
its table read and checked from the mapping by the converter's reader, then
every tensor declared and its bytes copied file to file
(``TensorWriter.write_from_many``), bool payloads checked at their source
offset first."""

from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

from .._access import open_regular_file
from ..files import TensorWriter
from ._common import check_bools, map_source


class Entry(NamedTuple):
    """One tensor of a source: what ``TensorWriter.add`` takes, and where its
    payload is in the source file."""

    name: str
    dtype: Any
    shape: Tuple[int, ...]
    offset: int                         # the payload's first byte in the source file
    nbytes: int
    options: Dict[str, Any] = {}        # layout, nbytes, block_size of an opaque dtype


Reader = Callable[[str, Any], Tuple[Optional[Dict[str, Any]], List[Entry]]]


def copy_tensors(src: str, dst: str, read: Reader, checksum: bool, progress: Any) -> int:
    """Convert ``src`` to the Kiln file ``dst``: ``read(src, mapping)`` returns
    the metadata to keep (or None) and the entries, checked; returns the
    tensor count."""
    with open_regular_file(src) as source:
        mm = map_source(src, source)   # the table and the payloads from the same file
        try:
            metadata, entries = read(src, mm)
            with TensorWriter(dst, metadata=metadata, checksum=checksum,
                              progress=progress) as w:
                for e in entries:
                    w.add(e.name, e.dtype, e.shape, **e.options)
                for e in entries:
                    if e.dtype == "bool":
                        check_bools(src, source.fileno(), e.offset, e.nbytes)
                # file to file (runs of small payloads: one read and one write a run)
                w.write_from_many([(e.name, e.offset) for e in entries], source)
            return len(entries)
        finally:
            try:
                mm.close()
            except BufferError:  # pragma: no cover - a failing write's traceback holds a view
                pass
