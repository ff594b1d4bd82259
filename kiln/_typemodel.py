"""The Kiln type model: the kinds of type, their canonical tokens, text and
schema hash, minimum sizes and plans, and the scalar singletons.

Types are immutable values.  This module builds them from other types only;
type text is read by :mod:`kiln._typetext`, Python annotations and classes
by :mod:`kiln._annotations`, and :mod:`kiln._types` (what the rest of kiln
imports) adds the public constructors that take any of them.
"""

import dataclasses
import operator
import re

from ._errors import KilnError
from . import _plan as P
from . import _wire as W
from ._wire import MAX_DEPTH, fnv1a_tokens

# the longest type text, in tokens and in characters: far past any real schema,
# far below memory (a type built by reuse, a JSON Schema's $defs, can double at
# each level: its tokens and characters are counted before it is built)
MAX_TOKENS = 1_000_000
MAX_TEXT = 16_000_000
# and what one parse (of type text or a JSON Schema) may build in all, summed
# over the containers it builds (each holds its own copy of its text)
MAX_BUILT = 8 * MAX_TOKENS
MAX_BUILT_TEXT = 4 * MAX_TEXT

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")

# the key of a dataclass field's metadata naming the field on the wire (and in
# the schema hash) when it differs from the attribute: what ``kiln gen`` writes
# for a schema property that is no Python attribute name (a keyword, ``__id``)
WIRE_NAME = "kiln.name"


def _need(t):
    """``t`` itself, which must be a Type (the constructors of kiln._types and
    kiln.as_type turn text and annotations into one first)."""
    if not isinstance(t, Type):
        raise TypeError("a kiln.Type is needed here, not %s (kiln.as_type makes one)"
                        % type(t).__name__)
    return t


class Type:
    """A Kiln type.

    Types are immutable values, equal exactly when they have the same
    canonical text (so the same bytes and ``schema_hash``) and decode to the
    same Python values: the form of each list of numbers (an ndarray,
    ``bytes`` for ``list<u8>``, or a Python list under a ``list[int]``
    annotation) and the class each struct is bound to.  The rule holds
    however a type is built (type text, constructors, annotations,
    :func:`kiln.schema_from_json`), and ``repr`` shows the Python side where
    it is not the text's (``python='list[i64]'``).  Build them with
    :func:`kiln.parse_type`, the constructors (:func:`kiln.list_`,
    :func:`kiln.struct`, ...) or from a class or annotation with
    :func:`kiln.as_type`; ``str(t)`` is the canonical text.

    Attributes:
        text: canonical type text, e.g. ``struct{id:i64,batch:tensors,}``.
        tokens: the tuple of tokens whose concatenation is ``text``.
        min_size: the minimum number of bytes one value occupies on the wire.
        depth: how many containers are nested (a scalar is 0).

    Example:
        >>> t = kiln.parse_type("struct{id:i64,name:str,}")
        >>> t.text, t.min_size, t.depth
        ('struct{id:i64,name:str,}', 12, 1)
        >>> t.tokens[:3]
        ('struct{', 'id', ':')
    """

    __slots__ = ("tokens", "text", "min_size", "depth", "_hash", "_plan")

    def __init__(self, tokens, min_size, depth):
        if depth > MAX_DEPTH:
            raise KilnError("DEPTH", 0, "type nests %d containers; at most %d allowed"
                            % (depth, MAX_DEPTH))
        self.tokens = tuple(tokens)
        if len(self.tokens) > MAX_TOKENS:
            # a type built by reuse (classes, or a JSON Schema's $defs) can double at
            # each level
            raise KilnError("LIMIT", 0, "type text of %d tokens is above %d"
                            % (len(self.tokens), MAX_TOKENS))
        chars = sum(map(len, self.tokens))
        if chars > MAX_TEXT:
            raise KilnError("LIMIT", 0, "type text of %d characters is above %d"
                            % (chars, MAX_TEXT))
        self.text = "".join(self.tokens)
        self.min_size = min_size
        self.depth = depth
        self._hash = None
        self._plan = None

    @property
    def schema_hash(self) -> int:
        """FNV-1a 64 of the canonical tokens: what a frame carries."""
        h = self._hash
        if h is None:
            h = self._hash = fnv1a_tokens(self.tokens)
        return h

    def __repr__(self):
        # a type that decodes otherwise than its text says how: the one
        # difference between types of one text (and so of one hash)
        if self._binding() is None:
            return "kiln.Type(%r)" % (self.text,)
        return "kiln.Type(%r, python=%r)" % (self.text, _python(self))

    def __str__(self):
        return self.text

    def __eq__(self, other):
        if not isinstance(other, Type):
            return NotImplemented
        return self.text == other.text and self._binding() == other._binding()

    def __ne__(self, other):
        r = self.__eq__(other)
        return r if r is NotImplemented else not r

    def __hash__(self):
        return hash((self.text, self._binding()))

    def _binding(self):
        return None

    def plan(self) -> "P.Plan":
        """The compiled plan of this type (built once, then cached)."""
        p = self._plan
        if p is None:
            p = self._plan = self._build_plan()
        return p


