"""Python annotations and classes as Kiln types: :func:`as_type` and the
struct of a dataclass or NamedTuple (``kiln.struct(SomeClass)``).

The annotation also picks the Python value of a list of numbers (a Python
list for ``list[int]``, an ndarray for the array aliases); the wire bytes
and the hash do not change (see :doc:`records` for the mapping).
"""

import dataclasses
import enum
import sys
import typing
from typing import Any

from ._errors import KilnError
from ._typemodel import (WIRE_NAME, Dict, List, Opt, Scalar, Struct, Type, _is_namedtuple,
                         _is_record,
                         bool_, bytes_, f32, f64, i8, i16, i32, i64, str_, tensors, u8, u16,
                         u32, u64)
from ._typetext import parse_type
from ._wire import MAX_DEPTH
from . import _pyconv

# what the constructors take as a type: a Type, type text or an annotation
TypeArg = Any


def as_type(t: "TypeArg") -> Type:
    """Turn a Type, type text, Python class or annotation into a Type.

    This is what every function taking a ``type`` argument does with it.

    Args:
        t: a :class:`kiln.Type`; type text; a dataclass or NamedTuple; or an
            annotation (``int``, ``list[float]``, ``Optional[str]``,
            ``dict[str, int]``, ``kiln.I32``, ``kiln.F32Array`` ...).

    Returns:
        Type: the Kiln type (see :doc:`records` for the mapping).

    Raises:
        TypeError: for an annotation with no Kiln wire form (``int | str``
            and other unions, ``complex``, a class that contains itself),
            naming the field and saying why.
        KilnError: ``DEPTH`` past 64 nested containers, and what
            :func:`kiln.parse_type` raises for text.

    Example:
        >>> kiln.as_type(list[int]), kiln.as_type(kiln.F32Array)
        (kiln.Type('list<i64>', python='list[i64]'), kiln.Type('list<f32>'))
        >>> kiln.as_type(typing.Optional[dict[str, float]]).text
        'opt<dict<str,f64>>'
    """
    if isinstance(t, Type):
        return t
    if isinstance(t, str):
        return parse_type(t)
    return _from_annotation(t, 0, {})


