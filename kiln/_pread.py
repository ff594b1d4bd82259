"""Reading a file's bytes with ``pread`` into memory kiln owns: the one loop
behind every read of an open file that must never touch its mapping (payload
checks and CRC-32s, ``copy_into``, record files, the torch loaders)."""

import os
from typing import Any

from ._errors import KilnError

__all__ = ["read_exactly"]


def read_exactly(fd: int, view: Any, at: int, path: str, what: str) -> None:
    """Fill ``view`` (a writable byte memoryview) from ``fd`` at ``at``;
    ``KilnError`` ``EOF`` at the byte where the file now ends when it ends
    first: it changed under the reader (``what`` names what was being read)."""
    done = 0
    n = len(view)
    while done < n:
        got = os.preadv(fd, [view[done:]], at + done)
        if got <= 0:
            end = min(at + done, os.fstat(fd).st_size)
            raise KilnError("EOF", end, "%s: the file changed under the reader: it ends at "
                            "byte %d, before the end of %s" % (path, end, what))
        done += got
