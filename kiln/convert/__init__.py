"""Converters between Kiln tensor files and other formats, tensor by tensor.

Each converter reads its source through a checked table (nothing is
allocated for a count or length the file cannot hold) and writes with
:class:`kiln.TensorWriter`, so memory stays flat whatever the file size.
Errors in a source file are :class:`ConvertError`, a :class:`kiln.KilnError`
with a code and the byte offset in the source where the fault was found.

Memory: a conversion holds at most :data:`PEAK` bytes plus the source's
table (bounded by its size: see ``docs/security.md``, "Converters"), with
payloads streamed a :data:`CHUNK` at a time; never an amount a length, count
or compression ratio in the source claims.
"""

import os
from typing import Any

from .._errors import KilnError
from ._common import CHUNK, PEAK, ConvertError, UnsupportedConversion


def kind_of(path: str) -> str:
    """The format of ``path`` by its extension: kiln, safetensors, gguf or npz, or
    kiln-set / safetensors-set for a sharded set's index (``*.kiln.index.json``,
    ``*.safetensors.index.json``)."""
    from .sharded import index_kind
    ext = os.path.splitext(path)[1].lower()
    kinds = {".kiln": "kiln", ".safetensors": "safetensors", ".gguf": "gguf", ".npz": "npz"}
    if ext not in kinds:
        sharded = index_kind(path)
        if sharded is not None:
            return sharded
        raise UnsupportedConversion("%s: unknown format %r (use .kiln, .safetensors, .gguf or "
                                    ".npz, or a sharded set's *.safetensors.index.json or "
                                    "*.kiln.index.json)" % (path, ext))
    return kinds[ext]


def folder_source(folder: str) -> str:
    """What a folder as ``save_pretrained`` writes it converts from: its one
    sharded set's index (``*.safetensors.index.json``, else
    ``*.kiln.index.json``), else its one ``*.safetensors`` file."""
    names = sorted(os.listdir(folder))
    for suffix in (".safetensors.index.json", ".kiln.index.json", ".safetensors"):
        found = [n for n in names if n.endswith(suffix)]
        if len(found) == 1:
            return os.path.join(folder, found[0])
        if found:
            raise UnsupportedConversion("%s holds %d *%s files (%s): name the one to convert"
                                        % (folder, len(found), suffix, ", ".join(found)))
    raise UnsupportedConversion("%s is a folder holding no *.safetensors file and no sharded "
                                "set's index: nothing to convert" % folder)


def convert(src: str, dst: str, *, checksum: bool = False, progress: Any = None) -> int:
    """Convert ``src`` to ``dst`` by their extensions; returns the tensor count.

    Either may be a path or a ``file://`` URL.  ``checksum=True`` records a
    CRC-32 of every payload in a ``.kiln`` destination's metadata (see
    :func:`kiln.save_tensors`); ``.kiln`` to ``.kiln`` with
    ``checksum=True`` adds checksums to an existing file.  A sharded set's
    index (``*.safetensors.index.json``, ``*.kiln.index.json``) converts to
    a set of the other format (shards written beside ``dst``, renamed
    ``.safetensors`` <-> ``.kiln``) or to one ``.kiln`` file (see
    ``kiln/convert/sharded.py``).  A folder as ``save_pretrained`` writes it
    converts as a whole: its one index (the set), else its one
    ``*.safetensors`` file.  ``progress``: True for a tqdm bar, or a
    callable ``fn(done_bytes, total_bytes)``, counting the payload bytes
    written (as for :func:`kiln.save_tensors`)."""
    from .._access import bytes_path, check_progress, local_path
    src = os.fspath(local_path(bytes_path(src, "kiln.convert.convert")))
    dst = os.fspath(local_path(bytes_path(dst, "kiln.convert.convert")))
    check_progress(progress, "convert")   # a bad value fails before any file is touched
    if os.path.isdir(src):
        src = folder_source(src)
    try:
        return _convert(src, dst, checksum, progress)
    except (KilnError, OSError, UnsupportedConversion):
        raise
    except (TypeError, RecursionError, MemoryError, UnicodeError, OverflowError, KeyError,
            BufferError) as e:
        raise ConvertError(src, 0, "cannot be converted (%s: %s)" % (type(e).__name__, e),
                           "TYPE") from None
    except ValueError as e:
        raise ConvertError(src, 0, str(e), "TYPE") from None


def _convert(src: str, dst: str, checksum: bool = False, progress: Any = None) -> int:
    a, b = kind_of(src), kind_of(dst)
    if a.endswith("-set") or b == "kiln-set" or (a, b) == ("kiln", "kiln"):
        from .sharded import convert_set
        return convert_set(src, dst, a, b, checksum, progress)
    if checksum and b != "kiln":
        raise UnsupportedConversion("%s: checksums are recorded in a .kiln file only, not in %s"
                                    % (dst, b))
    if a == "safetensors" and b == "kiln":
        from .safetensors import safetensors_to_kiln
        return safetensors_to_kiln(src, dst, checksum, progress)
    if a == "kiln" and b == "safetensors":
        from .safetensors import kiln_to_safetensors
        return kiln_to_safetensors(src, dst, progress)
    if a == "gguf" and b == "kiln":
        from .gguf import gguf_to_kiln
        return gguf_to_kiln(src, dst, checksum, progress)
    if a == "npz" and b == "kiln":
        from .npz import npz_to_kiln
        return npz_to_kiln(src, dst, checksum, progress)
    if a == "kiln" and b == "npz":
        from .npz import kiln_to_npz
        return kiln_to_npz(src, dst, progress)
    raise UnsupportedConversion("no conversion from %s to %s (%s -> %s); kiln converts "
                                "safetensors, gguf and npz to kiln, kiln to safetensors and npz"
                                % (a, b, src, dst))


__all__ = ["CHUNK", "PEAK", "ConvertError", "UnsupportedConversion", "convert"]


