"""What kiln takes as a tensor dtype: kiln's names ("f32"), codes, numpy
dtypes and types (np.float32, ml_dtypes.bfloat16) and numpy's names
("float32"); and the dtype code of a numpy dtype."""

import sys

import numpy as np

from . import _wire as W
from ._wire import DTYPE_CODES

DTYPE_NAMES = {c: d[0] for c, d in W.DTYPES.items()}
_ML_NAMES = {c: d[3] for c, d in W.DTYPES.items() if d[3] is not None}


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
        for code, nm in _ML_NAMES.items():
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
