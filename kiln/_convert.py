"""Conversions both kernels share: buffers in, Python values to wire runs.

This module sits beside the kernels (it imports only the wire constants and
the errors), so the compiled kernel can use it without importing the pure one.

The rule for a list of fixed-width numbers (``as_pod_array``): an item is
accepted exactly when a scalar field of the element type accepts it.  Integer
elements take ints, bools, numpy integers and anything with ``__index__``, in
range; float elements take anything with ``__float__`` or ``__index__`` whose
value fits (an f32 that would overflow is refused); bool elements take only
``True``, ``False`` and numpy bools.  A numpy array is judged by its dtype
instead: integers (or bools) for integer elements, checked against the range;
numbers for float elements; bools for bool elements.

The rounding rule, one for every source (a scalar field, a list's items, a
numpy scalar or array, JSON Lines): a value written as ``f32`` or ``f64``
must be exactly the value given.  One that would change (0.1 as f32, an
integer past 2**24 as f32 or past 2**53 as f64, a float64 array's values as
f32) is refused with ``TYPE``, saying ``pass round_floats=True``; with
``round_floats=True`` it rounds to the nearest.  A finite value too large
for the element (a float64 past f32's range) is refused either way; NaN and
the infinities are written as they are.
"""

import numbers
import operator
import struct as _struct

import numpy as np

from . import _wire as W
from ._errors import EncodeError

class Inexact(ValueError):
    """A float field's value would change (raised by the exact packers)."""


def float_changed(v, stored):
    """Is ``stored`` (the float written for ``v``) another value than ``v``?
    Compared exactly: an integer as an integer, a numpy or other number as
    itself, anything else by what its ``__float__`` gives.  NaN is NaN."""
    if stored != stored:
        return False
    if type(v) is float or type(v) is int:
        return stored != v
    try:
        if isinstance(v, (np.integer, numbers.Integral)):
            return stored != operator.index(v)
        if isinstance(v, numbers.Number):
            return bool(stored != v)
    except (TypeError, ValueError):
        pass
    return stored != float(v)


def inexact_error(v, op, offset):
    """The EncodeError for a value a float field would change."""
    stored = _struct.unpack("<" + W.SCALAR_FORMAT[op][0],
                            _struct.pack("<" + W.SCALAR_FORMAT[op][0], v))[0]
    return EncodeError("TYPE", offset, "%s would change as %s (%r); pass round_floats=True "
                       "to round" % (short_repr(v), W.SCALAR_NAME[op], stored))


def pack_scalar(op, round_floats=True):
    """``pack(v) -> bytes`` for one non-bool scalar field: struct's conversions
    (``__index__`` for integers, ``__float__`` for floats), plus numpy's bool
    as an integer like Python's bool; raises struct.error and friends, and
    :class:`Inexact` for a float field's value that would change unless
    ``round_floats``."""
    pack = _struct.Struct("<" + W.SCALAR_FORMAT[op][0]).pack
    if op not in W.INT_RANGE:
        if round_floats:
            return pack
        unpack = _struct.Struct("<" + W.SCALAR_FORMAT[op][0]).unpack
        f64 = op == W.OP_F64

        def pack_exact(v):
            b = pack(v)
            if (type(v) is not float or not f64) and float_changed(v, unpack(b)[0]):
                raise Inexact()
            return b
        return pack_exact
    np_bool = np.bool_

    def pack_int(v):
        try:
            return pack(v)
        except _struct.error:
            if type(v) is np_bool:
                return pack(bool(v))
            raise
    return pack_int


_PACKERS = {(op, rf): pack_scalar(op, rf) for op in W.SCALAR_FORMAT if op != W.OP_BOOL
            for rf in (False, True)}


def as_bytes_view(buf):
    """A flat memoryview of format 'B' over ``buf`` (any C-contiguous buffer)."""
    mv = buf if type(buf) is memoryview else memoryview(buf)
    if mv.nbytes == 0:
        # an empty buffer is contiguous whatever its shape and strides say
        return memoryview(b"")
    if not mv.c_contiguous:
        raise TypeError("kiln needs a contiguous buffer")
    if mv.format != "B" or mv.ndim != 1 or mv.itemsize != 1:
        mv = mv.cast("B")
    return mv


def type_name(v):
    return type(v).__name__


def short_repr(v):
    try:
        r = repr(v)
    except ValueError:  # an int past sys.get_int_max_str_digits()
        return "an integer of %d bits" % v.bit_length()
    return r if len(r) <= 40 else r[:18] + "..." + r[-18:]


