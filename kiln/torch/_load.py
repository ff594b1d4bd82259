"""Loading Kiln tensor files into torch: ``load_file`` and ``load_model``."""

from typing import TYPE_CHECKING, Any, Dict, List, Tuple, Union

import kiln
from kiln import KilnError

from ._common import (IncompatibleKeys, LoadError, PathLike, dtype_of as _dtype_of,
                      torch_module as _torch, ALIASES_KEY)

if TYPE_CHECKING:
    import torch

__all__ = ["load_file", "load_model"]


def _torch_dtype(torch: Any, t: kiln.Tensor, path: str) -> Any:
    dt = _dtype_of(torch, str(t.dtype))
    if dt is None:
        raise KilnError("TYPE", 0, "%s: tensor %r is %s, which torch has no dtype for (read "
                        "it with kiln.open)" % (path, t.name, t.dtype))
    return dt


def _view(torch: Any, t: kiln.Tensor, path: str, dt: Any = None) -> Any:
    """A CPU torch tensor over ``t``'s payload, no copy (its bits as torch's
    dtype, ``dt`` when the caller already looked it up)."""
    if dt is None:
        dt = _torch_dtype(torch, t, path)
    x = torch.from_dlpack(t.bits())   # numpy's capsule; the view keeps the mapping alive
    return x if x.dtype == dt else x.view(dt)


def _aliases(f: Any) -> Dict[str, str]:
    meta = f.metadata
    found = None if meta is None else meta.get(ALIASES_KEY)
    if found is None:
        return {}
    names = set(f.keys())
    if not isinstance(found, dict) or not all(
            isinstance(k, str) and isinstance(v, str) and v in names and k not in names
            for k, v in found.items()):
        raise KilnError("TYPE", 0, "%s: the metadata's %r is not a map of new names to the "
                        "file's tensors" % (f.path, ALIASES_KEY))
    return found


def load_file(path: PathLike, device: Union[str, "torch.device"] = "cpu"
              ) -> Dict[str, "torch.Tensor"]:
    """The tensors of a Kiln tensor file as a state dict (name -> ``torch.Tensor``).

    On the CPU every tensor views the file's copy-on-write mapping, with no
    copy and no read until it is used: an in-place change alters this
    process's private copy of its pages, never the file (nor another open).
    On another ``device`` each tensor is copied there.  Aliases recorded by
    :func:`save_file` come back as the same tensor object.

    Raises:
        KilnError: as :func:`kiln.open`; ``TYPE`` naming a tensor of a dtype
            torch has none for (the 4-bit and opaque dtypes).
        ImportError: torch is not installed.

    Example:
        >>> kiln.torch.save_file({"w": torch.arange(3)}, "model.kiln")
        >>> kiln.torch.load_file("model.kiln")
        {'w': tensor([0, 1, 2])}
    """
    torch = _torch()
    with kiln.open(path) as f:   # the views keep the mapping; closing frees nothing else
        aliases = _aliases(f)
        out = {name: _view(torch, f[name], f.path) for name in f.keys()}
    dev = torch.device(device)
    if dev.type != "cpu":
        out = {k: v.to(dev) for k, v in out.items()}
    for alias, name in aliases.items():
        out[alias] = out[name]
    return dict(sorted(out.items()))


def _check_model(model: Any, f: Any, sd: Dict[str, Any], aliases: Dict[str, str],
                 strict: bool) -> Tuple[List[str], List[str], List[Tuple[Any, Any, Any]]]:
    """(missing, unexpected, the copies to make: (target, file tensor, torch
    dtype), a tied target once), every name, shape and dtype checked first."""
    torch = _torch()
    have = set(f.keys()) | set(aliases)
    missing = [k for k in sd if k not in have]
    unexpected = sorted(k for k in have if k not in sd)
    mismatched = []
    copies = []
    done = set()
    dtypes: Dict[str, Any] = {}   # kiln dtype text -> torch dtype (None: torch has none)
    for k, target in sd.items():
        if k not in have:
            continue
        t = f[aliases.get(k, k)]
        if target.is_meta:
            mismatched.append((k, "no memory for %s: the model's tensor is on the meta "
                                  "device (load_file and load_state_dict(assign=True) "
                                  "give it one)" % k))
            continue
        kd = str(t.dtype)
        dt = dtypes.get(kd, dtypes)
        if dt is dtypes:
            dtypes[kd] = dt = _dtype_of(torch, kd)
        if t.shape != tuple(target.shape):
            mismatched.append((k, "size mismatch for %s: copying a param with shape %s from checkpoint, "
                                  "the shape in current model is %s"
                               % (k, list(t.shape), list(target.shape))))
        elif dt is None or dt != target.dtype:
            mismatched.append((k, "dtype mismatch for %s: the checkpoint's tensor is %s, the "
                                  "model's is %s (no conversion is made)"
                               % (k, t.dtype, str(target.dtype).replace("torch.", ""))))
        elif id(target) not in done:
            done.add(id(target))
            copies.append((target, t, dt))
    if mismatched or (strict and (missing or unexpected)):
        raise LoadError(type(model).__name__, missing if strict else [],
                        unexpected if strict else [], mismatched)
    return missing, unexpected, copies


def load_model(model: "torch.nn.Module", path: PathLike, strict: bool = True
               ) -> IncompatibleKeys:
    """Fill ``model``'s parameters and buffers in place from a Kiln tensor file.

    Every name, shape and dtype is checked before the first byte is copied;
    then each payload is copied once from the file's mapping into the tensor
    the model already holds (wherever it lives), with no intermediate copy.
    Tied weights (one tensor under two names) are filled once.

    Args:
        model: a ``torch.nn.Module``; its ``state_dict()`` names the targets.
        path: a Kiln tensor file (as :func:`save_file` writes).
        strict: names on one side only raise :class:`LoadError`; with False
            they are returned instead and the other tensors filled.

    Returns:
        IncompatibleKeys: ``(missing_keys, unexpected_keys)``, as
        ``load_state_dict`` returns them (both empty under ``strict``).

    Raises:
        LoadError: (a ``RuntimeError``) missing or unexpected names under
            ``strict``, or any tensor of another shape or dtype (a dtype is
            never converted); nothing was copied.
        KilnError: as :func:`kiln.open`.

    Example:
        >>> m = torch.nn.Linear(2, 2)
        >>> kiln.torch.save_file(m.state_dict(), "linear.kiln")
        >>> kiln.torch.load_model(torch.nn.Linear(2, 2), "linear.kiln")
        IncompatibleKeys(missing_keys=[], unexpected_keys=[])
    """
    torch = _torch()
    sd = model.state_dict(keep_vars=True)
    with kiln.open(path) as f:
        aliases = _aliases(f)
        missing, unexpected, copies = _check_model(model, f, sd, aliases, strict)
        with torch.no_grad():
            for target, t, dt in copies:
                target.copy_(_view(torch, t, f.path, dt))
    return IncompatibleKeys(missing, unexpected)
