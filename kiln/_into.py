"""Owned copies into memory the caller owns: ``Tensor.copy_into``,
``TensorDirectory.copy_into`` and ``kiln.load_tensors(path, into=...)``.

Every target is checked before any byte is written (name, dtype, shape,
writability), so a wrong target leaves every target as it was; then each
payload is copied once, straight from the tensor's buffer (a file's mapping)
into the target, with no intermediate array of the payload's size.
"""

from typing import Any, List, Mapping, Tuple

import numpy as np

from . import _wire as W
from ._tensors.arrays import file_source, mapping_intact


def as_target(obj: Any, what: str) -> np.ndarray:
    """A numpy view of a caller's array: an ndarray, an object with the buffer
    protocol (a memoryview's format and shape kept), or one with ``__dlpack__``."""
    if isinstance(obj, np.ndarray):
        return obj
    try:
        mv = memoryview(obj)
    except TypeError:
        mv = None
    if mv is not None:
        if mv.readonly:
            raise ValueError("%s is read-only" % what)
        return np.asarray(mv)
    if hasattr(obj, "__dlpack__"):
        try:
            return np.from_dlpack(obj)
        except (RuntimeError, BufferError) as e:   # numpy's "Unsupported dtype in DLTensor."
            raise TypeError("%s is %s, which numpy cannot read through DLPack (%s)%s"
                            % (what, type(obj).__name__, str(e).rstrip("."),
                               "; kiln.torch.load_model fills torch modules"
                               if type(obj).__module__.startswith("torch") else "")) from None
    raise TypeError("%s is %s: copy_into takes a numpy array, an object with the buffer "
                    "protocol or one with __dlpack__" % (what, type(obj).__name__))


def plan(t: Any, obj: Any, what: str) -> Tuple[np.ndarray, np.ndarray]:
    """(source view, target) for tensor ``t``, or ``TypeError``/``ValueError`` naming
    what does not fit; nothing is written."""
    a = as_target(obj, what)
    if not a.flags.writeable:
        raise ValueError("%s is read-only" % what)
    code = t.code
    entry = W.DTYPES.get(code)
    if entry is None or entry[1] == 0:   # opaque or packed: the raw bytes, as a u8 vector
        want_shape: Tuple[int, ...] = (t.nbytes,)
        ok = a.dtype == np.uint8
        want = "uint8 (the raw bytes of %s)" % (t.dtype,)
    else:
        want_shape = tuple(t.shape)
        if entry[3] is not None:         # bf16, float8: the ml_dtypes type of that name
            ok = a.dtype.name == entry[3] and a.dtype.itemsize == entry[1]
            want = entry[3]
        else:
            ok = a.dtype == np.dtype(entry[2])
            want = np.dtype(entry[2]).name
    if not ok:
        raise TypeError("%s has dtype %s; tensor %r (%s) needs %s"
                        % (what, a.dtype, t.name, t.dtype, want))
    if tuple(a.shape) != want_shape:
        raise ValueError("%s has shape %s; tensor %r needs %s"
                         % (what, tuple(a.shape), t.name, want_shape))
    src = np.frombuffer(t.data, dtype=a.dtype).reshape(want_shape) if t.nbytes else \
        np.empty(want_shape, a.dtype)
    mapping_intact(src, "tensor %r's file" % (t.name,))   # no copy from lost pages
    return src, a


def _copy(src: np.ndarray, dst: np.ndarray) -> None:
    """``dst[...] = src``; from an open file's mapping into a contiguous target,
    read with pread instead (a truncated file is EOF, never SIGBUS)."""
    where = file_source(src) if src.size and dst.flags.c_contiguous else None
    if where is None:
        np.copyto(dst, src, casting="no")
        return
    from ._pread import read_exactly
    shared, at, name = where
    fd = shared.hold()   # a close meanwhile waits for this read
    if fd is None:   # the file was closed: the view's mapping, as for any view
        np.copyto(dst, src, casting="no")
        return
    try:
        read_exactly(fd, memoryview(dst.reshape(-1).view(np.uint8)), at, name,
                     "a payload being copied")
    finally:
        shared.drop()


def copy_one(t: Any, obj: Any) -> None:
    src, dst = plan(t, obj, "the target of tensor %r" % (t.name,))
    _copy(src, dst)


def copy_many(d: Any, targets: Mapping[Any, Any], strict: bool) -> None:
    if not isinstance(targets, Mapping):
        raise TypeError("targets must be a mapping of tensor name to array, not %s"
                        % type(targets).__name__)
    keys = d.keys()
    unknown = [k for k in targets if k not in d]
    if unknown:
        raise KeyError("no tensor named %s in the directory" % ", ".join(map(repr, unknown)))
    if strict:
        missing = [k for k in keys if k not in targets]
        if missing:
            raise KeyError("no target for tensor %s (pass strict=False to fill only some)"
                           % ", ".join(map(repr, missing)))
    pairs: List[Tuple[np.ndarray, np.ndarray]] = []
    seen: List[np.ndarray] = []
    for k, obj in targets.items():   # every check before the first byte is written
        src, dst = plan(d[k], obj, "the target of tensor %r" % (k,))
        for other in seen:
            if np.shares_memory(dst, other):
                raise ValueError("the target of tensor %r overlaps another target" % (k,))
        seen.append(dst)
        pairs.append((src, dst))
    for src, dst in pairs:
        _copy(src, dst)
