"""Loading Kiln tensor files and sharded sets into torch: ``load_file``,
``load_model`` and ``load``."""

import contextlib
import gc
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Optional, Tuple, Union

import kiln
from kiln import KilnError
from kiln._access import alias_fault, dtype_label, file_offset, table

from . import _pipeline
from ._common import (ALIASES_KEY, IncompatibleKeys, LoadError, PathLike, check_path,
                      dtype_of as _dtype_of, torch_module as _torch, torch_shape,
                      torch_view, untied_notes)

if TYPE_CHECKING:
    import torch

__all__ = ["load_file", "load_model", "load"]


def _torch_dtype(torch: Any, t: kiln.Tensor, path: str) -> Any:
    dt = _dtype_of(torch, str(t.dtype))
    if dt is None:
        raise KilnError("TYPE", 0, "%s: tensor %r is %s, which torch has no dtype for (read "
                        "it with kiln.open)" % (path, t.name, dtype_label(t.dtype, t.layout)))
    return dt


def _view(torch: Any, t: kiln.Tensor, path: str, dt: Any = None) -> Any:
    """A CPU torch tensor over ``t``'s payload, no copy (its bits as torch's
    dtype, ``dt`` when the caller already looked it up)."""
    if dt is None:
        dt = _torch_dtype(torch, t, path)
    return torch_view(torch, t, dt, path)   # numpy's capsule; the view keeps the mapping alive


def _aliases(f: Any) -> Dict[str, str]:
    """alias -> stored name: a set's index's, or a file's metadata entry."""
    if isinstance(f, kiln.ShardedFile):
        return f.aliases
    meta = f.metadata
    found = None if meta is None else meta.get(ALIASES_KEY)
    if found is None:
        return {}
    bad = alias_fault(found, set(f.keys()))
    if bad:
        raise KilnError("TYPE", 0, "%s: the metadata's %r %s" % (f.path, ALIASES_KEY, bad))
    return found


class _Entry:
    """A stored tensor as the loader reads it: its table row, open file and CRC."""

    __slots__ = ("t", "src", "crc")

    def __init__(self, t: Any, src: _pipeline.FileBytes, crc: Optional[int]) -> None:
        self.t, self.src, self.crc = t, src, crc


class _Files:
    """The open files of one load (each a duplicate of ``kiln.open``'s
    descriptor, see :func:`_pipeline.file_bytes`), closed together."""

    def __init__(self) -> None:
        self.opened: List[_pipeline.FileBytes] = []

    def __enter__(self) -> "_Files":
        return self

    def __exit__(self, *exc: Any) -> None:
        for src in self.opened:
            src.close()
        self.opened = []

    def entries(self, f: Any) -> Dict[str, _Entry]:
        """Every stored tensor of a file or a set, no payload read: the bytes
        of each come from the file whose table named it."""
        files = [f.shard(s) for s in f.shards] if isinstance(f, kiln.ShardedFile) else [f]
        out: Dict[str, _Entry] = {}
        for one in files:
            sums = one.checksums
            src = _pipeline.file_bytes(one)
            self.opened.append(src)
            for i, (name, t) in enumerate(table(one).items()):
                crc = None if sums is None else int.from_bytes(sums[4 * i:4 * i + 4], "little")
                out[name] = _Entry(t, src, crc)
        return out


def _item(torch: Any, name: str, e: _Entry, dt: Any, target: Any) -> Any:
    t = e.t
    return _pipeline.Item(name, e.src, file_offset(t), t.nbytes, e.crc, dt,
                          torch_shape(t, e.src.name), target)


def _open(path: Any, what: str) -> Any:
    check_path(path, what)
    return kiln.open(path)


