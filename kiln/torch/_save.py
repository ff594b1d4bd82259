"""Saving torch state dicts: shared tensors found and stored once."""

from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Tuple

import kiln
from kiln import EncodeError
from kiln._access import same_memory_key, save_set

from ._common import ALIASES_KEY, PathLike, check_path, torch_module as _torch

if TYPE_CHECKING:
    import torch

__all__ = ["shared_names", "save_file", "save_model", "save_sharded", "save"]


def _span(t: Any) -> Tuple[int, int]:
    """The bytes [lo, hi) a strided tensor's elements cover."""
    lo = t.data_ptr()
    extent = 1 + sum((n - 1) * abs(s) for n, s in zip(t.shape, t.stride()))
    return lo, lo + extent * t.element_size()


def shared_names(torch: Any, tensors: Mapping[str, Any], order: Optional[List[str]] = None
                 ) -> Tuple[Dict[str, Any], Dict[str, str]]:
    """(the tensors to store, {alias: stored name}): the names of one tensor
    (same memory, shape, strides, dtype and negation and conjugation bits)
    become aliases of the first in ``order`` (sorted order by default);
    ``EncodeError`` naming both for any other overlap.

    Linear in the tensors but for one sort of the distinct tensors of each
    storage: a tensor is filed under its address and its storage's (ints,
    nothing kept per tensor), and only an address or a storage that two
    names reach is looked at again: the names at one address grouped by
    identity, the distinct tensors of one storage swept in address order."""
    store: Dict[str, Any] = {}
    aliases: Dict[str, str] = {}
    at_address: Dict[int, Any] = {}   # data address -> its first name, or a list of names
    on_storage: Dict[int, Any] = {}   # storage address -> the same
    for name in tensors:
        if not isinstance(name, str):
            raise EncodeError("TYPE", 0, "state_dict key %r is not a str" % (name,))
    for name in sorted(tensors) if order is None else order:
        t = tensors[name]
        if not isinstance(t, torch.Tensor):
            raise EncodeError("TYPE", 0, "state_dict[%r] is %s, not a torch.Tensor"
                              % (name, type(t).__name__))
        store[name] = t
        if same_memory_key(t) is None:   # the one rule kiln.save_sharded uses too
            continue   # no memory to share (or refused when stored), or values stored
        ptr = t.data_ptr()   # apart: a negation bit resolves into a copy.  The
        _file(at_address, ptr, name)   # storage's address from the tensor's own (no
        _file(on_storage, ptr - t.storage_offset() * t.element_size(), name)   # storage
    for names in at_address.values():   # object made, for the collector to walk)
        if type(names) is list:
            _same_tensors(tensors, names, store, aliases)
    for names in on_storage.values():
        if type(names) is list:
            _no_overlaps(tensors, [n for n in names if n not in aliases])
    return store, aliases


def _file(by: Dict[int, Any], key: int, name: str) -> None:
    prev = by.get(key)
    if prev is None:
        by[key] = name
    elif type(prev) is list:
        prev.append(name)
    else:
        by[key] = [prev, name]


def _same_tensors(tensors: Mapping[str, Any], names: List[str], store: Dict[str, Any],
                  aliases: Dict[str, str]) -> None:
    """The names at one address, in order: each name of a tensor an earlier
    name has (:func:`same_memory_key`) becomes its alias, out of ``store``."""
    first: Dict[Tuple[Any, ...], str] = {}   # identity -> the first name with it
    for name in names:
        ident = same_memory_key(tensors[name])
        same = first.get(ident)
        if same is not None:
            aliases[name] = same
            del store[name]
        else:
            first[ident] = name


def _no_overlaps(tensors: Mapping[str, Any], names: List[str]) -> None:
    """The distinct tensors of one storage, of each device, must not overlap."""
    by_device: Dict[Any, List[Tuple[int, int, int, str]]] = {}   # (lo, hi, rank, name)
    for rank, name in enumerate(names):
        t = tensors[name]
        lo, hi = _span(t)
        by_device.setdefault(t.device, []).append((lo, hi, rank, name))
    for spans in by_device.values():
        if len(spans) > 1:
            _no_overlap(spans)


def _no_overlap(spans: List[Tuple[int, int, int, str]]) -> None:
    """``EncodeError`` for two distinct tensors of one storage whose bytes
    overlap (one sweep in address order: each span against the farthest
    reaching span before it)."""
    spans.sort()
    reach = spans[0]
    for cur in spans[1:]:
        if cur[0] < reach[1]:
            a, b = sorted((reach, cur), key=lambda x: x[2])
            raise EncodeError("TYPE", 0, "tensors %r and %r share memory but are not the "
                              "same tensor (one is a view of the other, or its negation "
                              "or conjugate): store a .clone() of one" % (a[3], b[3]))
        if cur[1] > reach[1]:
            reach = cur


def _storable(torch: Any, store: Dict[str, Any]) -> Dict[str, Any]:
    """The tensors as the file takes them: on the CPU, negation and
    conjugation bits applied (``resolve_neg``: the values, not the bits)."""
    for name, t in store.items():
        if t.device.type == "meta":
            continue
        if t.is_neg() or t.is_conj():
            t = t.detach().resolve_conj().resolve_neg()
        if t.device.type != "cpu":
            t = t.detach().cpu()
        store[name] = t
    return store


