"""Python annotations and classes as Kiln types: :func:`as_type` and the
struct of a dataclass or NamedTuple (``kiln.struct(SomeClass)``).

The annotation also picks the Python value of a list of numbers (a Python
list for ``list[int]``, an ndarray for the array aliases); the wire bytes
and the hash do not change (see :doc:`records` for the mapping).
"""

import dataclasses
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
        KilnError: ``TYPE`` for an annotation with no Kiln type, ``DEPTH``
            past 64 nested containers, and what :func:`kiln.parse_type`
            raises for text.

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
                return meta
        return _from_annotation(args[0], depth, active)
    if origin is typing.Union or (sys.version_info >= (3, 10) and _is_uniontype(origin)):
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1 and len(args) == 2:
            return Opt(_from_annotation(rest[0], depth + 1, active))
        raise KilnError("TYPE", 0, "only Optional[T] unions map to Kiln types, not %r" % (ann,))
    if origin in (list, typing.List) or (origin is not None and origin.__name__ == "Sequence"):
        if len(args) != 1:
            raise KilnError("TYPE", 0, "list annotation needs one element type: %r" % (ann,))
        # a list annotation promises a Python list, numbers included
        return List(_from_annotation(args[0], depth + 1, active), "list")
    if origin in (dict, typing.Dict) or (origin is not None and origin.__name__ == "Mapping"):
        if len(args) != 2 or args[0] is not str:
            raise KilnError("TYPE", 0, "dict annotation must be dict[str, V]: %r" % (ann,))
        return Dict(_from_annotation(args[1], depth + 1, active))
    if _is_ndarray(origin or ann):
        if len(args) == 2:
            dt = typing.get_args(args[1])
            if dt:
                return List(_numpy_scalar_type(dt[0]), "ndarray")
        raise KilnError("TYPE", 0, "a numpy array annotation needs a width: use "
                        "Annotated[np.ndarray, kiln.f32] or NDArray[np.float32]")
    if isinstance(ann, type):
        from ._tensors import TensorDirectory
        if issubclass(ann, TensorDirectory):
            return tensors
        if dataclasses.is_dataclass(ann) or _is_namedtuple(ann) or _is_record(ann):
            return _struct_from_class(ann, depth, active)
        try:
            return _numpy_scalar_type(ann)
        except KilnError:
            pass
    raise KilnError("TYPE", 0, "no Kiln type for annotation %r" % (ann,))


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
        raise KilnError("TYPE", 0, "no Kiln type for %r" % (t,)) from None
    table = {"?": bool_, "i1": i8, "u1": u8, "i2": i16, "u2": u16, "i4": i32,
             "u4": u32, "i8": i64, "u8": u64, "f4": f32, "f8": f64}
    key = "?" if dt.kind == "b" else dt.kind + str(dt.itemsize)
    if key not in table:
        raise KilnError("TYPE", 0, "no Kiln scalar for numpy dtype %s" % dt)
    return table[key]


_CLASS_CACHE = {}

def _struct_from_class(cls, depth, active):
    cached = _CLASS_CACHE.get(cls)
    if cached is not None:
        return cached
    if cls in active:
        raise KilnError("DEPTH", 0, "class %s refers to itself; Kiln types are finite"
                        % cls.__qualname__)
    if depth > MAX_DEPTH:
        raise KilnError("DEPTH", 0, "classes nest more than %d containers" % MAX_DEPTH)
    active = dict(active)
    active[cls] = True
    try:
        hints = typing.get_type_hints(cls, include_extras=True)
    except Exception as e:
        raise KilnError("TYPE", 0, "cannot resolve annotations of %s: %s"
                        % (cls.__qualname__, e)) from None
    if dataclasses.is_dataclass(cls):
        names = [f.name for f in dataclasses.fields(cls)]
        wire = [f.metadata.get(WIRE_NAME, f.name) for f in dataclasses.fields(cls)]
        for f in dataclasses.fields(cls):
            if not f.init:
                raise KilnError("TYPE", 0, "dataclass field %s.%s has init=False"
                                % (cls.__qualname__, f.name))
    elif _is_namedtuple(cls):
        names = wire = list(cls._fields)
    elif _is_record(cls):
        names = wire = list(cls.__kiln_fields__)
    else:
        raise KilnError("TYPE", 0, "%s is neither a dataclass nor a NamedTuple" % cls.__qualname__)
    fields = []
    for name, wname in zip(names, wire):
        if name not in hints:
            raise KilnError("TYPE", 0, "field %s.%s has no annotation" % (cls.__qualname__, name))
        fields.append((wname, _from_annotation(hints[name], depth + 1, active)))
    t = Struct(fields, cls, names)
    _CLASS_CACHE[cls] = t
    return t
