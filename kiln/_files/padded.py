"""The pad head of a saved value (spec/kiln-v2.md section 13).

A framed value's tensor payloads are 64-byte aligned to their directory,
and the directory starts wherever the fields before it end.  So that they
are 64-byte aligned in the file too, ``kiln.save`` puts a pad head (magic,
version, pad length P, reserved) and P zero bytes before the framed value
when, without them, the value's first directory with payload bytes would
start off a 64-byte boundary.  A file that needs no pad (a value without
tensors, or one already aligned) is the framed value alone, as before.

``encode`` gives the head and the value to write; ``value_start`` checks a
head and says where the framed value starts.  The pad is the kernels' own
(``encode_record`` with ``base``), so both kernels pad alike.
"""

from typing import Any, Tuple

from .. import _api, _compat
from .. import _wire as W
from .._errors import KilnError

# encode_record's record (spec/records.md): a 16-byte head whose byte 9 is
# the pad, the pad, the framed value, a 4-byte CRC
_REC_HEAD = 16
_REC_PAD = 9
_REC_CRC = 4
_ZEROS = bytes(W.DIR_ALIGN)


def encode(value: Any, type: Any, round_floats: bool, at: int) -> Tuple[bytes, Any]:
    """``(head, framed value)`` of ``value`` for a file where the head lands at
    byte ``at``: the head (with its pad) is ``b""`` when the value's first
    directory with payload bytes already starts on a 64-byte boundary there,
    or when it has none."""
    enc = _api.cached_encoder(type, True, round_floats)
    if "tensors" not in enc.type.text:   # no directory: the plain encode
        return b"", enc.encode(value)
    # a record whose head lands at (at - 16) holds the value at byte ``at``:
    # its pad is what the value needs with no head before it
    rec = _compat.kernels.encode_record(enc._prog, value, (at - _REC_HEAD) % W.DIR_ALIGN, False)
    need = rec[_REC_PAD]
    body = memoryview(rec)[_REC_HEAD + need:len(rec) - _REC_CRC]
    if need == 0:
        return b"", body
    pad = (need - W.PADDED_SIZE) % W.DIR_ALIGN   # the head's 8 bytes take part of it
    return W.PADDED_HEAD.pack(W.PADDED_MAGIC, W.PADDED_VERSION, pad, 0) + _ZEROS[:pad], body


def value_start(buf: Any) -> int:
    """Where the framed value starts in ``buf`` (a saved file's bytes from its
    first, or as many of them as hold the head and pad): 0 without a pad head,
    else after the head and its pad, all checked (``KilnError`` at the file
    offset of the fault)."""
    mv = memoryview(buf)
    if mv.ndim != 1 or mv.format != "B":
        mv = mv.cast("B")
    n = len(mv)
    if bytes(mv[:len(W.PADDED_MAGIC)]) != W.PADDED_MAGIC:
        return 0
    if n < W.PADDED_SIZE:
        raise KilnError("EOF", 0, "%d bytes, shorter than the %d-byte pad head of a saved value"
                        % (n, W.PADDED_SIZE))
    _, version, pad, reserved = W.PADDED_HEAD.unpack_from(mv)
    if version != W.PADDED_VERSION:
        raise KilnError("FRAME", W.PADDED_AT_VERSION, "pad head version %d, not %d (a newer "
                        "kiln wrote this file?)" % (version, W.PADDED_VERSION))
    if pad >= W.DIR_ALIGN:
        raise KilnError("FRAME", W.PADDED_AT_PAD, "pad of %d bytes is not below %d"
                        % (pad, W.DIR_ALIGN))
    if reserved:
        raise KilnError("FRAME", W.PADDED_AT_RESERVED + (0 if mv[W.PADDED_AT_RESERVED] else 1),
                        "pad head reserved bytes are not 0")
    end = W.PADDED_SIZE + pad
    if end > n:
        raise KilnError("EOF", n, "the file ends inside the pad of %d bytes after the pad head"
                        % pad)
    padding = bytes(mv[W.PADDED_SIZE:end])
    if padding != _ZEROS[:pad]:
        first = next(i for i, b in enumerate(padding) if b)
        raise KilnError("FRAME", W.PADDED_SIZE + first, "pad byte is %d, not 0"
                        % padding[first])
    return end


def shifted(e: KilnError, start: int) -> KilnError:
    """A decode error of the value that starts at file offset ``start``, with its
    offset made the file's."""
    if start:
        e.offset += start
    return e


def padded_hint(e: KilnError) -> KilnError:
    """Say so when a tensor file's reader meets a pad head (``kiln.open``)."""
    e.reason += " (the file holds a value kiln.save wrote after a pad head: read it with " \
                "kiln.load and its type)"
    return e


__all__ = ["encode", "value_start", "shifted", "padded_hint"]
