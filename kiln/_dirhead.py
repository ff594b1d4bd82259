"""The header, descriptors and name heap of a tensor directory block (spec section 6).

Shared by the pure kernel's ``write_directory`` (``kiln/_kernels_py/dirwrite.py``)
and the file writers (``kiln/_files/save.py``, ``writer.py``), so a file's table is built by
the same code as every block the pure kernel encodes, without importing the
pure kernel on the compiled path.  Not a hot loop: one pass over the
descriptors.
"""

from . import _wire as W
from ._errors import EncodeError


def plan_heap(records, at, wide_ok=False):
    """(named, name offsets, layout offsets, heap size, wide), or EncodeError at ``at``.

    ``wide``: some name or layout offset or length passes the u16 fields, so
    the block needs the wide name fields (flag bit 2, spec section 12.3),
    which only a tensor file may have (``wide_ok``); the offsets are then
    u32 with ``NO_NAME_WIDE`` for none.  Otherwise the block is exactly what
    a directory without the flag has always been."""
    named = any(rec[W.R_NAME] is not None for rec in records)
    heap_n = 0
    noffs = []
    fits = True
    for rec in records:
        if named:
            if not rec[W.R_NAME]:
                raise EncodeError("TYPE", at, "when one tensor is named, all must be")
            if heap_n > W.U16_MAX or len(rec[W.R_NAME]) > W.U16_MAX:
                fits = False
            noffs.append(heap_n)
            heap_n += len(rec[W.R_NAME])
        else:
            noffs.append(None)
    loffs = []
    for rec in records:
        if rec[W.R_LAYOUT]:
            if heap_n > W.U16_MAX or len(rec[W.R_LAYOUT]) > W.U16_MAX:
                fits = False
            loffs.append(heap_n)
            heap_n += len(rec[W.R_LAYOUT])
        else:
            loffs.append(None)
    if heap_n > W.U32_MAX or (not fits and not wide_ok and any(
            o is not None and o > W.U16_MAX for o in noffs + loffs)):
        raise EncodeError("LIMIT", at, "name heap of %d bytes does not fit u16 offsets" % heap_n)
    if not fits and not wide_ok:
        raise EncodeError("LIMIT", at, "a name is longer than 65535 bytes")
    none = W.NO_NAME if fits else W.NO_NAME_WIDE
    return (named, [none if o is None else o for o in noffs],
            [none if o is None else o for o in loffs], heap_n, not fits)


def block_head(metas, at, wide_ok=False):
    """The header, descriptors, heap and padding of a block, before its payloads.

    ``metas`` are write records with the payload's length in place of the
    payload.  Returns ``(head bytes, payload offsets, payload_bytes)``; errors
    are EncodeErrors at ``at``.  The streaming file writer uses this too.
    ``wide_ok``: a tensor file's block, which takes wide name fields when its
    names need them (``plan_heap``).
    """
    count = len(metas)
    if count > W.U32_MAX:
        raise EncodeError("LIMIT", at, "%d tensors exceed u32" % count)
    named, noffs, loffs, heap_n, wide = plan_heap(metas, at, wide_ok)
    dir_bytes = count * W.DESC_SIZE + heap_n
    base = W.dir_align(W.HEADER_SIZE + dir_bytes)
    places = []
    r = 0
    for m in metas:
        o = W.dir_align(r)
        places.append(o)
        r = o + m[W.R_PAYLOAD]
    head = bytearray(W.HEADER.pack(W.DIR_MAGIC, W.DIR_VERSION,
                                   W.FLAG_LITTLE | (W.FLAG_NAMED if named else 0)
                                   | (W.FLAG_WIDE if wide else 0), 0, count,
                                   heap_n, r, dir_bytes, bytes(32)))
    desc = W.DESC.pack
    for i, m in enumerate(metas):
        dims, layout = m[W.R_SHAPE], m[W.R_LAYOUT]
        shape = tuple(dims) + (0,) * (W.MAX_RANK - len(dims))
        fields = (noffs[i], len(m[W.R_NAME]) if named else 0, loffs[i],
                  len(layout) if layout else 0)
        # block_size .. outer_index: the record's and the descriptor's order
        if wide:   # the u32 name fields in bytes 112..127, bytes 4..11 left 0
            head += desc(m[W.R_CODE], len(dims), 0, 0, 0, 0, 0, *m[W.R_BLOCK_SIZE:W.R_PAYLOAD],
                         places[i], m[W.R_PAYLOAD], *shape, W.WIDE_FIELDS.pack(*fields))
        else:
            head += desc(m[W.R_CODE], len(dims), 0, *fields, *m[W.R_BLOCK_SIZE:W.R_PAYLOAD],
                         places[i], m[W.R_PAYLOAD], *shape, bytes(16))
    for m in metas:
        if named:
            head += m[W.R_NAME]
    for m in metas:
        if m[W.R_LAYOUT]:
            head += m[W.R_LAYOUT]
    head += bytes(base - (W.HEADER_SIZE + dir_bytes))
    return bytes(head), places, r
