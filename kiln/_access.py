"""The one internal surface the top floor may use.

The command line (``kiln/cli.py``), Dask support (``kiln/dask.py``) and the
converters (``kiln/convert/``) are built on the public API.  What they need
beyond it is here, and only here: each name below is a promise to them, and
a change to the files floor that keeps these keeps them working.  Nothing
else under ``kiln/`` imports this module, and they import no other private
module of kiln (``tests/test_house.py`` checks it).

Importing it loads what reading a local file needs from the files floor
(``kiln/_files/``); the writers' names (``AtomicFile``, ``write_payload``, a
set's ``write_index``, ``old_shards``, ``fresh_names``, ``drop_shards``,
``make_folder``, ``remove_made``, ``save_set``), a
set's index helpers and the tied names' keys and check load their modules on
first use, so ``kiln inspect`` and
``kiln check`` of a file never load them.  Never a remote reader or an
optional package.
"""

from typing import TYPE_CHECKING, Any

import numpy as np

from ._compat import COMPILED_TENSOR_LAYER
from ._tensors.dtypes import _dtype_code_of_numpy
from ._tensors.tensor import dtype_label
from ._lazy import attribute
from ._pread import read_exactly, read_scattered
from ._files.local import file_size, open_regular_file, read_head
from ._files.paths import FOREIGN_HEAD, bytes_path, foreign_hint, is_url, local_path
from ._files.progress import make as check_progress, session as progress_session
from ._files.padded import head_size as saved_head_size, saved_head, value_start
from ._files.tables import tensor_offset, tensor_row

if TYPE_CHECKING:   # what type checkers see; at run time __getattr__ imports them
    from ._files.atomic import AtomicFile
    from ._files.save import write_payload
    from ._files.shardsave import (drop_shards, fresh_names, make_folder, old_shards,
                                   remove_made, save_set, uncache_shards, write_index)
    from ._files.sharded import (KILN_INDEX, ST_INDEX, check_shard, parse_index, parse_size,
                                 read_index, strict_json)
    from ._files.tied import FILE_ALIASES_KEY, SET_ALIASES_KEY, alias_fault, same_memory_key
    from ._files.checksum import crc32_combine

# the writers' and the sets' names, {name: module}, imported on first use (PEP 562)
_LATER = {"AtomicFile": "._files.atomic", "write_payload": "._files.save",
          "drop_shards": "._files.shardsave", "fresh_names": "._files.shardsave",
          "old_shards": "._files.shardsave", "write_index": "._files.shardsave",
          "make_folder": "._files.shardsave", "remove_made": "._files.shardsave",
          "save_set": "._files.shardsave", "uncache_shards": "._files.shardsave",
          **{name: "._files.sharded" for name in ("KILN_INDEX", "ST_INDEX", "check_shard",
                                                 "parse_index", "read_index", "strict_json",
                                                 "parse_size")},
          **{name: "._files.tied" for name in ("SET_ALIASES_KEY", "FILE_ALIASES_KEY",
                                              "alias_fault", "same_memory_key")},
          "crc32_combine": "._files.checksum"}


def __getattr__(name: str) -> Any:
    return attribute(globals(), _LATER, name)


__all__ = ["bytes_path", "AtomicFile", "read_exactly", "read_scattered", "write_payload", "progress_session", "check_progress", "local_path", "is_url",
           "foreign_hint", "FOREIGN_HEAD", "read_head", "open_regular_file", "file_size", "table", "file_offset",
           "version", "held_descriptor", "remote_range", "kernel_crc32", "crc32_combine", "dtype_code", "dtype_label", "COMPILED_TENSOR_LAYER",
           "compiled_tensor_part_bound", "tensor_row", "KILN_INDEX", "ST_INDEX", "check_shard",
           "parse_index", "read_index", "write_index", "old_shards", "fresh_names", "uncache_shards", "drop_shards", "make_folder", "remove_made", "save_set", "metadata_blob",
           "metadata_of_blob", "strict_json", "value_start", "saved_head", "saved_head_size", "parse_size",
           "SET_ALIASES_KEY", "FILE_ALIASES_KEY", "alias_fault",
           "same_memory_key"]


