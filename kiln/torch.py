"""PyTorch state dicts as Kiln tensor files: ``save_file``, ``load_file`` and
``load_model``, the calls ``safetensors.torch`` users type.

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

from typing import TYPE_CHECKING, Any, Dict, List, Mapping, NamedTuple, Optional, Tuple, Union
import os

import kiln
from ._errors import EncodeError, KilnError

if TYPE_CHECKING:
    import torch

__all__ = ["save_file", "load_file", "load_model", "IncompatibleKeys", "LoadError",
           "ALIASES_KEY"]

ALIASES_KEY = "__kiln_torch_aliases__"
PathLike = Union[str, "os.PathLike[str]"]

# Kiln dtype name -> torch dtype name: the dtypes with the same bits on both sides
_TORCH_DTYPES = {
    "f64": "float64", "f32": "float32", "f16": "float16", "bf16": "bfloat16",
    "f8e4m3": "float8_e4m3fn", "f8e5m2": "float8_e5m2", "e8m0": "float8_e8m0fnu",
    "bool": "bool", "i8": "int8", "u8": "uint8", "i16": "int16", "u16": "uint16",
    "i32": "int32", "u32": "uint32", "i64": "int64", "u64": "uint64",
}


class IncompatibleKeys(NamedTuple):
    """What :func:`load_model` found on one side only (``strict=False``), as
    ``torch.nn.Module.load_state_dict`` returns it."""

    missing_keys: List[str]
    unexpected_keys: List[str]


class LoadError(RuntimeError):
    """The file does not fit the model: nothing was copied.

    A ``RuntimeError`` as ``torch.nn.Module.load_state_dict`` raises, whose
    message lists every problem; the attributes hold them one by one.

    Attributes:
        missing_keys: names the model has and the file lacks (strict only).
        unexpected_keys: names the file has and the model lacks (strict only).
        mismatched: ``(name, message)`` of each tensor of another shape or dtype.
    """

    def __init__(self, model: str, missing_keys: List[str], unexpected_keys: List[str],
                 mismatched: List[Tuple[str, str]]) -> None:
        self.missing_keys = missing_keys
        self.unexpected_keys = unexpected_keys
        self.mismatched = mismatched
        lines = ["Error(s) in loading state_dict for %s:" % model]
        if missing_keys:
            lines.append("Missing key(s) in state_dict: %s." % _quoted(missing_keys))
        if unexpected_keys:
            lines.append("Unexpected key(s) in state_dict: %s." % _quoted(unexpected_keys))
        lines.extend(what + "." for _, what in mismatched)
        RuntimeError.__init__(self, "\n\t".join(lines))


def _quoted(names: List[str]) -> str:
    return ", ".join('"%s"' % n for n in names)


def _torch() -> Any:
    try:
        import torch
    except ImportError:
        raise ImportError("kiln.torch needs PyTorch, which is not installed "
                          "(see https://pytorch.org for the command)") from None
    return torch


# --- saving -------------------------------------------------------------------

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


# --- loading ------------------------------------------------------------------

def _dtype_of(torch: Any, label: str) -> Any:
    """torch's dtype for the Kiln dtype ``label`` (``"bf16"``), None if it has none."""
    name = _TORCH_DTYPES.get(label)
    return getattr(torch, name, None) if name is not None else None


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
