"""The header, descriptors and name heap of a tensor directory block (spec section 6).

Shared by the pure kernel's ``write_directory`` (``kiln/_kernels_py/dirwrite.py``)
and the file writers (``kiln/_files/save.py``, ``writer.py``), so a file's table is built by
the same code as every block the pure kernel encodes, without importing the
pure kernel on the compiled path.  Not a hot loop: one pass over the
descriptors.
"""

from . import _wire as W
from ._errors import EncodeError


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


def block_head(metas, at):
    """The header, descriptors, heap and padding of a block, before its payloads.

    ``metas`` are write records with the payload's length in place of the
    payload.  Returns ``(head bytes, payload offsets, payload_bytes)``; errors
    are EncodeErrors at ``at``.  The streaming file writer uses this too.
    """
    count = len(metas)
    if count > W.U32_MAX:
        raise EncodeError("LIMIT", at, "%d tensors exceed u32" % count)
    named, noffs, loffs, heap_n = plan_heap(metas, at)
    dir_bytes = count * W.DESC_SIZE + heap_n
    base = W.dir_align(W.HEADER_SIZE + dir_bytes)
    places = []
    r = 0
    for m in metas:
        o = W.dir_align(r)
        places.append(o)
        r = o + m[10]
    head = bytearray(W.HEADER.pack(W.DIR_MAGIC, W.DIR_VERSION,
                                   W.FLAG_LITTLE | (W.FLAG_NAMED if named else 0), 0, count,
                                   heap_n, r, dir_bytes, bytes(32)))
    for i, m in enumerate(metas):
        shape = tuple(m[1]) + (0,) * (W.MAX_RANK - len(m[1]))
        head += W.DESC.pack(m[0], len(m[1]), 0, noffs[i], len(m[2]) if named else 0,
                            loffs[i], len(m[3]) if m[3] else 0, m[4], m[5], m[6], m[7], m[8],
                            m[9], places[i], m[10], *shape, bytes(16))
    for m in metas:
        if named:
            head += m[2]
    for m in metas:
        if m[3]:
            head += m[3]
    head += bytes(base - (W.HEADER_SIZE + dir_bytes))
    return bytes(head), places, r
