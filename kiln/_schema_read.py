"""Reading a JSON Schema document into a Kiln type (``kiln.schema_from_json``).

Every bound is checked before anything is built from it:

* JSON text is scanned for its nesting before ``json`` parses it (at most
  :data:`MAX_JSON_DEPTH` arrays and objects), so no input reaches the JSON
  parser's recursion; a syntax error is a :class:`SchemaError` at its
  character offset, and repeated keys in one object are refused.
* :class:`_Sizer` counts the tokens and characters of the type the document
  describes, once per definition (a ``$ref`` reuses the definition's count),
  and refuses a type above ``MAX_TOKENS`` or ``MAX_TEXT``, or containers
  above ``MAX_BUILT`` or ``MAX_BUILT_TEXT`` in all, before any type is built:
  definitions that each use the one before twice double at every level, and
  each container holds its own copy of its text.
* :class:`_Reader` then builds the type, one pass over the document (each
  definition read once), in time linear in the document's size.
"""

import json
import re
import reprlib
from typing import Any, Dict, List, Optional, Set, Tuple

from ._errors import KilnError, SchemaError
from ._types import (Budget, Dict as _Dict, List as _List, Opt, Struct, Type, MAX_DEPTH,
                     bool_, bytes_, f32, f64, i8, i16, i32, i64, u8, u16, u32, u64, str_)

# JSON text nests at most this many arrays and objects: a schema of 64 containers
# needs two levels a container (properties, then the property) and a few more
# for $defs; ignored keywords (default, examples) get the same room
MAX_JSON_DEPTH = 2 * MAX_DEPTH + 16

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
_DEFS = "#/$defs/"


def pointer_text(pointer: Any, *parts: Any) -> str:
    """``pointer`` with ``parts`` appended, escaped as JSON pointers are."""
    return pointer + "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


class _Path:
    """A JSON pointer kept as a link to its parent and written out only for an
    error: a nest of long property names costs nothing per level."""

    __slots__ = ("up", "parts")

    def __init__(self, up: Any, parts: Tuple[Any, ...]) -> None:
        self.up = up
        self.parts = parts

    def __str__(self) -> str:
        links = []
        p: Any = self
        while isinstance(p, _Path):
            links.append(p.parts)
            p = p.up
        return pointer_text(str(p), *[x for parts in reversed(links) for x in parts])


def _ptr(pointer: Any, *parts: Any) -> Any:
    return _Path(pointer, parts)


# --- JSON text ---------------------------------------------------------------------

