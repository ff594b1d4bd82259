"""Opt-in payload checksums of a tensor file (spec/kiln-v2.md, "Payload checksums").

The wire format carries no checksum: a reader checks the structure and the
payload rules (bool bytes, 4-bit tails, zero gaps) but not the payload bytes.
A writer asked for ``checksum=True`` records a CRC-32 (``zlib.crc32``, the
ISO-HDLC polynomial of zlib, gzip and PNG) of every tensor's payload in the
file's metadata under the reserved key :data:`KEY`::

    {"algorithm": "crc32", "crc32": <bytes: one u32 little-endian per tensor, file order>}

The digests bytes have a fixed length (4 per tensor), so a streaming writer
reserves the metadata before the payloads and fills the digests in at close.
CRC-32 is a check against accidental damage (flipped bits, truncated copies,
torn writes), not against someone who rewrites the file on purpose.  It is
the record container's checksum too (spec/records.md), needs no extra
package, and was the fastest standard digest measured here (256 MiB, one
core: zlib.crc32 2.6 GB/s, hashlib.sha256 1.8 GB/s, blake2b 0.7 GB/s); a
cryptographic digest stored in the same file proves nothing more, since
whoever rewrites the payload can rewrite the digest as well.
"""

import threading
import zlib
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from .. import _compat
from .. import _wire as W
from .._errors import EncodeError, KilnError
from .._pread import read_bytes
from .tables import payload, payload_base, rows

KEY = "__kiln_checksum__"
ALGORITHM = "crc32"
_CHUNK = 1 << 22


def crc32(data: Any) -> int:
    """zlib's CRC-32 of ``data``: the kernel's (the compiled one uses the CPU's
    carry-less multiplication where it has one, zlib's table otherwise)."""
    return _compat.kernels.crc32(data) & 0xFFFFFFFF


def crc_of_range(fd: int, at: int, n: int, path: str) -> int:
    """The CRC-32 of ``n`` bytes of ``fd`` at ``at``, read with ``pread`` in
    chunks (never through a mapping: a file truncated meanwhile is ``EOF``)."""
    c = 0
    end = at + n
    while at < end:
        k = min(_CHUNK * 2, end - at)
        c = _compat.kernels.crc32(read_bytes(fd, k, at, path), c) & 0xFFFFFFFF
        at += k
    return c


# --- two threads: each sums half of the bytes ----------------------------------

PARALLEL_MIN = 1 << 23   # below 8 MiB in all, a second thread costs more than it saves
_POLY = 0xEDB88320       # the CRC-32 polynomial, bit-reversed (zlib's)


def _multmodp(a: int, b: int) -> int:
    """a * b modulo the CRC polynomial (bit-reversed: x^0 is bit 31), as zlib's."""
    m, p = 1 << 31, 0
    while True:
        if a & m:
            p ^= b
            if a & (m - 1) == 0:
                return p
        m >>= 1
        b = (b >> 1) ^ _POLY if b & 1 else b >> 1


def _powers() -> Tuple[int, ...]:
    out = [1 << 30]   # x^1; then x^2, x^4, ..., x^(2^31)
    for _ in range(31):
        out.append(_multmodp(out[-1], out[-1]))
    return tuple(out)


_X2N: Tuple[int, ...] = ()   # _powers(), at the first crc32_combine (not at import)


def crc32_combine(crc1: int, crc2: int, len2: int) -> int:
    """The CRC-32 of ``A + B`` from ``crc1`` of A, ``crc2`` of B and B's length
    (zlib's ``crc32_combine``): crc1 times x^(8 len2), plus crc2."""
    global _X2N
    if len2 < 0:
        raise ValueError("crc32_combine: a length of %d bytes" % len2)
    if not _X2N:
        _X2N = _powers()   # (two threads may both compute it: the same tuple)
    p, k = 1 << 31, 3   # x^0; 2^3 bits a byte
    while len2:
        if len2 & 1:
            p = _multmodp(_X2N[k & 31], p)
        len2 >>= 1
        k += 1
    return _multmodp(p, crc1) ^ crc2


def crcs(views: Sequence[Any]) -> List[int]:
    """The CRC-32 of each of ``views`` (byte buffers).  From :data:`PARALLEL_MIN`
    bytes in all, a second thread sums the second half of the bytes (the
    buffers taken end to end, the one cut in two joined by
    :func:`crc32_combine`) while this one sums the first: both kernels'
    ``crc32`` release the GIL, so on a file's mapping the two also take its
    page faults side by side."""
    lengths = [memoryview(v).nbytes for v in views]
    total = sum(lengths)
    if total < PARALLEL_MIN:
        return [crc32(v) for v in views]
    half, j, acc = total // 2, 0, 0
    while acc + lengths[j] <= half:   # views[j] holds byte `half`
        acc += lengths[j]
        j += 1
    k = half - acc
    cut = memoryview(views[j]).cast("B")
    second: List[Any] = []

    def run() -> None:
        try:
            second.extend(crc32(v) for v in [cut[k:]] + list(views[j + 1:]))
        except BaseException as e:   # noqa: BLE001 - raised in the caller's thread
            second[:] = [e]

    helper = threading.Thread(target=run, name="kiln-crc32", daemon=True)
    helper.start()
    try:
        first = [crc32(v) for v in views[:j]]
        head = crc32(cut[:k])
    finally:
        helper.join()
        cut.release()
    if len(second) == 1 and isinstance(second[0], BaseException):
        raise second[0]
    return first + [crc32_combine(head, second[0], lengths[j] - k)] + second[1:]


