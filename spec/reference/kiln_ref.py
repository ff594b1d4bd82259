"""Plain reference decoder for the Kiln v2 wire format.

This module is the executable form of spec/kiln-v2.md. It uses only the
Python standard library and is written for reading, not for speed: every
check appears in the same order as the numbered check list of the spec, and
every error carries the absolute byte offset that the spec's offset table
names.

Public API
    decode(buf, type_text, framed, max_count=CAP, max_bytes=CAP, trusted=False)
    read_tensor_file(buf, max_count=CAP, max_bytes=CAP, trusted=False)
        -> list of tensor dicts (a tensor file: one standalone directory that
           may use the wide name fields of section 12.3)
    parse_type(text) -> type node
    type_tokens(node) -> list of canonical tokens
    schema_hash(text) -> int
    RefError(code, offset)

Decoded values
    bool -> bool; integers -> int; f32/f64 -> float; str -> str;
    list<u8> -> bytes; other lists -> list; opt<T> -> None or the value;
    dict<str,V> -> dict (wire order); struct -> dict (field order);
    tensors -> list of dicts, one per tensor (see _tensor_value).
"""
import struct

CAP = 16777216           # default max_count and max_bytes
MAX_DEPTH = 64           # deepest allowed container nesting
U64_MAX = (1 << 64) - 1
NO16 = 0xFFFF
NO32 = 0xFFFFFFFF
CODES = ("FRAME", "LIMIT", "EOF", "TYPE", "UTF8", "TRAILING", "SCHEMA", "DEPTH")


class RefError(Exception):
    """A rejected buffer: `code` is one of CODES, `offset` is where."""

    def __init__(self, code, offset):
        assert code in CODES
        super().__init__("%s at %d" % (code, offset))
        self.code = code
        self.offset = offset


# --------------------------------------------------------------------------
# Type text
# --------------------------------------------------------------------------
# name -> (struct format or None, wire width)
SCALARS = {
    "bool": (None, 1), "i8": ("<b", 1), "u8": ("<B", 1),
    "i16": ("<h", 2), "u16": ("<H", 2),
    "i32": ("<i", 4), "u32": ("<I", 4), "f32": ("<f", 4),
    "i64": ("<q", 8), "u64": ("<Q", 8), "int": ("<q", 8), "uint": ("<Q", 8),
    "f64": ("<d", 8),
}
# A type node is a tuple (kind, arg):
#   (scalar name, None) | ("str", None) | ("tensors", None)
#   ("list", elem) | ("opt", inner) | ("dict", value) | ("struct", [(field, node), ...])


def _ident(text, pos):
    end = pos
    while end < len(text) and text[end].isascii() and (text[end].isalnum() or text[end] == "_"):
        end += 1
    return text[pos:end], end


def _expect(text, pos, lit):
    if not text.startswith(lit, pos):
        raise ValueError("type text: expected %r at index %d" % (lit, pos))
    return pos + len(lit)


def _parse(text, pos, depth):
    word, end = _ident(text, pos)
    opener = text[end:end + 1]
    is_container = (word == "tensors" or (word == "struct" and opener == "{")
                    or (word in ("list", "opt", "dict") and opener == "<"))
    if is_container and depth + 1 > MAX_DEPTH:
        raise RefError("DEPTH", pos)   # offset is an index into the type text
    if word in SCALARS or word in ("str", "tensors"):
        return (word, None), end
    if word in ("list", "opt") and opener == "<":
        inner, p = _parse(text, end + 1, depth + 1)
        return (word, inner), _expect(text, p, ">")
    if word == "dict" and opener == "<":
        p = _expect(text, end + 1, "str,")
        inner, p = _parse(text, p, depth + 1)
        return ("dict", inner), _expect(text, p, ">")
    if word == "struct" and opener == "{":
        p, fields = end + 1, []
        while not text.startswith("}", p):
            name, q = _ident(text, p)
            if not name or name[0].isdigit() or name in (f for f, _ in fields):
                raise ValueError("type text: bad field name at index %d" % p)
            inner, q = _parse(text, _expect(text, q, ":"), depth + 1)
            p = _expect(text, q, ",")
            fields.append((name, inner))
        return ("struct", fields), p + 1
    raise ValueError("type text: unknown type at index %d" % pos)


def parse_type(text):
    """Parse canonical type text. Syntax errors raise ValueError; nesting
    deeper than 64 containers raises RefError("DEPTH", index_in_text)."""
    node, end = _parse(text, 0, 0)
    if end != len(text):
        raise ValueError("type text: junk at index %d" % end)
    return node


