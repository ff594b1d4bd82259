"""The one place the files floor reads the inside of the tensor objects.

A file's table is checked by the kernel and handed up as rows (tuples in the
order ``kiln._wire.ROW_FIELDS`` names); :class:`kiln.TensorDirectory` keeps
them with the buffer they index.  The files floor needs those rows, the
buffer and the payload base (to check a payload, fetch its bytes, compare
its CRC-32, split the metadata off), which are not public: every such read
in ``kiln/_files/`` goes through a function here, and no other module of
the package imports ``kiln._tensors``.
"""

from typing import Any, Sequence

from .._tensors import Tensor, TensorDirectory, normalize_tensors
from .._tensors.arrays import mapping_intact, register_file, unregister_file
from .._tensors.directory import _raw_names as raw_names
from .._tensors.dtypes import _code_of as code_of, element_count
from .. import _wire as W

__all__ = ["Tensor", "TensorDirectory", "element_count", "normalize_tensors", "code_of",
           "raw_names", "rows", "buffer", "payload_base", "directory", "without_last",
           "tensor_row", "tensor_offset", "tensor_buffer", "payload", "mapping_intact",
           "register_file", "unregister_file"]


def rows(d: TensorDirectory) -> Sequence[tuple]:
    """The checked rows of directory ``d`` (``kiln._rows.LazyRows`` for an open file)."""
    return d._rows


def buffer(d: TensorDirectory) -> Any:
    """The buffer ``d``'s rows index: a file's mapping, or the copy it was read into."""
    return d._buf


def payload_base(d: TensorDirectory) -> int:
    """Where the payloads start in :func:`buffer` (a row's byte_offset counts from here)."""
    return d._pb


def directory(table: Sequence[tuple], buf: Any, base: int, errors: str) -> TensorDirectory:
    """A directory of lazy views of ``buf`` for the checked rows ``table``."""
    return TensorDirectory._from_table(table, buf, base, errors)


def without_last(d: TensorDirectory) -> TensorDirectory:
    """``d`` without its last tensor (the metadata), over the same buffer."""
    return TensorDirectory._from_table(d._rows[:-1], d._buf, d._pb, d._errors)


def payload(d: TensorDirectory, i: int) -> memoryview:
    """The payload bytes of tensor ``i`` of ``d`` (a view: release it)."""
    row = d._rows[i]
    at = d._pb + row[W.R_BYTE_OFFSET]
    return memoryview(d._buf)[at:at + row[W.R_BYTE_LENGTH]]


def tensor_row(t: Tensor) -> tuple:
    """A tensor's row (its descriptor fields, ``kiln._wire.R_*``)."""
    return t._row


def tensor_offset(t: Tensor) -> int:
    """Where ``t``'s payload starts in :func:`tensor_buffer`; for a tensor of an
    open local file, its file offset."""
    return t._off


def tensor_buffer(t: Tensor) -> Any:
    return t._buf
