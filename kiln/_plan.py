"""Plans: the flat description of a type that every kernel implementation reads.

A :class:`Plan` node is built by the type model (``kiln._types``) and handed to
a kernel module (``kiln._kernels_py`` or ``kiln._kernels_c``), which compiles it
into its own fast program.  Plans are plain data: an op code, the minimum wire
size, children, and for structs the names and the Python constructors.
"""

from ._wire import (  # noqa: F401  (the op codes, re-exported for the plan's readers)
    OP_BOOL, OP_I8, OP_U8, OP_I16, OP_U16, OP_I32, OP_U32, OP_I64, OP_U64, OP_F32, OP_F64,
    OP_STR, OP_BYTES, OP_PODLIST, OP_LIST, OP_OPT, OP_DICT, OP_STRUCT, OP_TENSORS)


from ._wire import FORM_DEFAULT, FORM_LIST, FORM_ARRAY  # noqa: F401  (Plan.form)


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
    form:      for OP_PODLIST and OP_BYTES, the Python value a decode gives:
               FORM_DEFAULT (an ndarray for OP_PODLIST, bytes for OP_BYTES),
               FORM_LIST (a Python list) or FORM_ARRAY (an ndarray).
    tensors:   for OP_TENSORS, the object providing ``build`` and ``normalize``
               (``kiln._tensor.HOOKS``, an instance of ``kiln._tensor._Hooks``).
    """

    __slots__ = ("op", "min_size", "text", "elem", "fields", "names", "cls",
                 "make", "get", "tensors", "form", "__weakref__")

    def __init__(self, op, min_size, text, elem=None, fields=(), names=(),
                 cls=None, make=None, get=None, tensors=None, form=FORM_DEFAULT):
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
        self.form = form

    def __repr__(self):
        return "Plan(%d, %r)" % (self.op, self.text)


class Some:
    """A present optional whose value is itself None or another ``Some``.

    Python's ``None`` cannot tell ``opt<opt<T>>``'s two "empty" values apart,
    so decoding an ``opt`` whose element is an ``opt`` wraps a present-but-empty
    inner value: bytes ``01 00`` decode to ``Some(None)`` and ``00`` to
    ``None``.  Any ``opt`` also accepts ``Some(x)`` when encoding (as ``x``).

    Example:
        >>> t = kiln.opt(kiln.opt(kiln.i8))
        >>> kiln.decode(b"\\x01\\x00", t), kiln.decode(b"\\x00", t)
        (kiln.Some(None), None)
        >>> kiln.encode(kiln.Some(None), t)
        b'\\x01\\x00'
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
