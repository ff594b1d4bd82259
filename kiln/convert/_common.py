"""What every converter shares: the error, the memory bounds, the source's
mapping and the bool check.  Imported by ``kiln/convert/__init__.py`` (which
re-exports the public names) and by each converter, so no converter imports
the package that imports it."""

import os
from typing import Any

from .._access import open_regular_file
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


ConvertError.__module__ = "kiln.convert"   # documented (and pickled) under its public name


class UnsupportedConversion(ValueError):
    """A conversion kiln does not make: an extension it does not know, a pair of
    formats with no converter, or an option the destination cannot hold.  A
    usage error (the command line exits 2), not a fault in a file, so it has
    no wire code or offset."""


def map_source(path: str, f: Any = None) -> Any:
    """A read-only mapping of a source file (ConvertError for an empty one); of
    the open file ``f`` when given, so the table and the payloads come from the
    same file even if the path is replaced meanwhile."""
    import mmap
    if f is None:
        with open_regular_file(path) as f:
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
