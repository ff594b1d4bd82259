"""``kiln.torch.safe_open``: the calls of ``safetensors.safe_open(path,
framework="pt")`` on a Kiln tensor file.

``get_tensor`` and ``get_slice(...)[...]`` read payload bytes with ``pread``
through the descriptor the open holds (a duplicate of ``kiln.open``'s), into
tensors that own their memory: never the file's name again, never a
mapping, so a file replaced or truncated meanwhile gives the bytes of the
file that was opened or ``KilnError`` ``EOF``, never a crash.  A slice reads
only the byte runs its rows and columns lie in (runs closer than 64 KiB are
read in one ``pread`` and the gap skipped).
"""

import itertools
import operator
from typing import Any, Dict, List, Optional, Tuple

import kiln
from kiln import KilnError
from kiln._access import alias_fault, dtype_label, file_offset, table

from ._sources import FileBytes, file_bytes
from ._common import ALIASES_KEY, PathLike, check_path, dtype_of, torch_module, torch_shape

__all__ = ["safe_open", "SafeSlice"]

_FRAMEWORKS = ("pt", "torch", "pytorch")
_GAP = 64 << 10      # runs this close are read in one pread (the gap read and dropped)
_GROUP = 16 << 20    # at most this many bytes in one merged read



def _device(torch: Any, device: Any) -> Any:
    if isinstance(device, int) and not isinstance(device, bool):   # safetensors: a CUDA index
        return torch.device("cuda", device)
    return torch.device(device)