def scalar_error(v, op, text, offset):
    """The EncodeError for a value a scalar field of ``op`` refused."""
    if op == W.OP_BOOL:
        return EncodeError("TYPE", offset, "expected bool, got %s" % type_name(v))
    if op in W.INT_RANGE:
        lo, hi = W.INT_RANGE[op]
        try:
            iv = v.__index__() if not isinstance(v, int) else v
        except (AttributeError, TypeError):
            return EncodeError("TYPE", offset, "expected an integer for %s, got %s"
                               % (text, type_name(v)))
        return EncodeError("TYPE", offset, "%s does not fit %s (%d..%d)"
                           % (short_repr(iv), text, lo, hi))
    tp = type(v)
    if not (hasattr(tp, "__float__") or hasattr(tp, "__index__")):
        # a str such as "1.0" is not a number, whatever float() would make of it
        return EncodeError("TYPE", offset, "expected a float for %s, got %s"
                           % (text, type_name(v)))
    return EncodeError("TYPE", offset, "%s does not fit %s" % (short_repr(v), text))


def missing_field(v, names, offset):
    """The EncodeError for a mapping that did not give a struct field: the
    first of ``names`` it lacks now, or, when none is missing any more (code
    the mapping ran, or another thread, changed it meanwhile), that it changed."""
    try:
        for nm in names:
            if nm not in v:
                return EncodeError("TYPE", offset, "missing field %r" % nm)
    except Exception:  # noqa: BLE001 - its own __contains__ or a key's __eq__ failed
        pass
    return EncodeError("TYPE", offset, "the mapping changed while its fields were read")


def unknown_fields(v, key_set, text, offset):
    """The EncodeError for a mapping whose len() is not the struct's field
    count: its keys that are no field, sorted, from one snapshot of its keys
    (so a mapping changed meanwhile cannot break the walk), or that it changed."""
    try:
        extra = [k for k in list(v.keys()) if k not in key_set]
        try:
            extra.sort()
        except Exception:  # noqa: BLE001 - keys of mixed types
            extra.sort(key=repr)
        if extra:
            return EncodeError("TYPE", offset, "unknown fields %s for %s" % (extra, text))
    except Exception:  # noqa: BLE001 - changed size meanwhile, a key's __hash__ failed
        pass
    return EncodeError("TYPE", offset, "the mapping changed while its fields were read "
                       "(or its len() disagrees with its keys)")


def mapping_changed(offset, e):
    """A RuntimeError (a dict changed size during iteration) as an EncodeError."""
    return EncodeError("TYPE", offset, "the mapping changed while it was read (%s)" % e)


def count_lied(offset, c, gave):
    """A sequence gave a different number of items than its len() said."""
    return EncodeError("TYPE", offset, "len() said %d items but the sequence gave %s (it "
                       "changed length while encoding, or its len() is wrong)" % (c, gave))


def as_byte_run(v, offset):
    """The bytes of a ``list<u8>`` value: bytes-like objects, 1-D uint8 arrays, int lists."""
    t = type(v)
    if t is bytes or t is bytearray:
        return v
    if t is memoryview or isinstance(v, (bytes, bytearray, memoryview)):
        mv = memoryview(v)
        if not mv.c_contiguous:
            raise EncodeError("TYPE", offset, "memoryview is not contiguous")
        if mv.itemsize != 1:
            raise EncodeError("TYPE", offset, "memoryview items are not bytes")
        return mv.cast("B") if mv.format != "B" else mv
    if isinstance(v, np.ndarray):
        if v.ndim != 1 or v.dtype != np.uint8:
            raise EncodeError("TYPE", offset, "list<u8> takes a 1-D uint8 array, got %s %s"
                              % (v.dtype, v.shape))
        return memoryview(np.ascontiguousarray(v)).cast("B")
    if isinstance(v, (list, tuple)):
        try:
            return bytes(v)
        except (ValueError, TypeError):
            # item by item with the scalar u8 rule: it accepts, or names the bad item
            arr = _item_run(list(v), W.OP_U8, np.dtype("|u1"), "list<u8>", offset)
            return memoryview(arr).cast("B")
    raise EncodeError("TYPE", offset, "expected bytes for list<u8>, got %s" % type_name(v))


_NOT_SEQUENCES = (str, bytes, bytearray, dict, set, frozenset)


def as_pod_array(v, op, offset=0, round_floats=False):
    """A contiguous little-endian 1-D array of the wire dtype of ``op`` (see module doc).

    Raises EncodeError for a wrong kind, a wrong shape or a value out of
    range; never wraps or truncates silently.
    """
    le = np.dtype(W.NUMPY_LE[op])
    text = "list<%s>" % _ELEM_TEXT[op]
    if isinstance(v, np.ndarray):
        return _array_run(v, op, le, text, offset, round_floats)
    if isinstance(v, _NOT_SEQUENCES) or not hasattr(v, "__len__") or \
            not hasattr(v, "__getitem__"):
        raise EncodeError("TYPE", offset, "expected a sequence of numbers for %s, got %s"
                          % (text, type_name(v)))
    # one snapshot of the items: code run while they are converted (an
    # __index__, another thread) cannot change what is encoded
    items = list(v)
    try:
        arr = np.asarray(items)
    except (ValueError, TypeError, OverflowError):
        arr = None
    if arr is not None and arr.ndim == 1 and _plain_kind(arr.dtype, op) and not (
            # numpy makes mixed or huge ints floats: judged item by item then
            arr.dtype.kind == "f" and not round_floats
            and any(type(x) is not float for x in items)):
        return _array_run(arr, op, le, text, offset, round_floats, True)
    return _item_run(items, op, le, text, offset, round_floats)


