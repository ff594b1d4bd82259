"""The record container's layout: constants, the fixed parts, and their checks.

Every reader (file, remote, stream) checks the fixed parts here, so they
agree on each error's code and byte offset.  See ``spec/records.md``.

All offsets are relative to the container's first byte (its header), which
is byte 0 of a file written by :class:`kiln.RecordWriter`.
"""

import struct
import zlib
from typing import Tuple

from .._errors import KilnError
from .._types import as_type
from .._wire import FRAME_MAGIC, RECORDS_MAGIC

# --- the container header (16 bytes, at offset 0) -----------------------------
MAGIC = RECORDS_MAGIC
VERSION = 1
HEADER = struct.Struct("<4sBBHQ")      # magic, version, flags, reserved, schema hash
HEADER_SIZE = 16

# --- one record ----------------------------------------------------------------
# head (16 bytes): value length L, kind, pad P, reserved, head CRC of bytes 0..12;
# then P zero bytes, the L bytes of one framed Kiln value, and the record CRC:
# the CRC of every byte of the record before it (head, pad and value).
HEAD = struct.Struct("<QBBHI")
HEAD_SIZE = 16
HEAD_CHECKED = 12                      # the head CRC covers bytes 0..12
CRC = struct.Struct("<I")
CRC_SIZE = 4
KIND_RECORD = 0
KIND_INDEX = 1
MAX_PAD = 63
ALIGN = 64
MIN_VALUE = 16                         # a framed value is at least its frame
OVERHEAD = HEAD_SIZE + CRC_SIZE        # bytes a record adds besides pad and value

# --- the index: one record of kind 1 whose value is a framed list<u64> ---------
INDEX_TYPE = "list<u64>"
INDEX_ENTRIES = 20                     # the first entry, from the value's start (frame + count)
INDEX_HASH = as_type(INDEX_TYPE).schema_hash

# --- the trailer (40 bytes, the container's last bytes) ------------------------
TRAILER = struct.Struct("<QQQBBHI8s")  # index pos, count, schema hash, version, flags,
TRAILER_SIZE = 40                      # reserved, CRC of bytes 0..28, end magic
TRAILER_CHECKED = 28
END_MAGIC = b"KLNR_END"

DEFAULT_MAX_RECORD = 256 << 20         # streams: the cap on one record's value length
U64_MAX = (1 << 64) - 1

assert HEADER.size == HEADER_SIZE and HEAD.size == HEAD_SIZE and TRAILER.size == TRAILER_SIZE


def crc(data, start: int = 0) -> int:
    """CRC-32 (zlib's polynomial, the one of gzip and PNG) of ``data``."""
    return zlib.crc32(data, start)


def make_header(schema_hash: int) -> bytes:
    return HEADER.pack(MAGIC, VERSION, 0, 0, schema_hash)


def make_head(length: int, kind: int, pad: int) -> bytes:
    first = struct.pack("<QBBH", length, kind, pad, 0)
    return first + CRC.pack(crc(first))


def make_trailer(index_pos: int, count: int, schema_hash: int) -> bytes:
    first = struct.pack("<QQQBBH", index_pos, count, schema_hash, VERSION, 0, 0)
    return first + CRC.pack(crc(first)) + END_MAGIC


def pad_for(value_at: int, base: int) -> int:
    """Zero bytes to put after a head written at ``value_at - HEAD_SIZE`` so that
    byte ``base`` of the value lands on a 64-byte boundary."""
    return -(value_at + base) % ALIGN


def check_header(buf, want_hash: int, name: str) -> None:
    """The container header at the start of ``buf`` (16 bytes or fewer)."""
    if len(buf) < HEADER_SIZE:
        raise KilnError("EOF", 0, "%s: %d bytes, shorter than the 16-byte record container "
                        "header" % (name, len(buf)))
    magic, version, flags, reserved, h = HEADER.unpack_from(buf, 0)
    if magic != MAGIC:
        raise KilnError("FRAME", 0, "%s: magic %r is not a Kiln record container's %r"
                        % (name, bytes(magic), MAGIC))
    if version != VERSION:
        raise KilnError("FRAME", 4, "%s: record container version %d, this reader knows %d"
                        % (name, version, VERSION))
    if flags:
        raise KilnError("FRAME", 5, "%s: header flags 0x%02x, none are defined" % (name, flags))
    if reserved:
        raise KilnError("FRAME", 6, "%s: header reserved bytes are not 0" % name)
    if h != want_hash:
        raise KilnError("SCHEMA", 8, "%s: the records are of type hash 0x%016x, not 0x%016x "
                        "(the type given)" % (name, h, want_hash))


