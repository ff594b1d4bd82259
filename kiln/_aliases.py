"""Annotation aliases that type checkers accept and kiln reads as Kiln types.

``kiln.list_(kiln.f32)`` works as an annotation at run time, but a call is not
a type to mypy or pyright.  These aliases are: a field ``values: kiln.F32Array``
is a ``numpy.ndarray`` of float32 to a type checker and ``list<f32>`` to kiln;
``count: kiln.I32`` is an ``int`` to a type checker and ``i32`` to kiln.
"""

from typing import Annotated

import numpy as np
import numpy.typing as npt

from ._types import bool_, f32, f64, i8, i16, i32, i64, u8, u16, u32, u64

# scalars with a width
I8 = Annotated[int, i8]
I16 = Annotated[int, i16]
I32 = Annotated[int, i32]
I64 = Annotated[int, i64]
U8 = Annotated[int, u8]
U16 = Annotated[int, u16]
U32 = Annotated[int, u32]
U64 = Annotated[int, u64]
F32 = Annotated[float, f32]
F64 = Annotated[float, f64]
Bool = Annotated[bool, bool_]

# lists of numbers that decode to numpy arrays
I8Array = npt.NDArray[np.int8]
I16Array = npt.NDArray[np.int16]
I32Array = npt.NDArray[np.int32]
I64Array = npt.NDArray[np.int64]
U8Array = npt.NDArray[np.uint8]
U16Array = npt.NDArray[np.uint16]
U32Array = npt.NDArray[np.uint32]
U64Array = npt.NDArray[np.uint64]
F32Array = npt.NDArray[np.float32]
F64Array = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]

__all__ = ["I8", "I16", "I32", "I64", "U8", "U16", "U32", "U64", "F32", "F64", "Bool",
           "I8Array", "I16Array", "I32Array", "I64Array", "U8Array", "U16Array", "U32Array",
           "U64Array", "F32Array", "F64Array", "BoolArray"]