def compiled_tensor_part_bound() -> bool:
    """Whether the compiled kernel's tensor part is the one bound now (what
    serves ``Tensor.numpy`` and the directories), not what was declared."""
    from ._tensors import BOUND
    return BOUND.part is not None and BOUND.part.__name__ == "kiln._kernels_c"


def table(f: Any) -> Any:
    """The tensors of an open :class:`kiln.KilnFile` or :class:`kiln.remote.RemoteFile`
    as a directory whose payloads are neither fetched nor checked: for names,
    dtypes, shapes and offsets (``kiln inspect``, ``from_kiln``), never for
    reading payloads."""
    return f._tensors_view()


def file_offset(t: Any) -> int:
    """Where tensor ``t``'s payload starts: for a tensor of an open local file
    or of a decoded file's directory, its byte offset in the file."""
    return tensor_offset(t)


def open_kiln_file(path: Any) -> Any:
    """``KilnFile(path)`` for a converter, a fault found opening it named as
    :func:`kiln.open` names it (the file's name; a truncated file says so)."""
    from ._errors import KilnError
    from ._files.base import name_fault
    from ._files.kilnfile import KilnFile
    try:
        return KilnFile(path)
    except KilnError as e:
        raise name_fault(e, str(path))


def held_descriptor(f: Any) -> Any:
    """How the torch loader reads the payloads of an open :class:`kiln.KilnFile`
    ``f`` from the file whose table it read: ``("fd", a duplicate of its
    descriptor)`` (the caller closes it), ``("bytes", the data)`` for a file
    object without a descriptor, or None for another kind of file (remote).
    ``ValueError`` once ``f`` is closed."""
    from ._files.kilnfile import KilnFile
    if not isinstance(f, KilnFile):
        return None
    shared = f._fd
    if shared is None:
        data = f._mm
        if data is None:
            raise ValueError("%s is closed" % f.path)
        return "bytes", data
    import os
    with shared.held(f.path) as fd:
        return "fd", os.dup(fd)


def remote_range(f: Any, start: int, end: int, what: str) -> bytes:
    """Bytes [start, end) of an open :class:`kiln.remote.RemoteFile`, of the
    version seen when it was opened (from the answer that came with the table
    when the server sent the whole object)."""
    have = f._base + len(f._head)   # bytes [base, have) came with the table
    if f._head and f._base <= start and end <= have:
        return bytes(f._head[start - f._base:end - f._base])
    return f._src.read(start, end, what)


def kernel_crc32(data: Any, value: int = 0) -> int:
    """zlib's CRC-32 of the bytes of ``data``, continued from ``value``, by the
    kernels in use (the compiled one with carry-less multiplication; both let
    other threads run while they sum a large buffer)."""
    from . import _compat
    return _compat.kernels.crc32(data, value) & 0xFFFFFFFF


def version(f: Any) -> Any:
    """The version a :class:`kiln.remote.RemoteFile` saw at open (size, ETag, ...),
    which a reader made elsewhere checks against (``RowSource``)."""
    return f._version


def dtype_code(dt: Any) -> int:
    """Kiln's dtype code of a numpy dtype (``TypeError`` when it has none)."""
    return _dtype_code_of_numpy(np.dtype(dt))


def metadata_blob(meta: Any) -> bytes:
    """Metadata as a ``.kiln`` file stores it: one framed Kiln value (``kiln._meta``)."""
    from . import _api, _meta
    return _api.encode(_meta.to_nodes(meta), _meta.META_TYPE, frame=True)


def metadata_of_blob(blob: Any) -> Any:
    """The metadata :func:`metadata_blob` made, checked as a file's metadata is
    (``KilnError`` with offsets in ``blob``)."""
    from . import _compat, _meta
    from ._errors import KilnError
    with memoryview(blob) as mv:
        try:
            return _meta.read(lambda a, n: mv[a:a + n], len(mv), 0, _compat.kernels)
        except _meta.WireError as e:   # a KilnError as any other
            raise KilnError(e.code, e.offset, e.reason) from None