class safe_open:
    """A Kiln tensor file opened as ``safetensors.safe_open`` opens a
    safetensors file: replace the import and the calls stay the same.

    Args:
        filename: a Kiln tensor file (a path or ``os.PathLike``; bytes are a
            ``TypeError``, as for every ``kiln.torch`` call).
        framework: ``"pt"`` (also ``"torch"``, ``"pytorch"``): the tensors
            are torch tensors.  Another framework is a ``ValueError`` (for
            numpy arrays use :func:`kiln.open`).
        device: where :meth:`get_tensor` and slices put their tensors:
            ``"cpu"`` (default), ``"cuda:0"``, a CUDA index, a ``torch.device``.

    Calls: :meth:`keys` (the names, sorted), :meth:`offset_keys` (in file
    order), :meth:`metadata`, :meth:`get_tensor`, :meth:`get_slice`; use it
    in a ``with`` block or call :meth:`close`.  Names saved as aliases by
    ``kiln.torch.save_file`` (tied weights stored once) are keys too, and
    read the stored tensor.

    Where kiln differs: a missing name is a ``KeyError`` and a closed file
    a ``ValueError`` (safetensors raises its ``SafetensorError``); a file
    fault is a :class:`kiln.KilnError`; metadata values are whatever the
    file stores (safetensors' are strings; a file converted from one has
    strings); each ``get_tensor`` returns a new tensor that owns its memory;
    a file recording CRC-32s has each tensor compared on its first
    ``get_tensor`` (slices are not compared, as ``KilnFile.rows``).

    Example:
        >>> kiln.torch.save_file({"w": torch.arange(6.0).reshape(3, 2)}, "model.kiln")
        >>> with kiln.torch.safe_open("model.kiln", framework="pt") as f:
        ...     f.keys(), f.get_slice("w")[1:, 0]
        (['w'], tensor([2., 4.]))
    """

    def __init__(self, filename: PathLike, framework: str, device: Any = "cpu") -> None:
        self._f: Any = None
        self._src: Optional[FileBytes] = None
        if framework not in _FRAMEWORKS:
            raise ValueError("kiln.torch.safe_open reads torch tensors (framework='pt'), not "
                             "%r (for numpy arrays use kiln.open)" % (framework,))
        torch = torch_module()
        self._torch = torch
        self._device = _device(torch, device)
        check_path(filename, "safe_open")
        f = kiln.open(filename)
        try:
            if isinstance(f, kiln.ShardedFile):
                raise ValueError("%s is a sharded set: safe_open opens one file (open each "
                                 "shard, or load the set with kiln.torch.load_file)" % f.path)
            self._table = table(f)
            meta = f.metadata
            aliases = {} if meta is None else meta.get(ALIASES_KEY) or {}
            bad = alias_fault(aliases, set(self._table.keys()))   # the one rule (kiln._files.tied)
            if bad:
                raise KilnError("TYPE", 0, "%s: the metadata's %r %s" % (f.path, ALIASES_KEY, bad))
            self._aliases: Dict[str, str] = aliases
            self._meta = None if meta is None else \
                {k: v for k, v in meta.items() if k != ALIASES_KEY} or None
            self._src = file_bytes(f)
        except BaseException:
            f.close()
            raise
        self._f = f
        self.path = f.path

    # --- the file ---------------------------------------------------------------

    def __enter__(self) -> "safe_open":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Close the file (tensors already read stay valid); a second close does nothing."""
        f, self._f = self._f, None
        src, self._src = self._src, None
        if src is not None:
            src.close()
        if f is not None:
            f.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:   # pragma: no cover - interpreter shutdown
            pass

    def _open(self) -> Any:
        f = self._f
        if f is None:
            raise ValueError("%s is closed" % getattr(self, "path", "the file"))
        return f

    def keys(self) -> List[str]:
        """The tensor names, sorted (as safetensors returns them)."""
        self._open()
        return sorted(list(self._table.keys()) + list(self._aliases))

    def offset_keys(self) -> List[str]:
        """The tensor names in the order of their payloads in the file (an
        alias right after the tensor it names)."""
        self._open()
        order = sorted(self._table.items(), key=lambda kv: (file_offset(kv[1]), kv[0]))
        by_target: Dict[str, List[str]] = {}
        for alias, name in sorted(self._aliases.items()):
            by_target.setdefault(name, []).append(alias)
        out: List[str] = []
        for name, _ in order:
            out.append(name)
            out.extend(by_target.get(name, ()))
        return out

    def metadata(self) -> Optional[Dict[str, Any]]:
        """The file's metadata (a new dict), or None when it has none; the
        reserved alias entry of ``kiln.torch.save_file`` is left out."""
        self._open()
        return None if self._meta is None else dict(self._meta)

    # --- tensors -----------------------------------------------------------------

    def _entry(self, name: str) -> Tuple[Any, Any, Tuple[int, ...]]:
        """(the table's tensor, torch dtype, torch shape) of ``name``."""
        self._open()
        if not isinstance(name, str):
            raise TypeError("a tensor name is a str, not %s" % type(name).__name__)
        stored = self._aliases.get(name, name)
        t = self._table.get(stored)
        if t is None:
            raise KeyError("%s does not contain tensor %r" % (self.path, name))
        dt = dtype_of(self._torch, str(t.dtype))
        if dt is None:
            raise KilnError("TYPE", 0, "%s: tensor %r is %s, which torch has no dtype for "
                            "(read it with kiln.open)" % (self.path, stored,
                                                          dtype_label(t.dtype, t.layout)))
        return t, dt, torch_shape(t, self.path)

    def get_tensor(self, name: str) -> Any:
        """Tensor ``name`` as a torch tensor on the open's device, a new one
        that owns its memory (read with ``pread``).

        Raises:
            KeyError: no tensor of that name.
            KilnError: its payload breaks a rule of its dtype, differs from
                its recorded CRC-32 (``CHECKSUM``), or the file ends before
                it (``EOF``: the file changed); ``TYPE`` for a dtype torch
                has none for (``i4``, ``u4``, opaque).
            ValueError: the file is closed.
        """
        t, dt, shape = self._entry(name)
        self._f[self._aliases.get(name, name)]   # the payload's rules and CRC, checked once
        return self._read(t, dt, shape, [(0, c, 1, False) for c in shape])

    def get_slice(self, name: str) -> "SafeSlice":
        """Tensor ``name`` to be read in part: ``f.get_slice(name)[a:b, c:d]``
        reads only the bytes of those rows and columns."""
        t, dt, shape = self._entry(name)
        stored = self._aliases.get(name, name)

        def read(sel: List[Tuple[int, int, int, bool]]) -> Any:
            if str(t.dtype) == "bool":   # its bytes' rule (0 or 1), checked once, whole
                self._open()[stored]
            return self._read(t, dt, shape, sel)
        return SafeSlice(name, str(t.dtype), shape, read)

    def _read(self, t: Any, dt: Any, shape: Tuple[int, ...],
              sel: List[Tuple[int, int, int, bool]]) -> Any:
        """The elements ``sel`` picks (per axis: start, count, step, an int
        index), read with pread: only the runs they lie in."""
        torch, src = self._torch, self._src
        if src is None:
            self._open()
        isz = torch.empty(0, dtype=dt).element_size()
        counts = [c for _, c, _, _ in sel]
        if 0 in counts:
            out = torch.empty([c for c, (_, _, _, i) in zip(counts, sel) if not i], dtype=dt)
            return out if self._device.type == "cpu" else out.to(self._device)
        full = [not i and s == 0 and st == 1 and c == d
                for (s, c, st, i), d in zip(sel, shape)]
        k = max([a for a, ok in enumerate(full) if not ok], default=-1)
        strides = [isz] * len(shape)
        for a in range(len(shape) - 2, -1, -1):
            strides[a] = strides[a + 1] * shape[a + 1]
        base = file_offset(t)
        if k < 0:   # every axis whole: one run
            runs, block = [base], t.nbytes
            view_shape = list(shape)
        else:
            s, c, st, _ = sel[k]
            span = (c - 1) * st + 1   # axis k's elements from the first picked to the last
            block = span * strides[k]
            outer = [range(s0, s0 + c0 * st0, st0) for s0, c0, st0, _ in sel[:k]]
            runs = [base + s * strides[k] + sum(i * strides[a] for a, i in enumerate(combo))
                    for combo in itertools.product(*outer)]
            view_shape = counts[:k] + [span] + list(shape[k + 1:])
        buf = torch.empty(len(runs) * block, dtype=torch.uint8)
        self._fill(memoryview(buf.numpy()), runs, block, t.name)
        out = buf.view(dt).reshape(view_shape)
        if k >= 0:
            pick = tuple(0 if i else slice(None) for _, _, _, i in sel[:k]) + \
                ((0 if sel[k][3] else slice(None, None, sel[k][2])),)
            out = out[pick].contiguous()
        return out if self._device.type == "cpu" else out.to(self._device)

    def _fill(self, dest: memoryview, runs: List[int], block: int, name: str) -> None:
        """Read ``block`` bytes at each of ``runs`` (increasing offsets) into
        ``dest`` one after another; runs closer than 64 KiB share one pread."""
        src = self._src
        assert src is not None
        what = "the payload of tensor %r" % name
        i = 0
        while i < len(runs):
            j = i + 1
            while j < len(runs) and runs[j] - (runs[j - 1] + block) <= _GAP and \
                    runs[j] + block - runs[i] <= _GROUP:
                j += 1
            if j == i + 1:
                src.read(dest[i * block:(i + 1) * block], runs[i], what)
            else:
                tmp = bytearray(runs[j - 1] + block - runs[i])
                src.read(memoryview(tmp), runs[i], what)
                for r in range(i, j):
                    at = runs[r] - runs[i]
                    dest[r * block:(r + 1) * block] = tmp[at:at + block]
            i = j


class SafeSlice:
    """A tensor of a :class:`safe_open` file, to be read in part:
    ``get_shape()``, ``get_dtype()`` and ``[index]``.

    The index takes what torch's basic indexing takes: ints (negative from
    the end), slices (with a positive step), one ``...``; the result is the
    tensor ``get_tensor(name)[index]`` would give (contiguous), read from
    only the bytes it needs.  ``None``, bools, tensors and lists are a
    ``TypeError``; an int out of range an ``IndexError``.
    """

    def __init__(self, name: str, dtype: str, shape: Tuple[int, ...], read: Any) -> None:
        self._name, self._dtype, self._shape, self._read = name, dtype, shape, read

    def get_shape(self) -> List[int]:
        """The shape, as torch gives it."""
        return list(self._shape)

    def get_dtype(self) -> str:
        """The dtype as safetensors names it (``"F32"``, ``"BF16"``, ``"F8_E4M3"``,
        ``"F4"``...): the converter's one table (kiln/convert/safetensors.py)."""
        from kiln.convert.safetensors import KILN_TO_ST
        return KILN_TO_ST.get(self._dtype, self._dtype)

    def __getitem__(self, index: Any) -> Any:
        return self._read(_selection(index, self._shape))

    def __repr__(self) -> str:
        return "<kiln.torch.SafeSlice %r %s%s>" % (self._name, self.get_dtype(), self.get_shape())


def _selection(index: Any, shape: Tuple[int, ...]) -> List[Tuple[int, int, int, bool]]:
    """(start, count, step, is an int) for every axis of ``shape``."""
    idx = index if isinstance(index, tuple) else (index,)
    if sum(1 for i in idx if i is Ellipsis) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    if any(i is Ellipsis for i in idx):
        at = next(n for n, i in enumerate(idx) if i is Ellipsis)
        fill = len(shape) - (len(idx) - 1)
        idx = idx[:at] + (slice(None),) * max(fill, 0) + idx[at + 1:]
    if len(idx) > len(shape):
        raise IndexError("too many indices for tensor of dimension %d" % len(shape))
    idx = idx + (slice(None),) * (len(shape) - len(idx))
    out: List[Tuple[int, int, int, bool]] = []
    for axis, (i, dim) in enumerate(zip(idx, shape)):
        if isinstance(i, slice):
            start, stop, step = i.indices(dim)
            if step <= 0:
                raise ValueError("step must be greater than zero")
            out.append((start, len(range(start, stop, step)), step, False))
            continue
        if i is None or isinstance(i, bool) or not hasattr(i, "__index__"):
            raise TypeError("a slice index is ints, slices and '...', not %s"
                            % type(i).__name__)
        n = operator.index(i)
        if not -dim <= n < dim:
            raise IndexError("index %d is out of bounds for dimension %d with size %d"
                             % (n, axis, dim))
        out.append((n % dim, 1, 1, True))
    return out

