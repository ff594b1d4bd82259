"""An open local tensor file: :class:`KilnFile`, made by :func:`kiln.open`.

Reading maps the file (``mmap``).  Views keep the mapping alive: closing a
file, or leaving its ``with`` block, while views live never raises and never
unmaps under them; the mapping goes when the last view goes.
"""

import os
import threading
from typing import Any, Dict, List, Optional, Tuple, Union

import numpy as np

from .. import _wire as W
from .._errors import KilnError
from .._pread import SharedFd, read_bytes
from . import checksum as _checksum
from .base import (TensorFile, decode_metadata, metadata_place, open_table, read_table_head,
                   row_bound)
from .local import PayloadChecks, map_file_fd, unmap
from .paths import Source, source
from .tables import (Tensor, TensorDirectory, mapping_intact, register_file, tensor_offset,
                     tensor_row, unregister_file, without_last)

PathLike = Union[str, "os.PathLike[str]"]
_UNSET = object()


class KilnFile(TensorFile):
    """An open tensor file: the table checked once, tensors viewed on access.

    A ``Mapping[str, Tensor]`` of name to tensor, as :class:`TensorDirectory`
    is: ``f.keys()`` (file order, a list), ``f["w"]`` (a :class:`Tensor`
    viewing the mapping), ``f.items()``, ``f.values()``, ``f.get("w")``,
    ``"w" in f``, ``len(f)``, iteration over names; also ``f.metadata`` and
    ``f.rows("w", start, stop)`` (a leading-axis slice that touches only
    those rows' pages).  Files compare by identity, not content.  Use as a
    context manager, or call :meth:`close`; views taken from the file stay
    valid after it is closed.  Made by :func:`kiln.open`.

    Opening checks everything the table decides; a tensor's payload
    contents (bool bytes, an odd 4-bit tail, the alignment gap after it) are
    checked when that tensor is first read (``f[name]``, ``f.rows``,
    ``f.tensors()``), so opening costs the table whatever the payloads
    claim.  A bad payload byte is then ``KilnError`` ``TYPE`` at its offset
    in the file, raised by the read.  The metadata is read and decoded when
    first used (``f.metadata``, ``f.checksums``, a verified read), a window
    of its bytes and a run of its nodes at a time; its faults are raised
    there.

    Args:
        path: a file path or a binary file object.
        trusted, max_count, max_bytes: as for :class:`kiln.Decoder`;
            ``max_bytes`` left unset grows to the file's size (the name heap
            a writer stored is read back, past the 16 MiB default).
        verify: compare each tensor's payload with the CRC-32 the file
            records (``checksum=True`` when written) the first time the
            tensor is read whole (``f[name]``, ``f.values()``,
            ``f.tensors()``...); a mismatch raises ``KilnError``
            ``CHECKSUM`` naming the tensor, at its payload's offset.  On by
            default (``None``): ``f.rows()`` of part of a tensor then reads
            only those rows and is not compared (a CRC covers the whole
            payload); ``True`` makes ``f.rows()`` read the whole tensor
            once to compare it too; ``False`` compares nothing.  A file
            that records no checksums is read as usual.

    Attributes:
        path: the file's name.
        metadata: the metadata dict, or None when the file has none (the
            checksum entry is not part of it).
        checksums: the recorded CRC-32s (4 little-endian bytes per tensor, in
            file order), or None.

    Raises:
        KilnError: any code :func:`kiln.decode_tensors` raises, at its file
            offset (``EOF`` also for an empty or short file); ``TYPE`` for a
            misplaced or malformed ``__metadata__`` tensor.
        OSError: a missing file, a directory, no permission;
            ``kiln._files.local.NotAFile`` for a FIFO, a socket or a device
            (refused without waiting on it).

    Example:
        >>> kiln.save_tensors("model.kiln", {"w": np.arange(6, dtype=np.int32).reshape(3, 2)})
        >>> with kiln.open("model.kiln") as f:
        ...     f.keys(), f.rows("w", 1, 3).tolist()
        (['w'], [[2, 3], [4, 5]])
    """

    def __init__(self, path: PathLike, *, trusted: bool = False,
                 max_count: int = W.DEFAULT_MAX_COUNT,
                 max_bytes: Optional[int] = None, verify: Optional[bool] = None) -> None:
        src = path if type(path) is Source else source(path)   # resolved once
        self.path = src.name
        self._names = None
        mm, fd = map_file_fd(src)
        if max_bytes is None:   # the name heap's cap follows the file's size
            max_bytes = max(W.DEFAULT_MAX_BYTES, len(mm))
        try:
            # the open's check reads the header and the table with pread, never the
            # mapping: a file truncated meanwhile is EOF, never SIGBUS; the tensors
            # then view the mapping.  The metadata is read and decoded on first use.
            head = None if fd is None else read_table_head(fd, len(mm), max_count, max_bytes,
                                                     self.path)
            d, end = open_table(mm, trusted, max_count, max_bytes, head)
            head = None
            self._meta_place = metadata_place(d, self.path)
            self._count = len(d)
            self._dir = d if self._meta_place is None else without_last(d)
        except BaseException:
            unmap(mm)
            if fd is not None:
                os.close(fd)
            raise
        d = None
        self._meta: Any = _UNSET   # (metadata, digests) once decoded
        self._meta_lock = threading.Lock()
        # kiln's own reads of the payloads (their checks, their CRC-32s) go
        # through this descriptor with pread, never through the mapping: a
        # file truncated under them is EOF, never SIGBUS
        # (shared by the readers: close() closes it once the reads holding it end)
        self._fd = None if fd is None else SharedFd(fd)
        self._fd_done: Any = None
        if self._fd is not None:
            register_file(mm, self._fd, self.path)   # copy_into reads through it while open
            import weakref   # a file never closed closes its descriptor when it goes
            self._fd_done = weakref.finalize(self, self._fd.close)
        self._checks = PayloadChecks(end, self._fd, self.path)
        self._mm: Any = mm
        self._verify = verify is None or bool(verify)   # whole reads compared
        self._verify_rows = bool(verify)                 # rows() reads the whole tensor
        self._verified: set = set()

    @property
    def metadata(self) -> Optional[Dict[str, Any]]:
        """The metadata dict, or None when the file has none (the checksum
        entry is not part of it): read and decoded on first use, then kept."""
        return self._metadata()[0]

    @property
    def checksums(self) -> Optional[bytes]:
        """The recorded CRC-32s (4 little-endian bytes per tensor, in file
        order), or None: from the metadata, decoded on first use."""
        return self._metadata()[1]

    def _metadata(self) -> Tuple[Optional[Dict[str, Any]], Optional[bytes]]:
        got = self._meta
        if got is _UNSET:
            with self._meta_lock:   # read and decoded once
                got = self._meta
                if got is _UNSET:
                    if self._dir is None:
                        raise ValueError("%s is closed" % self.path)
                    got = self._meta = self._read_metadata()
        return got

    def _read_metadata(self) -> Tuple[Optional[Dict[str, Any]], Optional[bytes]]:
        """The metadata, read with pread a window at a time as it is decoded
        (``kiln._meta.read``): a claimed length costs what the decode reads."""
        place = self._meta_place
        if place is None:
            return None, None
        at, n = place
        mm = self._mm
        if mm is None:
            raise ValueError("%s is closed" % self.path)
        if self._fd is None:   # the bytes of a file object without a descriptor
            with memoryview(mm)[at:at + n] as blob:
                return decode_metadata(lambda a, k: blob[a:a + k], n, at, self._count - 1,
                                       self.path)
        self._intact()
        with self._fd.held(self.path) as fd:
            return decode_metadata(lambda a, k: read_bytes(fd, k, at + a, self.path), n, at,
                                   self._count - 1, self.path)

    def _intact(self) -> None:
        """``EOF`` when the file is now shorter than when it was opened: kiln's
        own reads of its payloads (checks, CRC-32s, rows, copies) never touch
        pages another program's truncation took away."""
        mapping_intact(self._mm, self.path)

    def _checked(self, name: Any) -> Tensor:
        """Tensor ``name``; unless ``verify=False`` its payload's CRC-32 compared first."""
        self._intact()
        d = self._d()
        t = d[name]
        if isinstance(t, list):   # a slice
            return [self._checked(i) for i in range(*name.indices(len(d)))]  # type: ignore
        self._checks.tensor(t)   # its payload's contents, the first time it is read
        sums = self.checksums if self._verify else None   # verify=False reads no metadata
        if sums is not None:
            i = self._index(name)
            if i not in self._verified:
                self._crc_check(sums, i, t)
                self._verified.add(i)
        return t

    def _crc_check(self, sums: bytes, i: int, t: Tensor) -> None:
        at = tensor_offset(t)
        if self._fd is None:   # bytes of a file object without a descriptor
            _checksum.check(sums, i, t.data, t.name, at, self.path)
            return
        with self._fd.held(self.path) as fd:
            got = _checksum.crc_of_range(fd, at, t.nbytes, self.path)
        _checksum.compare(sums, i, got, t.name, at, self.path)

    def __getitem__(self, name: Any) -> Tensor:
        return self._checked(name)

    def verify(self) -> None:
        """Compare every payload with the CRC-32 the file records (``CHECKSUM``
        naming the first tensor that differs); ``KilnError`` ``CHECKSUM`` at
        byte 0 when the file records none."""
        if self.checksums is None:
            raise KilnError("CHECKSUM", 0, "%s records no checksums (written without "
                            "checksum=True)" % self.path)
        self._intact()
        if self._fd is None:
            _checksum.check_directory(self.checksums, self._d(), self.path, self._verified)
            return
        d = self._d()
        for i, t in enumerate(d.values()):   # read with pread, in file order
            if i not in self._verified:
                self._crc_check(self.checksums, i, t)
                self._verified.add(i)

    def _d(self) -> TensorDirectory:
        d = self._dir   # read once: another thread may close the file meanwhile
        if d is None:
            raise ValueError("%s is closed" % self.path)
        return d

    def _view(self) -> TensorDirectory:
        return self._d()

    def values(self) -> List[Tensor]:  # type: ignore[override]
        self._intact()
        vals = self._d().values()
        self._checks.tensors(vals)
        if self._verify and self.checksums is not None:
            self.verify()
        return vals

    def items(self) -> List[Tuple[str, Tensor]]:  # type: ignore[override]
        vals = self.values()   # every payload checked in one pass
        return list(zip(self.keys(), vals))

    def tensors(self) -> TensorDirectory:
        """The tensors as a :class:`TensorDirectory` of views (metadata left out),
        every payload checked; unless ``verify=False`` every payload is also
        compared with its CRC-32 (when the file records them)."""
        self._intact()
        d = self._d()
        self._checks.tensors(d.values())
        if self._verify and self.checksums is not None:
            self.verify()
        return d

    def _tensors_view(self) -> TensorDirectory:
        """The table as tensors whose payloads are not checked: for listing
        names, dtypes and shapes (``kiln inspect``), never for reading them."""
        return self._d()

    def rows(self, name: Any, start: int, stop: int) -> np.ndarray:
        """Rows ``start:stop`` of a tensor's leading axis, as a read-only view
        (only those rows' payload bytes are read and checked; with
        ``verify=True`` the whole tensor is read to compare its CRC-32, as
        it is by default when the rows are the whole tensor).
        ``start`` and ``stop`` are read once, as integers, before any check."""
        start, stop = row_bound(start), row_bound(stop)
        self._intact()
        if (self._verify_rows or (self._verify and _whole(self._d()[name], start, stop))) \
                and self.checksums is not None:   # (verify=False reads no metadata)
            return self._checked(name).numpy()[start:stop]
        t = self._d()[name]
        code, shape = tensor_row(t)[W.R_CODE], tensor_row(t)[W.R_SHAPE]
        if code <= W.DTYPE_MAX and W.DTYPES[code][1] and shape and shape[0]:
            self._checks.rows(t, start, stop)
        else:
            self._checks.tensor(t)   # packed, opaque, rank 0 or empty: the whole payload
        return t.numpy()[start:stop]

    def close(self) -> None:
        """Stop using the file; views already taken stay valid (see the module doc).

        Safe while other threads read: a read that starts after the close raises
        ``ValueError``; an array or tensor already handed out keeps the mapping,
        which is unmapped when the last of them goes."""
        self._dir = None  # type: ignore[assignment]  # first: no new reads
        mm, self._mm = self._mm, None
        if mm is not None:
            unregister_file(mm)
            unmap(mm)
        if self._fd_done is not None:
            self._fd_done()   # closed once, when no read holds it any more

    def __repr__(self) -> str:
        d = self._dir
        state = "closed" if d is None else "%d tensor%s" % (len(d), "" if len(d) == 1 else "s")
        return "<kiln.KilnFile %r, %s>" % (self.path, state)




def _whole(t: Tensor, start: Optional[int], stop: Optional[int]) -> bool:
    """Do rows ``start:stop`` cover the whole of tensor ``t``?"""
    shape = tensor_row(t)[W.R_SHAPE]
    if not shape:
        return True
    a, b, _ = slice(start, stop).indices(shape[0])
    return a == 0 and b == shape[0]
