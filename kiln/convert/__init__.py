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

CHUNK = 8 << 20   # bytes of one payload held at a time where a payload streams
# the published bound on a conversion's peak memory beyond its source's table
# (docs/security.md, "Converters"): chunks, their decompressed and checked
# copies, and the writer's buffers; measured at most 25 MiB
PEAK = 40 << 20


class ConvertError(KilnError):
    """A source file that cannot be converted (malformed, or a type with no twin).

    A :class:`kiln.KilnError` (so a ``ValueError``): ``code`` is one of the
    kiln error codes, ``offset`` the byte of the source (for npz: of the
    member's decompressed bytes) where the fault was found, ``path`` the
    source file.  ``str(e)`` is ``"PATH: CODE at byte N: reason"``.
    """

    def __init__(self, path: str, offset: int, reason: str, code: str = "FRAME") -> None:
        self.path = path
        KilnError.__init__(self, code, offset, reason)

    def __str__(self) -> str:
        return "%s: %s at byte %d: %s" % (self.path, self.code, self.offset, self.reason)

    def __reduce__(self) -> Any:
        return (type(self), (self.path, self.offset, self.reason, self.code))


def map_source(path: str, f: Any = None) -> Any:
    """A read-only mapping of a source file (ConvertError for an empty one); of
    the open file ``f`` when given, so the table and the payloads come from the
    same file even if the path is replaced meanwhile."""
    import mmap
    if f is None:
        with open(path, "rb") as f:
            return map_source(path, f)
    if os.fstat(f.fileno()).st_size == 0:
        raise ConvertError(path, 0, "the file is empty", "EOF")
    return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)


def check_bools(path: str, fd: int, at: int, n: int) -> None:
    """ConvertError at the source byte of the first bool byte other than 0 or 1
    in ``n`` bytes at ``at`` of ``fd``, read a CHUNK at a time (a Kiln bool
    is one byte, 0 or 1; other formats may hold any byte)."""
    done = 0
    while done < n:
        piece = os.pread(fd, min(CHUNK, n - done), at + done)
        if not piece:
            raise ConvertError(path, at + done, "the file ends inside a tensor's data", "EOF")
        if piece.translate(None, b"\0\1"):
            import numpy as np
            k = int(np.argmax(np.frombuffer(piece, np.uint8) > 1))
            raise ConvertError(path, at + done + k, "bool byte is %d, not 0 or 1" % piece[k],
                               "TYPE")
        done += len(piece)


def kind_of(path: str) -> str:
    """The format of ``path`` by its extension: kiln, safetensors, gguf or npz."""
    ext = os.path.splitext(path)[1].lower()
    kinds = {".kiln": "kiln", ".safetensors": "safetensors", ".gguf": "gguf", ".npz": "npz"}
    if ext not in kinds:
        raise ConvertError(path, 0, "unknown format %r (use .kiln, .safetensors, .gguf or .npz)"
                           % ext)
    return kinds[ext]


def convert(src: str, dst: str, *, checksum: bool = False, progress: Any = None) -> int:
    """Convert ``src`` to ``dst`` by their extensions; returns the tensor count.

    Either may be a path or a ``file://`` URL.  ``checksum=True`` records a
    CRC-32 of every payload in a ``.kiln`` destination's metadata (see
    :func:`kiln.save_tensors`).  ``progress``: True for a tqdm bar, or a
    callable ``fn(done_bytes, total_bytes)``, counting the payload bytes
    written (as for :func:`kiln.save_tensors`)."""
    from .._paths import local_path
    from .. import _progress
    src, dst = os.fspath(local_path(src)), os.fspath(local_path(dst))
    _progress.make(progress, "convert")   # a bad value fails before any file is touched
    try:
        return _convert(src, dst, checksum, progress)
    except (KilnError, OSError):
        raise
    except (TypeError, RecursionError, MemoryError, UnicodeError, OverflowError, KeyError,
            BufferError) as e:
        raise ConvertError(src, 0, "cannot be converted (%s: %s)" % (type(e).__name__, e),
                           "TYPE") from None
    except ValueError as e:
        raise ConvertError(src, 0, str(e), "TYPE") from None


def _convert(src: str, dst: str, checksum: bool = False, progress: Any = None) -> int:
    a, b = kind_of(src), kind_of(dst)
    if checksum and b != "kiln":
        raise ConvertError(dst, 0, "checksums are recorded in a .kiln file only, not in %s" % b)
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
    raise ConvertError(src, 0, "no conversion from %s to %s" % (a, b))


__all__ = ["CHUNK", "PEAK", "ConvertError", "convert"]


