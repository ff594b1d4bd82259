"""The record container's layout: constants, the fixed parts, and their checks.

Every reader (file, remote, stream) checks the fixed parts here, so they
agree on each error's code and byte offset.  See ``spec/records.md``.

All offsets are relative to the container's first byte (its header), which
is byte 0 of a file written by :class:`kiln.RecordWriter`.
"""

import struct
import zlib
from typing import Any, Optional, Tuple

from .._errors import KilnError
from .._types import as_type
from .._wire import FRAME_MAGIC, RECORDS_MAGIC

# --- the container header (16 bytes, at offset 0) -----------------------------
MAGIC = RECORDS_MAGIC
VERSION = 1
HEADER = struct.Struct("<4sBBHQ")      # magic, version, flags, reserved, schema hash
HEADER_SIZE = 16
# header flag 0x01: the header is followed by the record type's text, so that
# the file can be read without the type from elsewhere: u32 T, T bytes of
# canonical type text, u32 CRC of every byte of the head before it (the header
# included).  The records then start at byte 24 + T.
FLAG_TYPE_TEXT = 0x01
TYPE_TEXT_AT = 20                      # the text, after the header and its length
MAX_TYPE_TEXT = 1 << 20                # a reader refuses a longer text before reading it

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


def make_header(schema_hash: int, text: Optional[str] = None) -> bytes:
    """The container's head: the 16-byte header, and with ``text`` the type
    text block after it."""
    if text is None:
        return HEADER.pack(MAGIC, VERSION, 0, 0, schema_hash)
    raw = text.encode("ascii")
    if not 0 < len(raw) <= MAX_TYPE_TEXT:
        raise ValueError("type text of %d bytes does not fit a record file's head (at most "
                         "%d; store_type=False writes the hash alone)" % (len(raw), MAX_TYPE_TEXT))
    first = HEADER.pack(MAGIC, VERSION, FLAG_TYPE_TEXT, 0, schema_hash) + \
        struct.pack("<I", len(raw)) + raw
    return first + CRC.pack(crc(first))


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


def check_header(buf, want_hash: Optional[int], name: str) -> int:
    """The container header at the start of ``buf`` (16 bytes or fewer, or 20
    to learn the size of a type text block; a file with another magic may give
    up to ``FOREIGN_HEAD`` bytes, for the hint saying what it is); returns the size of the whole
    head: 16, or 24 + T when the header says a type text follows (then check
    it with :func:`read_type_text`), or 20 when it does and ``buf`` is too
    short to tell T.  ``want_hash`` None: any hash."""
    if len(buf) < HEADER_SIZE:
        raise KilnError("EOF", 0, "%s: %d bytes, shorter than the 16-byte record container "
                        "header" % (name, len(buf)))
    magic, version, flags, reserved, h = HEADER.unpack_from(buf, 0)
    if magic != MAGIC:
        from .._files.paths import FOREIGN_HEAD, foreign_hint   # what the file is, what reads it
        hint = foreign_hint(bytes(buf[:FOREIGN_HEAD]), MAGIC)
        raise KilnError("FRAME", 0, "%s: magic %r is not a Kiln record container's %r%s"
                        % (name, bytes(magic), MAGIC, "" if hint is None else " (%s)" % hint))
    if version != VERSION:
        raise KilnError("FRAME", 4, "%s: record container version %d, this reader knows %d"
                        % (name, version, VERSION))
    if flags & ~FLAG_TYPE_TEXT:
        raise KilnError("FRAME", 5, "%s: header flags 0x%02x, only 0x01 (type text) is "
                        "defined" % (name, flags))
    if reserved:
        raise KilnError("FRAME", 6, "%s: header reserved bytes are not 0" % name)
    if want_hash is not None and h != want_hash:
        raise KilnError("SCHEMA", 8, "%s: the records are of type hash 0x%016x, not 0x%016x "
                        "(the type given)" % (name, h, want_hash))
    if not flags:
        return HEADER_SIZE
    if len(buf) < TYPE_TEXT_AT:
        return TYPE_TEXT_AT
    (t,) = struct.unpack_from("<I", buf, HEADER_SIZE)
    if t == 0 or t > MAX_TYPE_TEXT:
        raise KilnError("LIMIT" if t else "FRAME", HEADER_SIZE, "%s: type text length %d, "
                        "expected 1..%d" % (name, t, MAX_TYPE_TEXT))
    return TYPE_TEXT_AT + t + CRC_SIZE