def type_tokens(node):
    kind, arg = node
    if kind in ("list", "opt"):
        return [kind + "<"] + type_tokens(arg) + [">"]
    if kind == "dict":
        return ["dict<", "str", ","] + type_tokens(arg) + [">"]
    if kind == "struct":
        out = ["struct{"]
        for name, sub in arg:
            out += [name, ":"] + type_tokens(sub) + [","]
        return out + ["}"]
    return [kind]


def fnv1a64_tokens(tokens):
    h = 14695981039346656037
    for tok in tokens:
        for byte in tok.encode("ascii") + b"\x00":
            h = ((h ^ byte) * 1099511628211) & U64_MAX
    return h


def schema_hash(text):
    return fnv1a64_tokens(type_tokens(parse_type(text)))


def min_size(node):
    """Smallest number of bytes one value of this type can occupy."""
    kind, arg = node
    if kind in SCALARS:
        return SCALARS[kind][1]
    if kind in ("str", "list", "dict"):
        return 4
    if kind == "opt":
        return 1
    if kind == "tensors":
        return 64
    return sum(min_size(sub) for _, sub in arg)   # struct; struct{} is 0


# --------------------------------------------------------------------------
# Frozen values
# --------------------------------------------------------------------------
class _Reader:
    def __init__(self, buf, max_count, max_bytes, trusted):
        self.buf = buf
        self.pos = 0
        self.max_count = max_count
        self.max_bytes = max_bytes
        self.trusted = trusted
        self.zero_left = max_count   # the zero-size element budget (spec section 4.3)

    def take(self, n):
        if len(self.buf) - self.pos < n:
            raise RefError("EOF", self.pos)
        out = self.buf[self.pos:self.pos + n]
        self.pos += n
        return out

    def count(self, caps, elem_min):
        """The allocation rule for one u32 count or length word."""
        at = self.pos
        (n,) = struct.unpack("<I", self.take(4))         # 1. word fits, else EOF
        if any(n > cap for cap in caps):                  # 2. cap
            raise RefError("LIMIT", at)
        need = n * elem_min
        if need > U64_MAX:                                # 3. product overflow
            raise RefError("LIMIT", at)
        if need > len(self.buf) - self.pos:               # 4. room for minimums
            raise RefError("EOF", at)
        return n

    def text(self):
        """A str: returns (raw bytes, decoded text)."""
        n = self.count([self.max_bytes], 1)
        start = self.pos
        raw = self.take(n)
        try:
            return raw, raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise RefError("UTF8", start + e.start)

    def flag(self):
        b = self.take(1)[0]
        if b > 1:
            raise RefError("TYPE", self.pos - 1)
        return b == 1

    def value(self, node):
        kind, arg = node
        if kind == "bool":
            return self.flag()
        if kind in SCALARS:
            fmt, width = SCALARS[kind]
            return struct.unpack(fmt, self.take(width))[0]
        if kind == "str":
            return self.text()[1]
        if kind == "list":
            if arg[0] == "u8":                            # a byte count: max_bytes alone
                n = self.count([self.max_bytes], 1)
                return bytes(self.take(n))
            at = self.pos
            m = min_size(arg)
            n = self.count([self.max_count], m)
            if m == 0:                                    # one budget per value
                if n > self.zero_left:
                    raise RefError("LIMIT", at)
                self.zero_left -= n
            return [self.value(arg) for _ in range(n)]
        if kind == "opt":
            return self.value(arg) if self.flag() else None
        if kind == "dict":
            n = self.count([self.max_count], 4 + min_size(arg))
            out, prev = {}, None
            for _ in range(n):
                key_at = self.pos
                raw, key = self.text()
                if prev is not None and raw <= prev:      # unsorted or repeated
                    raise RefError("TYPE", key_at)
                prev = raw
                out[key] = self.value(arg)
            return out
        if kind == "struct":
            return {name: self.value(sub) for name, sub in arg}
        if kind == "tensors":
            value, block_len = read_directory(self.buf, self.pos, self.max_count,
                                              self.max_bytes, self.trusted)
            self.pos += block_len
            return value
        raise AssertionError(kind)


