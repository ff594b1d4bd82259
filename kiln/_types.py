"""The Kiln type layer, as the rest of kiln imports it: the public
constructors (``kiln.list_``, ``kiln.opt``, ``kiln.dict_``, ``kiln.struct``),
which take a Type, type text or an annotation, and the names of the rooms
below, each with one job:

* :mod:`kiln._typemodel`: the type model (the kinds of type, canonical text,
  schema hash, minimum sizes, plans, the scalar singletons);
* :mod:`kiln._typetext`: type text (``parse_type``, its tokens and bounds);
* :mod:`kiln._annotations`: Python annotations and classes (``as_type``).

Each imports only the ones listed before it; this module imports all three.
"""

from typing import Any, Optional

from ._annotations import TypeArg, _struct_from_class, as_type
from ._typemodel import (
    MAX_BUILT, MAX_BUILT_TEXT, MAX_TEXT, MAX_TOKENS, SCALARS, WIRE_NAME, Dict, List, Opt,
    Scalar, Str, Struct, Tensors, Type, bool_, bytes_, f32, f64, i8, i16, i32, i64, int_, str_,
    tensors, u8, u16, u32, u64, uint)
from ._typetext import Budget, Tokens, count_tokens, field_name, parse_type
from ._wire import MAX_DEPTH, fnv1a_tokens

# what the rest of kiln imports from here (the rooms' names, re-exported)
__all__ = [
    "TypeArg", "as_type", "parse_type", "list_", "opt", "dict_", "struct",
    "Type", "Scalar", "Str", "Tensors", "List", "Opt", "Dict", "Struct", "SCALARS", "WIRE_NAME",
    "bool_", "i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64", "int_", "uint", "f32", "f64",
    "str_", "bytes_", "tensors",
    "MAX_DEPTH", "MAX_TOKENS", "MAX_TEXT", "MAX_BUILT", "MAX_BUILT_TEXT", "fnv1a_tokens",
    "Budget", "Tokens", "count_tokens", "field_name",
]


def list_(elem: "TypeArg") -> "List":
    """``list<T>``; a list of fixed-width numbers (``u8`` included) decodes to an ndarray.

    Args:
        elem: the element type (a Type, type text or an annotation).

    Returns:
        The list type.  Its text and hash are those of ``list<T>`` parsed from
        text; only the Python value differs for ``u8`` (an ndarray here,
        ``bytes`` from type text).

    Raises:
        KilnError: ``DEPTH`` past 64 nested containers.
        TypeError: for an annotation with no Kiln wire form.

    Example:
        >>> kiln.list_(kiln.f32)
        kiln.Type('list<f32>')
        >>> kiln.decode(kiln.encode([1, 2], "list<i8>"), kiln.list_(kiln.i8)).tolist()
        [1, 2]
    """
    return List(as_type(elem), "ndarray")


def opt(elem: "TypeArg") -> "Opt":
    """``opt<T>``: a value or None.

    Args:
        elem: the type of the present value.

    Returns:
        The optional type; ``None`` is absent.  An ``opt`` directly inside an
        ``opt`` decodes a present-but-empty inner value as
        :class:`kiln.Some` ``(None)``.

    Raises:
        KilnError: ``DEPTH`` past 64 nested containers.

    Example:
        >>> t = kiln.opt(kiln.str_)
        >>> kiln.encode(None, t), kiln.decode(kiln.encode("a", t), t)
        (b'\\x00', 'a')
    """
    return Opt(as_type(elem))


def dict_(value: "TypeArg") -> "Dict":
    """``dict<str,V>``: string keys, sorted by their UTF-8 bytes on the wire.

    Args:
        value: the value type.

    Returns:
        The dict type (decodes to a ``dict``).

    Raises:
        KilnError: ``DEPTH`` past 64 nested containers.

    Example:
        >>> t = kiln.dict_(kiln.i32)
        >>> kiln.decode(kiln.encode({"b": 2, "a": 1}, t), t)
        {'a': 1, 'b': 2}
    """
    return Dict(as_type(value))


def struct(fields: Any, cls: Optional[type] = None) -> "Struct":
    """A struct type.

    Args:
        fields: a mapping or a sequence of ``(name, type)`` pairs, decoded to a
            ``dict``; or a dataclass / NamedTuple class, whose annotations give
            the field types and whose instances are what decode returns.
        cls: with a mapping or pairs, a class to bind (rarely needed).

    Returns:
        The struct type; fields are written in declaration order.

    Raises:
        TypeError: for a class that is neither a dataclass nor a NamedTuple,
            or a field whose annotation has no Kiln wire form (a union other
            than ``T | None``, a class that contains itself), naming the field.
        KilnError: ``TYPE`` for a field name that is not an identifier or
            repeats; ``DEPTH`` past 64 nested containers.

    Example:
        >>> kiln.struct({"id": kiln.i64, "name": kiln.opt(kiln.str_)})
        kiln.Type('struct{id:i64,name:opt<str>,}')
        >>> @dataclasses.dataclass
        ... class Point:
        ...     x: kiln.F32
        ...     tags: list[str]
        >>> kiln.struct(Point).text
        'struct{x:f32,tags:list<str>,}'
    """
    if isinstance(fields, type):
        return _struct_from_class(fields, 0, {})
    items = fields.items() if hasattr(fields, "items") else fields
    return Struct(((name, as_type(t)) for name, t in items), cls)
