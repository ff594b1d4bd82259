"""What the kernels call for a ``tensors`` value (``plan.tensors``): ``HOOKS``."""

import numpy as np

from .._wire import R_BYTE_LENGTH, R_BYTE_OFFSET
from .directory import TensorDirectory
from .dtypes import _dtype_code_of_numpy
from .records import _LE_ORDERS, normalize_tensors


class _Hooks:
    """What the kernels call for a ``tensors`` value (plan.tensors)."""

    @staticmethod
    def build(mv, start, base, table, copy, trusted):
        """Wrap a checked table: views of ``mv``, or one owned copy of the payloads."""
        errors = "surrogateescape" if trusted else "strict"
        pb = start + base
        if not copy:
            return TensorDirectory._from_table(table, mv.toreadonly(), pb, errors)
        end = 0
        for row in table:
            e = row[R_BYTE_OFFSET] + row[R_BYTE_LENGTH]
            if e > end:
                end = e
        # every payload written once, into storage the directory owns
        owned = np.empty(end, np.uint8)
        if end:
            owned[:] = mv[pb:pb + end]
        owned.flags.writeable = False
        return TensorDirectory._from_table(table, owned, 0, errors)

    @staticmethod
    def normalize(value):
        return normalize_tensors(value)

    @staticmethod
    def fast_code(dt):
        """(code, itemsize) when an array of numpy dtype ``dt`` that is C-contiguous
        would get a plain write record from normalize_tensors (_array_record),
        else None: the compiled kernels then describe such arrays themselves."""
        try:
            if not isinstance(dt, np.dtype) or dt.byteorder not in _LE_ORDERS or \
                    dt.itemsize == 0:
                return None
            memoryview(np.empty(1, dt)).cast("B")
            return _dtype_code_of_numpy(dt), dt.itemsize
        except (TypeError, ValueError, NotImplementedError):
            return None


HOOKS = _Hooks()
