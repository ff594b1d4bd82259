"""``kiln.Record``: a base class for records that decode and encode fast.

A subclass declares its fields with annotations, as a dataclass does::

    class Point(kiln.Record):
        x: int
        y: float = 0.0

Fields are held in slots (no instance ``__dict__``); ``__init__`` takes them
by position or keyword, with the defaults given; instances compare equal
when they are of the same class with equal fields, are unhashable (a
dataclass with ``eq=True``), repr as ``Point(x=1, y=2.0)`` and pickle.  On
the wire a Record is exactly the dataclass of the same fields: the same
type text, bytes and schema hash.

With the compiled kernels the base is ``kiln._kernels_c.RecordBase`` (C):
the decoder builds instances without calling ``__init__``, and an instance
whose fields are all atomic (int, float, str, bytes, bool, None) is not
tracked by the garbage collector (storing any other value tracks it again;
the slot descriptors' own ``__set__`` refuses, so every store goes through
the base), which is where it beats a slots dataclass.  With the pure kernels the base
is :class:`_PyRecordBase`, the same behaviour in Python (always tracked).
"""

import sys
from _thread import get_ident
from typing import TYPE_CHECKING, Any, Dict, Tuple

from ._compat import IMPLEMENTATION, kernels

if sys.version_info >= (3, 11):
    from typing import dataclass_transform
else:   # pragma: no cover - type checkers read the branch above
    def dataclass_transform(**kwargs: Any) -> Any:
        return lambda c: c

_MUTABLE = (list, dict, set, bytearray)


@dataclass_transform(eq_default=True)
class RecordMeta(type):
    """Turns a Record subclass's annotations into its fields and slots."""

    _kiln_record_meta = True   # kiln._plan.direct_build's mark of a Record class

    def __new__(mcls, name: str, bases: Tuple[type, ...], ns: Dict[str, Any],
                **kwargs: Any) -> "RecordMeta":
        fields = []
        defaults: Dict[str, Any] = {}
        for b in reversed(bases):   # inherited fields first, as a dataclass takes them
            for nm in getattr(b, "__kiln_fields__", ()):
                if nm not in fields:
                    fields.append(nm)
            defaults.update(getattr(b, "__kiln_defaults__", {}))
        own = []
        for nm, ann in ns.get("__annotations__", {}).items():
            if _is_classvar(ann):
                continue
            if nm in ns:
                value = ns.pop(nm)
                if isinstance(value, _MUTABLE):
                    raise ValueError("mutable default %s for field %s is not allowed"
                                     % (type(value).__name__, nm))
                defaults[nm] = value
            elif nm in defaults:
                del defaults[nm]   # redeclared without a default
            if nm not in fields:
                fields.append(nm)
                own.append(nm)
        seen_default = None
        for nm in fields:
            if nm in defaults:
                seen_default = nm
            elif seen_default is not None:
                raise TypeError("non-default argument %r follows default argument %r"
                                % (nm, seen_default))
        ns["__slots__"] = tuple(own)
        ns["__kiln_fields__"] = tuple(fields)
        ns["__kiln_defaults__"] = defaults
        ns["__match_args__"] = tuple(fields)
        if "__eq__" not in ns and "__hash__" not in ns:
            ns["__hash__"] = None   # as a dataclass with eq=True, frozen=False
        cls = super().__new__(mcls, name, bases, ns, **kwargs)
        seal = getattr(cls, "_kiln_seal", None)   # the compiled base (src/kernels/record.pxi)
        if seal is not None:
            seal(cls)
        return cls


def _is_classvar(ann: Any) -> bool:
    if isinstance(ann, str):
        return ann.startswith(("ClassVar", "typing.ClassVar", "t.ClassVar"))
    import typing
    return ann is typing.ClassVar or getattr(ann, "__origin__", None) is typing.ClassVar


