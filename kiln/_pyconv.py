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

import datetime as _dt
import decimal as _decimal
import enum as _enum
import re
import uuid as _uuid

from ._plan import ConvError
from ._typemodel import Mapped, Scalar, Str, Struct, List, bool_, bytes_, i32, i64, str_
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


# --- dates and times ------------------------------------------------------------

_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.timezone.utc)
_EPOCH_DAY = _dt.date(1970, 1, 1).toordinal()
_US = _dt.timedelta(microseconds=1)


def _dt_to(v):
    if not isinstance(v, _dt.datetime):
        raise ConvError("expected a datetime, got %s" % _what(v))
    if v.tzinfo is None or v.utcoffset() is None:
        raise ConvError("datetime %s is naive: kiln writes instants in UTC, give it a tzinfo "
                        "(datetime.timezone.utc for UTC)" % v.isoformat())
    return (v - _EPOCH) // _US


def _dt_from(n):
    try:
        return _EPOCH + _dt.timedelta(microseconds=n)
    except OverflowError:
        raise ConvError("%d microseconds from 1970-01-01 UTC is outside datetime's range"
                        % n) from None


def _date_to(v):
    if isinstance(v, _dt.datetime) or not isinstance(v, _dt.date):
        raise ConvError("expected a date, got %s" % _what(v))
    return v.toordinal() - _EPOCH_DAY


def _date_from(n):
    try:
        return _dt.date.fromordinal(n + _EPOCH_DAY)
    except (ValueError, OverflowError):
        raise ConvError("%d days from 1970-01-01 is outside date's range" % n) from None


def _td_to(v):
    if not isinstance(v, _dt.timedelta):
        raise ConvError("expected a timedelta, got %s" % _what(v))
    return v // _US


def _td_from(n):
    try:
        return _dt.timedelta(microseconds=n)
    except OverflowError:   # pragma: no cover (every i64 of microseconds fits)
        raise ConvError("%d microseconds is outside timedelta's range" % n) from None


def _iso(v):
    return v.isoformat()


def _from_iso(cls):
    def parse(v):
        return cls.fromisoformat(v) if isinstance(v, str) else v
    return parse


def _us_json(v):
    return v // _US


def _td_json_in(v):
    return _dt.timedelta(microseconds=v) if type(v) is int else v


DATETIME = Mapped(i64, "datetime", ("datetime",), _dt_to, _dt_from, _from_iso(_dt.datetime),
                  _iso)
DATE = Mapped(i32, "date", ("date",), _date_to, _date_from, _from_iso(_dt.date), _iso)
TIMEDELTA = Mapped(i64, "timedelta", ("timedelta",), _td_to, _td_from, _td_json_in, _us_json)


# --- UUID and Decimal ----------------------------------------------------------

def _uuid_to(v):
    if not isinstance(v, _uuid.UUID):
        raise ConvError("expected a UUID, got %s" % _what(v))
    return v.bytes


def _uuid_from(b):
    if len(b) != 16:
        raise ConvError("a UUID is 16 bytes, not %d" % len(b))
    return _uuid.UUID(bytes=b)


def _uuid_json_in(v):
    return _uuid.UUID(v) if isinstance(v, str) else v


_DECIMAL = re.compile(r"[+-]?(?:(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?"
                      r"|Infinity|Inf|s?NaN[0-9]*)\Z", re.IGNORECASE)


def _dec_to(v):
    if not isinstance(v, _decimal.Decimal):
        hint = " (a float is not exact: pass Decimal(str(x)))" if isinstance(v, float) else ""
        raise ConvError("expected a Decimal, got %s%s" % (_what(v), hint))
    return str(v)


def _dec_from(s):
    if not _DECIMAL.match(s):
        raise ConvError("%r is not a decimal number" % (s[:40],))
    return _decimal.Decimal(s)


def _dec_json_in(v):
    return _decimal.Decimal(v) if isinstance(v, (str, int)) and type(v) is not bool else v


UUID = Mapped(bytes_, "UUID", ("uuid",), _uuid_to, _uuid_from, _uuid_json_in, str)
DECIMAL = Mapped(str_, "Decimal", ("decimal",), _dec_to, _dec_from, _dec_json_in, str)

# the classes mapped as they are (an Annotated cannot change their wire type)
BY_CLASS = {_dt.datetime: DATETIME, _dt.date: DATE, _dt.timedelta: TIMEDELTA,
            _uuid.UUID: UUID, _decimal.Decimal: DECIMAL}
