"""Tensor dtypes: what kiln takes as a dtype, and the numpy dtype of each.

kiln takes its own names ("f32"), codes, numpy dtypes and types (np.float32,
ml_dtypes.bfloat16) and numpy's names ("float32"); :func:`numpy_dtype` gives
the numpy dtype ``Tensor.numpy()`` uses.  ml_dtypes (optional extra
``kiln-wire[ml]``) is imported the first time a tensor of one of its dtypes
becomes an array (:func:`ml_dtypes`); an array of its dtypes to encode means
something imported it already (``sys.modules``).
"""

import sys
from typing import Any

import numpy as np

from .. import _wire as W
from .._wire import DTYPE_CODES, PACKED

DTYPE_NAMES = {c: d[0] for c, d in W.DTYPES.items()}
_ML_NAMES = {c: d[3] for c, d in W.DTYPES.items() if d[3] is not None}
# the 4-bit dtypes' ml_dtypes types: one element per byte (the value in the low
# nibble), so Tensor.numpy() of a packed tensor is an unpacked copy
_ML_PACKED = {DTYPE_CODES["i4"]: "int4", DTYPE_CODES["u4"]: "uint4",
              DTYPE_CODES["e2m1"]: "float4_e2m1fn"}
assert set(_ML_PACKED) == PACKED
WIDTH = {c: d[1] for c, d in W.DTYPES.items()}


def _code_of(dtype):
    """The dtype code of kiln's name ("f32"), an int code, a numpy dtype or
    type (np.float32, np.dtype("<f4"), ml_dtypes.bfloat16) or numpy's name
    ("float32", "bfloat16").  Kiln's names come first: "i4" is kiln's 4-bit
    integer, not numpy's int32 (numpy's short codes are not taken)."""
    if isinstance(dtype, str):
        code = DTYPE_CODES.get(dtype)
        if code is None:
            code = _NUMPY_NAMES.get(dtype)
        if code is None:
            raise ValueError("unknown tensor dtype %r (kiln's names: %s; or a numpy dtype, "
                             "or its name such as 'float32')" % (dtype, ", ".join(DTYPE_CODES)))
        return code
    if isinstance(dtype, bool) or dtype is None:
        raise TypeError("dtype must be a name, an int code or a numpy dtype, not %r" % (dtype,))
    if not isinstance(dtype, int):
        try:
            dt = np.dtype(dtype)
        except TypeError:
            raise TypeError("dtype must be a name, an int code or a numpy dtype, not %r"
                            % (dtype,)) from None
        if dt.byteorder == ">" or (dt.byteorder == "=" and sys.byteorder == "big"):
            raise ValueError("numpy dtype %s is big-endian; Kiln tensors are little-endian "
                             "(pass %s)" % (dt.str, dt.newbyteorder("<").str))
        try:
            return _dtype_code_of_numpy(dt)
        except TypeError as e:
            raise ValueError(str(e)) from None
    if dtype in DTYPE_NAMES or W.OPAQUE_MIN <= dtype <= W.OPAQUE_MAX:
        return dtype
    raise ValueError("dtype code %d is neither 1..%d nor an opaque code %d..%d"
                     % (dtype, W.DTYPE_MAX, W.OPAQUE_MIN, W.OPAQUE_MAX))


# numpy's dtype names (and ml_dtypes' names) of the dtypes with a twin
_NUMPY_NAMES = {np.dtype(d[2]).name: c for c, d in W.DTYPES.items()
                if d[3] is None and d[1] != 0}
_NUMPY_NAMES.update({d[3]: c for c, d in W.DTYPES.items() if d[3] is not None})


_CODE_BY_DTYPE = {}


def _dtype_code_of_numpy(dt):
    code = _CODE_BY_DTYPE.get(dt)
    if code is None:
        code = _CODE_BY_DTYPE[dt] = _dtype_code_lookup(dt)
    return code


def _dtype_code_lookup(dt):
    dt = np.dtype(dt)
    ml = sys.modules.get("ml_dtypes")   # (an array of its dtypes means it is imported)
    if ml is not None:
        for code, nm in list(_ML_NAMES.items()) + list(_ML_PACKED.items()):
            t = getattr(ml, nm, None)
            if t is not None and dt == np.dtype(t):
                return code
    code = _CODE_BY_KIND.get((dt.kind, dt.itemsize))
    if code is None:
        raise TypeError("no Kiln tensor dtype for numpy dtype %s" % dt)
    return code


