"""Reading the wire: errors, the allocation rule, the zero-size budget, the frame.

The twin of ``src/kernels/reader.pxi``.
"""

import struct as _struct
import threading

from .. import _wire as W
from .._errors import KilnError

U32 = _struct.Struct("<I")
U64 = _struct.Struct("<Q")


def err(code, offset, reason):
    return KilnError(code, offset, reason)


def eof(pos, size, n):
    return err("EOF", pos, "%d-byte value needs more bytes, %d remain" % (size, max(n - pos, 0)))


def check_count(buf, pos, cap, min_size, capname="max_count", n=None):
    """Read the u32 count at ``pos`` and apply the five-step allocation rule.

    1. the word needs 4 bytes (EOF), 2. read it, 3. it must not exceed the
    cap (LIMIT, naming ``capname``), 4. count * min_size must not overflow
    u64 (LIMIT), 5. count * min_size must not exceed the bytes after the word
    (EOF).  Returns the count.  ``n``: the bytes there are, when ``buf``
    holds only the first of them (list_head's ``length``).
    """
    if n is None:
        n = len(buf)
    if pos + 4 > n:
        raise err("EOF", pos, "count word needs 4 bytes, %d remain" % max(n - pos, 0))
    c = U32.unpack_from(buf, pos)[0]
    if c > cap:
        raise err("LIMIT", pos, "count %d is above the cap %s=%d" % (c, capname, cap))
    need = c * min_size
    if need > W.U64_MAX:
        raise err("LIMIT", pos, "count %d times %d bytes overflows u64" % (c, min_size))
    if need > n - pos - 4:
        raise err("EOF", pos, "count %d needs at least %d bytes, %d remain"
                  % (c, need, n - pos - 4))
    return c


def read_length(d, p, max_bytes, what):
    """A str or key length word at ``p``: returns the body's (start, end)."""
    n = len(d)
    if p + 4 > n:
        raise err("EOF", p, "%s length needs 4 bytes, %d remain" % (what, max(n - p, 0)))
    ln = U32.unpack_from(d, p)[0]
    if ln > max_bytes:
        raise err("LIMIT", p, "%s length %d is above the cap max_bytes=%d"
                  % (what, ln, max_bytes))
    q = p + 4
    if ln > n - q:
        raise err("EOF", p, "%s length %d, %d bytes remain" % (what, ln, n - q))
    return q, q + ln


# --- the zero-size budget (spec section 4.3) -------------------------------

# what is left of the budget of the decode running in this thread
budget = threading.local()


def zero_budget_error(pos, c, left, cap):
    return err("LIMIT", pos, "count %d of zero-size elements is above what is left (%d) of "
               "the max_count budget %d that all such elements of one value (of one "
               "record container read) share"
               % (c, left, cap))


def has_zero_lists(plan):
    """Does the plan hold a list whose elements have minimum size 0?"""
    if plan.op == W.OP_LIST and plan.elem.min_size == 0:
        return True
    if plan.elem is not None and has_zero_lists(plan.elem):
        return True
    return any(has_zero_lists(f) for f in plan.fields)


# --- the frame ---------------------------------------------------------------

def check_frame(mv, expected_hash):
    """Check the 16-byte frame at the start of ``mv``; returns its size."""
    n = len(mv)
    magic = bytes(mv[0:4])
    if n < 4:
        raise err("EOF", 0, "a frame needs 16 bytes, the buffer has %d" % n)
    if magic != W.FRAME_MAGIC:
        raise err("FRAME", 0, "frame magic is %r, not %r" % (magic, W.FRAME_MAGIC))
    if n < W.FRAME_SIZE:
        raise err("EOF", 0, "a frame needs 16 bytes, the buffer has %d" % n)
    _, profile, flags, _r, h = W.FRAME.unpack_from(mv, 0)
    if profile != 0:
        raise err("FRAME", W.FRAME_PROFILE, "frame profile is %d, not 0 (Frozen)" % profile)
    if flags != 0:
        raise err("FRAME", W.FRAME_FLAGS, "frame flags are %d, not 0" % flags)
    for i in (W.FRAME_RESERVED, W.FRAME_RESERVED + 1):
        if mv[i] != 0:
            raise err("FRAME", i, "reserved frame byte is %d, not 0" % mv[i])
    if h != expected_hash:
        raise err("SCHEMA", W.FRAME_HASH, "frame schema hash %#018x does not match the type's "
                  "%#018x" % (h, expected_hash))
    return W.FRAME_SIZE