class _PyRecordBase:
    """The pure twin of ``kiln._kernels_c.RecordBase`` (src/kernels/record.pxi)."""

    __slots__ = ()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        _init_fields(self, args, kwargs)   # the fields of type(self), as the C base

    def _values(self) -> Tuple[Any, ...]:
        return tuple([getattr(self, nm) for nm in type(self).__kiln_fields__])  # type: ignore

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return self._values() == other._values()

    def __ne__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return self._values() != other._values()

    def __repr__(self) -> str:
        return _py_repr(self)

    def __reduce__(self) -> Tuple[Any, ...]:
        return (type(self), self._values())


def _init_fields(self: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> None:
    cls = type(self)
    names = cls.__kiln_fields__
    nf, na = len(names), len(args)
    if na > nf:
        raise TypeError(_too_many(cls, nf, na))
    setattr_ = object.__setattr__
    for nm, v in zip(names, args):
        setattr_(self, nm, v)
    defaults = cls.__kiln_defaults__
    missing = []
    for nm in names[na:]:
        if nm in kwargs:
            setattr_(self, nm, kwargs.pop(nm))
        elif nm in defaults:
            setattr_(self, nm, defaults[nm])
        else:
            missing.append(nm)
    for nm in kwargs:
        if nm in names:
            raise TypeError("%s.__init__() got multiple values for argument %r"
                            % (cls.__qualname__, nm))
        raise TypeError("%s.__init__() got an unexpected keyword argument %r"
                        % (cls.__qualname__, nm))
    if missing:
        raise TypeError(_missing(cls, missing))


def _too_many(cls: Any, nf: int, na: int) -> str:
    """What a dataclass's __init__ says (counting self, as CPython does)."""
    nd = len(cls.__kiln_defaults__)
    if nd:
        return "%s.__init__() takes from %d to %d positional arguments but %d were given" % (
            cls.__qualname__, nf - nd + 1, nf + 1, na + 1)
    return "%s.__init__() takes %d positional argument%s but %d were given" % (
        cls.__qualname__, nf + 1, "" if nf == 0 else "s", na + 1)


def _missing(cls: Any, missing: "list[str]") -> str:
    q = ["%r" % m for m in missing]
    names = q[0] if len(q) == 1 else (q[0] + " and " + q[1]) if len(q) == 2 else \
        ", ".join(q[:-1]) + ", and " + q[-1]
    return "%s.__init__() missing %d required positional argument%s: %s" % (
        cls.__qualname__, len(q), "" if len(q) == 1 else "s", names)


_repr_running: "set[Tuple[int, int]]" = set()


def _py_repr(self: Any) -> str:
    # like dataclasses' repr (reprlib.recursive_repr): a record inside itself is "..."
    key = (id(self), get_ident())
    if key in _repr_running:
        return "..."
    _repr_running.add(key)
    try:
        return "%s(%s)" % (type(self).__qualname__, ", ".join(
            ["%s=%r" % (nm, getattr(self, nm)) for nm in type(self).__kiln_fields__]))
    finally:
        _repr_running.discard(key)


if TYPE_CHECKING:   # type checkers see the pure base; the metaclass gives __init__
    _Base = _PyRecordBase
else:
    _Base = kernels.RecordBase if IMPLEMENTATION == "cython" else _PyRecordBase


class Record(_Base, metaclass=RecordMeta):
    """Base class of fast records: subclasses declare fields as annotations.

    Example:
        >>> class Point(kiln.Record):
        ...     x: int
        ...     y: float = 0.0
        >>> p = Point(1, 2.5)
        >>> p, p == Point(1, 2.5), Point(3)
        (Point(x=1, y=2.5), True, Point(x=3, y=0.0))
        >>> kiln.decode(kiln.encode(p, Point), Point)
        Point(x=1, y=2.5)
        >>> kiln.as_type(Point).text
        'struct{x:i64,y:f64,}'
    """

    __slots__ = ()
    _kiln_record_root = True   # (kiln._plan.direct_build stops here)


class PyRecord(_PyRecordBase, metaclass=RecordMeta):
    """``kiln.Record`` on the pure base, whatever the kernels: what
    ``KILN_PUREPYTHON=1`` gives as ``kiln.Record`` (the tests run both)."""

    __slots__ = ()
    _kiln_record_root = True