class Scalar(Type):
    __slots__ = ("name", "op")

    def __init__(self, name, op):
        Type.__init__(self, (name,), W.SCALAR_FORMAT[op][1], 0)
        self.name = name
        self.op = op

    def _build_plan(self):
        return P.Plan(self.op, self.min_size, self.text)


class Str(Type):
    __slots__ = ()

    def __init__(self):
        Type.__init__(self, ("str",), 4, 0)

    def _build_plan(self):
        return P.Plan(P.OP_STR, 4, self.text)


class Tensors(Type):
    __slots__ = ()

    def __init__(self):
        Type.__init__(self, ("tensors",), 64, 1)

    def _build_plan(self):
        from ._tensors import HOOKS
        return P.Plan(P.OP_TENSORS, W.HEADER_SIZE, self.text, tensors=HOOKS)


class List(Type):
    """``list<T>``.  ``form`` picks the Python value of a list of fixed-width
    numbers: ``None`` (type text: an ndarray, bytes for ``list<u8>``), ``"list"``
    (a Python list) or ``"ndarray"``.  The wire bytes and the hash are the same."""

    __slots__ = ("elem", "form")

    def __init__(self, elem, form=None):
        elem = _need(elem)
        Type.__init__(self, ("list<",) + elem.tokens + (">",), 4, elem.depth + 1)
        if form not in (None, "list", "ndarray"):
            raise ValueError("list form must be None, 'list' or 'ndarray', not %r" % (form,))
        self.elem = elem
        if not isinstance(elem, Scalar) or (form == "ndarray" and elem.op != P.OP_U8):
            form = None   # the default already: a list, or an ndarray of numbers
        self.form = form

    def _binding(self):
        b = self.elem._binding()
        return b if self.form is None else (self.form, b)

    def _build_plan(self):
        e = self.elem
        if isinstance(e, Scalar):
            form = _FORMS[self.form]
            if e.op == P.OP_U8:
                return P.Plan(P.OP_BYTES, 4, self.text, elem=e.plan(), form=form)
            return P.Plan(P.OP_PODLIST, 4, self.text, elem=e.plan(), form=form)
        return P.Plan(P.OP_LIST, 4, self.text, elem=e.plan())


_FORMS = {None: P.FORM_DEFAULT, "list": P.FORM_LIST, "ndarray": P.FORM_ARRAY}


class Opt(Type):
    __slots__ = ("elem",)

    def __init__(self, elem):
        elem = _need(elem)
        Type.__init__(self, ("opt<",) + elem.tokens + (">",), 1, elem.depth + 1)
        self.elem = elem

    def _binding(self):
        return self.elem._binding()

    def _build_plan(self):
        return P.Plan(P.OP_OPT, 1, self.text, elem=self.elem.plan())


class Dict(Type):
    __slots__ = ("value",)

    def __init__(self, value):
        value = _need(value)
        Type.__init__(self, ("dict<", "str", ",") + value.tokens + (">",), 4,
                      value.depth + 1)
        self.value = value

    def _binding(self):
        return self.value._binding()

    def _build_plan(self):
        return P.Plan(P.OP_DICT, 4, self.text, elem=self.value.plan())


class Struct(Type):
    """A struct: named fields in declaration order.

    ``cls`` is None for a struct decoded to a ``dict``; otherwise the
    dataclass or NamedTuple the struct is bound to.
    """

    __slots__ = ("fields", "cls", "attrs")

    def __init__(self, fields, cls=None, attrs=None):
        items = list(fields.items()) if hasattr(fields, "items") else list(fields)
        toks = ["struct{"]
        size = 0
        depth = 0
        seen = set()
        out = []
        for name, ftype in items:
            if not isinstance(name, str) or not _IDENT.match(name):
                raise KilnError("TYPE", 0, "field name %r is not an identifier" % (name,))
            if name in seen:
                raise KilnError("TYPE", 0, "field name %r repeats" % (name,))
            seen.add(name)
            ftype = _need(ftype)
            out.append((name, ftype))
            toks.append(name)
            toks.append(":")
            toks.extend(ftype.tokens)
            toks.append(",")
            size += ftype.min_size
            depth = max(depth, ftype.depth)
        toks.append("}")
        Type.__init__(self, toks, size, depth + 1)
        self.fields = tuple(out)
        self.cls = cls
        # the bound class's attribute of each field, where one differs from the
        # field's (wire) name: a dataclass field with metadata {WIRE_NAME: name}
        attrs = tuple(attrs) if attrs is not None else None
        if attrs is not None and len(attrs) != len(out):
            raise KilnError("TYPE", 0, "%d attribute names for %d fields" % (len(attrs),
                                                                           len(out)))
        self.attrs = attrs if attrs != tuple(n for n, _ in out) else None

    def _binding(self):
        inner = tuple(t._binding() for _, t in self.fields)
        if self.cls is None and not any(x is not None for x in inner):
            return None
        return (self.cls, inner)

    def _build_plan(self):
        cls = self.cls
        # a class-bound struct reads and builds its class by attribute names
        names = self.attrs if cls is not None and self.attrs is not None else \
            tuple(n for n, _ in self.fields)
        plans = tuple(t.plan() for _, t in self.fields)
        make = get = None
        if cls is not None:
            make = _make_constructor(cls, names)
            get = _make_getter(names)
        return P.Plan(P.OP_STRUCT, self.min_size, self.text, fields=plans,
                      names=names, cls=cls, make=make, get=get)