def open_head(read, size: int, want_hash: Optional[int], name: str) -> Tuple[int, Optional[str]]:
    """The head of a container of ``size`` bytes whose bytes ``read(lo, hi)``
    returns: ``(where the records start, the type text or None)``."""
    got = read(0, min(size, TYPE_TEXT_AT))
    if len(got) >= len(MAGIC) and bytes(got[:len(MAGIC)]) != MAGIC:
        from .._files.paths import FOREIGN_HEAD   # enough to tell which format it is
        got = read(0, min(size, FOREIGN_HEAD))    # (a torch.save zip from an npz)
    start = check_header(got, want_hash, name)
    if start == HEADER_SIZE:
        return start, None
    if start == TYPE_TEXT_AT:
        raise KilnError("EOF", size, "%s: the file ends inside the type text's length after "
                        "the header" % name)
    head = bytes(got) + bytes(read(TYPE_TEXT_AT, min(size, start)))
    return start, read_type_text(head, start, name)


def read_type_text(buf, size: int, name: str) -> str:
    """The type text of a head of ``size`` bytes (``check_header``'s answer)
    at the start of ``buf``: its CRC, its syntax and its hash against the
    header's are checked."""
    if len(buf) < size:
        raise KilnError("EOF", len(buf), "%s: the file ends inside the %d-byte type text "
                        "after the header" % (name, size - TYPE_TEXT_AT - CRC_SIZE))
    end = size - CRC_SIZE
    (want,) = CRC.unpack_from(buf, end)
    if crc(buf[:end]) != want:
        raise KilnError("FRAME", end, "%s: the head's checksum does not match its header and "
                        "type text" % name)
    raw = bytes(buf[TYPE_TEXT_AT:end])
    try:
        text = raw.decode("ascii")
    except UnicodeDecodeError as e:
        raise KilnError("TYPE", TYPE_TEXT_AT + e.start, "%s: the head's type text is not "
                        "ASCII" % name) from None
    try:
        t = as_type(text)
    except KilnError as e:
        raise KilnError(e.code, TYPE_TEXT_AT + e.offset, "%s: the head's type text: %s"
                        % (name, e.reason)) from None
    h = HEADER.unpack_from(buf, 0)[4]
    if t.schema_hash != h:
        raise KilnError("FRAME", TYPE_TEXT_AT, "%s: the head's type text hashes to 0x%016x, "
                        "its header says 0x%016x" % (name, t.schema_hash, h))
    return t.text


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


def parse_trailer(buf, at: int, pos: int, want_hash: int, name: str,
                  start: int = HEADER_SIZE) -> Tuple[int, int]:
    """``(index position, count)`` from the trailer at ``buf[at:at+40]``,
    container offset ``pos``; the records start at ``start`` (the head's size)."""
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
    if index_pos < start or index_pos > pos - OVERHEAD - MIN_VALUE:
        raise KilnError("FRAME", pos, "%s: trailer index position %d lies outside the "
                        "records (%d..%d)" % (name, index_pos, start, pos))
    # each record takes at least OVERHEAD + MIN_VALUE bytes: a bound before any allocation
    if count > (index_pos - start) // (OVERHEAD + MIN_VALUE):
        raise KilnError("LIMIT", pos + 8, "%s: trailer count %d is more than %d bytes of "
                        "records can hold" % (name, count, index_pos - start))
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


def first_bad_entry(o: Any, prev: int, k: int, start: int, ip: int) -> Optional[int]:
    """Where in ``o`` (index entries ``k``, ``k + 1``, ... as a numpy ``uint64``
    array; ``prev`` the entry before them, unused when ``k`` is 0) the first
    entry breaks the index's rules: entry 0 at the first record (``start``),
    each at least one record after the one before, none past the index at
    ``ip``.  None when all hold.  The one rule of a file's reader and a
    stream's, which reads the entries a piece at a time."""
    import numpy as np
    before = np.empty_like(o)
    before[1:] = o[:-1]
    before[0] = prev
    # an entry past the index is caught first: the sum's wrap that matters
    # comes only after one
    wrong = (o > np.uint64(ip)) | (o < before + np.uint64(OVERHEAD + MIN_VALUE))
    if k == 0:
        wrong[0] = int(o[0]) != start
    hits = np.flatnonzero(wrong)
    return int(hits[0]) if len(hits) else None