def decode(buf, type_text, framed, max_count=CAP, max_bytes=CAP, trusted=False):
    """Decode one standalone Kiln value, or raise RefError."""
    buf = bytes(buf)
    node = parse_type(type_text)          # DEPTH is reported here
    r = _Reader(buf, max_count, max_bytes, trusted)
    if framed:
        if len(buf) < 4:
            raise RefError("EOF", 0)
        if buf[0:4] != b"KLN0":
            raise RefError("FRAME", 0)
        if len(buf) < 16:
            raise RefError("EOF", 0)
        for i in (4, 5, 6, 7):            # profile, flags, reserved u16
            if buf[i] != 0:
                raise RefError("FRAME", i)
        if struct.unpack_from("<Q", buf, 8)[0] != fnv1a64_tokens(type_tokens(node)):
            raise RefError("SCHEMA", 8)
        r.pos = 16
    value = r.value(node)
    if r.pos != len(buf):
        raise RefError("TRAILING", r.pos)
    return value


# --------------------------------------------------------------------------
# Tensor directory (version 2)
# --------------------------------------------------------------------------
# dtype code -> (name, bytes per element); 0 marks a packed nibble dtype
DTYPES = {
    1: ("f64", 8), 2: ("f32", 4), 3: ("f16", 2), 4: ("bf16", 2),
    5: ("f8e4m3", 1), 6: ("f8e5m2", 1), 7: ("bool", 1), 8: ("i8", 1),
    9: ("u8", 1), 10: ("i16", 2), 11: ("u16", 2), 12: ("i32", 4),
    13: ("u32", 4), 14: ("i64", 8), 15: ("u64", 8), 16: ("i4", 0),
    17: ("u4", 0), 18: ("e2m1", 0), 19: ("e8m0", 1),
}
DT_BOOL, DT_F32 = 7, 2
OPAQUE_MIN, OPAQUE_MAX = 4096, 32767
DESC_FMT = "<HBBHHHHIHHIIIQQ8Q"    # 112 bytes, then 16 reserved bytes
DESC_KEYS = ("dtype", "rank", "reserved", "name_off", "name_len", "layout_off",
             "layout_len", "block_size", "quant_scheme", "quant_axis",
             "group_size", "scale_index", "outer_index", "byte_offset",
             "byte_length")


def _first_nonzero(buf, start, end):
    """Absolute index of the first nonzero byte in buf[start:end], or None."""
    seg = buf[start:end]
    rest = seg.lstrip(b"\x00")
    return None if not rest else start + len(seg) - len(rest)


def _element_count(t):
    n = 1
    for dim in t["shape"][:t["rank"]]:
        n *= dim                 # exact product: a zero dimension gives 0
    return n


def read_tensor_file(buf, max_count=CAP, max_bytes=CAP, trusted=False):
    """A tensor file (section 12): one standalone directory, which alone may
    set flag bit 2 (the wide name fields of section 12.3)."""
    tensors, block_len = read_directory(buf, 0, max_count, max_bytes, trusted, wide_ok=True)
    if block_len != len(buf):
        raise RefError("TRAILING", block_len)
    return tensors


# a wide directory's name fields: u32 name_off, name_len, layout_off,
# layout_len in descriptor bytes 112..127 (section 12.3)
WIDE_FMT = "<IIII"


