"""The standard library's value types carried by a wire type: ``datetime``,
``date``, ``timedelta``, ``uuid.UUID`` and ``decimal.Decimal`` (see
:mod:`kiln._pyconv`; imported on first use, so ``import kiln`` imports
neither uuid nor decimal)."""

import datetime as _dt
import decimal as _decimal
import re
import uuid as _uuid

from ._plan import ConvError
from ._typemodel import Mapped, bytes_, i32, i64, str_


def _what(v):
    return type(v).__name__


# --- dates and times ------------------------------------------------------------

_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.timezone.utc)
_EPOCH_DAY = _dt.date(1970, 1, 1).toordinal()
_US = _dt.timedelta(microseconds=1)
# the microseconds from the epoch a reader can give back as an aware datetime
_DT_MIN_US = (_dt.datetime.min.replace(tzinfo=_dt.timezone.utc) - _EPOCH) // _US
_DT_MAX_US = (_dt.datetime.max.replace(tzinfo=_dt.timezone.utc) - _EPOCH) // _US


def _dt_to(v):
    if not isinstance(v, _dt.datetime):
        raise ConvError("expected a datetime, got %s" % _what(v))
    if v.tzinfo is None or v.utcoffset() is None:
        raise ConvError("datetime %s is naive: kiln writes instants in UTC, give it a tzinfo "
                        "(datetime.timezone.utc for UTC)" % v.isoformat())
    n = (v - _EPOCH) // _US
    if not _DT_MIN_US <= n <= _DT_MAX_US:   # written, it could never be read back
        raise ConvError("datetime %s is in UTC outside datetime's range (years 1 to 9999): "
                        "kiln writes instants in UTC and reads them back as such"
                        % v.isoformat())
    return n


def _dt_from(n):
    try:
        return _EPOCH + _dt.timedelta(0, 0, n)   # (positional: faster)
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
        if not isinstance(v, str):
            return v
        try:
            return cls.fromisoformat(v)
        except ValueError as e:
            raise ConvError("%r is not an ISO 8601 %s (%s)" % (v[:40], cls.__name__, e)) from None
    return parse


def _us_json(v):
    return v // _US


def _td_json_in(v):
    if type(v) is not int:
        return v
    try:
        return _dt.timedelta(microseconds=v)
    except OverflowError:
        raise ConvError("%d microseconds is outside timedelta's range" % v) from None


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
    if not isinstance(v, str):
        return v
    try:
        return _uuid.UUID(v)
    except ValueError:
        raise ConvError("%r is not a UUID" % (v[:40],)) from None


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
    return _decimal_of(s)


def _decimal_of(v):
    try:
        return _decimal.Decimal(v)
    except (ArithmeticError, ValueError):   # decimal.InvalidOperation: an exponent past
        raise ConvError("%r is not a decimal number Python's Decimal can hold"
                        % (str(v)[:40],)) from None


def _dec_json_in(v):
    if isinstance(v, str) and not _DECIMAL.match(v):
        raise ConvError("%r is not a decimal number" % (v[:40],))
    return _decimal_of(v) if isinstance(v, (str, int)) and type(v) is not bool else v


UUID = Mapped(bytes_, "UUID", ("uuid",), _uuid_to, _uuid_from, _uuid_json_in, str)
DECIMAL = Mapped(str_, "Decimal", ("decimal",), _dec_to, _dec_from, _dec_json_in, str)

# the classes mapped as they are (kiln._pyconv.by_class)
BY_CLASS = {_dt.datetime: DATETIME, _dt.date: DATE, _dt.timedelta: TIMEDELTA,
            _uuid.UUID: UUID, _decimal.Decimal: DECIMAL}