_ELEM_TEXT = W.SCALAR_NAME


def _plain_kind(dt, op):
    """Would numpy's conversion of Python items match the scalar rule exactly?"""
    if op == W.OP_BOOL:
        return dt.kind == "b"
    if op in W.INT_RANGE:
        return dt.kind in "iub"
    return dt.kind in "iubf"


def _item_run(items, op, le, text, offset, round_floats=False):
    """Convert item by item with the scalar rule (mixed or unusual items)."""
    out = bytearray()
    if op == W.OP_BOOL:
        np_bool = np.bool_
        for i, x in enumerate(items):
            if x is True or x is False or type(x) is np_bool:
                out.append(1 if x else 0)
            else:
                e = scalar_error(x, op, "bool", offset)
                e.add_path("[%d]" % i)
                raise e
    else:
        pack = _PACKERS[op, bool(round_floats)]
        for i, x in enumerate(items):
            try:
                out += pack(x)
            except Inexact:
                e = inexact_error(x, op, offset)
                e.add_path("[%d]" % i)
                raise e from None
            except (_struct.error, TypeError, OverflowError, ValueError):
                e = scalar_error(x, op, _ELEM_TEXT[op], offset)
                e.add_path("[%d]" % i)
                raise e from None
    return np.frombuffer(bytes(out), le)


def _array_changed(arr, out, changed, op, offset, items):
    i = int(np.argmax(changed))
    x = arr[i].item()
    where = "" if items else " in a %s array" % arr.dtype   # (items: a list's, as given)
    e = EncodeError("TYPE", offset, "%s%s would change as %s (%r); pass round_floats=True "
                    "to round" % (short_repr(x), where, _ELEM_TEXT[op], float(out[i])))
    e.add_path("[%d]" % i)
    return e


def describe_dtype(dt):
    """A numpy dtype in the user's terms ("an array of str", "a float64 array")."""
    words = {"U": "an array of str", "S": "an array of bytes", "O": "an array of objects",
             "V": "an array of records", "M": "an array of datetimes",
             "m": "an array of timedeltas", "c": "a complex array"}
    return words.get(dt.kind, "a %s array" % dt.name)


def _array_run(arr, op, le, text, offset, round_floats, items=False):
    """Judge an ndarray by its dtype (see module doc)."""
    if arr.ndim != 1:
        raise EncodeError("TYPE", offset, "%s takes a 1-D array, got shape %s"
                          % (text, arr.shape))
    if arr.dtype == le:
        return np.ascontiguousarray(arr)
    kind = arr.dtype.kind
    if arr.size == 0 and kind in "fiub":
        return np.empty(0, le)
    if op == W.OP_BOOL:
        if kind != "b":
            raise EncodeError("TYPE", offset, "%s takes a bool array, got %s"
                              % (text, describe_dtype(arr.dtype)))
    elif op in W.INT_RANGE:
        if kind not in "iub":
            raise EncodeError("TYPE", offset, "%s takes an integer array, got %s"
                              % (text, describe_dtype(arr.dtype)))
        if not np.can_cast(arr.dtype, le, "safe"):
            lo, hi = W.INT_RANGE[op]
            mn = int(arr.min())
            mx = int(arr.max())
            if mn < lo or mx > hi:
                bad = mn if mn < lo else mx
                raise EncodeError("TYPE", offset, "%d does not fit %s (%d..%d)"
                                  % (bad, _ELEM_TEXT[op], lo, hi))
    else:
        if kind not in "fiub":
            raise EncodeError("TYPE", offset, "%s takes a numeric array, got %s"
                              % (text, describe_dtype(arr.dtype)))
        if kind == "f" and arr.dtype.itemsize > le.itemsize:
            with np.errstate(over="ignore", invalid="ignore"):
                out = arr.astype(le)
                if not np.array_equal(np.isfinite(out), np.isfinite(arr)):
                    raise EncodeError("TYPE", offset, "a value overflows %s" % _ELEM_TEXT[op])
                if not round_floats:
                    changed = (out.astype(arr.dtype) != arr) & ~np.isnan(arr)
                    if changed.any():
                        raise _array_changed(arr, out, changed, op, offset, items)
            return out
        if kind in "iu" and not round_floats and arr.size and \
                8 * arr.dtype.itemsize - (kind == "i") > (24 if op == W.OP_F32 else 53):
            # an integer past the element's 24 or 53 bits of mantissa may round
            out = arr.astype(le)
            top = 2.0 ** (8 * arr.dtype.itemsize - (kind == "i"))
            with np.errstate(over="ignore", invalid="ignore"):
                big = out >= top   # rounded up past the integer type: changed
                back = np.where(big, 0, out).astype(arr.dtype)
            changed = big | (back != arr)
            if changed.any():
                raise _array_changed(arr, out, changed, op, offset, items)
            return out
    return np.ascontiguousarray(arr, dtype=le)
