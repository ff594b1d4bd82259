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
* ``{"type": "array", "items": S}``: ``list<S>`` (a Python list).
* ``{"type": "object", "properties": {...}, "required": [...]}``: a
  ``struct`` with the properties in document order; those left out of
  ``required`` (when it is given) are ``opt<...>``.
* ``{"type": "object", "additionalProperties": V}``: ``dict<str,V>``.
* ``{"$ref": "#/$defs/Name"}``: the definition (not recursive).

Annotation keywords (``title``, ``description``, ``$comment``, ``examples``,
``default``, ``$schema``, ``$id``, ``deprecated``, ``readOnly``, ``writeOnly``)
are ignored; any other keyword changes what a value may be and is refused, as
is everything outside this list: a :class:`SchemaError` naming the JSON
pointer of the node.  Documents nest at most 64 containers (``DEPTH``).
"""

import json
import keyword
import re
from typing import Any, Dict, List, Optional, Tuple

from ._errors import KilnError
from ._types import (Dict as _Dict, List as _List, Opt, Scalar, Str, Struct, Type, as_type,
                     bool_, f32, f64, i8, i16, i32, i64, u8, u16, u32, u64, str_, MAX_DEPTH)


class SchemaError(ValueError):
    """A JSON Schema outside the subset kiln reads (or a type it cannot write).

    A ``ValueError`` (not a :class:`kiln.KilnError`: it is about a schema, not
    bytes).

    Attributes:
        pointer: the JSON pointer of the offending node (``#/properties/a``).
        reason: what is wrong there.

    Example:
        >>> try:
        ...     kiln.schema_from_json({"type": "integer", "minimum": 0})
        ... except kiln.SchemaError as e:
        ...     print(e.pointer)
        #
    """

    def __init__(self, pointer: str, reason: str) -> None:
        ValueError.__init__(self, "%s: %s" % (pointer or "#", reason))
        self.pointer = pointer or "#"
        self.reason = reason


SchemaError.__module__ = "kiln"

_INTS = {"int8": i8, "int16": i16, "int32": i32, "int64": i64, "uint8": u8, "uint16": u16,
         "uint32": u32, "uint64": u64}
_FLOATS = {"float": f32, "double": f64}
_IGNORED = {"title", "description", "$comment", "examples", "default", "$schema", "$id",
            "deprecated", "readOnly", "writeOnly"}
_ALLOWED = {
    "boolean": {"type"}, "integer": {"type", "format"}, "number": {"type", "format"},
    "string": {"type", "format"}, "array": {"type", "items"},
    "object": {"type", "properties", "required", "additionalProperties"},
}
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def _ptr(pointer: str, *parts: Any) -> str:
    return pointer + "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


class _Reader:
    def __init__(self, doc: Dict[str, Any]) -> None:
        self.doc = doc
        self.defs = doc.get("$defs", {}) if isinstance(doc, dict) else {}
        if not isinstance(self.defs, dict):
            raise SchemaError("#/$defs", "$defs must be an object")
        self.resolving: List[str] = []
        self.cache: Dict[str, Type] = {}

    def read(self, node: Any, pointer: str, depth: int) -> Type:
        if depth > MAX_DEPTH:
            raise KilnError("DEPTH", 0, "%s: the schema nests more than %d containers"
                            % (pointer, MAX_DEPTH))
        if not isinstance(node, dict):
            raise SchemaError(pointer, "a schema must be an object, not %s"
                              % type(node).__name__)
        if "$ref" in node:
            return self.ref(node, pointer, depth)
        kind = node.get("type")
        if not isinstance(kind, str) or kind not in _ALLOWED:
            raise SchemaError(pointer, "type %r is outside the subset kiln reads (boolean, "
                              "integer, number, string, array, object, $ref)" % (kind,))
        extra = sorted(set(node) - _ALLOWED[kind] - _IGNORED - ({"$defs"} if pointer == "#"
                                                                 else set()))
        if extra:
            raise SchemaError(pointer, "keyword %r is not in the subset (it would change what "
                              "a %s may be)" % (extra[0], kind))
        fmt = node.get("format")
        if fmt is not None and not isinstance(fmt, str):
            raise SchemaError(_ptr(pointer, "format"), "format must be a string")
        if kind == "boolean":
            return bool_
        if kind == "integer":
            if fmt is None:
                return i64
            if fmt not in _INTS:
                raise SchemaError(_ptr(pointer, "format"), "integer format %r is not int8.."
                                  "int64 or uint8..uint64" % (fmt,))
            return _INTS[fmt]
        if kind == "number":
            if fmt is None:
                return f64
            if fmt not in _FLOATS:
                raise SchemaError(_ptr(pointer, "format"), "number format %r is not float or "
                                  "double" % (fmt,))
            return _FLOATS[fmt]
        if kind == "string":
            if fmt is None:
                return str_
            if fmt != "binary":
                raise SchemaError(_ptr(pointer, "format"), "string format %r is not binary"
                                  % (fmt,))
            return _List(u8)
        if kind == "array":
            if "items" not in node:
                raise SchemaError(pointer, "an array needs items")
            return _List(self.read(node["items"], _ptr(pointer, "items"), depth + 1), "list")
        return self.obj(node, pointer, depth)

    def obj(self, node: Dict[str, Any], pointer: str, depth: int) -> Type:
        props = node.get("properties")
        extra = node.get("additionalProperties")
        if props is None and isinstance(extra, dict):
            if "required" in node:
                raise SchemaError(_ptr(pointer, "required"), "a map has no required keys")
            return _Dict(self.read(extra, _ptr(pointer, "additionalProperties"), depth + 1))
        if props is None:
            props = {}
        if not isinstance(props, dict):
            raise SchemaError(_ptr(pointer, "properties"), "properties must be an object")
        if extra not in (None, False):
            raise SchemaError(_ptr(pointer, "additionalProperties"), "an object with "
                              "properties cannot also take additional ones")
        required = node.get("required")
        if required is not None and (not isinstance(required, list) or not all(
                isinstance(r, str) and r in props for r in required)):
            raise SchemaError(_ptr(pointer, "required"), "required must list properties of "
                              "this object")
        fields = []
        for name, sub in props.items():
            p = _ptr(pointer, "properties", name)
            if not _IDENT.match(name):
                raise SchemaError(p, "property %r is not an identifier" % name)
            t = self.read(sub, p, depth + 1)
            if required is not None and name not in required:
                t = Opt(t)
            fields.append((name, t))
        return Struct(fields)

    def ref(self, node: Dict[str, Any], pointer: str, depth: int) -> Type:
        ref = node["$ref"]
        extra = sorted(set(node) - {"$ref"} - _IGNORED - ({"$defs"} if pointer == "#"
                                                         else set()))
        if extra:
            raise SchemaError(pointer, "keyword %r beside $ref is not in the subset" % extra[0])
        if not isinstance(ref, str) or not ref.startswith("#/$defs/") or \
                ref[len("#/$defs/"):] not in self.defs:
            raise SchemaError(_ptr(pointer, "$ref"), "$ref %r is not #/$defs/<a definition>"
                              % (ref,))
        if ref in self.resolving:
            raise SchemaError(_ptr(pointer, "$ref"), "$ref %r is recursive (Kiln types "
                              "cannot contain themselves)" % ref)
        if ref not in self.cache:
            self.resolving.append(ref)
            try:
                self.cache[ref] = self.read(self.defs[ref[len("#/$defs/"):]], ref, depth + 1)
            finally:
                self.resolving.pop()
        return self.cache[ref]


def schema_from_json(doc: Any) -> Type:
    """The Kiln type of a JSON Schema document (a dict, or JSON text).

    Args:
        doc: the schema, in the subset listed in :mod:`kiln.schema`.

    Returns:
        Type: the Kiln type; structs decode to ``dict``, arrays to ``list``.

    Raises:
        SchemaError: text that is not JSON, a keyword or type outside the
            subset, a bad ``$ref`` or a recursive one.
        KilnError: ``DEPTH`` for a document nesting more than 64 containers,
            ``LIMIT`` for a type of more than 1,000,000 tokens (reused
            ``$defs`` can double at each level).

    Example:
        >>> doc = {"type": "object", "required": ["id"],
        ...        "properties": {"id": {"type": "integer"},
        ...                       "score": {"type": "number", "format": "float"}}}
        >>> kiln.schema_from_json(doc).text
        'struct{id:i64,score:opt<f32>,}'
    """
    if isinstance(doc, (str, bytes)):
        try:
            doc = json.loads(doc)
        except ValueError as e:
            raise SchemaError("#", "not JSON: %s" % e) from None
    return _Reader(doc).read(doc, "#", 0)


# --- out --------------------------------------------------------------------------

def _scalar_schema(t: Scalar) -> Dict[str, Any]:
    if t.op == bool_.op:
        return {"type": "boolean"}
    for name, s in _INTS.items():
        if s.op == t.op:
            return {"type": "integer", "format": name}
    return {"type": "number", "format": "float" if t.op == f32.op else "double"}


def _schema_of(t: Type, pointer: str, field: bool = False) -> Dict[str, Any]:
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


# --- the generator ------------------------------------------------------------------

_ANN = {"bool": "bool", "i64": "int", "f64": "float", "i8": "kiln.I8", "i16": "kiln.I16",
        "i32": "kiln.I32", "u8": "kiln.U8", "u16": "kiln.U16", "u32": "kiln.U32",
        "u64": "kiln.U64", "f32": "kiln.F32"}


# names the generated module itself uses
_TAKEN = {"Optional", "dataclasses", "kiln", "ROOT", "TYPES"}


def _class_name(text: str) -> str:
    parts = re.split(r"[^A-Za-z0-9]+", str(text))
    name = "".join(p[:1].upper() + p[1:] for p in parts if p) or "Record"
    if name[0].isdigit() or keyword.iskeyword(name) or name in _TAKEN:
        name = name + "_" if not name[0].isdigit() else "_" + name
    return name


class _Gen:
    def __init__(self) -> None:
        self.classes: List[Tuple[str, List[Tuple[str, str]]]] = []
        self.names: Dict[str, int] = {}
        self.done: Dict[Struct, str] = {}

    def unique(self, name: str) -> str:
        n = self.names.get(name, 0)
        self.names[name] = n + 1
        return name if n == 0 else "%s%d" % (name, n + 1)

    def ann(self, t: Type, hint: str) -> str:
        if isinstance(t, Scalar):
            return _ANN[t.text]
        if isinstance(t, Str):
            return "str"
        if isinstance(t, _List):
            if isinstance(t.elem, Scalar) and t.elem.op == u8.op and t.form is None:
                return "bytes"
            return "list[%s]" % self.ann(t.elem, hint + "Item")
        if isinstance(t, _Dict):
            return "dict[str, %s]" % self.ann(t.value, hint + "Value")
        if isinstance(t, Opt):
            return "Optional[%s]" % self.ann(t.elem, hint)
        if isinstance(t, Struct):
            return self.struct(t, hint)
        raise SchemaError("#", "%s has no generated form" % t.text)

    def struct(self, t: Struct, hint: str) -> str:
        if t in self.done:
            return self.done[t]
        name = self.unique(_class_name(hint))
        self.done[t] = name
        for fname, _ in t.fields:
            if keyword.iskeyword(fname):
                raise SchemaError("#", "property %r is a Python keyword: a dataclass cannot "
                                  "have that field (kiln.struct(...) from type text can)"
                                  % fname)
        fields = [(fname, self.ann(ft, hint + "_" + fname)) for fname, ft in t.fields]
        self.classes.append((name, fields))
        return name


def generate(doc: Any, root_name: Optional[str] = None) -> str:
    """The source of a module of dataclasses for the JSON Schema ``doc``.

    What ``kiln gen`` writes.  Each object becomes a ``@dataclass`` (named
    after its ``$defs`` entry, the root's ``title`` or ``root_name``); the
    module ends with ``ROOT`` (the root class) and ``TYPES`` (each class's
    struct).  ``kiln.struct(ROOT)`` has the same canonical text and hash as
    ``schema_from_json(doc)``.

    Args:
        doc: the schema (a dict or JSON text); its root must be an object.
        root_name: the root class's name (default: ``title``, else ``Root``).

    Returns:
        str: Python source.

    Raises:
        SchemaError: as :func:`schema_from_json`, a root that is not an
            object, or a property named like a Python keyword.

    Example:
        >>> from kiln.schema import generate
        >>> src = generate({"title": "point", "type": "object",
        ...                 "properties": {"x": {"type": "number"}}})
        >>> print(src.split("\\n\\n\\n")[1])
        @dataclasses.dataclass
        class Point:
            x: float
    """
    if isinstance(doc, (str, bytes)):
        doc = json.loads(doc)
    t = schema_from_json(doc)
    if not isinstance(t, Struct):
        raise SchemaError("#", "the generator needs an object at the root, not %s" % t.text)
    g = _Gen()
    defs = doc.get("$defs", {})
    reader = _Reader(doc)
    for name in defs:   # named definitions keep their names
        dt = reader.read({"$ref": "#/$defs/" + name}, "#", 0)
        if isinstance(dt, Struct):
            g.struct(dt, name)
    title = doc.get("title")
    root = g.struct(t, root_name or (title if isinstance(title, str) else None) or "Root")
    out = ['"""Generated by kiln gen from a JSON Schema: edit the schema, not this file."""',
           "", "import dataclasses", "from typing import Optional", "", "import kiln", ""]
    for name, fields in g.classes:
        out += ["", "@dataclasses.dataclass", "class %s:" % name]
        out += ["    %s: %s" % (f, a) for f, a in fields] or ["    pass"]
        out.append("")
    out += ["", "ROOT = %s" % root, "TYPES = {%s}" % ", ".join(
        "%r: kiln.struct(%s)" % (n, n) for n, _ in g.classes), ""]
    return "\n".join(out)


__all__ = ["SchemaError", "schema_from_json", "to_json_schema", "generate"]