# a string (an unterminated one runs to the end, so no quote is scanned twice) or
# a bracket
_JSON_NEST = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*(?:"|\\?\Z)|[\[\]{}]', re.S)


def _no_repeats(pairs: List[Tuple[str, Any]]) -> Dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: Set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise SchemaError("#", "key %r repeats in one JSON object" % (_short(key),))
            seen.add(key)
    return out


def load_json(text: Any) -> Any:
    """The document of JSON text (str or bytes), parsed once; SchemaError with the
    character offset for text that is not JSON or nests too deep."""
    if isinstance(text, (bytes, bytearray, memoryview)):
        raw = bytes(text)
        try:
            text = raw.decode(json.detect_encoding(raw))
        except (UnicodeDecodeError, LookupError) as e:
            raise SchemaError("#", "not JSON: %s" % e, "TYPE", getattr(e, "start", 0),
                              True) from None
    depth = 0
    for m in _JSON_NEST.finditer(text):
        c = m.group()
        if c in "[{":
            depth += 1
            if depth > MAX_JSON_DEPTH:
                raise SchemaError("#", "JSON nests more than %d arrays and objects"
                                  % MAX_JSON_DEPTH, "DEPTH", m.start(), True)
        elif c in "]}":
            depth -= 1
    try:
        return json.loads(text, object_pairs_hook=_no_repeats)
    except json.JSONDecodeError as e:
        raise SchemaError("#", "not JSON: %s" % e.msg, "TYPE", e.pos, True) from None
    except SchemaError as e:
        raise SchemaError(e.pointer, e.reason, e.code, 0, True) from None
    except (ValueError, RecursionError) as e:   # e.g. an integer too long to convert
        raise SchemaError("#", "not JSON: %s" % e, "TYPE", 0, True) from None


# --- shared checks -------------------------------------------------------------------

_COMBINERS = ("oneOf", "anyOf", "allOf", "not", "if", "then", "else", "enum", "const")


def _kind(node: Any, pointer: Any) -> str:
    """The node's type keyword, after checking the node's keys (SchemaError)."""
    if not isinstance(node, dict):
        raise SchemaError(pointer, "a schema must be an object, not %s" % type(node).__name__)
    for k in node:
        if not isinstance(k, str):
            raise SchemaError(pointer, "a schema's keys are strings, not %s"
                              % type(k).__name__)
    if "$ref" in node:
        extra = sorted(set(node) - {"$ref"} - _IGNORED - ({"$defs"} if pointer == "#"
                                                         else set()))
        if extra:
            raise SchemaError(pointer, "keyword %r beside $ref is not in the subset" % extra[0])
        return "$ref"
    kind = node.get("type")
    if "type" not in node:
        combos = sorted(k for k in node if k in _COMBINERS)
        if combos:   # a schema that combines others says so: name the keyword
            raise SchemaError(pointer, "keyword %r is outside the subset kiln reads (one type "
                              "per schema: boolean, integer, number, string, array, object, "
                              "or a $ref)" % combos[0])
    if not isinstance(kind, str) or kind not in _ALLOWED:
        raise SchemaError(pointer, "type %r is outside the subset kiln reads (boolean, "
                          "integer, number, string, array, object, $ref)" % (_short(kind),))
    extra = sorted(set(node) - _ALLOWED[kind] - _IGNORED - ({"$defs"} if pointer == "#"
                                                             else set()))
    if extra:
        raise SchemaError(pointer, "keyword %r is not in the subset (it would change what "
                          "%s %s may be)" % (extra[0], "an" if kind[0] in "aeiou" else "a",
                                             kind))
    fmt = node.get("format")
    if fmt is not None and not isinstance(fmt, str):
        raise SchemaError(_ptr(pointer, "format"), "format must be a string")
    return kind


def _short(v: Any) -> Any:
    """A value for a message: at most 60 characters (reprlib bounds depth and size)."""
    r = v if isinstance(v, str) else reprlib.repr(v)
    return r[:60] + "..." if len(r) > 60 else r


def _object_parts(node: Dict[str, Any], pointer: Any) -> Tuple[Any, Any, Any]:
    """(properties, additionalProperties schema of a map or None, required set or None)."""
    props = node.get("properties")
    extra = node.get("additionalProperties")
    if props is None and isinstance(extra, dict):
        if "required" in node:
            raise SchemaError(_ptr(pointer, "required"), "a map has no required keys")
        return None, extra, None
    if props is None:
        props = {}
    if not isinstance(props, dict):
        raise SchemaError(_ptr(pointer, "properties"), "properties must be an object")
    if extra is not None and extra is not False:
        raise SchemaError(_ptr(pointer, "additionalProperties"), "an object with "
                          "properties cannot also take additional ones")
    for name in props:
        if not isinstance(name, str) or not _IDENT.match(name):
            raise SchemaError(_ptr(pointer, "properties", name), "property %r is not an "
                              "identifier" % (_short(name),))
    required = node.get("required")
    if required is not None:
        if not isinstance(required, list) or not all(
                isinstance(r, str) and r in props for r in required):
            raise SchemaError(_ptr(pointer, "required"), "required must list properties of "
                              "this object")
        required = set(required)
    return props, None, required


def _ref_target(node: Dict[str, Any], pointer: Any, defs: Dict[str, Any]) -> str:
    ref = node["$ref"]
    if not isinstance(ref, str) or not ref.startswith(_DEFS) or ref[len(_DEFS):] not in defs:
        raise SchemaError(_ptr(pointer, "$ref"), "$ref %r is not #/$defs/<a definition>"
                          % (_short(ref),))
    return ref


def _defs_of(doc: Any) -> Dict[str, Any]:
    defs = doc.get("$defs", {}) if isinstance(doc, dict) else {}
    if not isinstance(defs, dict):
        raise SchemaError("#/$defs", "$defs must be an object")
    for k in defs:
        if not isinstance(k, str):
            raise SchemaError("#/$defs", "definition names are strings, not %s"
                              % type(k).__name__)
    return defs


# --- the size of the type, before it is built ------------------------------------------

def _leaf(node: Dict[str, Any], pointer: Any, kind: str) -> Type:
    """The type of a boolean, integer, number or string node (no container built)."""
    fmt = node.get("format")
    if kind == "boolean":
        return bool_
    if kind == "integer":
        if fmt is not None and fmt not in _INTS:
            raise SchemaError(_ptr(pointer, "format"), "integer format %r is not int8.."
                              "int64 or uint8..uint64" % (_short(fmt),))
        return i64 if fmt is None else _INTS[fmt]
    if kind == "number":
        if fmt is not None and fmt not in _FLOATS:
            raise SchemaError(_ptr(pointer, "format"), "number format %r is not float or "
                              "double" % (_short(fmt),))
        return f64 if fmt is None else _FLOATS[fmt]
    if fmt is not None and fmt != "binary":
        raise SchemaError(_ptr(pointer, "format"), "string format %r is not binary"
                          % (_short(fmt),))
    return str_ if fmt is None else bytes_


class _Sizer:
    """(tokens, characters) of the type a node describes, counted before anything
    is built: once per definition (a ``$ref`` reuses the count), and each
    container's size spent from one :class:`kiln._types.Budget` (a type above
    ``MAX_TOKENS``/``MAX_TEXT``, or containers above ``MAX_BUILT``/
    ``MAX_BUILT_TEXT`` in all, are refused with ``LIMIT``).  A node is checked
    as :class:`_Reader` checks it, and a recursive ``$ref`` or a nest too deep
    is refused here."""

    def __init__(self, defs: Dict[str, Any]) -> None:
        self.defs = defs
        self.memo: Dict[str, Tuple[int, int]] = {}
        self.resolving: List[str] = []
        self.budget = Budget(SchemaError)

    def size(self, node: Any, pointer: Any, depth: int) -> Tuple[int, int]:
        if depth > MAX_DEPTH:
            raise SchemaError(pointer, "the schema nests more than %d containers"
                              % MAX_DEPTH, "DEPTH")
        kind = _kind(node, pointer)
        if kind == "$ref":
            return self.ref(node, pointer, depth)
        if kind == "array":
            if "items" not in node:
                raise SchemaError(pointer, "an array needs items")
            t, c = self.size(node["items"], _ptr(pointer, "items"), depth + 1)
            return self.spend(t + 2, c + 6, pointer)    # list< ... >
        if kind != "object":
            leaf = _leaf(node, pointer, kind)
            return len(leaf.tokens), len(leaf.text)           # no container built (bytes_ is one)
        props, extra, required = _object_parts(node, pointer)
        if props is None:
            t, c = self.size(extra, _ptr(pointer, "additionalProperties"), depth + 1)
            return self.spend(t + 4, c + 10, pointer)   # dict<str, ... >
        tokens, chars = 2, 8                             # struct{ ... }
        for name, sub in props.items():
            p = _ptr(pointer, "properties", name)
            t, c = self.size(sub, p, depth + 1)
            if required is not None and name not in required:
                t, c = self.spend(t + 2, c + 5, p)       # opt< ... >
            tokens, chars = tokens + t + 3, chars + c + len(name) + 2
        return self.spend(tokens, chars, pointer)

    def ref(self, node: Dict[str, Any], pointer: Any, depth: int) -> Tuple[int, int]:
        ref = _ref_target(node, pointer, self.defs)
        got = self.memo.get(ref)
        if got is not None:
            return got
        if ref in self.resolving:
            raise SchemaError(_ptr(pointer, "$ref"), "$ref %r is recursive (Kiln types "
                              "cannot contain themselves)" % ref)
        self.resolving.append(ref)
        try:
            got = self.memo[ref] = self.size(self.defs[ref[len(_DEFS):]], ref, depth + 1)
        finally:
            self.resolving.pop()
        return got

    def spend(self, tokens: int, chars: int, pointer: Any) -> Tuple[int, int]:
        self.budget.spend(tokens, chars, 0, pointer)
        return tokens, chars


# --- the type ------------------------------------------------------------------------

class _Reader:
    """Builds the type of a node, each definition once (after :class:`_Sizer`)."""

    def __init__(self, doc: Any, arrays: Optional[str] = None) -> None:
        self.defs = _defs_of(doc)
        self.cache: Dict[str, Type] = {}
        self.arrays = arrays     # the form of every list (kiln._types.List.form)

    def read(self, node: Any, pointer: Any) -> Type:
        kind = _kind(node, pointer)
        if kind == "$ref":
            ref = _ref_target(node, pointer, self.defs)
            t = self.cache.get(ref)
            if t is None:
                t = self.cache[ref] = self.read(self.defs[ref[len(_DEFS):]], ref)
            return t
        if kind not in ("array", "object"):
            return _leaf(node, pointer, kind)
        if kind == "array":
            return self.build(_List, pointer, self.read(node["items"], _ptr(pointer, "items")),
                              self.arrays)
        props, extra, required = _object_parts(node, pointer)
        if props is None:
            return self.build(_Dict, pointer, self.read(extra, _ptr(pointer,
                                                                    "additionalProperties")))
        fields = []
        for name, sub in props.items():
            p = _ptr(pointer, "properties", name)
            t = self.read(sub, p)
            fields.append((name, t if required is None or name in required else
                           self.build(Opt, p, t)))
        return self.build(Struct, pointer, fields)

    @staticmethod
    def build(cls: Any, pointer: Any, *args: Any) -> Type:
        try:
            return cls(*args)
        except SchemaError:
            raise
        except KilnError as e:   # the type model's own bounds, at this node
            raise SchemaError(pointer, e.reason, e.code) from None


def document(doc: Any) -> Any:
    """The document itself: JSON text parsed once, anything else as given."""
    if isinstance(doc, (str, bytes, bytearray, memoryview)):
        return load_json(doc)
    return doc


ARRAYS = (None, "list", "ndarray")


def type_of(doc: Any, arrays: Optional[str] = None) -> Type:
    """The Kiln type of a parsed document (sized first, then built)."""
    if arrays not in ARRAYS:
        raise ValueError("arrays must be None, 'list' or 'ndarray', not %r" % (arrays,))
    defs = _defs_of(doc)
    _Sizer(defs).size(doc, "#", 0)
    return _Reader(doc, arrays).read(doc, "#")


def schema_from_json(doc: Any, arrays: Optional[str] = None) -> Type:
    """The Kiln type of a JSON Schema document (a dict, or JSON text).

    The type is the one its canonical text parses to, equal to it and
    decoding to the same Python values (an array of numbers to an ndarray,
    an array of ``uint8`` to ``bytes``), unless ``arrays`` asks for another
    Python form; the wire bytes and ``schema_hash`` are the same either way.

    Args:
        doc: the schema, in the subset listed in :mod:`kiln.schema`: a dict,
            or JSON text (str or bytes), which is parsed once.
        arrays: the Python value of an array of numbers: ``None`` (the type
            text's: an ndarray, ``bytes`` for ``uint8``), ``"list"`` (a
            Python list, as JSON has it; the type is then not equal to the
            text's) or ``"ndarray"`` (an ndarray, ``uint8`` included).  A
            binary string is ``bytes`` in every case.

    Returns:
        Type: the Kiln type; structs decode to ``dict``, arrays of other
        items to ``list``.

    Raises:
        SchemaError: a :class:`kiln.KilnError` whose ``pointer`` names the
            node: ``TYPE`` for text that is not JSON (with its character
            offset), a keyword or type outside the subset, a bad ``$ref`` or
            a recursive one; ``DEPTH`` for a document nesting more than 64
            containers (or JSON text more than 144 arrays and objects);
            ``LIMIT`` for a type of more than 1,000,000 tokens or 16,000,000
            characters (reused ``$defs`` can double at each level), refused
            before it is built.

    Example:
        >>> doc = {"type": "object", "required": ["id"],
        ...        "properties": {"id": {"type": "integer"},
        ...                       "score": {"type": "number", "format": "float"}}}
        >>> kiln.schema_from_json(doc).text
        'struct{id:i64,score:opt<f32>,}'
        >>> nums = {"type": "array", "items": {"type": "integer"}}
        >>> kiln.schema_from_json(nums) == kiln.parse_type("list<i64>")
        True
        >>> buf = kiln.encode([1, 2], "list<i64>")
        >>> kiln.decode(buf, kiln.schema_from_json(nums)).tolist()
        [1, 2]
        >>> kiln.decode(buf, kiln.schema_from_json(nums, arrays="list"))
        [1, 2]
    """
    return type_of(document(doc), arrays)