def load_file(path: PathLike, device: Union[str, "torch.device", Dict[str, Any]] = "cpu", *,
              direct_io: bool = False) -> Dict[str, "torch.Tensor"]:
    """The tensors of a Kiln tensor file, or of a sharded set (its index or its
    folder), as a state dict (name -> ``torch.Tensor``).

    On the CPU every tensor views the file's copy-on-write mapping, with no
    copy and no read until it is used: an in-place change alters this
    process's private copy of its pages, never the file (nor another open).
    These views are the one place kiln reads a file through a mapping after
    handing it out: like ``numpy.memmap`` and safetensors' own, a view of a
    file that another program truncates faults when it is read (copy the
    tensors, or load onto a device, where that can happen).  On another
    ``device`` the payloads are read with ``pread`` through pinned staging
    buffers and copied there (see "Loading onto a device" in the integrations guide); each tensor owns
    its memory.  Aliases (tied weights saved once) come back as the same
    tensor object.

    ``device`` may be a device map (name prefix -> device, as accelerate
    and transformers write ``device_map``: the longest prefix that is a name
    or a dotted start of it, ``""`` for the rest): one pipelined load a
    device, all at once, sharing out the reader threads; each tensor owns
    its memory there, a ``"cpu"`` one included.

    ``direct_io=True`` (a device only) reads with O_DIRECT, for a cold load
    of a file the page cache does not hold (buffered where the file system
    refuses it).

    Raises:
        KilnError: as :func:`kiln.open`; ``TYPE`` naming a tensor of a dtype
            torch has none for (the 4-bit and opaque dtypes); on a device,
            ``EOF`` for a file that changed under the load and ``CHECKSUM``
            for a payload that differs from its recorded CRC-32.
        TypeError: bytes where a path is expected (:func:`load` reads bytes).
        ImportError: torch is not installed.

    Example:
        >>> kiln.torch.save_file({"w": torch.arange(3)}, "model.kiln")
        >>> kiln.torch.load_file("model.kiln")
        {'w': tensor([0, 1, 2])}
    """
    torch = _torch()
    places = device if isinstance(device, dict) else None   # a device map
    dev = None if places is not None else torch.device(device)
    with _open(path, "load_file") as f:   # the views keep the mapping; closing frees nothing else
        aliases = _aliases(f)
        if dev is not None and dev.type == "cpu":
            pairs = f.items() if isinstance(f, kiln.ShardedFile) else \
                zip(f.keys(), f.values())   # (no list of pairs kept for the collector)
            out = {name: _view(torch, t, f.path) for name, t in pairs}
        else:
            with _Files() as files:
                entries = files.entries(f)
                parts: Dict[Any, Any] = {}
                for n, e in entries.items():
                    parts.setdefault(dev if places is None else _place(torch, places, n),
                                     []).append(_item(torch, n, e, _torch_dtype(
                                         torch, e.t, e.src.name), None))
                got = _pipeline.load_each(parts, direct_io=direct_io)
                out = {it.key: t for d, its in parts.items() for it, t in zip(its, got[d])}
    for alias, name in aliases.items():
        out[alias] = out[name]
    return {k: out[k] for k in sorted(out)}


def _place(torch: Any, places: Dict[str, Any], name: str) -> Any:
    """The device of ``name`` in a ``device_map`` (name prefix -> device, as
    accelerate writes it: the longest prefix that is the name, a dotted
    start of it, or ``""``)."""
    best = None
    for prefix in places:
        if (prefix == "" or name == prefix or name.startswith(prefix + ".")) and \
                (best is None or len(prefix) > len(best)):
            best = prefix
    if best is None:
        raise ValueError("tensor %r: no entry of the device map names it or a prefix of it"
                         % name)
    return torch.device(places[best])


def load(data: Any) -> Dict[str, "torch.Tensor"]:
    """The tensors of a Kiln tensor file held in memory (``bytes``, as
    :func:`kiln.torch.save` returns them) as CPU tensors that own their
    memory (one copy out of ``data``); aliases as the same tensor object.

    Example:
        >>> kiln.torch.load(kiln.torch.save({"w": torch.ones(2)}))
        {'w': tensor([1., 1.])}
    """
    torch = _torch()
    from kiln._access import metadata_of_blob
    d = kiln.decode_tensors(data, copy=True)
    out: Dict[str, Any] = {}
    meta = None
    for name, t in d.items():
        if name == "__metadata__":
            meta = metadata_of_blob(bytes(t.bits()))
            continue
        out[name] = _view(torch, t, "<bytes>")
    found = (meta or {}).get(ALIASES_KEY)
    bad = None if found is None else alias_fault(found, out)
    if bad:
        raise KilnError("TYPE", 0, "<bytes>: the metadata's %r %s" % (ALIASES_KEY, bad))
    found = found or {}
    for alias, name in found.items():
        out[alias] = out[name]
    return dict(sorted(out.items()))


def _groups(torch: Any, sd: Dict[str, Any]) -> List[List[str]]:
    """The model's names, grouped by tensor: tied names (one tensor under
    several names) share a group, in the state dict's order."""
    seen: Dict[Any, List[str]] = {}
    for k, v in sd.items():
        key: Any = id(v)
        if not v.is_meta and v.numel() and v.layout == torch.strided:
            key = (v.data_ptr(), tuple(v.shape), v.stride(), v.dtype, v.device)
        seen.setdefault(key, []).append(k)
    return list(seen.values())


