"""The payloads' CRC-32s of a tensor file summed while the file is read into
memory (``kiln.load_tensors(copy=True)`` with checksums verified): see
:class:`Overlapped`."""

import os
import threading
from typing import Any, Dict, Optional, Tuple

from .. import _compat
from .. import _wire as W
from .base import has_metadata, open_table
from .checksum import KEY
from .tables import rows

OVERLAP_MIN = 1 << 22   # files smaller than this are read, then summed, in one thread
_META_PEEK = 16 << 20   # metadata longer than this is not read ahead: the payloads are summed
_KEY_BYTES = KEY.encode()     # in the metadata's bytes whenever it holds the entry


class Overlapped:
    """The payloads' CRC-32s of a file being read into memory, computed in a
    second thread while the rest is read (for :func:`kiln._files.local.read_owned`).

    Once the reader has passed the table, the thread parses it from the bytes
    read (the kernel's table check, with the caller's caps) and computes each
    payload's CRC as far as the bytes have arrived, waiting for more; the
    kernels' ``crc32`` lets the reading thread run meanwhile.  The result,
    :attr:`known`, is only a cache for :func:`check_directory`, keyed by where
    the bytes are: the caller still decodes and checks the whole file after
    the read, and a payload the thread did not reach (a table it could not
    parse, an error, a read that stopped) is computed then.  The bytes it
    reads are the ones the caller keeps, so what is compared is what is
    returned."""

    def __init__(self, trusted: bool, max_count: int, max_bytes: int) -> None:
        self._caps = (trusted, max_count, max_bytes)
        self._cv = threading.Condition()
        self._got = 0
        self._stop = False
        self._out: Any = None
        self._fd: Optional[int] = None
        self._thread: Optional[threading.Thread] = None
        self.known: Dict[Tuple[int, int], int] = {}

    def start(self, out: Any, fd: Optional[int] = None) -> None:
        """Follow the read into ``out`` of the file open as ``fd`` (which the
        thread may ``pread`` the metadata from, ahead of the read)."""
        self._out = out
        self._fd = fd
        if len(out) < OVERLAP_MIN:   # a thread costs more than it saves
            return
        self._thread = threading.Thread(target=self._run, name="kiln-crc32", daemon=True)
        self._thread.start()

    def advance(self, got: int) -> None:
        with self._cv:
            self._got = got
            self._cv.notify()

    def finish(self) -> None:
        """Stop the thread (it ends at its next wait) and wait for it."""
        with self._cv:
            self._stop = True
            self._cv.notify()
        if self._thread is not None:
            self._thread.join()

    def _wait(self, n: int) -> int:
        """The bytes read once at least ``n`` are (0 when the read ended first)."""
        with self._cv:
            while self._got < n and not self._stop:
                self._cv.wait()
            return self._got if self._got >= n else 0

    def _run(self) -> None:
        try:
            self._digest(self._spans())
        except Exception:   # noqa: BLE001 - the caller's decode after the read reports it
            pass

    def _spans(self) -> Any:
        out = self._out
        size = len(out)
        if not self._wait(min(W.HEADER_SIZE, size)) or size < W.HEADER_SIZE:
            return ()
        base = W.dir_align(W.HEADER_SIZE + int.from_bytes(bytes(out[24:32]), "little"))
        if base > size or not self._wait(base):
            return ()
        d, _ = open_table(out, *self._caps)
        table = rows(d)
        if not has_metadata(table, ""):   # no metadata, no checksums: nothing to compute
            return ()
        meta = table[-1]
        if not self._may_hold_checksums(base + meta[W.R_BYTE_OFFSET], meta[W.R_BYTE_LENGTH]):
            return ()
        return sorted((base + r[W.R_BYTE_OFFSET], r[W.R_BYTE_LENGTH]) for r in table)

    def _may_hold_checksums(self, at: int, n: int) -> bool:
        """False only when the metadata's bytes, read from the file ahead of the
        read (it is usually last), do not hold the checksum entry's key: then
        the file records no checksums and nothing is summed.  True when they
        do, or when they cannot be read here (the sums are only a cache)."""
        if self._fd is None or n > _META_PEEK:
            return True
        try:
            blob = os.pread(self._fd, n, at)
        except OSError:
            return True
        return len(blob) < n or _KEY_BYTES in blob

    def _digest(self, spans: Any) -> None:
        view = memoryview(self._out)
        for start, n in spans:
            c, at, end = 0, start, start + n
            while at < end:
                got = self._wait(at + 1)
                if not got:
                    return
                upto = min(got, end)
                c = _compat.kernels.crc32(view[at:upto], c)
                at = upto
            self.known[(start, n)] = c & 0xFFFFFFFF