def parse_head(buf, at: int, pos: int, number: int) -> Tuple[int, int, int]:
    """``(length, kind, pad)`` of the head at ``buf[at:at+16]``, which lies at
    container offset ``pos`` and belongs to record ``number``; the head CRC
    is checked before the length is believed."""
    length, kind, pad, reserved, want = HEAD.unpack_from(buf, at)
    if crc(buf[at:at + HEAD_CHECKED]) != want:
        raise KilnError("CHECKSUM", pos + HEAD_CHECKED, "record %d: head checksum mismatch (a "
                        "torn or corrupted record head)" % number)
    if kind > KIND_INDEX:
        raise KilnError("FRAME", pos + 8, "record %d: kind %d is neither record (0) nor "
                        "index (1)" % (number, kind))
    if pad > MAX_PAD:
        raise KilnError("FRAME", pos + 9, "record %d: padding %d is above 63" % (number, pad))
    if reserved:
        raise KilnError("FRAME", pos + 10, "record %d: head reserved bytes are not 0" % number)
    if length < MIN_VALUE:
        raise KilnError("FRAME", pos, "record %d: value length %d is shorter than a frame"
                        % (number, length))
    return length, kind, pad


def check_body(buf, at: int, pos: int, pad: int, length: int, number: int,
               verify: bool, seed: int) -> None:
    """The pad bytes and the record CRC of a record whose pad starts at
    ``buf[at]`` (container offset ``pos``); ``seed`` is the CRC of its head."""
    if pad and buf[at:at + pad] != bytes(pad):
        raise KilnError("FRAME", pos, "record %d: padding byte is not 0" % number)
    if verify:
        end = at + pad + length
        (want,) = CRC.unpack_from(buf, end)
        if crc(buf[at:end], seed) != want:
            raise KilnError("CHECKSUM", pos + pad + length, "record %d: value checksum mismatch "
                            "(a torn or corrupted record)" % number)


def parse_trailer(buf, at: int, pos: int, want_hash: int, name: str) -> Tuple[int, int]:
    """``(index position, count)`` from the trailer at ``buf[at:at+40]``,
    container offset ``pos``."""
    index_pos, count, h, version, flags, reserved, want, magic = TRAILER.unpack_from(buf, at)
    if magic != END_MAGIC:
        raise KilnError("FRAME", pos + 32, "%s: no record container trailer at the end "
                        "(a file not closed, or torn; recover=True reads its complete "
                        "records)" % name)
    if crc(buf[at:at + TRAILER_CHECKED]) != want:
        raise KilnError("CHECKSUM", pos + TRAILER_CHECKED, "%s: trailer checksum mismatch" % name)
    if version != VERSION or flags or reserved:
        raise KilnError("FRAME", pos + 24, "%s: trailer version %d flags %d reserved %d, "
                        "expected %d 0 0" % (name, version, flags, reserved, VERSION))
    if h != want_hash:
        raise KilnError("SCHEMA", pos + 16, "%s: the records are of type hash 0x%016x, not "
                        "0x%016x (the type given)" % (name, h, want_hash))
    if index_pos < HEADER_SIZE or index_pos > pos - OVERHEAD - MIN_VALUE:
        raise KilnError("FRAME", pos, "%s: trailer index position %d lies outside the "
                        "records (%d..%d)" % (name, index_pos, HEADER_SIZE, pos))
    # each record takes at least OVERHEAD + MIN_VALUE bytes: a bound before any allocation
    if count > (index_pos - HEADER_SIZE) // (OVERHEAD + MIN_VALUE):
        raise KilnError("LIMIT", pos + 8, "%s: trailer count %d is more than %d bytes of "
                        "records can hold" % (name, count, index_pos - HEADER_SIZE))
    return index_pos, count


def check_index_frame(buf, at: int, pos: int, count: int, name: str) -> None:
    """The first 20 bytes of an index value (at container offset ``pos``): a
    Kiln frame of ``list<u64>`` and the count ``count``."""
    magic, profile, flags, reserved, h = struct.unpack_from("<4sBBHQ", buf, at)
    (n,) = struct.unpack_from("<I", buf, at + 16)
    if magic != FRAME_MAGIC or profile or flags or reserved or h != INDEX_HASH or n != count:
        raise KilnError("FRAME", pos, "%s: the index's frame or count (%d) is not that of a "
                        "list<u64> of %d offsets" % (name, n, count))


def index_length(count: int) -> int:
    """The value length of an index of ``count`` entries."""
    return INDEX_ENTRIES + 8 * count


def rewrap(e: KilnError, pos: int, number: int) -> KilnError:
    """A decode error of record ``number``'s value (at container offset
    ``pos``) with the offset made absolute."""
    if e.reason.startswith("record "):
        return e
    return KilnError(e.code, pos + e.offset, "record %d: %s" % (number, e.reason))
