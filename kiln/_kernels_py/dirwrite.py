"""Writing a canonical tensor directory block (spec section 6).

The twin of ``src/kernels/dirwrite.pxi``.  A record is the kernel
interface's write layout: ``(code, shape, name, layout, block_size,
quant_scheme, quant_axis, group_size, scale_index, outer_index, payload)``
with ``name``/``layout`` as bytes or None and ``payload`` a contiguous byte
buffer of little-endian bits.
"""

from .._dirhead import block_head, plan_heap  # noqa: F401  (plan_heap: the twin's first step)
from .._wire import R_PAYLOAD


def write_directory(records, out):
    """Append the canonical block of ``records`` to the bytearray ``out``; returns its start."""
    start = len(out)
    # block_head's layout: a record's fields before the payload, then its length
    head, places, _ = block_head([rec[:R_PAYLOAD] + (len(rec[R_PAYLOAD]),) for rec in records],
                                 start)
    out += head
    pstart = len(out)
    for i, rec in enumerate(records):
        gap = pstart + places[i] - len(out)
        if gap:
            out += bytes(gap)
        out += rec[R_PAYLOAD]
    return start
