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

from typing import Any, Optional, Tuple

from .. import _api, _compat
from .. import _wire as W
from .._errors import KilnError

# encode_record's record (spec/records.md): a 16-byte head whose byte 9 is
# the pad, the pad, the framed value, a 4-byte CRC
_REC_HEAD = 16
_REC_PAD = 9
_REC_CRC = 4
_ZEROS = bytes(W.DIR_ALIGN)


def encode(value: Any, type: Any, round_floats: bool, at: int,
           store_type: bool = False) -> Tuple[bytes, Any]:
    """``(head, framed value)`` of ``value`` for a file where the head lands at
    byte ``at``.  ``store_type``: always a head of version 2, holding the
    type text, its pad aligning the first directory with payload bytes.
    Else a head of version 1 only where that directory would start off a
    64-byte boundary; ``b""`` when it already starts on one, or when the
    value has none."""
    enc = _api.cached_encoder(type, True, round_floats)
    text = enc.type.text.encode("utf-8") if store_type else None
    size = W.PADDED_SIZE if text is None else W.TYPED_SIZE + len(text)   # the head, no pad
    if "tensors" not in enc.type.text:   # no directory: the plain encode, nothing to align
        need, body = 0, enc.encode(value)
    else:
        # a record whose head lands at (at - 16) holds the value at byte ``at``:
        # its pad is what the value needs with no head before it
        rec = _compat.kernels.encode_record(enc._prog, value, (at - _REC_HEAD) % W.DIR_ALIGN,
                                            False)
        need = rec[_REC_PAD]
        body = memoryview(rec)[_REC_HEAD + need:len(rec) - _REC_CRC]
    if text is None:
        if need == 0:
            return b"", body
        pad = (need - size) % W.DIR_ALIGN   # the head's 8 bytes take part of it
        return W.PADDED_HEAD.pack(W.PADDED_MAGIC, W.PADDED_VERSION, pad, 0) + _ZEROS[:pad], body
    pad = (need - size) % W.DIR_ALIGN if need else 0
    return W.TYPED_HEAD.pack(W.PADDED_MAGIC, W.TYPED_VERSION, pad, 0, len(text)) + text + \
        _ZEROS[:pad], body


def saved_head(buf: Any) -> Tuple[int, Optional[str]]:
    """``(where the framed value starts, the stored type text or None)`` of a
    saved file's first bytes ``buf`` (as many as hold the head, its type text
    and pad: :func:`head_size` says how many), all checked (``KilnError`` at
    the file offset of the fault); ``(0, None)`` without a head."""
    mv = memoryview(buf)
    if mv.ndim != 1 or mv.format != "B":
        mv = mv.cast("B")
    n = len(mv)
    if bytes(mv[:len(W.PADDED_MAGIC)]) != W.PADDED_MAGIC:
        return 0, None
    if n < W.PADDED_SIZE:
        raise KilnError("EOF", 0, "%d bytes, shorter than the %d-byte pad head of a saved value"
                        % (n, W.PADDED_SIZE))
    _, version, pad, reserved = W.PADDED_HEAD.unpack_from(mv)
    if version not in (W.PADDED_VERSION, W.TYPED_VERSION):
        raise KilnError("FRAME", W.PADDED_AT_VERSION, "pad head version %d, not %d or %d (a "
                        "newer kiln wrote this file?)" % (version, W.PADDED_VERSION,
                                                         W.TYPED_VERSION))
    if pad >= W.DIR_ALIGN:
        raise KilnError("FRAME", W.PADDED_AT_PAD, "pad of %d bytes is not below %d"
                        % (pad, W.DIR_ALIGN))
    if reserved:
        raise KilnError("FRAME", W.PADDED_AT_RESERVED + (0 if mv[W.PADDED_AT_RESERVED] else 1),
                        "pad head reserved bytes are not 0")
    end, text = W.PADDED_SIZE, None
    if version == W.TYPED_VERSION:
        if n < W.TYPED_SIZE:
            raise KilnError("EOF", n, "the file ends inside the type text length of the head")
        t = int.from_bytes(mv[W.TYPED_AT_LENGTH:W.TYPED_SIZE], "little")
        if t > W.TYPED_MAX:
            raise KilnError("LIMIT", W.TYPED_AT_LENGTH, "a stored type text of %d bytes is "
                            "above %d" % (t, W.TYPED_MAX))
        end = W.TYPED_SIZE + t
        if end > n:
            raise KilnError("EOF", n, "the file ends inside the stored type text of %d bytes"
                            % t)
        try:
            text = bytes(mv[W.TYPED_SIZE:end]).decode("utf-8")
        except UnicodeDecodeError as e:
            raise KilnError("UTF8", W.TYPED_SIZE + e.start,
                            "the stored type text is not UTF-8") from None
    start = end + pad
    if start > n:
        raise KilnError("EOF", n, "the file ends inside the pad of %d bytes after the pad head"
                        % pad)
    padding = bytes(mv[end:start])
    if padding != _ZEROS[:pad]:
        first = next(i for i, b in enumerate(padding) if b)
        raise KilnError("FRAME", end + first, "pad byte is %d, not 0" % padding[first])
    return start, text


def head_size(first: Any) -> int:
    """How many bytes from the start of a saved file hold its head, type text
    and pad, from its first :data:`W.TYPED_SIZE` bytes (or fewer)."""
    mv = memoryview(first).cast("B") if not isinstance(first, bytes) else first
    if bytes(mv[:4]) != W.PADDED_MAGIC or len(mv) < W.TYPED_SIZE or \
            mv[W.PADDED_AT_VERSION] != W.TYPED_VERSION:
        return W.PADDED_SIZE + W.DIR_ALIGN
    t = int.from_bytes(mv[W.TYPED_AT_LENGTH:W.TYPED_SIZE], "little")
    return W.TYPED_SIZE + min(t, W.TYPED_MAX + 1) + W.DIR_ALIGN


def value_start(buf: Any) -> int:
    """Where the framed value starts in ``buf`` (a saved file's bytes from its
    first, or as many of them as hold the head and pad): 0 without a pad head,
    else after the head, its type text and its pad, all checked (``KilnError``
    at the file offset of the fault)."""
    return saved_head(buf)[0]


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


__all__ = ["encode", "value_start", "saved_head", "head_size", "shifted", "padded_hint"]