# (numpy kind, itemsize) -> dtype code, for the dtypes with a plain numpy twin
_CODE_BY_KIND = {(np.dtype(d[2]).kind, np.dtype(d[2]).itemsize): c
                 for c, d in W.DTYPES.items() if d[3] is None and d[1] != 0}


_ml: Any = None   # ml_dtypes once imported, False when it is not installed
# whole-element dtype code -> numpy dtype: the dtypes whose arrays are views
# (handed to the kernel's tensor_setup, which keeps this dict; ml_dtypes()
# extends it in place when ml_dtypes arrives)
SHAPED = {}


def ml_dtypes() -> Any:
    """ml_dtypes, imported now if need be, or None when it is not installed."""
    global _ml
    if _ml is None:
        try:
            import ml_dtypes as ml
        except ImportError:  # pragma: no cover - depends on the environment
            ml = False
        _ml = ml
        SHAPED.update(_shaped_dtypes())
    return _ml or None


def ml_name(code):
    """The ml_dtypes type name of a dtype numpy has no type for, else None."""
    return _ML_NAMES.get(code) or _ML_PACKED.get(code)


def numpy_dtype(code: Any) -> np.dtype:
    """The numpy dtype :meth:`Tensor.numpy` uses for a dtype code.

    Args:
        code: a Kiln dtype code (1..19, or an opaque code 4096..32767), or a
            dtype as :class:`Tensor` takes it (``"bf16"``, ``"float32"``).

    Returns:
        numpy.dtype: little-endian for the plain numbers; an ``ml_dtypes``
        type for bf16, the float8 types and the 4-bit types (``int4``,
        ``uint4``, ``float4_e2m1fn``, one element per byte); ``uint8`` for
        the opaque dtypes (the raw bytes).

    Raises:
        ImportError: a bf16, float8 or 4-bit code when ml_dtypes is not
            installed (``pip install kiln-wire[ml]``; :meth:`Tensor.bits`
            reads the raw bits).

    Example:
        >>> kiln.numpy_dtype(2), kiln.numpy_dtype(4096)
        (dtype('float32'), dtype('uint8'))
    """
    if not isinstance(code, int) or isinstance(code, bool):
        code = _code_of(code)
    name = ml_name(code)
    if name is not None:
        ml = ml_dtypes()
        if ml is None or not hasattr(ml, name):
            raise no_ml(code)
        return np.dtype(getattr(ml, name))
    return bits_dtype(code)


def no_ml(code, name=None):
    """The ImportError of a dtype numpy has no type for, without ml_dtypes."""
    what = "%s tensor%s" % (DTYPE_NAMES[code], "" if name is None else " %r" % (name,))
    bits = "packed bytes (two 4-bit elements per byte) as uint8" if code in PACKED else \
        "bit patterns as %s" % np.dtype(W.DTYPES[code][2]).name
    return ImportError("%s: numpy has no %s dtype and ml_dtypes %s; install it with "
                       "pip install 'kiln-wire[ml]', or call Tensor.bits() for the raw %s"
                       % (what, DTYPE_NAMES[code],
                          "is not installed" if _ml is False else "lacks it", bits))


def bits_dtype(code):
    """The unsigned integers (or raw bytes) holding a dtype's bit patterns."""
    if code in W.DTYPES:
        return np.dtype(W.DTYPES[code][2])
    return np.dtype("|u1")  # an opaque dtype: the raw bytes


def element_count(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def _shaped_dtypes():
    out = {}
    for code in W.DTYPES:
        if code in PACKED or (code in _ML_NAMES and not _ml):
            continue   # (ml_dtypes' codes: once ml_dtypes() has found it)
        dt = numpy_dtype(code)
        if code in _ML_NAMES and (dt.kind == "V" or sys.byteorder == "big") and dt.itemsize > 1:
            continue  # host-ordered ml_dtypes need the slow path on big-endian hosts
        out[code] = dt
    return out


SHAPED.update(_shaped_dtypes())
