"""The record container's record loop (``spec/records.md``), pure Python.

The twin of ``src/kernels/records.pxi``: each record's head, length, padding
and CRC are checked, in this order, and its framed value decoded by a decode
program, with the codes, offsets and messages of ``kiln/records/_format.py``
(``parse_head``, ``check_body``, ``rewrap``).

``decode_records(program, buf, origin, offsets, first, last, verify, out, budget=None)``
    Records ``first .. last - 1`` of a file: record ``k`` spans the container
    offsets ``offsets[k] .. offsets[k + 1]`` (``offsets``: 8-byte unsigned
    integers, e.g. ``array("Q")``); byte ``j`` of ``buf`` is container offset
    ``origin + j``.  Each span must lie in ``buf`` and be exactly one record
    of kind 0.  ``program`` is a decode program of ``compile_decoder`` (any
    object with a ``decode(buf)`` method is called with a memoryview of each
    value).  The values are appended to the list ``out`` one by one, so
    after a ``KilnError`` it holds the records before the bad one.  Values
    view ``buf`` as ``program.decode`` would (tensor payloads).  The records
    share one budget of zero-size elements (``max_count``, spec 4.3):
    ``budget`` is ``[left]``, what is left of it for the whole read (a
    RecordFile iteration, a stream), updated as records spend it; None
    starts a budget for this call.

``decode_stream(program, buf, at, origin, number, verify, cap, ocrc, out, budget=None)``
    The records complete at ``buf[at:]`` (``buf[0]`` at container offset
    ``origin``; the first is record ``number``), appended to ``out``.  Stops
    at the first head that is the index's, or whose value length is above
    ``cap``, or whose record is not all in ``buf`` (the caller reads those);
    a damaged head, padding or CRC is raised.  Values are decoded from a
    private copy of their bytes.  Returns ``(at, number, ocrc)`` after the
    records taken, ``ocrc`` being the CRC-32 continued over each record's
    offset as 8 little-endian bytes.  ``budget`` as for ``decode_records``.

``encode_record(program, value, base=-1, crc=True)``
    One whole record of kind 0 (head, pad, framed value, record CRC) as
    bytes; ``program`` is an encode program that frames its values.  An
    ``EncodeError`` is that of ``program.encode`` (its offset counts from
    the value's frame).  ``base`` -1: no pad.  ``base`` >= 0: the record's
    head lands at container offset ``base``, and the record is padded so
    that the first tensor directory of the value whose payload bytes are
    not 0 starts on a 64-byte boundary of the container (every payload of
    that directory is then 64-aligned); no such directory: no pad.  Padded
    records need a program of this kernel (else ``ValueError``).  ``crc``
    False: the 4 bytes of the record CRC are 0 (for a caller that keeps only
    the value, as ``kiln.save`` does; the head's CRC is still computed).

``encode_records(program, values, room, limit, offsets, base=-1)``
    The records of values taken from the iterator ``values``, at most
    ``room`` of them, in one bytes object; stops after the record that
    brings it to ``limit`` bytes or more.  The offset of each record's head
    in that object is appended to ``offsets``.  Returns ``(data, more,
    error)``: ``more`` when it stopped for ``room`` or ``limit`` (the
    iterator may hold more), ``error`` the ``EncodeError`` of the value that
    stopped it, or the iterator's own exception (``data`` then holds the
    records before it, ``offsets`` only theirs), or None.  Only exceptions
    that are not ``Exception`` (``KeyboardInterrupt``) propagate, with
    nothing returned.  ``base`` >= 0: byte 0 of ``data`` lands at container
    offset ``base``, and each record is padded as ``encode_record`` pads.

``crc32(data, value=0)``
    ``zlib.crc32``.
"""

import struct
import zlib

from .._convert import as_bytes_view
from .._errors import KilnError
from .._wire import DIR_ALIGN

_HEAD = struct.Struct("<QBBHI")
_CRC = struct.Struct("<I")
_Q = struct.Struct("<Q")
_ZEROS = bytes(63)
_LEAST = 20 + 16                       # a head, an empty frame and a record CRC


def crc32(data, value=0):
    return zlib.crc32(data, value)


_FIRST = struct.Struct("<QI")          # length, kind (0), pad, reserved
_NO_CRC = bytes(4)
_ALIGN_OTHER = "encode_records: padded records need an encode program of this kernel"


