"""Reading chunks of a kiln DCP checkpoint: a rank file opened once (its
table checked by ``kiln.open`` on the descriptor kiln reads through), and
any box of a stored chunk read with ``pread`` straight into the caller's
memory, the chunk's CRC-32 compared when the box is the whole chunk and the
file records one."""

import os
import zlib
from typing import Any, Optional, Sequence, Tuple

import numpy as np

import kiln
from kiln import _access

__all__ = ["RankFile", "RUN_MIN", "WINDOW"]

RUN_MIN = 4 << 10    # a box's contiguous runs at least this long are read one by one,
RUNS_MAX = 4096      # and so are a box's runs when there are at most this many;
WINDOW = 16 << 20    # else whole stored rows are read this many bytes at a time


class RankFile:
    """One rank file, open: the table checked, tensors found by name."""

    def __init__(self, path: str, verify: bool = True, size: Optional[int] = None) -> None:
        self.path = path
        self.bytes_read = 0   # payload bytes read so far (what a load costs this rank)
        self._fobj = _access.open_regular_file(path)
        try:
            if size is not None and os.fstat(self._fobj.fileno()).st_size != size:
                raise kiln.KilnError("FRAME", 0, "%s: %d bytes, the commit record says %d "
                                     "(replaced or cut short after the commit)"
                                     % (path, os.fstat(self._fobj.fileno()).st_size, size))
            self._f = kiln.open(self._fobj)   # maps and checks this descriptor's file
            self._table = _access.table(self._f)
            self._order = {n: i for i, n in enumerate(self._f.keys())}
            self._sums = self._f.checksums if verify else None
        except BaseException:
            self._fobj.close()
            raise
        self.fd = self._fobj.fileno()

    @property
    def file(self) -> Any:
        """The file object kiln reads through (one generation of the file)."""
        return self._fobj

    @property
    def has_sums(self) -> bool:
        """Whether whole reads check a recorded CRC-32."""
        return self._sums is not None

    def tensor(self, name: str) -> Tuple[int, Tuple[int, ...], str, int]:
        """(file offset, shape, kiln dtype name, bytes) of stored tensor ``name``."""
        try:
            t = self._table[name]
        except KeyError:
            raise kiln.KilnError("TYPE", 0, "%s: holds no tensor %r, which the commit "
                                 "record names" % (self.path, name)) from None
        return _access.file_offset(t), tuple(t.shape), t.dtype, t.nbytes

    def read_whole(self, name: str) -> bytearray:
        at, _, _, n = self.tensor(name)
        out = bytearray(n)
        with memoryview(out) as mv:
            _access.read_exactly(self.fd, mv, at, self.path, "tensor %r" % name)
            self._check(name, at, mv)
        self.bytes_read += n
        return out

    def read_box(self, name: str, offsets: Sequence[int], lengths: Sequence[int],
                 out: memoryview, itemsize: int) -> None:
        """The box ``offsets``/``lengths`` of stored tensor ``name`` into
        ``out`` (C order, ``prod(lengths) * itemsize`` bytes)."""
        at, shape, dtype, nbytes = self.tensor(name)
        if len(shape) != len(offsets) or any(o + n > s for o, n, s in
                                             zip(offsets, lengths, shape)):
            raise kiln.KilnError("TYPE", at, "%s: tensor %r is %s, which does not hold the "
                                 "box at %s of %s" % (self.path, name, list(shape),
                                                      list(offsets), list(lengths)))
        if len(out) == 0:
            return
        whole = tuple(lengths) == shape
        if whole:
            _access.read_exactly(self.fd, out, at, self.path, "tensor %r" % name)
            self._check(name, at, out)
            self.bytes_read += len(out)
        else:
            self.bytes_read += _read_part(self.fd, self.path, at, shape, itemsize, offsets,
                                          lengths, out)
        if dtype == "bool":
            _bool_bytes(out, at, self.path, name)

    def check_whole(self, name: str) -> None:
        """Check stored tensor ``name`` against its recorded CRC-32 (where the
        file records one), reading it 8 MiB at a time (for a copy that goes
        file to file, never through this process's memory)."""
        if self._sums is None:
            return
        at, _, _, n = self.tensor(name)
        buf = bytearray(min(n, 8 << 20))
        crc, pos = 0, 0
        with memoryview(buf) as mv:
            while pos < n:
                k = min(len(buf), n - pos)
                _access.read_exactly(self.fd, mv[:k], at + pos, self.path, "tensor %r" % name)
                crc = zlib.crc32(mv[:k], crc)
                pos += k
        self._check(name, at, None, crc)

    def _check(self, name: str, at: int, data: Any, crc: Optional[int] = None) -> None:
        if self._sums is None:
            return
        i = self._order[name]
        want = int.from_bytes(self._sums[4 * i:4 * i + 4], "little")
        got = (zlib.crc32(data) if crc is None else crc) & 0xFFFFFFFF
        if got != want:
            raise kiln.KilnError("CHECKSUM", at, "%s: tensor %r: the payload's CRC-32 is "
                                 "%08x, the file records %08x" % (self.path, name, got, want))

    def close(self) -> None:
        self._f.close()
        self._fobj.close()


def _bool_bytes(out: memoryview, at: int, path: str, name: str) -> None:
    a = np.frombuffer(out, np.uint8)
    bad = np.flatnonzero(a > 1)
    if bad.size:
        raise kiln.KilnError("TYPE", at, "%s: tensor %r: a bool byte of %d (bool bytes are "
                             "0 or 1)" % (path, name, int(a[bad[0]])))


def _read_part(fd: int, path: str, at: int, shape: Tuple[int, ...], itemsize: int,
               offsets: Sequence[int], lengths: Sequence[int], out: memoryview) -> int:
    """Part of a stored tensor: one ``pread`` per contiguous run of the box
    when the runs are long or few (only the box's bytes are read), else the
    stored rows holding the box a window at a time; the bytes read."""
    n = len(shape)
    k = n - 1   # the last dimension the box does not cover whole
    while k >= 0 and lengths[k] == shape[k] and offsets[k] == 0:
        k -= 1
    strides = [itemsize] * n
    for d in range(n - 2, -1, -1):
        strides[d] = strides[d + 1] * shape[d + 1]
    run = lengths[k] * strides[k] if k >= 0 else len(out)
    outer = lengths[:max(k, 0)]
    if run >= RUN_MIN or not outer or int(np.prod(outer)) <= RUNS_MAX:
        dst = 0
        for idx in (np.ndindex(*outer) if outer else [()]):
            src = at + sum((offsets[d] + idx[d]) * strides[d] for d in range(len(idx)))
            src += offsets[k] * strides[k] if k >= 0 else 0
            _access.read_exactly(fd, out[dst:dst + run], src, path, "a chunk's rows")
            dst += run
        return dst
    row = strides[0]   # whole stored rows of the leading axis, a window at a time
    per = max(1, WINDOW // max(row, 1))
    dest = np.frombuffer(out, np.uint8).reshape(tuple(lengths) + (itemsize,))
    box = tuple(slice(o, o + m) for o, m in zip(offsets[1:], lengths[1:]))
    buf = np.empty(min(per, lengths[0]) * row, np.uint8)
    got = 0
    for i in range(0, lengths[0], per):
        m = min(per, lengths[0] - i)
        view = memoryview(buf)[:m * row]
        _access.read_exactly(fd, view, at + (offsets[0] + i) * row, path, "a chunk's rows")
        got += m * row
        rows = buf[:m * row].reshape((m,) + tuple(shape[1:]) + (itemsize,))
        dest[i:i + m] = rows[(slice(None),) + box]
    return got
