"""Writing a canonical tensor directory block (spec section 6).

The twin of ``src/kernels/dirwrite.pxi``.  A record is the kernel
interface's write layout: ``(code, shape, name, layout, block_size,
quant_scheme, quant_axis, group_size, scale_index, outer_index, payload)``
with ``name``/``layout`` as bytes or None and ``payload`` a contiguous byte
buffer of little-endian bits.
"""

from .. import _wire as W
from .._errors import EncodeError


def plan_heap(records, at):
    """(named, name offsets, layout offsets, heap size), or EncodeError at ``at``."""
    named = any(rec[2] is not None for rec in records)
    heap_n = 0
    noffs = []
    for rec in records:
        if named:
            if not rec[2]:
                raise EncodeError("TYPE", at, "when one tensor is named, all must be")
            noffs.append(heap_n)
            heap_n += len(rec[2])
        else:
            noffs.append(W.NO_NAME)
    loffs = []
    for rec in records:
        if rec[3]:
            loffs.append(heap_n)
            heap_n += len(rec[3])
        else:
            loffs.append(W.NO_NAME)
    if any(o >= W.NO_NAME for o in noffs + loffs if o != W.NO_NAME) or heap_n > W.U32_MAX:
        raise EncodeError("LIMIT", at, "name heap of %d bytes does not fit u16 offsets" % heap_n)
    for rec in records:
        if (rec[2] and len(rec[2]) > W.U16_MAX) or (rec[3] and len(rec[3]) > W.U16_MAX):
            raise EncodeError("LIMIT", at, "a name is longer than 65535 bytes")
    return named, noffs, loffs, heap_n


def write_directory(records, out):
    """Append the canonical block of ``records`` to the bytearray ``out``; returns its start."""
    count = len(records)
    start = len(out)
    if count > W.U32_MAX:
        raise EncodeError("LIMIT", start, "%d tensors exceed u32" % count)
    named, noffs, loffs, heap_n = plan_heap(records, start)
    dir_bytes = count * W.DESC_SIZE + heap_n
    align = W.DIR_ALIGN - 1
    base = (W.HEADER_SIZE + dir_bytes + align) & ~align
    places = []
    r = 0
    for rec in records:
        o = (r + align) & ~align
        places.append(o)
        r = o + len(rec[10])
    out += W.HEADER.pack(W.DIR_MAGIC, W.DIR_VERSION, W.FLAG_LITTLE | (W.FLAG_NAMED if named else 0),
                         0, count, heap_n, r, dir_bytes, bytes(32))
    for i, rec in enumerate(records):
        shape = tuple(rec[1]) + (0,) * (W.MAX_RANK - len(rec[1]))
        out += W.DESC.pack(rec[0], len(rec[1]), 0, noffs[i], len(rec[2]) if named else 0,
                           loffs[i], len(rec[3]) if rec[3] else 0, rec[4], rec[5], rec[6],
                           rec[7], rec[8], rec[9], places[i], len(rec[10]), *shape, bytes(16))
    for rec in records:
        if named:
            out += rec[2]
    for rec in records:
        if rec[3]:
            out += rec[3]
    out += bytes(base - (W.HEADER_SIZE + dir_bytes))
    pstart = len(out)
    for i, rec in enumerate(records):
        gap = pstart + places[i] - len(out)
        if gap:
            out += bytes(gap)
        out += rec[10]
    return start
