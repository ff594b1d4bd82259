"""Converters between Kiln tensor files and other formats, tensor by tensor.

Each converter reads its source through a checked table (nothing is
allocated for a count or length the file cannot hold) and writes with
:class:`kiln.TensorWriter`, so memory stays flat whatever the file size.
Errors in a source file are :class:`ConvertError` (a ``ValueError``) naming
the file and what is wrong.
"""

import os
import sys
from typing import Any, Iterable


class ConvertError(ValueError):
    """A source file that cannot be converted (malformed, or a type with no twin)."""


def progress(items: Iterable[Any], total: int, what: str) -> Iterable[Any]:
    """A progress bar on stderr for long runs when stderr is a terminal and tqdm is
    installed; the items unchanged otherwise."""
    if total < 16 or not sys.stderr.isatty():
        return items
    try:
        from tqdm import tqdm
    except ImportError:
        return items
    return tqdm(items, total=total, desc=what, unit="tensor", file=sys.stderr)


def map_source(path: str, f: Any = None) -> Any:
    """A read-only mapping of a source file (ConvertError for an empty one); of
    the open file ``f`` when given, so the table and the payloads come from the
    same file even if the path is replaced meanwhile."""
    import mmap
    if f is None:
        with open(path, "rb") as f:
            return map_source(path, f)
    if os.fstat(f.fileno()).st_size == 0:
        raise ConvertError("%s is empty" % path)
    return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)


def kind_of(path: str) -> str:
    """The format of ``path`` by its extension: kiln, safetensors, gguf or npz."""
    ext = os.path.splitext(path)[1].lower()
    kinds = {".kiln": "kiln", ".safetensors": "safetensors", ".gguf": "gguf", ".npz": "npz"}
    if ext not in kinds:
        raise ConvertError("%s: unknown format %r (use .kiln, .safetensors, .gguf or .npz)"
                           % (path, ext))
    return kinds[ext]


def convert(src: str, dst: str) -> int:
    """Convert ``src`` to ``dst`` by their extensions; returns the tensor count."""
    try:
        return _convert(src, dst)
    except (ConvertError, OSError):
        raise
    except (TypeError, RecursionError, MemoryError, UnicodeError, OverflowError, KeyError,
            BufferError) as e:
        raise ConvertError("%s: cannot be converted (%s: %s)" % (src, type(e).__name__, e)) \
            from None
    except ValueError as e:
        from .._errors import KilnError
        if isinstance(e, KilnError):
            raise
        raise ConvertError("%s: %s" % (src, e)) from None


def _convert(src: str, dst: str) -> int:
    a, b = kind_of(src), kind_of(dst)
    if a == "safetensors" and b == "kiln":
        from .safetensors import safetensors_to_kiln
        return safetensors_to_kiln(src, dst)
    if a == "kiln" and b == "safetensors":
        from .safetensors import kiln_to_safetensors
        return kiln_to_safetensors(src, dst)
    if a == "gguf" and b == "kiln":
        from .gguf import gguf_to_kiln
        return gguf_to_kiln(src, dst)
    if a == "npz" and b == "kiln":
        from .npz import npz_to_kiln
        return npz_to_kiln(src, dst)
    if a == "kiln" and b == "npz":
        from .npz import kiln_to_npz
        return kiln_to_npz(src, dst)
    raise ConvertError("no conversion from %s to %s" % (a, b))


__all__ = ["ConvertError", "convert"]


