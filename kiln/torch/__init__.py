"""PyTorch state dicts as Kiln tensor files: ``save_file``, ``load_file`` and
``load_model``, the calls ``safetensors.torch`` users type, and ``safe_open``
(``safetensors.safe_open(path, framework="pt")``'s calls).

torch is imported when one of them is first called, never by ``import kiln``
nor by ``import kiln.torch``; it is not in any of kiln's extras (install it
as PyTorch says).  The files are plain Kiln tensor files: any Kiln reader
(``kiln.open``, ``kiln.load_tensors``, ``kiln inspect``) reads them.

- Every torch dtype with a Kiln twin is stored bit for bit, bf16 and the
  float8 kinds included (no ml_dtypes needed); see ``kiln._tensors.foreign``.
- ``load_file`` hands out CPU tensors that view the file's copy-on-write
  mapping with no copy: an in-place change (``x.add_(1)``) changes this
  process's private copy of those pages, never the file.
- Shared tensors (tied weights: two names for the same memory, the same
  shape, strides and dtype) are stored once, under the first of their names
  in sorted order, and the other names are recorded in the metadata under
  the reserved key ``__kiln_torch_aliases__`` (alias name -> stored name);
  ``load_file`` gives every name back, the aliases as the same tensor
  object, and ``load_model`` fills both.  Two tensors that overlap in memory
  any other way (a slice of another) are refused naming both: store a
  ``.clone()``.  Views of one storage that do not overlap are stored as
  separate tensors (their values, not their common storage).
"""

from ._common import ALIASES_KEY, IncompatibleKeys, LoadError, safetensors_names as _st
from ._save import save, save_file, save_model, save_sharded, shared_names
from ._load import load, load_file, load_model

# safetensors.torch's keyword names, where they mean what kiln's do
save_file = _st(tensors="state_dict", filename="path")(save_file)
save_model = _st(filename="path")(save_model)
load_file = _st(filename="path")(load_file)
load_model = _st(filename="path")(load_model)
from ._safe_open import SafeSlice, safe_open
from ._collate import collate, to_torch
from ._pipeline import release

__all__ = ["save_file", "save_model", "save_sharded", "save", "load_file", "load_model",
           "load", "IncompatibleKeys", "LoadError", "ALIASES_KEY", "shared_names", "safe_open",
           "SafeSlice", "collate", "to_torch", "release"]
