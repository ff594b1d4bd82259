"""Every wire constant of Kiln v2, in one place.

Both kernels, the type model and the tensor objects take their numbers from
here.  The compiled kernel gets them from ``src/kiln_wire.h``, which
``tools/gen_wire.py`` writes from this module (a test checks that the header
is up to date), so a constant is never typed twice.

The order of the op codes matters: the compiled dispatch relies on the
scalars being ``OP_BOOL..OP_F64`` in one run, integers ``OP_I8..OP_U64``
before the floats.
"""

import re
import struct as _struct

# --- limits -------------------------------------------------------------------

U16_MAX = 0xFFFF
U32_MAX = 0xFFFFFFFF
U64_MAX = 0xFFFFFFFFFFFFFFFF
DEFAULT_MAX_COUNT = 16_777_216
DEFAULT_MAX_BYTES = 16_777_216
MAX_DEPTH = 64

# --- plan op codes --------------------------------------------------------------

OP_BOOL = 1
OP_I8 = 2
OP_U8 = 3
OP_I16 = 4
OP_U16 = 5
OP_I32 = 6
OP_U32 = 7
OP_I64 = 8
OP_U64 = 9
OP_F32 = 10
OP_F64 = 11
OP_STR = 12
OP_BYTES = 13      # list<u8>: decodes to bytes
OP_PODLIST = 14    # list<fixed-width number or bool>: one bulk run
OP_LIST = 15
OP_OPT = 16
OP_DICT = 17
OP_STRUCT = 18
OP_TENSORS = 19
OP_CONV = 20       # a Python-level conversion over the wire type of elem (kiln._pyconv)

OPS = {name: value for name, value in globals().items() if name.startswith("OP_")}
LAST_SCALAR = OP_F64    # ops OP_BOOL..LAST_SCALAR are the fixed-width scalars

# the Python value a list of fixed-width numbers decodes to (Plan.form)
FORM_DEFAULT = 0        # type text: an ndarray, bytes for list<u8>
FORM_LIST = 1           # a Python list
FORM_ARRAY = 2          # an ndarray, list<u8> included

# struct format character and width in bytes of each fixed-width scalar op
SCALAR_FORMAT = {
    OP_BOOL: ("?", 1), OP_I8: ("b", 1), OP_U8: ("B", 1), OP_I16: ("h", 2),
    OP_U16: ("H", 2), OP_I32: ("i", 4), OP_U32: ("I", 4), OP_I64: ("q", 8),
    OP_U64: ("Q", 8), OP_F32: ("f", 4), OP_F64: ("d", 8),
}

# the type-text token of each fixed-width op (int and uint are i64 and u64 too)
SCALAR_NAME = {
    OP_BOOL: "bool", OP_I8: "i8", OP_U8: "u8", OP_I16: "i16", OP_U16: "u16", OP_I32: "i32",
    OP_U32: "u32", OP_I64: "i64", OP_U64: "u64", OP_F32: "f32", OP_F64: "f64",
}

# the wire's little-endian numpy dtype of each fixed-width op
NUMPY_LE = {
    OP_BOOL: "|b1", OP_I8: "|i1", OP_U8: "|u1", OP_I16: "<i2", OP_U16: "<u2",
    OP_I32: "<i4", OP_U32: "<u4", OP_I64: "<i8", OP_U64: "<u8",
    OP_F32: "<f4", OP_F64: "<f8",
}

# inclusive value range of each integer op
INT_RANGE = {
    OP_I8: (-(1 << 7), (1 << 7) - 1), OP_U8: (0, 255),
    OP_I16: (-(1 << 15), (1 << 15) - 1), OP_U16: (0, (1 << 16) - 1),
    OP_I32: (-(1 << 31), (1 << 31) - 1), OP_U32: (0, (1 << 32) - 1),
    OP_I64: (-(1 << 63), (1 << 63) - 1), OP_U64: (0, (1 << 64) - 1),
}

