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
    named = any(rec[W.R_NAME] is not None for rec in records)
    heap_n = 0
    noffs = []
    for rec in records:
        if named:
            if not rec[W.R_NAME]:
                raise EncodeError("TYPE", at, "when one tensor is named, all must be")
            noffs.append(heap_n)
            heap_n += len(rec[W.R_NAME])
        else:
            noffs.append(W.NO_NAME)
    loffs = []
    for rec in records:
        if rec[W.R_LAYOUT]:
            loffs.append(heap_n)
            heap_n += len(rec[W.R_LAYOUT])
        else:
            loffs.append(W.NO_NAME)
    if any(o >= W.NO_NAME for o in noffs + loffs if o != W.NO_NAME) or heap_n > W.U32_MAX:
        raise EncodeError("LIMIT", at, "name heap of %d bytes does not fit u16 offsets" % heap_n)
    for rec in records:
        name, layout = rec[W.R_NAME], rec[W.R_LAYOUT]
        if (name and len(name) > W.U16_MAX) or (layout and len(layout) > W.U16_MAX):
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
        r = o + m[W.R_PAYLOAD]
    head = bytearray(W.HEADER.pack(W.DIR_MAGIC, W.DIR_VERSION,
                                   W.FLAG_LITTLE | (W.FLAG_NAMED if named else 0), 0, count,
                                   heap_n, r, dir_bytes, bytes(32)))
    for i, m in enumerate(metas):
        dims, layout = m[W.R_SHAPE], m[W.R_LAYOUT]
        shape = tuple(dims) + (0,) * (W.MAX_RANK - len(dims))
        # block_size .. outer_index: the record's and the descriptor's order
        head += W.DESC.pack(m[W.R_CODE], len(dims), 0, noffs[i],
                            len(m[W.R_NAME]) if named else 0, loffs[i],
                            len(layout) if layout else 0, *m[W.R_BLOCK_SIZE:W.R_PAYLOAD],
                            places[i], m[W.R_PAYLOAD], *shape, bytes(16))
    for m in metas:
        if named:
            head += m[W.R_NAME]
    for m in metas:
        if m[W.R_LAYOUT]:
            head += m[W.R_LAYOUT]
    head += bytes(base - (W.HEADER_SIZE + dir_bytes))
    return bytes(head), places, r