class _Plan:
    """What :func:`load_model` will do, every check made first."""

    def __init__(self) -> None:
        self.missing: List[str] = []
        self.unexpected: List[str] = []
        self.mismatched: List[Tuple[str, str]] = []
        self.loads: List[Tuple[List[str], str, Any, Any]] = []   # (names, stored, dtype, target)
        self.extra: List[str] = []   # extra-state names the file holds (set_extra_state)


def _extra_states(torch: Any, model: Any, sd: Dict[str, Any]) -> Dict[str, Any]:
    """name -> module of each extra-state entry of the state dict that a
    module takes back (it overrides ``set_extra_state``: its ``_extra_state``,
    whatever it is), as ``load_state_dict`` finds them.  An entry of a module
    that gives extra state but takes none back is dropped from ``sd`` (the
    file's copy of it is then unexpected, as there)."""
    out: Dict[str, Any] = {}
    base = torch.nn.Module.set_extra_state
    for k in [k for k in sd if k.rpartition(".")[2] == "_extra_state"]:
        owner = k.rpartition(".")[0]
        module = model.get_submodule(owner) if owner else model
        if getattr(type(module), "set_extra_state", base) is not base:
            out[k] = module
        elif getattr(type(module), "get_extra_state", None) is not \
                torch.nn.Module.get_extra_state:
            del sd[k]
    return out


_PIECE = 1 << 20   # tied copies are compared this many bytes at a time


def _differ(a: str, x: _Entry, b: str, y: _Entry) -> bool:
    """Do stored tensors ``a`` and ``b`` (two names of one tied tensor) differ?
    By their recorded CRC-32s where both have one, else read with ``pread``
    a piece at a time from their files (never through a mapping: a file
    truncated meanwhile is ``EOF``, never SIGBUS; never two whole copies)."""
    s, t = x.t, y.t
    if s.dtype != t.dtype or tuple(s.shape) != tuple(t.shape) or s.nbytes != t.nbytes:
        return True
    if x.crc is not None and y.crc is not None:
        return x.crc != y.crc
    n = s.nbytes
    one, two = bytearray(min(n, _PIECE)), bytearray(min(n, _PIECE))
    at, bt = file_offset(s), file_offset(t)
    for k in range(0, n, _PIECE):
        m = min(_PIECE, n - k)
        u, v = memoryview(one)[:m], memoryview(two)[:m]
        x.src.read(u, at + k, "the payload of tensor %r" % a)
        y.src.read(v, bt + k, "the payload of tensor %r" % b)
        if u != v:
            return True
    return False


def _check_model(torch: Any, entries: Dict[str, _Entry], sd: Dict[str, Any],
                 extra: Dict[str, Any], aliases: Dict[str, str], assign: bool,
                 strict: bool) -> _Plan:
    plan = _Plan()
    have = set(entries) | set(aliases)
    plan.unexpected = sorted(k for k in have if k not in sd)
    for k in extra:   # as load_state_dict: set when the file has it, else missing
        if k in have:
            plan.extra.append(k)
        else:
            plan.missing.append(k)
    dtypes: Dict[str, Any] = {}
    for names in _groups(torch, {k: v for k, v in sd.items() if k not in extra}):
        present = [k for k in names if k in have]
        if not present:
            plan.missing.extend(names)
            continue
        stored = [aliases.get(k, k) for k in present]
        for a, b in zip(stored, stored[1:]):
            if a != b and _differ(a, entries[a], b, entries[b]):
                plan.mismatched.append((names[0], "tied tensors %s and %s hold different "
                                        "values in the checkpoint: they are one tensor in "
                                        "the model" % (present[stored.index(a)],
                                                       present[stored.index(b)])))
                break
        k, target, t = present[0], sd[present[0]], entries[stored[0]].t
        if target.is_meta and not assign:
            plan.mismatched.append((k, "no memory for %s: the model's tensor is on the meta "
                                       "device (pass assign=True, and device=, to make it "
                                       "from the file)" % k))
            continue
        kd = str(t.dtype)
        if kd not in dtypes:
            dtypes[kd] = _dtype_of(torch, kd)
        dt = dtypes[kd]
        shape = torch_shape(t) if dt is not None else t.shape   # e2m1: torch counts pairs
        if shape != tuple(target.shape):
            plan.mismatched.append((k, "size mismatch for %s: copying a param with shape %s "
                                       "from checkpoint, the shape in current model is %s"
                                    % (k, list(shape), list(target.shape))))
        elif dt is None or dt != target.dtype:
            plan.mismatched.append((k, "dtype mismatch for %s: the checkpoint's tensor is %s, "
                                       "the model's is %s (no conversion is made)"
                                    % (k, dtype_label(t.dtype, t.layout),
                                       str(target.dtype).replace("torch.", ""))))
        else:
            plan.loads.append((names, stored[0], dt, target))
    return plan