# --- tensor dtypes ---------------------------------------------------------------

# code: (name, width in bytes or 0 for two elements per byte, numpy dtype of
# Tensor.numpy() without ml_dtypes, ml_dtypes type name or None)
DTYPES = {
    1: ("f64", 8, "<f8", None),
    2: ("f32", 4, "<f4", None),
    3: ("f16", 2, "<f2", None),
    4: ("bf16", 2, "<u2", "bfloat16"),
    5: ("f8e4m3", 1, "|u1", "float8_e4m3fn"),
    6: ("f8e5m2", 1, "|u1", "float8_e5m2"),
    7: ("bool", 1, "|b1", None),
    8: ("i8", 1, "|i1", None),
    9: ("u8", 1, "|u1", None),
    10: ("i16", 2, "<i2", None),
    11: ("u16", 2, "<u2", None),
    12: ("i32", 4, "<i4", None),
    13: ("u32", 4, "<u4", None),
    14: ("i64", 8, "<i8", None),
    15: ("u64", 8, "<u8", None),
    16: ("i4", 0, "|u1", None),
    17: ("u4", 0, "|u1", None),
    18: ("e2m1", 0, "|u1", None),
    19: ("e8m0", 1, "|u1", "float8_e8m0fnu"),
}
DTYPE_MAX = 19
DTYPE_BOOL = 7
DTYPE_F32 = 2
PACKED = frozenset(c for c, d in DTYPES.items() if d[1] == 0)   # i4 u4 e2m1
OPAQUE_MIN = 4096
OPAQUE_MAX = 32767
DTYPE_CODES = {d[0]: c for c, d in DTYPES.items()}

# --- frame -----------------------------------------------------------------------

FRAME_MAGIC = b"KLN0"
FRAME_SIZE = 16
FRAME = _struct.Struct("<4sBBHQ")          # magic, profile, flags, reserved, schema hash
FRAME_PROFILE = 4
FRAME_FLAGS = 5
FRAME_RESERVED = 6                          # two bytes
FRAME_HASH = 8

# a file of kiln.save whose value carries tensors may start with a pad head
# (spec/kiln-v2.md section 13): magic, version, pad length, reserved; then
# the pad's zero bytes, then the framed value
PADDED_MAGIC = b"KLNP"
PADDED_HEAD = _struct.Struct("<4sBBH")
PADDED_SIZE = 8
PADDED_VERSION = 1
PADDED_AT_VERSION = 4
PADDED_AT_PAD = 5
PADDED_AT_RESERVED = 6                      # two bytes
# version 2 of the head also stores the value's type text (spec/kiln-v2.md section 13):
# the 8 bytes above, a u32 length T, T bytes of UTF-8 type text, then the pad
TYPED_VERSION = 2
TYPED_HEAD = _struct.Struct("<4sBBHI")
TYPED_SIZE = 12
TYPED_AT_LENGTH = 8
TYPED_MAX = 1 << 20                         # the longest stored type text a reader takes

# --- tensor directory ------------------------------------------------------------

DIR_MAGIC = b"KLNT"
RECORDS_MAGIC = b"KLNR"         # the record container's first bytes (spec/records.md)
DIR_VERSION = 2
DIR_ALIGN = 64                  # the table's end and every payload start: dir_align()


def dir_align(n):
    """``n`` rounded up to a multiple of DIR_ALIGN: where the payloads start after
    a table of ``n`` bytes, and where a payload starts after ``n`` payload bytes.
    The compiled kernels use the same rule from kiln_wire.h (kiln_dir_align)."""
    return (n + DIR_ALIGN - 1) & -DIR_ALIGN


