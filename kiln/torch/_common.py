"""What kiln.torch's modules share: torch imported on first use, the dtype
table, the reserved metadata key and the errors of ``load_model``."""

from typing import Any, Callable, Collection, List, NamedTuple, Sequence, Tuple, TypeVar, Union
import functools
import os

__all__ = ["ALIASES_KEY", "PathLike", "IncompatibleKeys", "LoadError", "torch_module",
           "TORCH_DTYPES", "dtype_of", "check_path", "torch_shape", "torch_view", "safetensors_names", "untied_notes"]

ALIASES_KEY = "__kiln_torch_aliases__"
PathLike = Union[str, "os.PathLike[str]"]

# Kiln dtype name -> torch dtype name: the dtypes with the same bits on both sides
TORCH_DTYPES = {
    "f64": "float64", "f32": "float32", "f16": "float16", "bf16": "bfloat16",
    "f8e4m3": "float8_e4m3fn", "f8e5m2": "float8_e5m2", "e8m0": "float8_e8m0fnu",
    "bool": "bool", "i8": "int8", "u8": "uint8", "i16": "int16", "u16": "uint16",
    "i32": "int32", "u32": "uint32", "i64": "int64", "u64": "uint64",
    # two elements a byte, the first in the low nibble, on both sides; torch's
    # shape counts bytes along the last axis, Kiln's elements (see torch_shape)
    "e2m1": "float4_e2m1fn_x2",
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
                 mismatched: List[Tuple[str, str]], notes: Sequence[str] = ()) -> None:
        self.missing_keys = missing_keys
        self.unexpected_keys = unexpected_keys
        self.mismatched = mismatched
        lines = ["Error(s) in loading state_dict for %s:" % model]
        if missing_keys:
            lines.append("Missing key(s) in state_dict: %s." % _quoted(missing_keys))
        if unexpected_keys:
            lines.append("Unexpected key(s) in state_dict: %s." % _quoted(unexpected_keys))
        lines.extend(what + "." for _, what in mismatched)
        lines.extend(notes)
        RuntimeError.__init__(self, "\n\t".join(lines))


def _quoted(names: List[str]) -> str:
    return ", ".join('"%s"' % n for n in names)


def torch_module() -> Any:
    try:
        import torch
    except ImportError:
        raise ImportError("kiln.torch needs PyTorch, which is not installed "
                          "(see https://pytorch.org for the command)") from None
    return torch


def check_path(path: Any, what: str) -> Any:
    """``path`` under kiln's one rule for bytes (``kiln._access.bytes_path``):
    a ``bytes`` path is a path; a file's contents given where a path is
    expected are a ``TypeError`` that says to use ``kiln.torch.load(data)``
    (``kiln.torch.save`` for the writers)."""
    from kiln._access import bytes_path
    return bytes_path(path, "kiln.torch." + what, "kiln.torch.save(state_dict), which returns "
                      "the bytes" if what.startswith("save") else "kiln.torch.load(data)")


def dtype_of(torch: Any, label: str) -> Any:
    """torch's dtype for the Kiln dtype ``label`` (``"bf16"``), None if it has none."""
    name = TORCH_DTYPES.get(label)
    return getattr(torch, name, None) if name is not None else None


def torch_shape(t: Any, path: str = "") -> Tuple[int, ...]:
    """The shape torch gives Kiln tensor ``t``: its own, but for ``e2m1``,
    whose last axis torch's ``float4_e2m1fn_x2`` counts in bytes (pairs)."""
    shape = tuple(t.shape)
    if str(t.dtype) == "e2m1":
        if not shape or shape[-1] % 2:
            from kiln import KilnError
            raise KilnError("TYPE", 0, "%s%stensor %r is e2m1 of shape %s: torch's "
                            "float4_e2m1fn_x2 packs two elements a byte along the last axis, "
                            "which needs an even length there (read it with kiln.open)"
                            % (path, ": " if path else "", t.name, list(shape)))
        shape = shape[:-1] + (shape[-1] // 2,)
    return shape


def torch_view(torch: Any, t: Any, dt: Any, path: str = "") -> Any:
    """A CPU torch tensor of dtype ``dt`` over Kiln tensor ``t``'s payload,
    no copy (numpy's capsule of its bits: the view keeps the buffer alive)."""
    x = torch.from_dlpack(t.bits())
    if str(t.dtype) == "e2m1":   # the packed bytes, 1-D: shaped as torch counts them
        return x.view(dt).reshape(torch_shape(t, path))
    return x if x.dtype == dt else x.view(dt)


_F = TypeVar("_F", bound=Callable[..., Any])


def safetensors_names(**names: str) -> Callable[[_F], _F]:
    """Let a call take safetensors' keyword names for its parameters
    (``tensors=`` for ``state_dict=``, ``filename=`` for ``path=``): each
    ``theirs=ours`` pair; both names given at once is a ``TypeError``."""
    def wrap(fn: _F) -> _F:
        @functools.wraps(fn)
        def call(*args: Any, **kw: Any) -> Any:
            for theirs, ours in names.items():
                if theirs in kw:
                    if ours in kw:
                        raise TypeError("%s() got %r and %r, two names of one argument"
                                        % (fn.__name__, ours, theirs))
                    kw[ours] = kw.pop(theirs)
            return fn(*args, **kw)
        return call  # type: ignore[return-value]
    return wrap


def untied_notes(model: Any, missing: Sequence[str], held: Collection[str]) -> List[str]:
    """A line for each missing name that the model declares tied to a name
    the file holds (transformers' ``all_tied_weights_keys`` or
    ``_tied_weights_keys``, tied name -> source) but has not tied yet (two
    separate parameters, as a model built under accelerate's
    ``init_empty_weights`` has until ``tie_weights()``)."""
    tied = getattr(model, "all_tied_weights_keys", None) or \
        getattr(model, "_tied_weights_keys", None)
    if not isinstance(tied, dict):
        return []
    out = []
    for name in missing:
        src = tied.get(name)
        if not isinstance(src, str) or src not in held:
            continue
        try:
            if model.get_parameter(name) is model.get_parameter(src):
                continue
        except AttributeError:
            continue
        out.append("%s is tied to %s in the model (which the file holds), but the model has "
                   "not tied them yet: call model.tie_weights() before loading (a model built "
                   "under init_empty_weights is untied until then)" % (name, src))
    return out
