"""JSON Schema in and out: ``schema_from_json``, ``to_json_schema``, and the
generator of dataclasses behind ``kiln gen``.

The subset (the same as the spec's dynamic values):

* ``{"type": "boolean"}``: ``bool``.
* ``{"type": "integer"}``: ``i64``; with ``"format"`` ``int8`` ... ``int64``
  or ``uint8`` ... ``uint64``, that width.
* ``{"type": "number"}``: ``f64``; with ``"format": "float"``, ``f32``
  (``"double"`` is the default).
* ``{"type": "string"}``: ``str``; with ``"format": "binary"``, ``list<u8>``
  (bytes).
* ``{"type": "array", "items": S}``: ``list<S>``, decoded as the type text
  decodes it (an ndarray of numbers, ``bytes`` for ``uint8``) unless
  ``schema_from_json(doc, arrays="list")`` asks for Python lists.
* ``{"type": "object", "properties": {...}, "required": [...]}``: a
  ``struct`` with the properties in document order; those left out of
  ``required`` (when it is given) are ``opt<...>``.
* ``{"type": "object", "additionalProperties": V}``: ``dict<str,V>``.
* ``{"$ref": "#/$defs/Name"}``: the definition (not recursive).

Annotation keywords (``title``, ``description``, ``$comment``, ``examples``,
``default``, ``$schema``, ``$id``, ``deprecated``, ``readOnly``, ``writeOnly``)
are ignored; any other keyword changes what a value may be and is refused, as
is everything outside this list: a :class:`SchemaError` naming the JSON
pointer of the node.  Documents nest at most 64 containers (``DEPTH``); the
type they describe is counted before it is built and holds at most 1,000,000
tokens and 16,000,000 characters (``LIMIT``); see ``kiln._schema_read``.
"""

from typing import Any, Dict

from ._errors import SchemaError
from ._schema_gen import generate
from ._schema_read import _INTS, pointer_text as _ptr, schema_from_json
from ._types import (Dict as _Dict, List as _List, Opt, Scalar, Str, Struct, Type, as_type,
                     bool_, f32, u8)


# --- out --------------------------------------------------------------------------

def _scalar_schema(t: Scalar) -> Dict[str, Any]:
    if t.op == bool_.op:
        return {"type": "boolean"}
    for name, s in _INTS.items():
        if s.op == t.op:
            return {"type": "integer", "format": name}
    return {"type": "number", "format": "float" if t.op == f32.op else "double"}


def _schema_of(t: Type, pointer: str, field: bool = False) -> Dict[str, Any]:
    wire = getattr(t, "wire", None)
    if wire is not None:   # a Python type carried by a wire type: the wire's schema
        return _schema_of(wire, pointer, field)
    if isinstance(t, Scalar):
        return _scalar_schema(t)
    if isinstance(t, Str):
        return {"type": "string"}
    if isinstance(t, _List):
        if isinstance(t.elem, Scalar) and t.elem.op == u8.op and t.form is None:
            return {"type": "string", "format": "binary"}
        return {"type": "array", "items": _schema_of(t.elem, pointer + "/items")}
    if isinstance(t, _Dict):
        return {"type": "object",
                "additionalProperties": _schema_of(t.value, pointer + "/additionalProperties")}
    if isinstance(t, Struct):
        props: Dict[str, Any] = {}
        required = []
        for name, ft in t.fields:
            p = _ptr(pointer, "properties", name)
            if isinstance(ft, Opt):
                if isinstance(ft.elem, Opt):
                    raise SchemaError(p, "opt<opt<...>> has no JSON Schema form")
                props[name] = _schema_of(ft.elem, p)
            else:
                props[name] = _schema_of(ft, p)
                required.append(name)
        return {"type": "object", "properties": props, "required": required}
    if isinstance(t, Opt):
        raise SchemaError(pointer, "opt<...> has a JSON Schema form only as a struct field "
                          "(a property left out of required)")
    raise SchemaError(pointer, "%s has no JSON Schema form (tensors are binary payloads)"
                      % t.text)


def to_json_schema(type_or_class: Any) -> Dict[str, Any]:
    """The JSON Schema of a Kiln type (or a bound class), in the subset kiln reads.

    ``int`` and ``uint`` are written as int64 and uint64 and so read back as
    ``i64`` and ``u64``; tensors and ``opt`` outside a struct field are refused.

    Args:
        type_or_class: a :class:`kiln.Type`, type text or a bound class.

    Returns:
        dict: a JSON Schema (draft 2020-12) document.

    Raises:
        SchemaError: ``tensors``, ``opt`` outside a struct field, or
            ``opt<opt<...>>``.

    Example:
        >>> doc = kiln.to_json_schema("struct{id:i64,name:opt<str>,}")
        >>> doc["properties"]["id"], doc["required"]
        ({'type': 'integer', 'format': 'int64'}, ['id'])
        >>> kiln.schema_from_json(doc).text
        'struct{id:i64,name:opt<str>,}'
    """
    t = as_type(type_or_class)
    doc = {"$schema": "https://json-schema.org/draft/2020-12/schema"}
    doc.update(_schema_of(t, "#"))
    return doc


__all__ = ["SchemaError", "schema_from_json", "to_json_schema", "generate"]