def _framed(value_bytes, pad=0, crc=True):
    n = len(value_bytes)
    if n < 16:
        raise ValueError("encode_records: the program must frame its values (frame=True)")
    first = _FIRST.pack(n, pad << 8)
    hc = _CRC.pack(zlib.crc32(first))
    if not crc:
        return first, hc, _NO_CRC
    at = zlib.crc32(hc, zlib.crc32(first))
    if pad:
        at = zlib.crc32(_ZEROS[:pad], at)
    return first, hc, _CRC.pack(zlib.crc32(value_bytes, at))


def _record(program, value, base, at, crc=True):
    """The parts of the record of ``value`` whose head lands at container
    offset ``base + at`` (``base`` -1: no pad)."""
    if base < 0:
        b = program.encode(value)
        first, hc, tail = _framed(b, 0, crc)
        return (first, hc, b, tail)
    marked = getattr(program, "encode_marked", None)
    if marked is None:
        raise ValueError(_ALIGN_OTHER)
    b, d = marked(value)
    pad = -(base + at + 16 + d) % DIR_ALIGN if d > 0 else 0
    first, hc, tail = _framed(b, pad, crc)
    return (first, hc, _ZEROS[:pad], b, tail)


def encode_record(program, value, base=-1, crc=True):
    if getattr(program, "frame_hash", 0) is None:
        raise ValueError("encode_records: the program must frame its values (frame=True)")
    return b"".join(_record(program, value, base, 0, crc))


def encode_records(program, values, room, limit, offsets, base=-1):
    if getattr(program, "frame_hash", 0) is None:
        raise ValueError("encode_records: the program must frame its values (frame=True)")
    if base >= 0 and getattr(program, "encode_marked", None) is None:
        raise ValueError(_ALIGN_OTHER)
    out = bytearray()
    if room <= 0:
        return b"", True, None
    append = offsets.append
    it = iter(values)
    while True:
        try:
            value = next(it)
        except StopIteration:
            break
        except Exception as e:           # the iterator's own error
            return bytes(out), False, e
        try:
            parts = _record(program, value, base, len(out))
        except Exception as e:           # a value that does not encode
            return bytes(out), False, e
        append(len(out))
        for part in parts:
            out += part
        room -= 1
        if len(out) >= limit or room == 0:
            return bytes(out), True, None
    return bytes(out), False, None


def _head(mv, at, pos, number):
    """``(length, kind, pad)`` of the head at ``mv[at:]`` (container offset ``pos``)."""
    head = bytes(mv[at:at + 16])             # read once: the buffer may change
    length, kind, pad, reserved, want = _HEAD.unpack(head)
    if zlib.crc32(head[:12]) != want:
        raise KilnError("CHECKSUM", pos + 12, "record %d: head checksum mismatch (a torn or "
                        "corrupted record head)" % number)
    if kind > 1:
        raise KilnError("FRAME", pos + 8, "record %d: kind %d is neither record (0) nor "
                        "index (1)" % (number, kind))
    if pad > 63:
        raise KilnError("FRAME", pos + 9, "record %d: padding %d is above 63" % (number, pad))
    if reserved:
        raise KilnError("FRAME", pos + 10, "record %d: head reserved bytes are not 0" % number)
    if length < 16:
        raise KilnError("FRAME", pos, "record %d: value length %d is shorter than a frame"
                        % (number, length))
    return length, kind, pad


def _body(mv, at, pos, length, pad, number, verify):
    """The padding and the record CRC of the record whose head is at ``mv[at:]``."""
    if pad and mv[at + 16:at + 16 + pad] != _ZEROS[:pad]:
        raise KilnError("FRAME", pos + 16, "record %d: padding byte is not 0" % number)
    end = at + 16 + pad + length
    if verify and zlib.crc32(mv[at:end]) != _CRC.unpack_from(mv, end)[0]:
        raise KilnError("CHECKSUM", pos + 16 + pad + length, "record %d: value checksum "
                        "mismatch (a torn or corrupted record)" % number)


def _rewrap(e, at, number):
    if e.reason.startswith("record "):
        return e
    return KilnError(e.code, at + e.offset, "record %d: %s" % (number, e.reason))