def _from_annotation(ann, depth, active):
    if isinstance(ann, Type):
        return ann
    if depth > MAX_DEPTH:
        raise KilnError("DEPTH", 0, "annotation nests more than %d containers" % MAX_DEPTH)
    if isinstance(ann, str):
        return parse_type(ann)
    if ann is int:
        return i64
    if ann is float:
        return f64
    if ann is str:
        return str_
    if ann is bytes or ann is bytearray:
        return bytes_
    if ann is bool:
        return bool_
    origin = typing.get_origin(ann)
    args = typing.get_args(ann)
    if origin is typing.Annotated:
        for meta in args[1:]:
            if isinstance(meta, Type):
                base = args[0]
                if _is_ndarray(base) and isinstance(meta, Scalar):
                    return List(meta, "ndarray")
                if isinstance(base, type) and issubclass(base, enum.Enum):
                    return _pyconv.enum_type(base, meta)   # the enum on that wire type
                if typing.get_origin(base) is typing.Literal:
                    return _pyconv.literal_type(typing.get_args(base), meta)
                if _pyconv.by_class(base) is not None:
                    raise TypeError("%s has one wire type (%s); Annotated cannot change it"
                                    % (base.__name__, _pyconv.by_class(base).text))
                return meta
        return _from_annotation(args[0], depth, active)
    if origin is typing.Union or (sys.version_info >= (3, 10) and _is_uniontype(origin)):
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1 and len(args) == 2:
            return Opt(_from_annotation(rest[0], depth + 1, active))
        raise TypeError("%s has no wire form: a Kiln value carries no tag saying which "
                        "member of a union it is, so only T | None (opt<T>) is mapped"
                        % _ann_name(ann))
    if origin is typing.Literal:
        return _pyconv.literal_type(args)
    if origin in (tuple, typing.Tuple):
        if ann is typing.Tuple:
            raise TypeError("a bare tuple has no wire form: give its element types, "
                            "tuple[int, str] or tuple[int, ...]")
        if len(args) == 2 and args[1] is Ellipsis:
            return _pyconv.var_tuple_type(_from_annotation(args[0], depth + 1, active))
        if Ellipsis in args:
            raise TypeError("%s: only tuple[T, ...] may have an ellipsis" % _ann_name(ann))
        return _pyconv.fixed_tuple_type([_from_annotation(a, depth + 1, active)
                                         for a in args])
    if origin in (list, typing.List) or (origin is not None and origin.__name__ == "Sequence"):
        if len(args) != 1:
            raise TypeError("a list annotation needs one element type: %s" % _ann_name(ann))
        # a list annotation promises a Python list, numbers included
        return List(_from_annotation(args[0], depth + 1, active), "list")
    if origin in (dict, typing.Dict) or (origin is not None and origin.__name__ == "Mapping"):
        if len(args) != 2 or args[0] is not str:
            raise TypeError("a dict annotation must be dict[str, V] (keys are str on the "
                            "wire): %s" % _ann_name(ann))
        return Dict(_from_annotation(args[1], depth + 1, active))
    if _is_ndarray(origin or ann):
        if len(args) == 2:
            dt = typing.get_args(args[1])
            if dt:
                return List(_numpy_scalar_type(dt[0]), "ndarray")
        raise TypeError("a numpy array annotation needs a width: use "
                        "Annotated[np.ndarray, kiln.f32] or NDArray[np.float32]")
    if isinstance(ann, type):
        from ._tensors import TensorDirectory
        if issubclass(ann, TensorDirectory):
            return tensors
        if issubclass(ann, enum.Enum):
            return _pyconv.enum_type(ann)
        mapped = _pyconv.by_class(ann)
        if mapped is not None:
            return mapped
        if ann is tuple:
            raise TypeError("a bare tuple has no wire form: give its element types, "
                            "tuple[int, str] or tuple[int, ...]")
        if dataclasses.is_dataclass(ann) or _is_namedtuple(ann) or _is_record(ann):
            return _struct_from_class(ann, depth, active)
        try:
            return _numpy_scalar_type(ann)
        except TypeError:
            pass
    raise TypeError("%s has no Kiln wire form%s" % (_ann_name(ann), _hint(ann, origin)))


def _hint(ann, origin):
    """What to write instead, for the annotations people reach for first."""
    import datetime
    import pathlib
    what = origin or ann
    if what in (set, frozenset, typing.Set, typing.FrozenSet) or \
            getattr(what, "__name__", None) in ("AbstractSet", "MutableSet"):
        return ": a set has no order on the wire; use list[T] (and sorted(s) to write one)"
    if ann is datetime.time:
        return (": a time of day has no wire type; use datetime.timedelta (since midnight), "
                "or str for its ISO text")
    if ann is complex:
        return ": use tuple[float, float] (real, imaginary), or a tensors field for arrays"
    if isinstance(ann, type) and issubclass(ann, pathlib.PurePath):
        return ": store str(path) in a str field"
    if ann is typing.Any or ann is object:
        return (": a Kiln value carries no tag saying what it is, so every field needs one "
                "type; give it (a dataclass, T | None, list[T], dict[str, V], ...)")
    return ""


def _ann_name(ann):
    if isinstance(ann, type):
        return ann.__qualname__
    return repr(ann).replace("typing.", "")


class AnnotationError(TypeError):
    """An annotation with no wire form, with the fields that lead to it."""

    def __init__(self, path, why):
        TypeError.__init__(self, "field %s: %s" % (".".join(path), why))
        self.path = path
        self.why = why


def _is_uniontype(origin):
    import types as _t
    return origin is getattr(_t, "UnionType", None)


def _is_ndarray(x):
    try:
        import numpy
    except ImportError:  # pragma: no cover
        return False
    return x is numpy.ndarray


