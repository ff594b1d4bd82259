"""``kiln.torch.collate``: a ``DataLoader`` ``collate_fn`` for records that
hold Kiln tensors, which torch's ``default_collate`` does not know."""

import dataclasses
from typing import Any, Callable, List, Mapping, Optional, Sequence

import kiln

from ._common import dtype_of, torch_module, torch_view

__all__ = ["collate", "to_torch"]


def to_torch(value: Any) -> Any:
    """``value`` with every :class:`kiln.Tensor` in it made a torch tensor
    (a copy that owns its memory), walked through as ``default_collate``
    walks a batch: a :class:`kiln.TensorDirectory` or another mapping
    becomes a ``dict``, a dataclass instance the ``dict`` of its fields, a
    named tuple stays one, a list or tuple stays one; anything else is kept.

    Raises:
        KilnError: ``TYPE`` for a tensor whose dtype torch has none for
            (``i4``, ``u4``, opaque; see :func:`kiln.torch.load_file`).
    """
    return _walk(torch_module(), value)


def _walk(torch: Any, v: Any) -> Any:
    if isinstance(v, kiln.Tensor):
        dt = dtype_of(torch, str(v.dtype))
        if dt is None:
            raise kiln.KilnError("TYPE", 0, "tensor %r is %s, which torch has no dtype for"
                                 % (v.name, v.dtype))
        return torch_view(torch, v, dt).clone()
    if isinstance(v, (kiln.TensorDirectory, Mapping)):
        return {k: _walk(torch, x) for k, x in v.items()}
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return {f.name: _walk(torch, getattr(v, f.name)) for f in dataclasses.fields(v)}
    if isinstance(v, tuple) and hasattr(v, "_fields"):   # a named tuple
        return type(v)(*(_walk(torch, x) for x in v))
    if isinstance(v, (list, tuple)):
        return type(v)(_walk(torch, x) for x in v)
    return v


def collate(batch: Sequence[Any], collate_fn: Optional[Callable[[List[Any]], Any]] = None
            ) -> Any:
    """Collate a batch of records as ``torch.utils.data.default_collate``
    does, their Kiln tensors first made torch tensors (see :func:`to_torch`):
    pass it as a ``DataLoader``'s ``collate_fn``.

    Tensors of one name are stacked (they need one shape across the batch,
    as ``default_collate`` needs); numbers, numpy arrays and strings collate
    as there.  ``collate_fn``: another collate function to hand the
    converted batch to instead.

    Example:
        >>> rec = {"id": 1, "x": {"w": kiln.Tensor.from_numpy(np.ones(2, np.float32))}}
        >>> kiln.torch.collate([rec, rec])["x"]["w"].shape
        torch.Size([2, 2])
    """
    torch = torch_module()
    if collate_fn is None:
        from torch.utils.data import default_collate as collate_fn
    return collate_fn([_walk(torch, r) for r in batch])