def digests(payloads: Iterable[Any]) -> bytes:
    return b"".join(c.to_bytes(4, "little") for c in crcs(list(payloads)))


def with_entry(metadata: Optional[Dict[str, Any]], sums: bytes) -> Dict[str, Any]:
    """The metadata to store: the caller's (checked for the reserved key) plus the entry."""
    if metadata is not None and not isinstance(metadata, dict):
        raise EncodeError("TYPE", 0, "metadata must be a dict, not %s" % type(metadata).__name__)
    refuse_key(metadata)
    out = dict(metadata or {})
    out[KEY] = {"algorithm": ALGORITHM, ALGORITHM: sums}
    return out


def refuse_key(metadata: Any) -> None:
    if isinstance(metadata, dict) and KEY in metadata:
        raise EncodeError("TYPE", 0, "the metadata key %r is reserved for kiln's checksums "
                          "(pass checksum=True)" % KEY)


def split(meta: Optional[Dict[str, Any]], count: int, at: int,
          path: str) -> Tuple[Optional[Dict[str, Any]], Optional[bytes]]:
    """(the caller's metadata, or None when only the entry was stored; the digests
    bytes, or None when the file has none), the entry checked; ``at`` is the
    metadata's file offset, where a malformed entry is reported."""
    if meta is None or KEY not in meta:
        return meta, None
    entry = meta[KEY]
    user = {k: v for k, v in meta.items() if k != KEY}
    if not isinstance(entry, dict) or set(entry) != {"algorithm", ALGORITHM} \
            or entry["algorithm"] != ALGORITHM or not isinstance(entry[ALGORITHM], bytes):
        raise KilnError("TYPE", at, "%s: the metadata's %r entry is not {'algorithm': 'crc32', "
                        "'crc32': bytes}" % (path, KEY))
    sums = entry[ALGORITHM]
    if len(sums) != 4 * count:
        raise KilnError("TYPE", at, "%s: the metadata's %r entry holds %d bytes of digests for "
                        "%d tensors (4 each)" % (path, KEY, len(sums), count))
    return (user or None), sums


def check(sums: bytes, i: int, payload: Any, name: Any, offset: int, path: str) -> None:
    """CHECKSUM at the payload's file ``offset`` when tensor ``i``'s bytes differ
    (from 8 MiB, summed by two threads)."""
    compare(sums, i, crcs([payload])[0], name, offset, path)


def compare(sums: bytes, i: int, got: int, name: Any, offset: int, path: str) -> None:
    """CHECKSUM at ``offset`` when ``got`` is not tensor ``i``'s recorded CRC-32."""
    want = int.from_bytes(sums[4 * i:4 * i + 4], "little")
    if got != want:
        raise KilnError("CHECKSUM", offset, "%s: tensor %r: payload crc32 is %08x, the file "
                        "records %08x (the payload bytes changed after they were written)"
                        % (path, name if name is not None else i, got, want))


def check_directory(sums: bytes, d: Any, path: str, done: Optional[set] = None,
                    base: Optional[int] = None,
                    known: Optional[Dict[Tuple[int, int], int]] = None) -> None:
    """Check every tensor of directory ``d``; a fault is reported at ``base`` (the
    payload base's file offset; by default the directory's own) plus the offset.
    ``known`` holds CRC-32s already computed of ``d``'s buffer, by (start,
    length) of the bytes (:class:`kiln._files.overlap.Overlapped`); a payload
    not in it is computed now."""
    pb = payload_base(d)
    table = rows(d)
    todo = [i for i, row in enumerate(table) if (done is None or i not in done) and (
        known is None or (pb + row[W.R_BYTE_OFFSET], row[W.R_BYTE_LENGTH]) not in known)]
    views: List[memoryview] = []
    try:
        views.extend(payload(d, i) for i in todo)
        got = dict(zip(todo, crcs(views)))   # two threads from 8 MiB, then compared in order
    finally:
        for v in views:
            v.release()
    for i, row in enumerate(table):
        if done is not None and i in done:
            continue
        off, n = row[W.R_BYTE_OFFSET], row[W.R_BYTE_LENGTH]
        c = got[i] if i in got else known[(pb + off, n)]   # type: ignore[index]
        compare(sums, i, c, _name(row[W.R_NAME]), (pb if base is None else base) + off, path)
        if done is not None:
            done.add(i)


def _name(raw: Optional[bytes]) -> Optional[str]:
    return None if raw is None else raw.decode("utf-8", "replace")


def file_digests(fd: int, spans: Iterable[Tuple[int, int]]) -> bytes:
    """The digests of the payloads at (offset, length) in the open file ``fd``,
    read back in chunks of 4 MiB (a streaming writer's payloads come in any order)."""
    import os
    out = []
    for at, n in spans:
        c = 0
        end = at + n
        while at < end:
            chunk = os.pread(fd, min(_CHUNK, end - at), at)
            if not chunk:
                break   # past the end: the rest is a hole the truncate left
            c = zlib.crc32(chunk, c)
            at += len(chunk)
        if at < end:   # a sparse tail past the file's end reads as zeros
            zeros = bytes(min(_CHUNK, end - at))
            while at < end:
                k = min(len(zeros), end - at)
                c = zlib.crc32(zeros[:k], c)
                at += k
        out.append((c & 0xFFFFFFFF).to_bytes(4, "little"))
    return b"".join(out)