def _numpy_scalar_type(t):
    import numpy as np
    try:
        dt = np.dtype(t)
    except TypeError:
        raise TypeError("%s has no Kiln wire form" % _ann_name(t)) from None
    table = {"?": bool_, "i1": i8, "u1": u8, "i2": i16, "u2": u16, "i4": i32,
             "u4": u32, "i8": i64, "u8": u64, "f4": f32, "f8": f64}
    key = "?" if dt.kind == "b" else dt.kind + str(dt.itemsize)
    if key not in table:
        hint = ""
        if dt.kind in "fcV" or dt.name in ("float16", "bfloat16"):
            hint = ("; keep such arrays in a tensors field (kiln.TensorDirectory: f16, bf16 "
                    "and the float8 kinds), or use NDArray[np.float32]")
        raise TypeError("numpy dtype %s has no Kiln scalar%s" % (dt, hint))
    return table[key]


_CLASS_CACHE = {}

def _struct_from_class(cls, depth, active):
    cached = _CLASS_CACHE.get(cls)
    if cached is not None:
        return cached
    if cls in active:
        raise TypeError("class %s contains itself, which has no wire form: a Kiln type "
                        "is finite (a value holds no reference to another)" % cls.__qualname__)
    if depth > MAX_DEPTH:
        raise KilnError("DEPTH", 0, "classes nest more than %d containers" % MAX_DEPTH)
    active = dict(active)
    active[cls] = True
    hints = _type_hints(cls)
    if dataclasses.is_dataclass(cls):
        names = [f.name for f in dataclasses.fields(cls)]
        wire = [f.metadata.get(WIRE_NAME, f.name) for f in dataclasses.fields(cls)]
        for f in dataclasses.fields(cls):
            if not f.init:
                raise AnnotationError([cls.__qualname__, f.name], "a dataclass field with "
                                      "init=False cannot be built from the wire")
    elif _is_namedtuple(cls):
        names = wire = list(cls._fields)
    elif _is_record(cls):
        names = wire = list(cls.__kiln_fields__)
    else:
        raise TypeError("%s is neither a dataclass nor a NamedTuple" % cls.__qualname__)
    fields = []
    for name, wname in zip(names, wire):
        if name not in hints:
            raise AnnotationError([cls.__qualname__, name], "no annotation")
        try:
            fields.append((wname, _from_annotation(hints[name], depth + 1, active)))
        except AnnotationError as e:
            raise AnnotationError([cls.__qualname__, name] + e.path[1:], e.why) from None
        except TypeError as e:
            raise AnnotationError([cls.__qualname__, name], str(e)) from None
    t = Struct(fields, cls, names)
    _CLASS_CACHE[cls] = t
    return t


def _type_hints(cls):
    """The resolved annotations of ``cls``.  A name a string annotation uses
    (``from __future__ import annotations``, a forward reference) is looked up
    in the class's module, then, for a class defined inside a function, in the
    frames of the code building the type (the function that defines the
    classes, while it runs)."""
    try:
        return typing.get_type_hints(cls, include_extras=True)
    except NameError:
        pass
    except Exception as e:
        raise TypeError("cannot resolve the annotations of %s: %s" % (cls.__qualname__, e)) \
            from None
    # (a name the module defines keeps the module's meaning: the frames only
    # add the names it lacks)
    known = getattr(sys.modules.get(cls.__module__), "__dict__", {})
    localns = {}
    f = sys._getframe(1)
    while f is not None:
        for k, v in f.f_locals.items():
            if k not in known:
                localns.setdefault(k, v)
        f = f.f_back
    localns.setdefault(cls.__name__, cls)
    try:
        return typing.get_type_hints(cls, localns=localns, include_extras=True)
    except NameError as e:
        name = getattr(e, "name", None) or str(e)
        field = next((k for k, a in _raw_annotations(cls).items()
                      if isinstance(a, str) and name in a), None)
        why = ("the annotation names %s, which is neither in module %s nor visible where the "
               "type is built: define the class at module level, or build the type "
               "(kiln.struct) where the class is in scope" % (name, cls.__module__))
        if field is None:
            raise TypeError("%s: %s" % (cls.__qualname__, why)) from None
        raise AnnotationError([cls.__qualname__, field], why) from None
    except Exception as e:
        raise TypeError("cannot resolve the annotations of %s: %s" % (cls.__qualname__, e)) \
            from None


def _raw_annotations(cls):
    out = {}
    for k in reversed(cls.__mro__):
        out.update(vars(k).get("__annotations__", {}))
    return out