FLAG_NAMED = 1
FLAG_LITTLE = 2
# bit 2: wide name fields (spec/kiln-v2.md 12.3): only this library's tensor
# files may set it, and only when a name or layout offset or length passes u16;
# every other directory (a Frozen ``tensors`` value) refuses it as FRAME
FLAG_WIDE = 4
WIDE_HINT = (" (bit 2, wide name fields, is only for a kiln tensor file whose names pass "
             "16-bit offsets: a newer kiln wrote it)")
HEADER_SIZE = 64
DESC_SIZE = 128
MAX_RANK = 8
NO_INDEX = U32_MAX              # scale_index / outer_index: none
NO_AXIS = U16_MAX               # quant_axis: none
NO_NAME = U16_MAX               # name_offset / layout_offset: none
NO_NAME_WIDE = U32_MAX          # the same in a wide directory's u32 fields
QUANT_SCHEMES = 2               # 1: one scale tensor, 2: plus an outer f32

# header field offsets
H_MAGIC = 0
H_VERSION = 4
H_FLAGS = 5
H_RESERVED = 6                  # bytes 6..7
H_COUNT = 8                     # u32
H_NAME_BYTES = 12               # u32
H_PAYLOAD_BYTES = 16            # u64
H_DIRECTORY_BYTES = 24          # u64
H_RESERVED32 = 32               # bytes 32..63
HEADER = _struct.Struct("<4sBBHIIQQ32s")

# descriptor field offsets
D_DTYPE = 0                     # u16
D_RANK = 2                      # u8
D_RESERVED = 3                  # u8
D_NAME_OFF = 4                  # u16
D_NAME_LEN = 6                  # u16
D_LAYOUT_OFF = 8                # u16
D_LAYOUT_LEN = 10               # u16
D_BLOCK_SIZE = 12               # u32
D_QUANT_SCHEME = 16             # u16
D_QUANT_AXIS = 18               # u16
D_GROUP_SIZE = 20               # u32
D_SCALE_INDEX = 24              # u32
D_OUTER_INDEX = 28              # u32
D_BYTE_OFFSET = 32              # u64
D_BYTE_LENGTH = 40              # u64
D_SHAPE = 48                    # 8 x u64
D_RESERVED16 = 112              # bytes 112..127
# a wide directory (FLAG_WIDE) keeps its name fields as u32 in bytes 112..127,
# and bytes 4..11 (the u16 name fields) are reserved, 0
D_WNAME_OFF = 112               # u32
D_WNAME_LEN = 116               # u32
D_WLAYOUT_OFF = 120             # u32
D_WLAYOUT_LEN = 124             # u32
D_NARROW = 4                    # bytes 4..11 in a wide directory: reserved
WIDE_FIELDS = _struct.Struct("<IIII")
DESC = _struct.Struct("<HBBHHHHIHHIIIQQ8Q16s")

# index of each field in a DESC.unpack tuple (shape is 8 items from I_SHAPE)
I_DTYPE = 0
I_RANK = 1
I_RESERVED = 2
I_NAME_OFF = 3
I_NAME_LEN = 4
I_LAYOUT_OFF = 5
I_LAYOUT_LEN = 6
I_BLOCK_SIZE = 7
I_QUANT_SCHEME = 8
I_QUANT_AXIS = 9
I_GROUP_SIZE = 10
I_SCALE_INDEX = 11
I_OUTER_INDEX = 12
I_BYTE_OFFSET = 13
I_BYTE_LENGTH = 14
I_SHAPE = 15
I_RESERVED16 = 23

# --- a checked table's row and a record for write_directory --------------------
# validate_directory returns each tensor as a tuple in this order, and
# write_directory takes the same first ten items followed by the payload.  Every
# reader of a row, in Python and in Cython (src/kernels/wire.pxi), uses these
# names instead of bare positions.
ROW_FIELDS = ("code", "shape", "name", "layout", "block_size", "quant_scheme", "quant_axis",
              "group_size", "scale_index", "outer_index", "byte_offset", "byte_length")
