"""The tensor layer's old single-module path, kept importable.

The tensor layer lives in the package ``kiln._tensors``.  Pickles of a
``Tensor`` or ``TensorDirectory`` made before the split name their
reconstructors here (``kiln._tensor._rebuild_tensor``,
``kiln._tensor._rebuild_directory``), so they still load; the other names
are those other modules imported from here before the split.  New code
imports from ``kiln._tensors``.
"""

from ._tensors import HOOKS, Tensor, TensorDirectory, normalize_tensors, numpy_dtype, \
    pack_nibbles, unpack_nibbles
from ._tensors.directory import _raw_names, _rebuild_directory
from ._tensors.dtypes import DTYPE_NAMES, _code_of, _dtype_code_of_numpy, element_count
from ._tensors.tensor import _rebuild_tensor

__all__ = ["Tensor", "TensorDirectory", "unpack_nibbles", "pack_nibbles", "numpy_dtype",
           "HOOKS", "normalize_tensors", "DTYPE_NAMES", "element_count", "_raw_names",
           "_code_of", "_dtype_code_of_numpy", "_rebuild_tensor", "_rebuild_directory"]
