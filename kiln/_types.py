"""The Kiln type model: canonical type text, schema hash, minimum sizes, plans.

Types are immutable values.  Build them from canonical text with
:func:`parse_type`, with the constructors (``kiln.i32``, ``kiln.list_(T)``,
``kiln.struct({...})`` ...) or from a Python class with :func:`struct`.
"""

import dataclasses
import operator
import re
import sys
import typing
from typing import Any, Optional, Union

from ._errors import KilnError
from . import _plan as P
from . import _wire as W
from ._wire import MAX_DEPTH, fnv1a_tokens  # noqa: F401  (re-exported)
from ._typetext import (  # noqa: F401  (the limits, re-exported)
    MAX_BUILT, MAX_BUILT_TEXT, MAX_TEXT, MAX_TOKENS, Budget, Tokens, count_tokens, field_name)

# what the constructors take as a type: a Type, type text or an annotation
TypeArg = Any

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


class Type:
    """A Kiln type.

    Types are immutable values, equal when their canonical text (and, for a
    struct, the bound class) is the same.  Build them with
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
        return "kiln.Type(%r)" % (self.text,)

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
        from ._tensor import HOOKS
        return P.Plan(P.OP_TENSORS, W.HEADER_SIZE, self.text, tensors=HOOKS)


class List(Type):
    """``list<T>``.  ``form`` picks the Python value of a list of fixed-width
    numbers: ``None`` (type text: an ndarray, bytes for ``list<u8>``), ``"list"``
    (a Python list) or ``"ndarray"``.  The wire bytes and the hash are the same."""

    __slots__ = ("elem", "form")

    def __init__(self, elem, form=None):
        elem = as_type(elem)
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
        elem = as_type(elem)
        Type.__init__(self, ("opt<",) + elem.tokens + (">",), 1, elem.depth + 1)
        self.elem = elem

    def _binding(self):
        return self.elem._binding()

    def _build_plan(self):
        return P.Plan(P.OP_OPT, 1, self.text, elem=self.elem.plan())


class Dict(Type):
    __slots__ = ("value",)

    def __init__(self, value):
        value = as_type(value)
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
            ftype = as_type(ftype)
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


def list_(elem: "TypeArg") -> "List":
    """``list<T>``; a list of fixed-width numbers (``u8`` included) decodes to an ndarray.

    Args:
        elem: the element type (a Type, type text or an annotation).

    Returns:
        The list type.  Its text and hash are those of ``list<T>`` parsed from
        text; only the Python value differs for ``u8`` (an ndarray here,
        ``bytes`` from type text).

    Raises:
        KilnError: ``DEPTH`` past 64 nested containers, ``TYPE`` for an
            annotation with no Kiln type.

    Example:
        >>> kiln.list_(kiln.f32)
        kiln.Type('list<f32>')
        >>> kiln.decode(kiln.encode([1, 2], "list<i8>"), kiln.list_(kiln.i8)).tolist()
        [1, 2]
    """
    return List(elem, "ndarray")


def opt(elem: "TypeArg") -> "Opt":
    """``opt<T>``: a value or None.

    Args:
        elem: the type of the present value.

    Returns:
        The optional type; ``None`` is absent.  An ``opt`` directly inside an
        ``opt`` decodes a present-but-empty inner value as
        :class:`kiln.Some` ``(None)``.

    Raises:
        KilnError: ``DEPTH`` past 64 nested containers.

    Example:
        >>> t = kiln.opt(kiln.str_)
        >>> kiln.encode(None, t), kiln.decode(kiln.encode("a", t), t)
        (b'\\x00', 'a')
    """
    return Opt(elem)


def dict_(value: "TypeArg") -> "Dict":
    """``dict<str,V>``: string keys, sorted by their UTF-8 bytes on the wire.

    Args:
        value: the value type.

    Returns:
        The dict type (decodes to a ``dict``).

    Raises:
        KilnError: ``DEPTH`` past 64 nested containers.

    Example:
        >>> t = kiln.dict_(kiln.i32)
        >>> kiln.decode(kiln.encode({"b": 2, "a": 1}, t), t)
        {'a': 1, 'b': 2}
    """
    return Dict(value)


def struct(fields: Any, cls: Optional[type] = None) -> "Struct":
    """A struct type.

    Args:
        fields: a mapping or a sequence of ``(name, type)`` pairs, decoded to a
            ``dict``; or a dataclass / NamedTuple class, whose annotations give
            the field types and whose instances are what decode returns.
        cls: with a mapping or pairs, a class to bind (rarely needed).

    Returns:
        The struct type; fields are written in declaration order.

    Raises:
        KilnError: ``TYPE`` for a field name that is not an identifier or
            repeats, a class that is neither a dataclass nor a NamedTuple, an
            annotation with no Kiln type; ``DEPTH`` past 64 nested containers
            or for a class that contains itself.

    Example:
        >>> kiln.struct({"id": kiln.i64, "name": kiln.opt(kiln.str_)})
        kiln.Type('struct{id:i64,name:opt<str>,}')
        >>> @dataclasses.dataclass
        ... class Point:
        ...     x: kiln.F32
        ...     tags: list[str]
        >>> kiln.struct(Point).text
        'struct{x:f32,tags:list<str>,}'
    """
    if isinstance(fields, type):
        return _struct_from_class(fields, 0, {})
    return Struct(fields, cls)


# --- canonical text parser ------------------------------------------------

_OPENERS = ("list<", "opt<", "dict<", "struct{")


def parse_type(text: Union[str, Type]) -> Type:
    """Parse type text (``list<struct{id:i64,}>``) into a :class:`kiln.Type` whose
    ``.text`` is canonical; whitespace and a missing last comma are accepted.  Raises
    :class:`~kiln.KilnError` ``TYPE`` (bad token or syntax, a repeated field name at
    its offset), ``DEPTH`` (over 64 levels), ``LIMIT`` (over 1,000,000 tokens, found
    while reading, before the rest is read), and ``TypeError`` for a non-str:

    >>> kiln.parse_type("struct { id : i64 }").text
    'struct{id:i64,}'
    """
    if isinstance(text, Type):
        return text
    if not isinstance(text, str):
        raise TypeError("type text must be a str, not %s" % type(text).__name__)
    cached = _PARSE_CACHE.get(text)
    if cached is not None:
        return cached
    if len(text) > MAX_TOKENS:
        count_tokens(text)
    result = _parse(Tokens(text))
    if len(_PARSE_CACHE) < 1024:
        _PARSE_CACHE[text] = result
    return result


def _parse(toks):
    # iterative: no recursion, so a hostile nest cannot exhaust the stack
    stack = []   # frames: [opener, offset, fields, names] (fields, names: structs)
    budget = Budget()
    while True:
        # the start of one type
        tok, at = toks.take()
        if tok is None:
            raise KilnError("TYPE", at, "type text ends early")
        if tok in _OPENERS and len(stack) >= MAX_DEPTH:
            raise KilnError("DEPTH", at, "type nests more than %d containers" % MAX_DEPTH)
        if tok == "dict<":
            toks.need("str")
            toks.need(",")
        if tok in ("list<", "opt<", "dict<"):
            stack.append((tok, at, None, None))
            continue
        if tok == "struct{":
            if toks.peek()[0] == "}":
                toks.take()
                value = Struct(())
            else:
                names = set()
                stack.append((tok, at, [field_name(toks, names)], names))
                continue
        elif tok in SCALARS:
            value = SCALARS[tok]
        else:
            raise KilnError("TYPE", at, "unknown type token %r" % tok)
        # attach the finished value to the enclosing frames
        while stack:
            kind, opened, fields, names = stack[-1]
            if kind != "struct{":
                toks.need(">")
                stack.pop()
                extra = (4, 10) if kind == "dict<" else (2, len(kind) + 1)
                budget.spend(len(value.tokens) + extra[0], len(value.text) + extra[1], opened)
                value = (List if kind == "list<" else Opt if kind == "opt<" else Dict)(value)
                continue
            # the value completes the pending field; the last comma may be left out
            fields[-1] = (fields[-1], value)
            if toks.peek()[0] != "}":
                toks.need(",")
            if toks.peek()[0] == "}":
                toks.take()
                stack.pop()
                budget.spend(2 + sum(3 + len(t.tokens) for _, t in fields),
                             8 + sum(2 + len(n) + len(t.text) for n, t in fields), opened)
                value = Struct(fields)
                continue
            fields.append(field_name(toks, names))
            break
        else:
            tok, at = toks.peek()
            if tok is not None:
                raise KilnError("TYPE", at, "text continues after the type")
            return value


_PARSE_CACHE = {}


# --- Python annotations -> types --------------------------------------------

def as_type(t: "TypeArg") -> Type:
    """Turn a Type, type text, Python class or annotation into a Type.

    This is what every function taking a ``type`` argument does with it.

    Args:
        t: a :class:`kiln.Type`; type text; a dataclass or NamedTuple; or an
            annotation (``int``, ``list[float]``, ``Optional[str]``,
            ``dict[str, int]``, ``kiln.I32``, ``kiln.F32Array`` ...).

    Returns:
        Type: the Kiln type (see :doc:`records` for the mapping).

    Raises:
        KilnError: ``TYPE`` for an annotation with no Kiln type, ``DEPTH``
            past 64 nested containers, and what :func:`kiln.parse_type`
            raises for text.

    Example:
        >>> kiln.as_type(list[int]), kiln.as_type(kiln.F32Array)
        (kiln.Type('list<i64>'), kiln.Type('list<f32>'))
        >>> kiln.as_type(typing.Optional[dict[str, float]]).text
        'opt<dict<str,f64>>'
    """
    if isinstance(t, Type):
        return t
    if isinstance(t, str):
        return parse_type(t)
    return _from_annotation(t, 0, {})


def _from_annotation(ann, depth, active):
    if isinstance(ann, Type):
        return ann
    if depth > MAX_DEPTH:
        raise KilnError("DEPTH", 0, "annotation nests more than %d containers" % MAX_DEPTH)
    if isinstance(ann, str):
        return parse_type(ann)
    if ann is int:
        return i64
    if ann is float:
        return f64
    if ann is str:
        return str_
    if ann is bytes or ann is bytearray:
        return bytes_
    if ann is bool:
        return bool_
    origin = typing.get_origin(ann)
    args = typing.get_args(ann)
    if origin is typing.Annotated:
        for meta in args[1:]:
            if isinstance(meta, Type):
                base = args[0]
                if _is_ndarray(base) and isinstance(meta, Scalar):
                    return List(meta, "ndarray")
                return meta
        return _from_annotation(args[0], depth, active)
    if origin is typing.Union or (sys.version_info >= (3, 10) and _is_uniontype(origin)):
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1 and len(args) == 2:
            return Opt(_from_annotation(rest[0], depth + 1, active))
        raise KilnError("TYPE", 0, "only Optional[T] unions map to Kiln types, not %r" % (ann,))
    if origin in (list, typing.List) or (origin is not None and origin.__name__ == "Sequence"):
        if len(args) != 1:
            raise KilnError("TYPE", 0, "list annotation needs one element type: %r" % (ann,))
        # a list annotation promises a Python list, numbers included
        return List(_from_annotation(args[0], depth + 1, active), "list")
    if origin in (dict, typing.Dict) or (origin is not None and origin.__name__ == "Mapping"):
        if len(args) != 2 or args[0] is not str:
            raise KilnError("TYPE", 0, "dict annotation must be dict[str, V]: %r" % (ann,))
        return Dict(_from_annotation(args[1], depth + 1, active))
    if _is_ndarray(origin or ann):
        if len(args) == 2:
            dt = typing.get_args(args[1])
            if dt:
                return List(_numpy_scalar_type(dt[0]), "ndarray")
        raise KilnError("TYPE", 0, "a numpy array annotation needs a width: use "
                        "Annotated[np.ndarray, kiln.f32] or NDArray[np.float32]")
    if isinstance(ann, type):
        from ._tensor import TensorDirectory
        if issubclass(ann, TensorDirectory):
            return tensors
        if dataclasses.is_dataclass(ann) or _is_namedtuple(ann) or _is_record(ann):
            return _struct_from_class(ann, depth, active)
        try:
            return _numpy_scalar_type(ann)
        except KilnError:
            pass
    raise KilnError("TYPE", 0, "no Kiln type for annotation %r" % (ann,))


def _is_uniontype(origin):
    import types as _t
    return origin is getattr(_t, "UnionType", None)


def _is_ndarray(x):
    try:
        import numpy
    except ImportError:  # pragma: no cover
        return False
    return x is numpy.ndarray


def _numpy_scalar_type(t):
    import numpy as np
    try:
        dt = np.dtype(t)
    except TypeError:
        raise KilnError("TYPE", 0, "no Kiln type for %r" % (t,)) from None
    table = {"?": bool_, "i1": i8, "u1": u8, "i2": i16, "u2": u16, "i4": i32,
             "u4": u32, "i8": i64, "u8": u64, "f4": f32, "f8": f64}
    key = "?" if dt.kind == "b" else dt.kind + str(dt.itemsize)
    if key not in table:
        raise KilnError("TYPE", 0, "no Kiln scalar for numpy dtype %s" % dt)
    return table[key]


_CLASS_CACHE = {}

# the key of a dataclass field's metadata naming the field on the wire (and in
# the schema hash) when it differs from the attribute: what ``kiln gen`` writes
# for a schema property that is no Python attribute name (a keyword, ``__id``)
WIRE_NAME = "kiln.name"


def _struct_from_class(cls, depth, active):
    cached = _CLASS_CACHE.get(cls)
    if cached is not None:
        return cached
    if cls in active:
        raise KilnError("DEPTH", 0, "class %s refers to itself; Kiln types are finite"
                        % cls.__qualname__)
    if depth > MAX_DEPTH:
        raise KilnError("DEPTH", 0, "classes nest more than %d containers" % MAX_DEPTH)
    active = dict(active)
    active[cls] = True
    try:
        hints = typing.get_type_hints(cls, include_extras=True)
    except Exception as e:
        raise KilnError("TYPE", 0, "cannot resolve annotations of %s: %s"
                        % (cls.__qualname__, e)) from None
    if dataclasses.is_dataclass(cls):
        names = [f.name for f in dataclasses.fields(cls)]
        wire = [f.metadata.get(WIRE_NAME, f.name) for f in dataclasses.fields(cls)]
        for f in dataclasses.fields(cls):
            if not f.init:
                raise KilnError("TYPE", 0, "dataclass field %s.%s has init=False"
                                % (cls.__qualname__, f.name))
    elif _is_namedtuple(cls):
        names = wire = list(cls._fields)
    elif _is_record(cls):
        names = wire = list(cls.__kiln_fields__)
    else:
        raise KilnError("TYPE", 0, "%s is neither a dataclass nor a NamedTuple" % cls.__qualname__)
    fields = []
    for name, wname in zip(names, wire):
        if name not in hints:
            raise KilnError("TYPE", 0, "field %s.%s has no annotation" % (cls.__qualname__, name))
        fields.append((wname, _from_annotation(hints[name], depth + 1, active)))
    t = Struct(fields, cls, names)
    _CLASS_CACHE[cls] = t
    return t


bytes_ = List(u8)