R_CODE = 0
R_SHAPE = 1
R_NAME = 2
R_LAYOUT = 3
R_BLOCK_SIZE = 4
R_QUANT_SCHEME = 5
R_QUANT_AXIS = 6
R_GROUP_SIZE = 7
R_SCALE_INDEX = 8
R_OUTER_INDEX = 9
R_BYTE_OFFSET = 10
R_BYTE_LENGTH = 11
R_PAYLOAD = 10          # in a write_directory record, the payload follows outer_index
ROW_SIZE = 12
RECORD_SIZE = 11

# --- the tensor objects' slots, as the compiled tensor part reads them -----------
# kiln.Tensor and kiln.TensorDirectory declare __slots__ from these tuples, and
# the compiled kernel's tensor part (src/kernels/tensors.pxi) finds each slot's
# offset by these names (TS_* / DS_* index them, generated into wire.pxi with the
# tuples themselves), so a slot renamed on one side only switches the compiled
# tensor part off (tensor_setup / directory_setup return False), which
# tests/test_paths.py turns into a failure.
TENSOR_SLOTS = ("name", "layout", "_row", "_buf", "_off", "_own")
TS_NAME, TS_LAYOUT, TS_ROW, TS_BUF, TS_OFF, TS_OWN = range(6)
DIRECTORY_SLOTS = ("_tensors", "_rows", "_buf", "_pb", "_errors", "_index", "_names", "_own")
DS_TENSORS, DS_ROWS, DS_BUF, DS_PB, DS_ERRORS, DS_INDEX, DS_NAMES, DS_OWN = range(8)

# --- the schema hash -------------------------------------------------------------

FNV_OFFSET = 14695981039346656037
FNV_PRIME = 1099511628211


def fnv1a_tokens(tokens):
    """FNV-1a 64 over each token's UTF-8 bytes followed by one 0x00 byte."""
    h = FNV_OFFSET
    for tok in tokens:
        for b in tok.encode("utf-8"):
            h = ((h ^ b) * FNV_PRIME) & U64_MAX
        h = (h * FNV_PRIME) & U64_MAX  # the 0x00 byte: h ^ 0 == h
    return h


def _check():
    assert HEADER.size == HEADER_SIZE and DESC.size == DESC_SIZE and FRAME.size == FRAME_SIZE
    # the descriptor's field offsets, its struct format and the tuple indexes agree
    offsets = []
    off = 0
    for count, ch in re.findall(r"(\d*)([a-zA-Z?])", DESC.format):
        size = _struct.calcsize("<" + ch)
        for _ in range(1 if ch == "s" else int(count or 1)):
            offsets.append(off)
            off += size * (int(count) if ch == "s" else 1)
    g = globals()
    for name in ("DTYPE", "RANK", "RESERVED", "NAME_OFF", "NAME_LEN", "LAYOUT_OFF",
                 "LAYOUT_LEN", "BLOCK_SIZE", "QUANT_SCHEME", "QUANT_AXIS", "GROUP_SIZE",
                 "SCALE_INDEX", "OUTER_INDEX", "BYTE_OFFSET", "BYTE_LENGTH", "SHAPE",
                 "RESERVED16"):
        assert offsets[g["I_" + name]] == g["D_" + name], name
    assert sorted(OPS.values()) == list(range(1, len(OPS) + 1))
    assert sorted(SCALAR_FORMAT) == list(range(OP_BOOL, LAST_SCALAR + 1))
    assert sorted(SCALAR_NAME) == sorted(NUMPY_LE) == sorted(SCALAR_FORMAT)
    assert all(OP_I8 <= op <= OP_U64 for op in INT_RANGE)
    assert [g["R_" + f.upper()] for f in ROW_FIELDS] == list(range(ROW_SIZE))
    for prefix, slots in (("TS_", TENSOR_SLOTS), ("DS_", DIRECTORY_SLOTS)):
        assert [g[prefix + n.lstrip("_").upper()] for n in slots] == list(range(len(slots)))


_check()