class Mapped(Type):
    """A Python type carried by a wire type: an enum, ``Literal``, datetime,
    UUID, Decimal or ``tuple[T, ...]`` (see :mod:`kiln._pyconv`).

    Its text, bytes and schema hash are those of ``wire``; only the Python
    value differs.  ``to_wire(value)`` runs before encode, ``from_wire(value)``
    after decode (either may be None: the value passes as it is); ``key``
    names the conversion (it is part of the type's equality) and ``name`` is
    what ``repr`` shows."""

    __slots__ = ("wire", "name", "key", "to_wire", "from_wire", "json_in", "json_out")

    def __init__(self, wire, name, key, to_wire, from_wire, json_in=None, json_out=None):
        wire = _need(wire)
        Type.__init__(self, wire.tokens, wire.min_size, wire.depth)
        self.wire = wire
        self.name = name
        self.key = key
        self.to_wire = to_wire
        self.from_wire = from_wire
        # a JSON value as what to_wire takes, and a decoded value as JSON data
        self.json_in = json_in
        self.json_out = json_out

    def _binding(self):
        return ("mapped", self.key, self.wire._binding())

    def _build_plan(self):
        return P.Plan(P.OP_CONV, self.min_size, self.text, elem=self.wire.plan(),
                      make=self.from_wire, get=self.to_wire)


def _python(t):
    """What ``t`` decodes to, where that is not its text's: ``list[T]`` for a
    Python list, ``ndarray[u8]`` for a uint8 array, a bound struct's class."""
    if isinstance(t, List):
        inner = _python(t.elem)
        return {None: "list<%s>", "list": "list[%s]", "ndarray": "ndarray[%s]"}[t.form] % inner
    if isinstance(t, Opt):
        return "opt<%s>" % _python(t.elem)
    if isinstance(t, Dict):
        return "dict<str,%s>" % _python(t.value)
    if isinstance(t, Mapped):
        return t.name
    if isinstance(t, Struct):
        if t.cls is not None:
            return getattr(t.cls, "__qualname__", repr(t.cls))
        return "struct{%s}" % "".join("%s:%s," % (n, _python(f)) for n, f in t.fields)
    return t.text


def _make_constructor(cls, names):
    if _is_record(cls):
        return cls
    if _is_namedtuple(cls):
        new = tuple.__new__

        def make(*values):
            return new(cls, values)
        make.tuple_new_of = cls   # (the pure decoder writes the call inline)
        return make
    if any(getattr(f, "kw_only", False) for f in dataclasses.fields(cls)):
        # keyword-only fields cannot be passed by position
        def make(*values):
            return cls(**dict(zip(names, values)))
        return make
    return cls


def _make_getter(names):
    if len(names) == 1:
        g = operator.attrgetter(names[0])
        return lambda obj: (g(obj),)
    if not names:
        return lambda obj: ()
    return operator.attrgetter(*names)


def _is_namedtuple(cls):
    return isinstance(cls, type) and issubclass(cls, tuple) and hasattr(cls, "_fields")


def _is_record(cls):   # a kiln.Record subclass (kiln/_record.py)
    return isinstance(cls, type) and getattr(type(cls), "_kiln_record_meta", False) is True


# --- scalar singletons ---------------------------------------------------

bool_ = Scalar("bool", W.OP_BOOL)
i8 = Scalar("i8", W.OP_I8)
i16 = Scalar("i16", W.OP_I16)
i32 = Scalar("i32", W.OP_I32)
i64 = Scalar("i64", W.OP_I64)
u8 = Scalar("u8", W.OP_U8)
u16 = Scalar("u16", W.OP_U16)
u32 = Scalar("u32", W.OP_U32)
u64 = Scalar("u64", W.OP_U64)
int_ = Scalar("int", W.OP_I64)
uint = Scalar("uint", W.OP_U64)
f32 = Scalar("f32", W.OP_F32)
f64 = Scalar("f64", W.OP_F64)
str_ = Str()
tensors = Tensors()

SCALARS = {t.name: t for t in (bool_, i8, i16, i32, i64, u8, u16, u32, u64,
                                int_, uint, f32, f64)}
SCALARS["str"] = str_
SCALARS["tensors"] = tensors
bytes_ = List(u8)
