"""Plans: the flat description of a type that every kernel implementation reads.

A :class:`Plan` node is built by the type model (``kiln._types``) and handed to
a kernel module (``kiln._kernels_py`` or ``kiln._kernels_c``), which compiles it
into its own fast program.  Plans are plain data: an op code, the minimum wire
size, children, and for structs the names and the Python constructors;
:func:`direct_build` tells a compiled kernel when it may build a struct's
class without calling that constructor.
"""

import dataclasses

from ._wire import (  # noqa: F401  (the op codes, re-exported for the plan's readers)
    OP_BOOL, OP_I8, OP_U8, OP_I16, OP_U16, OP_I32, OP_U32, OP_I64, OP_U64, OP_F32, OP_F64,
    OP_STR, OP_BYTES, OP_PODLIST, OP_LIST, OP_OPT, OP_DICT, OP_STRUCT, OP_TENSORS, OP_CONV)


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
    make:      callable(*values) -> object for a class-bound struct; for
               OP_CONV, callable(wire value) -> Python value (decode's post-step).
    get:       callable(obj) -> tuple of field values for a class-bound struct;
               for OP_CONV, callable(Python value) -> wire value (encode's pre-step).
               An OP_CONV callable refuses a value by raising :class:`ConvError`,
               which the kernels turn into ``TYPE`` at the value's first byte.
    form:      for OP_PODLIST and OP_BYTES, the Python value a decode gives:
               FORM_DEFAULT (an ndarray for OP_PODLIST, bytes for OP_BYTES),
               FORM_LIST (a Python list) or FORM_ARRAY (an ndarray).
    tensors:   for OP_TENSORS, the object providing ``build`` and ``normalize``
               (``kiln._tensors.HOOKS``, an instance of ``kiln._tensors.hooks._Hooks``).
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


def direct_build(cls, names):
    """How a compiled kernel may build ``cls`` from decoded field values
    without calling Python code, giving what the plan's ``make(*values)``
    gives.  The kernel asks when it compiles a plan, not when the plan is
    made, as the class may change in between.

    ``"record"``: a ``kiln.Record`` (see :func:`_record_build`).
    ``"tuple"``: a NamedTuple (``make`` is ``tuple.__new__(cls, values)``
    already).  ``"object"``: a dataclass whose instances its generated
    ``__init__`` builds by nothing but ``object.__new__(cls)`` and one
    ``object.__setattr__(self, name, value)`` per field in field order, which
    is what the kernel then does itself.  ``None``: anything else (a custom
    ``__init__``, ``__new__``, ``__setattr__`` or metaclass ``__call__``, a
    ``__post_init__``, InitVar pseudo-fields, an abstract class, fields in
    another order than ``names``, an ``__init__`` whose code is not what
    ``dataclasses`` writes for the fields, or whose closure's cells hold
    anything but what ``dataclasses`` puts there): the kernel calls
    ``make``.  The code reads no globals (else ``None``), and its defaults do
    not matter (every parameter is given a value).  The kernel checks the
    class's version tag, the ``__init__``'s code object and what its closure's
    cells hold on every decode, after the fields, so a class changed after
    this answer is called again.
    """
    if isinstance(cls, type) and issubclass(cls, tuple) and hasattr(cls, "_fields"):
        return "tuple"
    if getattr(type(cls), "_kiln_record_meta", False) is True:
        return _record_build(cls, names)
    if not dataclasses.is_dataclass(cls) or not isinstance(cls, type):
        return None
    try:
        if type(cls).__call__ is not type.__call__ or cls.__new__ is not object.__new__:
            return None
        if getattr(cls, "__abstractmethods__", None) or hasattr(cls, "__post_init__"):
            return None
        every = getattr(cls, "__dataclass_fields__", {}).values()
        if any(f._field_type is dataclasses._FIELD_INITVAR for f in every):
            return None   # InitVar pseudo-fields are parameters of __init__
        owner = next((k for k in cls.__mro__ if "__init__" in vars(k)), object)
        params = vars(owner).get("__dataclass_params__")
        if params is None or not params.init:
            return None   # __init__ is not one a dataclass decorator wrote
        if cls.__setattr__ is not object.__setattr__ and not params.frozen:
            return None   # ``self.x = v`` would run a custom __setattr__
        init = vars(owner)["__init__"]
        code = getattr(init, "__code__", None)
        if (code is None or code.co_filename != "<string>" or code.co_name != "__init__"
                or getattr(init, "__qualname__", None) != owner.__qualname__ + ".__init__"):
            return None
        fields = dataclasses.fields(owner)
        if tuple(f.name for f in fields) != tuple(names):
            return None   # make passes the values by position, in names' order
        ref, reads_globals = _generated_init(fields, params.frozen)
        if reads_globals or not _same_code(code, ref):
            return None   # not the body dataclasses writes for these fields (its
                          # parameters, names and flags included): a hand-written
                          # __init__ exec'd from a string, one a second @dataclass kept
        cells = init.__closure__ or ()
        if len(cells) != len(code.co_freevars) or not all(
                _cell_ok(nm, c.cell_contents) for nm, c in zip(code.co_freevars, cells)):
            return None   # e.g. the object a frozen class's __init__ stores through
    except Exception:   # an exotic class (or an empty cell): calling it is always right
        return None
    return "object"


def _record_build(cls, names):
    """``"record"``: a ``kiln.Record`` subclass whose construction is the
    base's own (no class of its MRO above the base defines ``__new__``,
    ``__init__``, ``__setattr__`` or ``__delattr__`` below ``kiln.Record``, the metaclass has no
    ``__call__`` of its own), fields in ``names``' order, not abstract: the
    compiled kernel allocates the instance and stores each field in its slot,
    which is what the base's ``__init__`` does.  Else ``None``."""
    try:
        if type(cls).__call__ is not type.__call__ or getattr(cls, "__abstractmethods__", None):
            return None
        if tuple(cls.__kiln_fields__) != tuple(names):
            return None
        for k in cls.__mro__:
            if vars(k).get("_kiln_record_root") is True:
                break   # kiln.Record itself: its base builds as the kernel does
            if any(m in vars(k) for m in ("__new__", "__init__", "__setattr__", "__delattr__")):
                return None
        else:
            return None
    except Exception:
        return None
    return "record"


_GENERATED = {}


def _cell_ok(name, value):
    """Does a closure cell of a generated __init__ hold what dataclasses puts
    in it?  (By the cell's name, as CPython's versions spell it: 3.11 to 3.13
    have ``_HAS_DEFAULT_FACTORY`` or ``__dataclass_HAS_DEFAULT_FACTORY__``,
    ``__dataclass_builtins_object__``, ``_dflt_x`` or ``__dataclass_dflt_x__``.)"""
    if "HAS_DEFAULT_FACTORY" in name:
        return value is dataclasses._HAS_DEFAULT_FACTORY
    if "builtins_object" in name:
        return value is object
    # a default factory: called only for an argument that is the sentinel
    # above, which no decoded value is
    return "dflt_" in name


def _generated_init(fields, frozen):
    """(The code of the __init__ dataclasses writes for these fields, whose
    defaults, other than a default_factory, do not change the body; whether
    that code reads a global)."""
    key = (tuple((f.name, f.kw_only is True, f.default_factory is not dataclasses.MISSING)
                 for f in fields), bool(frozen))
    code = _GENERATED.get(key)
    if code is None:
        spec = [(name, object, dataclasses.field(kw_only=kw, default_factory=list) if fac
                 else dataclasses.field(kw_only=kw, default=None))
                for name, kw, fac in key[0]]
        ref = dataclasses.make_dataclass("_Generated", spec, frozen=frozen, eq=False,
                                         repr=False, match_args=False)
        import dis   # (imported already: dataclasses imports inspect, which imports it)
        reads = any(ins.opname in ("LOAD_GLOBAL", "LOAD_NAME")
                    for ins in dis.get_instructions(ref.__init__))
        code = _GENERATED[key] = (ref.__init__.__code__, reads)
    return code


def _same_code(a, b):
    return all(getattr(a, k) == getattr(b, k) for k in (
        "co_code", "co_consts", "co_names", "co_varnames", "co_freevars", "co_cellvars",
        "co_argcount", "co_posonlyargcount", "co_kwonlyargcount", "co_flags"))


class ConvError(Exception):
    """Raised by an OP_CONV plan's ``make`` or ``get`` for a value with no
    form on the other side (an integer that is no member of the enum, a naive
    datetime); the kernels raise ``TYPE`` with this reason at the offset of
    the value (decode: its first byte; encode: where it would be written)."""


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
