"""Tied names: one stored tensor under several names.

The alias map (alias -> stored name) is kept in one of two places, each under
its own reserved key:

* :data:`SET_ALIASES_KEY` (``"__kiln_aliases__"``), in a sharded set's index
  metadata (:func:`kiln.save_sharded`, :class:`kiln.ShardedFile`);
* :data:`FILE_ALIASES_KEY` (``"__kiln_torch_aliases__"``), in one file's
  metadata (``kiln.torch.save_file``, and ``kiln convert`` of a set into one
  ``.kiln`` file).

:func:`alias_fault` is the one rule both places are checked by, on write and
on read; :func:`same_memory_key` is the one rule for "two values are one
tensor" that the writers use to find tied names.
"""

import sys
from typing import Any, Collection, Optional

from .. import _meta

__all__ = ["SET_ALIASES_KEY", "FILE_ALIASES_KEY", "alias_fault", "same_memory_key"]

SET_ALIASES_KEY = "__kiln_aliases__"          # a set's index metadata: alias -> stored name
FILE_ALIASES_KEY = "__kiln_torch_aliases__"   # one file's metadata: alias -> stored name


def alias_fault(found: Any, stored: Collection[str]) -> Optional[str]:
    """None when ``found`` is a valid alias map for the stored names ``stored``
    (a set or dict: membership is all it is asked), else what is wrong with it,
    the first bad entry named.  Valid: a dict whose every key is a non-empty
    ``str``, not the reserved metadata name and not a stored name, and whose
    every value is a ``str`` that is a stored name (an alias names a stored
    tensor, never another alias)."""
    if not isinstance(found, dict):
        return "is not an object of alias name to stored name (it is %s)" % type(found).__name__
    for alias, name in found.items():
        if not isinstance(alias, str) or alias in ("", _meta.META_NAME):
            return "maps %r, which is not a non-empty, unreserved name" % (alias,)
        if alias in stored:
            return "maps %r, a stored tensor's name, to %r" % (alias, name)
        if not isinstance(name, str) or name not in stored:
            return "maps %r to %r, which is not a stored tensor (an alias names a stored " \
                "tensor, never another alias)" % (alias, name)
    return None


def same_memory_key(x: Any) -> Any:
    """What makes two values one tensor, or None for a value that is never
    shared: a numpy array or a torch tensor (found through ``sys.modules``:
    torch is never imported here) is one tensor with another when both have
    the same memory address, shape, strides and dtype (and device); an empty
    one, a torch tensor on the meta device, not strided, or with its negation
    or conjugation bit set (stored as its resolved values) is never shared;
    any other object is one with itself only."""
    import numpy as np
    if type(x) is np.ndarray:
        if x.size == 0:
            return None
        return ("numpy", x.__array_interface__["data"][0], x.shape, x.strides, x.dtype.str)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        if x.numel() == 0 or x.device.type == "meta" or x.layout != torch.strided or \
                x.is_neg() or x.is_conj():
            return None
        return ("torch", x.data_ptr(), tuple(x.shape), x.stride(), x.dtype, x.device)
    return ("object", id(x))
