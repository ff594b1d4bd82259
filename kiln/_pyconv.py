"""Python types carried by an existing wire type (no new bytes, no new hash):
enums, ``Literal``, ``tuple``, ``datetime``/``date``/``timedelta``,
``uuid.UUID`` and ``decimal.Decimal``.

Each maker returns a :class:`kiln._typemodel.Mapped`: the wire type plus an
encode pre-step ``to_wire`` and a decode post-step ``from_wire``, which the
kernels run (plan op ``OP_CONV``).  A value with no form on the other side is
refused with :class:`kiln._plan.ConvError`, which the kernels report as
``TYPE`` at the value's offset.  An annotation with no wire form is a
``TypeError`` (raised while the type is built).  The mapping is documented in
``docs/records.md``.
"""

import enum as _enum

from ._plan import ConvError
from ._typemodel import Mapped, Scalar, Str, Struct, List, bool_, i64, str_
from ._wire import INT_RANGE


def _what(v):
    return type(v).__name__


# --- enums -------------------------------------------------------------------

def enum_type(cls, wire=None):
    """An enum as the type of its values: ``i64`` (or the integer type of an
    ``Annotated``) for int values, ``str`` for str values."""
    values = [m._value_ for m in cls.__members__.values()]
    if not values:
        raise TypeError("enum %s has no members" % cls.__qualname__)
    if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        base = i64 if wire is None else wire
        if not (isinstance(base, Scalar) and base.op in INT_RANGE):
            raise TypeError("enum %s has int values: its wire type is an integer, not %s"
                            % (cls.__qualname__, base.text))
        lo, hi = INT_RANGE[base.op]
        bad = [v for v in values if not lo <= v <= hi]
        if bad:
            raise TypeError("enum %s: value %d does not fit %s" % (cls.__qualname__, bad[0],
                                                                    base.text))
        kind = int
    elif all(isinstance(v, str) for v in values):
        base = str_ if wire is None else wire
        if not isinstance(base, Str):
            raise TypeError("enum %s has str values: its wire type is str, not %s"
                            % (cls.__qualname__, base.text))
        kind = str
    else:
        raise TypeError("enum %s has values that are not all int or all str (%s); only "
                        "those have a wire form" % (cls.__qualname__, ", ".join(
                            sorted({_what(v) for v in values}))))
    vmap = dict(cls._value2member_map_)
    name = cls.__qualname__

    def to_wire(v):
        if isinstance(v, cls):
            return v._value_
        if type(v) is bool or not isinstance(v, kind):
            raise ConvError("expected %s, got %s" % (name, _what(v)))
        m = vmap.get(v)
        if m is None:
            try:
                m = cls(v)
            except ValueError:
                raise ConvError("%r is not a value of %s" % (v, name)) from None
        return m._value_

    def from_wire(v):
        m = vmap.get(v)
        if m is not None:
            return m
        try:
            return cls(v)
        except ValueError:
            raise ConvError("%r is not a value of %s" % (v, name)) from None
    return Mapped(base, name, ("enum", cls), to_wire, from_wire, json_out=_value)


def _value(v):
    return v._value_


# --- Literal ------------------------------------------------------------------

def literal_type(values, wire=None):
    """``Literal[...]`` as its values' type, the values checked both ways."""
    values = tuple(values)
    if not values:
        raise TypeError("Literal[] has no values")
    if all(type(v) is bool for v in values):
        kind, default = bool, bool_
    elif all(isinstance(v, int) and not isinstance(v, (bool, _enum.Enum)) for v in values):
        kind, default = int, i64
    elif all(isinstance(v, str) and not isinstance(v, _enum.Enum) for v in values):
        kind, default = str, str_
    else:
        raise TypeError("Literal%r mixes kinds; only all-int, all-str or all-bool Literals "
                        "have a wire form" % (list(values),))
    base = default if wire is None else wire
    if kind is int:
        if not (isinstance(base, Scalar) and base.op in INT_RANGE):
            raise TypeError("Literal of ints: its wire type is an integer, not %s" % base.text)
        lo, hi = INT_RANGE[base.op]
        for v in values:
            if not lo <= v <= hi:
                raise TypeError("Literal value %d does not fit %s" % (v, base.text))
    elif base.text != default.text:
        raise TypeError("Literal of %s: its wire type is %s, not %s"
                        % (kind.__name__, default.text, base.text))
    allowed = frozenset(values)
    name = "Literal[%s]" % ", ".join(repr(v) for v in values)

    def check(v):
        if not (type(v) is bool if kind is bool else
                isinstance(v, kind) and type(v) is not bool):
            raise ConvError("expected %s, got %s" % (name, _what(v)))
        if v not in allowed:
            raise ConvError("%r is not one of %s" % (v, name))
        return v
    return Mapped(base, name, ("literal", kind, allowed), check, check)


# --- tuples -------------------------------------------------------------------

def fixed_tuple_type(elems):
    """``tuple[A, B]``: a struct of positional fields ``_0``, ``_1``, ..."""
    names = tuple("_%d" % i for i in range(len(elems)))
    wire = Struct(list(zip(names, elems)))
    n = len(names)
    name = "tuple[%s]" % ", ".join(_python_name(t) for t in elems)

    def to_wire(v):
        if not isinstance(v, (tuple, list)):
            raise ConvError("expected a tuple of %d for %s, got %s" % (n, name, _what(v)))
        if len(v) != n:
            raise ConvError("expected a tuple of %d for %s, got %d items" % (n, name, len(v)))
        return dict(zip(names, v))

    def from_wire(d):
        return tuple(d.values())
    return Mapped(wire, name, ("tuple", tuple(e._binding() for e in elems)), to_wire,
                  from_wire)


def var_tuple_type(elem):
    """``tuple[T, ...]``: ``list<T>``, decoded to a tuple."""
    wire = List(elem, "list")
    return Mapped(wire, "tuple[%s, ...]" % _python_name(elem), ("tuple...",), None, tuple)


def _python_name(t):
    from ._typemodel import _python
    return _python(t)


# --- dates and times, UUID and Decimal (kiln/_pystd.py) -----------------------------

_BY_NAME = {("datetime", "datetime"), ("datetime", "date"), ("datetime", "timedelta"),
            ("uuid", "UUID"), ("decimal", "Decimal")}


def by_class(cls):
    """The type of ``datetime``, ``date``, ``timedelta``, ``uuid.UUID`` or
    ``decimal.Decimal`` (exactly those classes), else None.  Each has one wire
    type (an Annotated cannot change it)."""
    if (getattr(cls, "__module__", None), getattr(cls, "__qualname__", None)) not in _BY_NAME:
        return None
    from ._pystd import BY_CLASS
    return BY_CLASS.get(cls)