def _put(torch: Any, model: Any, name: str, value: Any, param: bool,
         owners: Dict[str, Any]) -> None:
    """Set parameter (``param``) or buffer ``name`` of ``model`` to ``value``
    (one lookup of the name in its module: linear in the names loaded);
    ``owners``: the modules found so far by dotted name, each found as an
    attribute of its parent."""
    owner, _, attr = name.rpartition(".")
    module = _module(torch, model, owner, owners) if owner else model
    if param:
        module.register_parameter(attr, value)
    else:
        module.register_buffer(attr, value)


def _module(torch: Any, model: Any, name: str, owners: Dict[str, Any]) -> Any:
    """Submodule ``name`` of ``model``: its parent's attribute (one lookup
    once the parent is known), else ``get_submodule``'s answer or error."""
    m = owners.get(name)
    if m is None:
        parent, _, last = name.rpartition(".")
        m = getattr(_module(torch, model, parent, owners) if parent else model, last, None)
        if not isinstance(m, torch.nn.Module):
            m = model.get_submodule(name)
        owners[name] = m
    return m


def load_model(model: "torch.nn.Module", path: PathLike, strict: bool = True,
               device: Union[None, str, "torch.device"] = None, *, assign: bool = False,
               progress: Any = None, direct_io: bool = False) -> IncompatibleKeys:
    """Fill ``model``'s parameters and buffers from a Kiln tensor file or a
    sharded set (its index or its folder).

    Every name, shape and dtype is checked before the first byte is read;
    then each payload is read with ``pread`` from the file ``kiln.open``
    opened (its descriptor, never the name again: a checkpoint replaced
    meanwhile loads whole from the generation opened), straight into the
    tensor the model holds (CPU; payloads under 64 KiB through a staged
    chunk shared with their neighbours), or through pinned staging buffers
    onto its device (see "Loading onto a device" in the integrations guide):
    no mapping, so a file truncated under the load is a ``KilnError``, never
    a crash.  ``path`` may also be a binary file object or a URL read as
    :func:`kiln.open` reads it.  Tied weights (one tensor under several
    names) are filled once, from whichever of their names the file holds
    (``safetensors.torch.save_model`` and ``save_pretrained`` store one of
    them): the others are not missing.  Two names of one tied tensor stored
    with different values are refused (compared by their CRC-32s, or read
    with ``pread`` a piece at a time).  Extra state is loaded as
    ``load_state_dict`` loads it; bool payloads are checked before anything
    is written into the model.  Python's cyclic garbage collector is paused
    while it runs (and left as it was found).

    Args:
        model: a ``torch.nn.Module``; its ``state_dict()`` names the targets.
        path: a Kiln tensor file or set.
        strict: names on one side only raise :class:`LoadError`; with False
            they are returned instead and the other tensors filled.
        device: with ``assign``, where the new tensors are made (default: the
            device of the tensor each replaces, the CPU for the meta device);
            otherwise each tensor is filled where it is and this is unused
            (accepted as ``safetensors.torch.load_model`` takes it).
        assign: make new tensors from the file and put them in the model
            (as ``load_state_dict(assign=True)``; a parameter stays a
            ``Parameter`` with its ``requires_grad``, and tied names get one
            parameter again): the way to load a model built on the meta
            device, with no full-size copy made first.
        progress: True for a tqdm bar, or ``fn(done_bytes, total_bytes)``.
        direct_io: read what goes to a device with O_DIRECT (a cold load;
            buffered where the file system refuses it).

    Returns:
        IncompatibleKeys: ``(missing_keys, unexpected_keys)``, as
        ``load_state_dict`` returns them (both empty under ``strict``).

    Raises:
        LoadError: (a ``RuntimeError``) missing or unexpected names under
            ``strict``, any tensor of another shape or dtype (a dtype is
            never converted), a meta tensor without ``assign``, tied names
            stored with different values; nothing was read.
        KilnError: as :func:`kiln.open`; ``EOF`` for a file that changed under
            the load, ``CHECKSUM`` for a payload that differs from its
            recorded CRC-32 (the message names the targets written).

    Example:
        >>> m = torch.nn.Linear(2, 2)
        >>> kiln.torch.save_file(m.state_dict(), "linear.kiln")
        >>> kiln.torch.load_model(torch.nn.Linear(2, 2), "linear.kiln")
        IncompatibleKeys(missing_keys=[], unexpected_keys=[])
    """
    with _open(path, "load_model") as f, _collector_paused():
        return _load_model(model, f, strict, device, assign, progress, direct_io)


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector paused for a load (as it was after).
    A load makes a few objects for every tensor, nearly all kept or freed
    by reference counting; with the collector running, their count sets off
    full collections that walk every object the model holds, again and
    again: 8,000 parameters of one module loaded with ``assign=True`` took
    2.8x as long (see docs/benchmarks.md).  Nothing a load makes is cyclic
    garbage.  (Process-wide: another thread's load that ends first leaves
    it paused until this one ends, and a collector another thread paused
    meanwhile stays paused.)"""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _load_model(model: Any, f: Any, strict: bool, device: Any, assign: bool, progress: Any,
                direct_io: bool) -> IncompatibleKeys:
    """:func:`load_model` of ``f``, a file or set ``kiln.open`` opened: every
    byte read from the files whose tables it read."""
    torch = _torch()
    sd = model.state_dict(keep_vars=True)
    extra = _extra_states(torch, model, sd)
    with _Files() as files:
        aliases = _aliases(f)
        entries = files.entries(f)
        plan = _check_model(torch, entries, sd, extra, aliases, assign, strict)
        if plan.mismatched or (strict and (plan.missing or plan.unexpected)):
            raise LoadError(type(model).__name__, plan.missing if strict else [],
                            plan.unexpected if strict else [], plan.mismatched,
                            untied_notes(model, plan.missing, set(entries) | set(aliases))
                            if strict else ())
        items = []
        for names, stored, dt, target in plan.loads:
            e = entries[stored]
            items.append(_item(torch, stored, e, dt, None if assign else target.detach()))
        states = []   # the extra states, read (and checked) before anything is written
        for k in plan.extra:
            e = entries[aliases.get(k, k)]
            states.append(_item(torch, k, e, _torch_dtype(torch, e.t, e.src.name), None))
        states = _pipeline.load(states, "cpu") if states else []
        with torch.no_grad():
            made = _by_device(torch, plan, items, device if assign else None, progress,
                              direct_io)
        if assign:
            _assign(torch, model, plan, made, sd)
        for k, value in zip(plan.extra, states):
            extra[k].set_extra_state(value)
    return IncompatibleKeys(plan.missing, plan.unexpected)


def _by_device(torch: Any, plan: _Plan, items: List[Any], device: Any, progress: Any,
               direct_io: bool = False) -> List[Any]:
    """The loaded tensors, one pipelined load per destination device.  The
    bool payloads of every device are read into tensors of their own and
    checked first (a byte other than 0 or 1 is ``TYPE`` before any target of
    any device is written), then copied into their targets."""
    groups: Dict[Any, List[int]] = {}
    cpu = torch.device("cpu")
    fixed = None if device is None else torch.device(device)
    for k, (_, _, _, target) in enumerate(plan.loads):
        dev = fixed if fixed is not None else (cpu if target.is_meta else target.device)
        groups.setdefault(dev, []).append(k)
    made: List[Any] = [None] * len(items)
    flags = {k for k, it in enumerate(items) if it.dtype == torch.bool and it.nbytes}
    if len(groups) > 1 and flags:
        for dev, ks in groups.items():   # checked, none visible yet
            ks = [k for k in ks if k in flags]
            if ks:
                loaded = _pipeline.load([items[k].untargeted() for k in ks], dev,
                                        direct_io=direct_io)
                for k, t in zip(ks, loaded):
                    made[k] = t
        for k in flags:
            if items[k].target is not None:
                made[k] = items[k].target.copy_(made[k])
    groups = {dev: [k for k in ks if made[k] is None] for dev, ks in groups.items()}
    loaded = _pipeline.load_each({dev: [items[k] for k in ks] for dev, ks in groups.items()
                                  if ks}, progress=progress, direct_io=direct_io)
    for dev, outs in loaded.items():   # (one load a device, all at once)
        for k, t in zip(groups[dev], outs):
            made[k] = t
    return made


def _assign(torch: Any, model: Any, plan: _Plan, made: List[Any], sd: Dict[str, Any]
            ) -> None:
    """The new tensors put in the model (tied names: one tensor again), each
    name as what it is now (``sd``: the model's ``state_dict(keep_vars=True)``,
    its parameters and buffers themselves)."""
    owners: Dict[str, Any] = {}
    for (names, _, _, target), t in zip(plan.loads, made):
        if isinstance(target, torch.nn.Parameter):
            t = torch.nn.Parameter(t, requires_grad=target.requires_grad)
        for name in names:
            _put(torch, model, name, t, isinstance(sd[name], torch.nn.Parameter), owners)
