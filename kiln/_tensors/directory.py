"""kiln.TensorDirectory: the tensors of one directory, a mapping of name to Tensor."""

import functools
from collections.abc import Mapping
from typing import Any, Dict, Iterable, List, Optional, Tuple

import numpy as np

from .._wire import DIRECTORY_SLOTS, R_BYTE_OFFSET, R_LAYOUT, R_NAME
from .arrays import owner
from .checks import check_directory
from .tensor import Tensor, _new_tensor

# the bound tensor part's fast paths (see _bind): make the Tensors of a decoded
# directory (None: the Python path does), and the base its arrays hold
_fill: Any = None
_hold: Any = None


class TensorDirectory(Mapping):
    """The tensors of one directory: a mapping of name to :class:`Tensor`.

    ``d["w"]`` finds a tensor by name and ``d[0]`` by position (directory
    order).  As a :class:`collections.abc.Mapping` its keys are the names in
    directory order (the positions 0..n-1 for an unnamed directory), so
    ``dict(d)``, ``d.items()`` and ``d.values()`` work as for any mapping.

    A decoded directory builds each :class:`Tensor` object the first time it
    is reached; the checks all ran before.  Directories compare equal when
    their names and tensors do, and pickle (payloads out of band with
    protocol 5).

    Args:
        tensors: the :class:`Tensor` objects, in directory order.

    Raises:
        EncodeError: what the wire's directory check would refuse: names
            not all present or all absent, an empty or repeated name, a
            scale or outer link to a missing or unsuitable tensor.
        TypeError: an item that is not a :class:`Tensor`.

    Example:
        >>> d = kiln.TensorDirectory([kiln.Tensor.from_numpy(np.ones(2, np.float32), name="b")])
        >>> d.keys(), d["b"].shape, "b" in d, d.get("c")
        (['b'], (2,), True, None)
    """

    # the slots (_tensors, _rows, _buf, _pb, _errors, _index, _names, _own) are
    # named once, in kiln._wire, for the compiled tensor part too
    __slots__ = DIRECTORY_SLOTS + ("__weakref__",)

    def __init__(self, tensors: Iterable["Tensor"] = ()) -> None:
        ts = list(tensors)
        for i, t in enumerate(ts):
            if not isinstance(t, Tensor):
                raise TypeError("TensorDirectory item %d is %s, not a kiln.Tensor"
                                % (i, type(t).__name__))
        check_directory(ts)   # names and links, as the wire check would
        self._tensors = ts
        self._rows = None
        self._index = None
        self._names = None
        self._own = None

    @classmethod
    def _from_table(cls, rows, buf, pb, errors):
        d = cls.__new__(cls)
        d._rows = rows
        d._buf = buf = owner(buf)
        d._pb = pb
        d._errors = errors
        d._tensors = [None] * len(rows)
        d._index = None
        d._names = None
        d._own = _hold(buf)   # the base of the arrays Tensor.numpy makes (compiled kernels)
        return d

    def _make(self, i):
        row = self._rows[i]
        t = _new_tensor(Tensor)
        nm = row[R_NAME]
        t.name = None if nm is None else nm.decode("utf-8", self._errors)
        lay = row[R_LAYOUT]
        t.layout = None if lay is None else lay.decode("utf-8", self._errors)
        t._row = row
        t._buf = self._buf
        t._off = self._pb + row[R_BYTE_OFFSET]
        t._own = self._own
        self._tensors[i] = t
        return t

    @property
    def names(self) -> List[Optional[str]]:
        """Tensor names in directory order (None for unnamed tensors)."""
        names = self._names
        if names is None:
            if self._rows is None:
                names = [t.name for t in self._tensors]
            else:
                err = self._errors
                names = [None if r is None else r.decode("utf-8", err)
                         for r in _raw_names(self._rows)]
            self._names = names
        return list(names)

    def __len__(self) -> int:
        return len(self._tensors)

    def _tensor(self, i):
        t = self._tensors[i]
        return t if t is not None else self._make(i)

    def __iter__(self):
        """The keys: names in directory order, or positions when unnamed."""
        names = self.names
        if names and names[0] is not None:
            return iter(names)
        return iter(range(len(names)))

    def values(self) -> List["Tensor"]:  # type: ignore[override]
        """The tensors in directory order (a list)."""
        if self._rows is not None and _fill(self) is not None:
            return list(self._tensors)   # every Tensor made by the bound tensor part
        return [self._tensor(i) for i in range(len(self._tensors))]

    def items(self) -> List[Tuple[Any, "Tensor"]]:  # type: ignore[override]
        """(key, tensor) pairs in directory order (a list)."""
        return list(zip(self, self.values()))

    def keys(self) -> List[Any]:  # type: ignore[override]
        """The names in directory order, or the positions when unnamed (a list)."""
        return list(self)

    def __getitem__(self, key: Any) -> "Tensor":
        if isinstance(key, str):
            idx = self._index
            if idx is None:
                idx = self._index = self._name_index()
            if self._rows is None:
                return self._tensor(idx[key])
            try:   # a decoded directory is indexed by the raw name bytes: nothing decoded
                raw = key.encode("utf-8", self._errors)
            except UnicodeEncodeError:
                raise KeyError(key) from None
            i = idx.get(raw)
            if i is None:
                raise KeyError(key)
            return self._tensor(i)
        if isinstance(key, slice):
            return [self._tensor(i) for i in range(*key.indices(len(self)))]
        n = len(self._tensors)
        index = getattr(key, "__index__", None)
        if index is None or isinstance(key, bool):
            raise KeyError(key)   # neither a name nor a position
        i = index()
        if not -n <= i < n:
            raise IndexError("tensor index %d out of range for %d tensors" % (i, n))
        return self._tensor(i % n if n else i)

    def _name_index(self) -> Dict[Any, int]:
        if self._rows is None:
            return {n: i for i, n in enumerate(self.names) if n is not None}
        out: Dict[Any, int] = {}
        for i, r in enumerate(_raw_names(self._rows)):
            if r is not None:
                out.setdefault(r, i)
        return out

    def __contains__(self, key: object) -> bool:
        """Is ``key`` one of the keys: a name, or a position when the tensors are unnamed."""
        names = self.names
        if names and names[0] is not None:
            return isinstance(key, str) and key in names
        return isinstance(key, int) and not isinstance(key, bool) and 0 <= key < len(names)

    def __reduce_ex__(self, protocol):
        # the tensors pickle themselves (out of band with protocol 5)
        return (_rebuild_directory, (self.values(),))

    def get(self, key: Any, default: Any = None) -> Any:
        """``d[key]``, or ``default`` when there is no such name or position."""
        try:
            return self[key]
        except (KeyError, IndexError):
            return default

    def copy_into(self, targets: Any, *, strict: bool = True) -> None:
        """Write each tensor's payload once into the caller's array ``targets[name]``.

        Every name, dtype, shape and writability is checked first (see
        :meth:`Tensor.copy_into`): when one target is wrong, nothing is
        written to any of them.  Filling a model's existing weights this way
        makes no second copy and allocates nothing of the payloads' size.

        Args:
            targets: a mapping of tensor name (or position, for unnamed
                tensors) to a writable array.
            strict: every tensor needs a target (``KeyError`` naming those
                without); ``False`` fills only the names given.

        Raises:
            KeyError: a name the directory does not have, or (``strict``) a
                tensor without a target.
            TypeError, ValueError: as :meth:`Tensor.copy_into`; also two
                targets that share memory.

        Example:
            >>> d = kiln.decode_tensors(kiln.encode_tensors({"w": np.ones(2, np.float32)}))
            >>> w = np.zeros(2, np.float32)
            >>> d.copy_into({"w": w})
            >>> w.tolist()
            [1.0, 1.0]
        """
        from .._into import copy_many
        copy_many(self, targets, strict)

    def to_dict(self) -> Dict[Optional[str], np.ndarray]:
        """``{name: numpy array}`` for named tensors (views of the payloads).

        Example:
            >>> d = kiln.decode_tensors(kiln.encode_tensors({"w": np.ones(2, np.float32)}))
            >>> d.to_dict()["w"].tolist()
            [1.0, 1.0]
        """
        return {t.name: t.numpy() for t in self.values()}

    def __eq__(self, other):
        if isinstance(other, TensorDirectory):
            return self.names == other.names and self.values() == other.values()
        return NotImplemented

    __hash__ = None

    def __repr__(self):
        n = len(self._tensors)
        return "<kiln.TensorDirectory of %d tensor%s>" % (n, "" if n == 1 else "s")


_PY_TO_DICT = TensorDirectory.to_dict   # the Python method: its name, docstring, signature


def _bind(part):
    """values(), to_dict() and decoded directories use ``part``'s tensor part
    (kiln/_tensors/bind.py calls this, and only it)."""
    global _fill, _hold
    _fill = part.tensors_fill
    _hold = part.hold_buffer
    TensorDirectory.to_dict = functools.update_wrapper(part.tensors_dict_method, _PY_TO_DICT)


def _raw_names(rows):
    """The rows' raw names: a lazy table gives them without building its rows."""
    raw = getattr(rows, "raw_names", None)
    return raw() if raw is not None else [r[R_NAME] for r in rows]


def _rebuild_directory(tensors):
    return TensorDirectory(tensors)