def read_directory(buf, s, max_count=CAP, max_bytes=CAP, trusted=False, wide_ok=False):
    """Check the directory block starting at buf[s]; return (tensors, block_len).
    Bytes after the block are not examined here (step 12 is the caller's).
    ``wide_ok``: the block is a tensor file's, so flag bit 2 may be set."""
    size = len(buf)

    def fail(code, at):
        raise RefError(code, at)

    # 1. magic and minimum size
    if size - s < 4:
        fail("EOF", s)
    if buf[s:s + 4] != b"KLNT":
        fail("FRAME", s)
    if size - s < 64:
        fail("EOF", s)
    # 2. version, flags, reserved header bytes
    version, flags = buf[s + 4], buf[s + 5]
    if version != 2:
        fail("FRAME", s + 4)
    if flags & ~(0x07 if wide_ok else 0x03) or not flags & 0x02:
        fail("FRAME", s + 5)
    wide = bool(flags & 0x04)
    # where the name fields are (for the offsets of faults), and "no name"
    at_name, at_layout, none = (112, 120, NO32) if wide else (4, 8, NO16)
    for i in list(range(s + 6, s + 8)) + list(range(s + 32, s + 64)):
        if buf[i]:
            fail("FRAME", i)
    count, name_bytes, payload_bytes, directory_bytes = struct.unpack_from("<IIQQ", buf, s + 8)
    # 3. caps
    if count > max_count:
        fail("LIMIT", s + 8)
    if name_bytes > max_bytes:
        fail("LIMIT", s + 12)
    # 4. table arithmetic
    table = count * 128 + name_bytes
    if table > U64_MAX:
        fail("LIMIT", s + 8)
    if directory_bytes != table:
        fail("TYPE", s + 24)
    # 5. descriptors and heap inside the buffer
    if s + 64 + directory_bytes > size:
        fail("EOF", s + 8)
    # 6. payload region inside the buffer
    base = (64 + directory_bytes + 63) & ~63
    if base + payload_bytes > U64_MAX:
        fail("LIMIT", s + 16)
    block_len = base + payload_bytes
    if s + block_len > size:
        fail("EOF", s + 16)
    # 7. padding between heap and payloads
    heap = s + 64 + count * 128
    bad = _first_nonzero(buf, heap + name_bytes, s + base)
    if bad is not None:
        fail("TYPE", bad)

    descs = []
    for i in range(count):
        d = s + 64 + 128 * i
        t = dict(zip(DESC_KEYS, struct.unpack_from(DESC_FMT, buf, d)[:15]))
        t["shape"] = list(struct.unpack_from("<8Q", buf, d + 48))
        if wide:   # the u32 fields replace the u16 ones, which must be 0 (8a)
            (t["name_off"], t["name_len"], t["layout_off"],
             t["layout_len"]) = struct.unpack_from(WIDE_FMT, buf, d + 112)
        t["at"] = d
        descs.append(t)

    # 8a. descriptor reserved bytes
    for t in descs:
        d = t["at"]
        reserved = range(d + 4, d + 12) if wide else range(d + 112, d + 128)
        for i in [d + 3] + list(reserved):
            if buf[i]:
                fail("FRAME", i)
    # 8b. name flag and heap walk
    named = bool(flags & 0x01)
    if named and count == 0:
        fail("TYPE", s + 5)
    for t in descs:
        if not named and (t["name_len"] != 0 or t["name_off"] != none):
            fail("TYPE", t["at"] + at_name)
        if named and t["name_len"] == 0:
            fail("TYPE", t["at"] + at_name)
    cursor = 0
    for t in descs:
        if named:
            if t["name_off"] != cursor or cursor + t["name_len"] > name_bytes:
                fail("TYPE", t["at"] + at_name)
            cursor += t["name_len"]
    for t in descs:
        if t["layout_len"] == 0:
            if t["layout_off"] != none:
                fail("TYPE", t["at"] + at_layout)
            continue
        if t["layout_off"] != cursor or cursor + t["layout_len"] > name_bytes:
            fail("TYPE", t["at"] + at_layout)
        cursor += t["layout_len"]
    if cursor != name_bytes:
        fail("TYPE", s + 12)
    # 12.3: the wide fields only where some used slice needs them
    if wide and all(t[k + "_off"] <= NO16 and t[k + "_len"] <= NO16
                    for t in descs for k in ("name", "layout") if t[k + "_len"]):
        fail("TYPE", s + 5)
    # 8c. UTF-8 of names, then of layout names
    for key in ("name", "layout"):
        for t in descs:
            raw = b""
            if t[key + "_len"]:
                start = heap + t[key + "_off"]
                raw = buf[start:start + t[key + "_len"]]
            t[key + "_raw"] = raw
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                if not trusted:
                    fail("UTF8", start + e.start)
                text = raw.decode("utf-8", "surrogateescape")
            t[key] = text if t[key + "_len"] else None
    # 8d. unique tensor names (raw bytes)
    seen = set()
    for t in descs:
        if named:
            if t["name_raw"] in seen:
                fail("TYPE", t["at"] + at_name)
            seen.add(t["name_raw"])

    # 9. dtype, rank, shape, length, range -- one descriptor at a time
    for t in descs:
        d, dt = t["at"], t["dtype"]
        opaque = OPAQUE_MIN <= dt <= OPAQUE_MAX
        if dt not in DTYPES and not opaque:
            fail("TYPE", d)
        if t["rank"] > 8:
            fail("TYPE", d + 2)
        for k in range(t["rank"], 8):
            if t["shape"][k]:
                fail("TYPE", d + 48 + 8 * k)
        n = _element_count(t)
        if n > U64_MAX:
            fail("LIMIT", d + 48)
        t["count"] = n
        if not opaque:
            if t["block_size"] != 0:
                fail("TYPE", d + 12)
            if t["layout_len"] != 0:
                fail("TYPE", d + at_layout)
            width = DTYPES[dt][1]
            want = (n + 1) // 2 if width == 0 else n * width
            if want > U64_MAX:
                fail("LIMIT", d + 40)
            if t["byte_length"] != want:
                fail("TYPE", d + 40)
        else:
            if t["layout_len"] == 0:
                fail("TYPE", d + at_layout)
            if t["block_size"] == 0:
                fail("TYPE", d + 12)
            if t["byte_length"] % t["block_size"]:
                fail("TYPE", d + 40)
        end = t["byte_offset"] + t["byte_length"]
        if end > U64_MAX:
            fail("LIMIT", d + 32)
        if end > payload_bytes:
            fail("TYPE", d + 32)
    # 9 (overlap pass). Zero-length ranges never overlap.
    ranges = sorted((t["byte_offset"], i) for i, t in enumerate(descs) if t["byte_length"])
    reach, holder = 0, None
    for off, i in ranges:
        end = off + descs[i]["byte_length"]
        if holder is not None and off < reach:
            fail("TYPE", descs[max(i, holder)]["at"] + 32)
        if holder is None or end > reach:
            reach, holder = end, i

    # 10. canonical placement and zero gaps
    run = 0
    for t in descs:
        if t["byte_offset"] != (run + 63) & ~63:
            fail("TYPE", t["at"] + 32)
        run = t["byte_offset"] + t["byte_length"]
    if payload_bytes != run:
        fail("TYPE", s + 16)
    pay = s + base
    covered = 0
    for t in descs:
        bad = _first_nonzero(buf, pay + covered, pay + t["byte_offset"])
        if bad is not None:
            fail("TYPE", bad)
        covered = max(covered, t["byte_offset"] + t["byte_length"])
    bad = _first_nonzero(buf, pay + covered, pay + payload_bytes)
    if bad is not None:
        fail("TYPE", bad)

    # 11a. element bytes with forbidden patterns
    for t in descs:
        start = pay + t["byte_offset"]
        data = buf[start:start + t["byte_length"]]
        if t["dtype"] == DT_BOOL:
            for j, b in enumerate(data):
                if b > 1:
                    fail("TYPE", start + j)
        if DTYPES.get(t["dtype"], ("", 1))[1] == 0 and t["count"] % 2 and data[-1] & 0xF0:
            fail("TYPE", start + len(data) - 1)
    # 11b. quantization links, one descriptor at a time
    for i, t in enumerate(descs):
        d, scheme = t["at"], t["quant_scheme"]
        if scheme > 2:
            fail("TYPE", d + 16)
        if scheme == 0:
            for off, key, none in ((18, "quant_axis", NO16), (20, "group_size", 0),
                                   (24, "scale_index", NO32), (28, "outer_index", NO32)):
                if t[key] != none:
                    fail("TYPE", d + off)
            continue
        axis, group, si, oi = t["quant_axis"], t["group_size"], t["scale_index"], t["outer_index"]
        if t["rank"] == 0 or axis >= t["rank"]:
            fail("TYPE", d + 18)
        if group == 0:
            fail("TYPE", d + 20)
        if si >= count or si == i:
            fail("TYPE", d + 24)
        if descs[si]["quant_scheme"] != 0:
            fail("TYPE", d + 24)              # chains are not allowed
        if scheme == 1 and oi != NO32:
            fail("TYPE", d + 28)
        if scheme == 2:
            if oi >= count or oi == i or oi == si:
                fail("TYPE", d + 28)
            outer = descs[oi]
            if outer["dtype"] != DT_F32 or outer["quant_scheme"] != 0 or outer["count"] != 1:
                fail("TYPE", d + 28)
        if not trusted:
            groups = -(-t["shape"][axis] // group)
            others = 1
            for k in range(t["rank"]):
                if k != axis:
                    others *= t["shape"][k]
            if descs[si]["count"] != groups * others:
                fail("TYPE", d + 24)

    return [_tensor_value(t, buf, pay) for t in descs], block_len


def _tensor_value(t, buf, pay):
    start = pay + t["byte_offset"]
    return {
        "dtype": t["dtype"],
        "dtype_name": DTYPES.get(t["dtype"], ("opaque", 0))[0],
        "rank": t["rank"],
        "shape": t["shape"][:t["rank"]],
        "name": t["name"],
        "layout": t["layout"],
        "block_size": t["block_size"],
        "quant_scheme": t["quant_scheme"],
        "quant_axis": t["quant_axis"],
        "group_size": t["group_size"],
        "scale_index": t["scale_index"],
        "outer_index": t["outer_index"],
        "byte_offset": t["byte_offset"],
        "payload": bytes(buf[start:start + t["byte_length"]]),
    }
