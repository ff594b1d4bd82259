"""Plans: the flat description of a type that every kernel implementation reads.

A :class:`Plan` node is built by the type model (``kiln._types``) and handed to
a kernel module (``kiln._kernels_py`` or ``kiln._kernels_c``), which compiles it
into its own fast program.  Plans are plain data: an op code, the minimum wire
size, children, and for structs the names and the Python constructors.
"""

# op codes (shared by both kernel implementations; keep in sync with src/)
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

# struct.Struct format character and width of each fixed-width scalar op
SCALAR_FORMAT = {
    OP_BOOL: ("?", 1), OP_I8: ("b", 1), OP_U8: ("B", 1), OP_I16: ("h", 2),
    OP_U16: ("H", 2), OP_I32: ("i", 4), OP_U32: ("I", 4), OP_I64: ("q", 8),
    OP_U64: ("Q", 8), OP_F32: ("f", 4), OP_F64: ("d", 8),
}

# little-endian numpy dtype string of each fixed-width op
NUMPY_LE = {
    OP_BOOL: "|b1", OP_I8: "|i1", OP_U8: "|u1", OP_I16: "<i2", OP_U16: "<u2",
    OP_I32: "<i4", OP_U32: "<u4", OP_I64: "<i8", OP_U64: "<u8",
    OP_F32: "<f4", OP_F64: "<f8",
}

INT_RANGE = {
    OP_I8: (-(1 << 7), (1 << 7) - 1), OP_U8: (0, 255),
    OP_I16: (-(1 << 15), (1 << 15) - 1), OP_U16: (0, (1 << 16) - 1),
    OP_I32: (-(1 << 31), (1 << 31) - 1), OP_U32: (0, (1 << 32) - 1),
    OP_I64: (-(1 << 63), (1 << 63) - 1), OP_U64: (0, (1 << 64) - 1),
}


class Plan:
    """One node of a compiled plan.

    op:        one of the ``OP_*`` codes.
    min_size:  minimum wire size in bytes (the allocation rule's m).
    text:      canonical type text of this node (for messages).
    elem:      element plan (list, opt, dict value), else None.
    fields:    tuple of field plans (struct), else ().
    names:     tuple of field names (struct), else ().
    cls:       None for a struct decoded to a dict, else the bound class.
    make:      callable(*values) -> object for a class-bound struct.
    get:       callable(obj) -> tuple of field values for a class-bound struct.
    tensors:   for OP_TENSORS, the object providing ``build`` and ``normalize``
               (see kiln._tensor.TensorsHooks).
    """

    __slots__ = ("op", "min_size", "text", "elem", "fields", "names", "cls",
                 "make", "get", "tensors", "__weakref__")

    def __init__(self, op, min_size, text, elem=None, fields=(), names=(),
                 cls=None, make=None, get=None, tensors=None):
        self.op = op
        self.min_size = min_size
        self.text = text
        self.elem = elem
        self.fields = fields
        self.names = names
        self.cls = cls
        self.make = make
        self.get = get
        self.tensors = tensors

    def __repr__(self):
        return "Plan(%d, %r)" % (self.op, self.text)


class Some:
    """A present optional whose value is itself None or another ``Some``.

    Python's ``None`` cannot tell ``opt<opt<T>>``'s two "empty" values apart,
    so decoding an ``opt`` whose element is an ``opt`` wraps a present-but-empty
    inner value: bytes ``01 00`` decode to ``Some(None)`` and ``00`` to
    ``None``.  Any ``opt`` also accepts ``Some(x)`` when encoding (as ``x``).
    """

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value

    def __eq__(self, other):
        if type(other) is Some:
            return self.value == other.value
        return NotImplemented

    __hash__ = None

    def __repr__(self):
        return "kiln.Some(%r)" % (self.value,)
