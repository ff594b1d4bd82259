"""Saving torch state dicts: shared tensors found and stored once."""

from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Tuple

import kiln
from kiln import EncodeError

from ._common import ALIASES_KEY, PathLike, torch_module as _torch

if TYPE_CHECKING:
    import torch

__all__ = ["shared_names", "save_file"]


def _span(t: Any) -> Tuple[int, int]:
    """The bytes [lo, hi) a strided tensor's elements cover."""
    lo = t.data_ptr()
    extent = 1 + sum((n - 1) * abs(s) for n, s in zip(t.shape, t.stride()))
    return lo, lo + extent * t.element_size()


def shared_names(torch: Any, tensors: Mapping[str, Any]) -> Tuple[Dict[str, Any], Dict[str, str]]:
    """(the tensors to store, {alias: stored name}): the names of one tensor
    (same memory, shape, strides and dtype) become aliases of the first in
    sorted order; ``EncodeError`` naming both for any other overlap."""
    store: Dict[str, Any] = {}
    aliases: Dict[str, str] = {}
    by_storage: Dict[int, List[str]] = {}
    for name in tensors:
        if not isinstance(name, str):
            raise EncodeError("TYPE", 0, "state_dict key %r is not a str" % (name,))
    for name in sorted(tensors):
        t = tensors[name]
        if not isinstance(t, torch.Tensor):
            raise EncodeError("TYPE", 0, "state_dict[%r] is %s, not a torch.Tensor"
                              % (name, type(t).__name__))
        if t.numel() == 0 or t.device.type == "meta" or t.layout != torch.strided:
            store[name] = t   # no memory to share (or refused when stored)
            continue
        key = t.untyped_storage().data_ptr()
        same = None
        for other in by_storage.get(key, ()):
            u = tensors[other]
            if (u.data_ptr(), u.shape, u.stride(), u.dtype, u.device) == \
                    (t.data_ptr(), t.shape, t.stride(), t.dtype, t.device):
                same = other
                break
            (a, b), (c, d) = _span(t), _span(u)
            if a < d and c < b:
                raise EncodeError("TYPE", 0, "tensors %r and %r share memory but are not the "
                                  "same tensor (one is a view of the other): store a .clone() "
                                  "of one" % (other, name))
        if same is not None:
            aliases[name] = same
            continue
        by_storage.setdefault(key, []).append(name)
        store[name] = t
    return store, aliases


def save_file(state_dict: Mapping[str, "torch.Tensor"], path: PathLike,
              metadata: Optional[Dict[str, Any]] = None, *, checksum: bool = False) -> None:
    """Write a state dict (name -> ``torch.Tensor``) to a Kiln tensor file.

    Tensors on another device than the CPU are copied to it first, and a
    non-contiguous tensor is copied once into C order; a contiguous CPU
    tensor is written straight from its memory.  Shared tensors are stored
    once (see the module doc).  The file is replaced atomically.

    Args:
        state_dict: a mapping of str name to tensor (``model.state_dict()``).
        path: the file to write.
        metadata: a dict as :func:`kiln.save_tensors` takes it (values of any
            Kiln kind, not only str); the key ``__kiln_torch_aliases__`` is
            reserved.
        checksum: record a CRC-32 of every payload (see :func:`kiln.save_tensors`).

    Raises:
        EncodeError: a value that is not a tensor, a dtype with no Kiln twin
            (complex, the ``fnuz`` float8 kinds), a quantized or sparse
            tensor, or two tensors that partly overlap, naming the tensor;
            the reserved metadata key.
        ImportError: torch is not installed.

    Example:
        >>> kiln.torch.save_file({"w": torch.ones(2, dtype=torch.bfloat16)}, "model.kiln")
        >>> kiln.torch.load_file("model.kiln")["w"]
        tensor([1., 1.], dtype=torch.bfloat16)
    """
    torch = _torch()
    if not isinstance(state_dict, Mapping):
        raise EncodeError("TYPE", 0, "state_dict must be a mapping of name to tensor, not %s"
                          % type(state_dict).__name__)
    store, aliases = shared_names(torch, state_dict)
    for name, t in store.items():
        if t.device.type not in ("cpu", "meta"):
            store[name] = t.detach().cpu()
    if metadata is not None and ALIASES_KEY in metadata:
        raise EncodeError("TYPE", 0, "the metadata key %r is reserved for kiln.torch"
                          % ALIASES_KEY)
    if aliases:
        metadata = dict(metadata or {})
        metadata[ALIASES_KEY] = aliases
    kiln.save_tensors(path, store, metadata=metadata, checksum=checksum)


