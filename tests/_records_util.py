"""An independent writer of record containers for the tests, from spec/records.md.

It uses ``struct`` and ``zlib`` only, never ``kiln.records``, so that hostile
files can be crafted field by field and expected offsets computed by hand.
"""

import struct
import zlib

HEADER = 16
TRAILER = 40
LIST_U64_HASH = None


def list_u64_hash():
    import kiln
    return kiln.parse_type("list<u64>").schema_hash


def head(length, kind=0, pad=0, reserved=0, crc=None):
    first = struct.pack("<QBBH", length, kind, pad, reserved)
    return first + struct.pack("<I", zlib.crc32(first) if crc is None else crc)


def record(framed, kind=0, pad=0):
    first = head(len(framed), kind, pad) + bytes(pad) + framed
    return first + struct.pack("<I", zlib.crc32(first))


def header(schema_hash, magic=b"KLNR", version=1, text=None):
    """The container's head; with ``text`` (bytes or str) the type text block:
    flag 0x01, u32 length, the text, and the CRC of all that comes before."""
    if text is None:
        return struct.pack("<4sBBHQ", magic, version, 0, 0, schema_hash)
    raw = text.encode("ascii") if isinstance(text, str) else text
    first = struct.pack("<4sBBHQI", magic, version, 1, 0, schema_hash, len(raw)) + raw
    return first + struct.pack("<I", zlib.crc32(first))


def index_value(offsets):
    return struct.pack("<4sBBHQ", b"KLN0", 0, 0, 0, list_u64_hash()) + \
        struct.pack("<I", len(offsets)) + b"".join(struct.pack("<Q", o) for o in offsets)


def trailer(index_pos, count, schema_hash, magic=b"KLNR_END"):
    first = struct.pack("<QQQBBH", index_pos, count, schema_hash, 1, 0, 0)
    return first + struct.pack("<I", zlib.crc32(first)) + magic


def container(schema_hash, framed_values, offsets=None, count=None, index_pos=None,
              closed=True, text=None):
    """A whole container; ``offsets``/``count``/``index_pos`` override what
    the trailer and index say (the index and trailer CRCs stay right);
    ``text``: the head carries that type text."""
    out = bytearray(header(schema_hash, text=text))
    real = []
    for v in framed_values:
        real.append(len(out))
        out += record(v)
    if not closed:
        return bytes(out), real
    ip = len(out)
    entries = real if offsets is None else offsets
    pad = -(ip + 16 + 20) % 8
    out += record(index_value(entries), kind=1, pad=pad)
    out += trailer(ip if index_pos is None else index_pos,
                   len(entries) if count is None else count, schema_hash)
    return bytes(out), real


def entry_at(data, k):
    """The byte offset of index entry ``k`` in a container made by ``container``."""
    ip = struct.unpack_from("<Q", data, len(data) - TRAILER)[0]
    pad = data[ip + 9]
    return ip + 16 + pad + 20 + 8 * k