def _with_aliases(metadata: Optional[Dict[str, Any]], aliases: Dict[str, str]
                  ) -> Optional[Dict[str, Any]]:
    if metadata is not None and ALIASES_KEY in metadata:
        raise EncodeError("TYPE", 0, "the metadata key %r is reserved for kiln.torch"
                          % ALIASES_KEY)
    if aliases:
        metadata = dict(metadata or {})
        metadata[ALIASES_KEY] = aliases
    return metadata


def _state(torch: Any, state_dict: Any, order: Optional[List[str]] = None
           ) -> Tuple[Dict[str, Any], Dict[str, str]]:
    if not isinstance(state_dict, Mapping):
        raise EncodeError("TYPE", 0, "state_dict must be a mapping of name to tensor, not %s"
                          % type(state_dict).__name__)
    store, aliases = shared_names(torch, state_dict, order)
    return _storable(torch, store), aliases


def save_file(state_dict: Mapping[str, "torch.Tensor"], path: PathLike,
              metadata: Optional[Dict[str, Any]] = None, *, checksum: bool = False) -> None:
    """Write a state dict (name -> ``torch.Tensor``) to a Kiln tensor file.

    Tensors on another device than the CPU are copied to it first, and a
    non-contiguous tensor is copied once into C order; a contiguous CPU
    tensor is written straight from its memory.  A tensor with torch's
    negation or conjugation bit set is stored as its values.  Shared tensors
    are stored once (see the module doc).  The file is replaced atomically.

    Args:
        state_dict: a mapping of str name to tensor (``model.state_dict()``).
        path: the file to write.
        metadata: a dict as :func:`kiln.save_tensors` takes it (values of any
            Kiln kind, not only str); the key ``__kiln_torch_aliases__`` is
            reserved.
        checksum: record a CRC-32 of every payload (see :func:`kiln.save_tensors`).

    Raises:
        EncodeError: a value that is not a tensor, a dtype with no Kiln twin
            (complex, the ``fnuz`` float8 kinds), a quantized, sparse or meta
            tensor, or two tensors that partly overlap, naming the tensor;
            the reserved metadata key.
        TypeError: bytes where a path is expected.
        ImportError: torch is not installed.

    Example:
        >>> kiln.torch.save_file({"w": torch.ones(2, dtype=torch.bfloat16)}, "model.kiln")
        >>> kiln.torch.load_file("model.kiln")["w"]
        tensor([1., 1.], dtype=torch.bfloat16)
    """
    torch = _torch()
    check_path(path, "save_file")
    store, aliases = _state(torch, state_dict)
    kiln.save_tensors(path, store, metadata=_with_aliases(metadata, aliases),
                      checksum=checksum)


def save_model(model: "torch.nn.Module", path: PathLike,
               metadata: Optional[Dict[str, Any]] = None, force_contiguous: bool = True, *,
               checksum: bool = False) -> None:
    """Write ``model.state_dict()`` to a Kiln tensor file, as
    ``safetensors.torch.save_model`` does: a tied weight is stored once,
    under its first name in the state dict's order (the module that
    registered it first: ``transformer.wte.weight`` for GPT-2's tied
    ``lm_head.weight``, the name ``save_pretrained`` keeps), its other names
    recorded as aliases (so :func:`load_file` gives every name back).
    ``force_contiguous`` (and ``filename=`` for ``path``) is taken as
    safetensors takes it; kiln stores a non-contiguous tensor's values in C
    order either way, so False changes nothing.

    Example:
        >>> emb = torch.nn.Embedding(4, 2)
        >>> head = torch.nn.Linear(2, 4, bias=False)
        >>> head.weight = emb.weight
        >>> kiln.torch.save_model(torch.nn.Sequential(emb, head), "tied.kiln")
        >>> sorted(kiln.open("tied.kiln").keys())
        ['0.weight']
    """
    torch = _torch()
    check_path(path, "save_model")
    sd = model.state_dict()
    store, aliases = _state(torch, sd, list(sd))
    kiln.save_tensors(path, store, metadata=_with_aliases(metadata, aliases),
                      checksum=checksum)


def save_sharded(state_dict: Mapping[str, "torch.Tensor"], folder: PathLike, *,
                 max_shard_size: Any = "5GB", metadata: Optional[Dict[str, Any]] = None,
                 checksum: bool = False, prefix: str = "model") -> str:
    """Write a state dict as a sharded set (see :func:`kiln.save_sharded`):
    shared tensors stored once across the set, their other names kept in the
    index (:attr:`kiln.ShardedFile.aliases`); returns the index's path.

    Example:
        >>> kiln.torch.save_sharded({"a": torch.ones(4), "b": torch.zeros(4)}, "ckpt",
        ...                         max_shard_size=16)
        'ckpt/model.kiln.index.json'
    """
    torch = _torch()
    check_path(folder, "save_sharded")
    store, aliases = _state(torch, state_dict)   # (each tensor once: not searched again)
    return save_set(store, folder, max_shard_size=max_shard_size, metadata=metadata,
                    checksum=checksum, prefix=prefix, aliases=aliases, once=True)


def save(tensors: Mapping[str, "torch.Tensor"], metadata: Optional[Dict[str, Any]] = None
         ) -> bytes:
    """The Kiln tensor file of ``tensors`` as bytes (what :func:`save_file`
    would write; :func:`kiln.torch.load` reads it back).

    Example:
        >>> data = kiln.torch.save({"w": torch.arange(3)})
        >>> kiln.torch.load(data)
        {'w': tensor([0, 1, 2])}
    """
    import io
    torch = _torch()
    store, aliases = _state(torch, tensors)
    out = io.BytesIO()
    kiln.save_tensors(out, store, metadata=_with_aliases(metadata, aliases))
    return out.getvalue()