def _decoder(program, budget):
    """``decode(view)`` for the records of one read: a pure decode program
    spends one zero-size budget (``budget``, ``[left]``, or a fresh one for
    this call) for all of them."""
    shared = getattr(program, "decode_shared", None)
    if shared is None:
        return program.decode
    if budget is None:
        budget = [program.max_count]
    elif len(budget) != 1 or not 0 <= budget[0] <= program.max_count:
        raise ValueError("budget: a list of one int between 0 and max_count")
    return lambda view: shared(view, budget)


def _one(decode, mv, origin, lo, hi, k, verify):
    """Record ``k`` at container offsets ``lo .. hi``: every check, then its value."""
    n = len(mv)
    if lo < origin or hi < lo + _LEAST or hi - origin > n:
        raise KilnError("FRAME", lo, "record %d: bytes %d..%d named by the index are not a "
                        "record within bytes %d..%d" % (k, lo, hi, origin, origin + n))
    at = lo - origin
    length, kind, pad = _head(mv, at, lo, k)
    if kind:
        raise KilnError("FRAME", lo + 8, "record %d: the index points at the index" % k)
    if length != hi - lo - 20 - pad:
        raise KilnError("FRAME", lo, "record %d: its length %d does not match the index (the "
                        "next entry is at byte %d)" % (k, length, hi))
    _body(mv, at, lo, length, pad, k, verify)
    v = at + 16 + pad
    try:
        return decode(mv[v:v + length])
    except KilnError as e:
        raise _rewrap(e, lo + 16 + pad, k)


def decode_records(program, buf, origin, offsets, first, last, verify, out, budget=None):
    offs = offsets
    if not 0 <= first <= last < len(offs):
        raise IndexError("decode_records: records %d..%d of an index of %d entries"
                         % (first, last, len(offs) - 1))
    mv = as_bytes_view(buf)
    decode, unpack, crc, unpack_crc = _decoder(program, budget), _HEAD.unpack_from, \
        zlib.crc32, _CRC.unpack_from
    append = out.append
    verify = bool(verify)
    n = len(mv)
    lo = offs[first]
    for k in range(first, last):
        hi = offs[k + 1]
        at = lo - origin
        # the common case in a few expressions; any doubt goes through _one for the exact error
        if origin <= lo and hi - origin <= n and hi >= lo + _LEAST:
            length, kind, pad, reserved, hc = unpack(mv, at)
            v = at + 16 + pad
            e = v + length
            if not (kind or reserved or length < 16 or e + 4 != hi - origin or
                    crc(mv[at:at + 12]) != hc or
                    (pad and (pad > 63 or mv[at + 16:v] != _ZEROS[:pad])) or
                    (verify and crc(mv[at:e]) != unpack_crc(mv, e)[0])):
                try:
                    append(decode(mv[v:e]))
                except KilnError as err:
                    raise _rewrap(err, origin + v, k)
                lo = hi
                continue
        append(_one(decode, mv, origin, lo, hi, k, verify))
        lo = hi


def decode_stream(program, buf, at, origin, number, verify, cap, ocrc, out, budget=None):
    decode = _decoder(program, budget)
    mv = as_bytes_view(buf)
    try:
        return _stream(decode, mv, at, origin, number, verify, cap, ocrc, out)
    finally:
        if mv is not buf:
            mv.release()       # the caller resizes buf next, whatever happened here


def _stream(decode, mv, at, origin, number, verify, cap, ocrc, out):
    n = len(mv)
    if not 0 <= at <= n:
        raise IndexError("decode_stream: position %d of %d bytes" % (at, n))
    while n - at >= 16:
        pos = origin + at
        length, kind, pad = _head(mv, at, pos, number)
        if kind == 1 or length > cap or 20 + pad + length > n - at:
            break
        _body(mv, at, pos, length, pad, number, verify)
        v = at + 16 + pad
        try:
            out.append(decode(bytes(mv[v:v + length])))
        except KilnError as e:
            raise _rewrap(e, pos + 16 + pad, number)
        ocrc = zlib.crc32(_Q.pack(pos), ocrc)
        number += 1
        at = v + length + 4
    return at, number, ocrc


__all__ = ["crc32", "decode_records", "decode_stream", "encode_record", "encode_records"]
