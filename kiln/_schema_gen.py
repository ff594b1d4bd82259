"""The generator behind ``kiln gen``: a module of dataclasses for a JSON Schema.

Python names and wire names are kept apart.  Every class name is unique in
the module and every attribute unique in its class, neither a keyword nor a
name the module itself uses (its imports, the builtins its annotations name,
the other classes), and no attribute starts with two underscores (Python
would mangle it inside the class body, or it is a dunder the class relies
on).  A property whose name cannot be its attribute gets another one, and
its wire name in the field's metadata (``kiln._types.WIRE_NAME``), so the
classes' types have the schema's canonical text and hash.
"""

import keyword
import re
from typing import Any, Dict, List, Optional, Set, Tuple

from ._errors import SchemaError
from ._schema_read import _Reader, _Sizer, document, type_of
from ._types import Dict as _Dict, List as _List, Opt, Scalar, Str, Struct, Type, WIRE_NAME, u8

_ANN = {"bool": "bool", "i64": "int", "f64": "float", "i8": "kiln.I8", "i16": "kiln.I16",
        "i32": "kiln.I32", "u8": "kiln.U8", "u16": "kiln.U16", "u32": "kiln.U32",
        "u64": "kiln.U64", "f32": "kiln.F32"}

# the names the generated module binds or its annotations name: no class or
# attribute may take one (a bound attribute would shadow it in the class body)
RESERVED = frozenset({"Optional", "dataclasses", "kiln", "ROOT", "TYPES", "bool", "int",
                      "float", "str", "bytes", "list", "dict"})


def _class_name(text: str) -> str:
    parts = re.split(r"[^A-Za-z0-9]+", str(text))
    name = "".join(p[:1].upper() + p[1:] for p in parts if p) or "Record"
    if name[0].isdigit():
        name = "_" + name
    return name


def _fresh(base: str, used: Set[str]) -> str:
    """``base``, or ``base2``, ``base3`` ... : the first not in ``used`` (then added)."""
    name, n = base, 1
    while name in used or keyword.iskeyword(name) or name in RESERVED:
        n += 1
        name = "%s%d" % (base, n)
    used.add(name)
    return name


def _keeps_name(name: str) -> bool:
    """May a property's wire name be its attribute as it is?"""
    return not (keyword.iskeyword(name) or name.startswith("__") or name in RESERVED)


def attribute_names(wire: List[str], classes: Set[str]) -> List[str]:
    """One attribute per wire name: the name itself where it may be, else a fresh
    one (``class`` -> ``class_``, ``__id`` -> ``id_``, ``int`` -> ``int_``)."""
    used = set(classes) | {w for w in wire if _keeps_name(w)}
    out = []
    for w in wire:
        if _keeps_name(w) and w not in classes:
            out.append(w)
            continue
        core = w.strip("_") or "field"
        if core[0].isdigit():
            core = "field" + core
        out.append(_fresh(core + "_", used))
    return out


class _Gen:
    def __init__(self) -> None:
        self.classes: List[Tuple[str, Struct]] = []
        self.used: Set[str] = set()
        self.done: Dict[Struct, str] = {}
        self.optional = False

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
            self.optional = True     # the module imports Optional only then
            return "Optional[%s]" % self.ann(t.elem, hint)
        if isinstance(t, Struct):
            return self.struct(t, hint)
        raise SchemaError("#", "%s has no generated form" % t.text)

    def struct(self, t: Struct, hint: str) -> str:
        name = self.done.get(t)
        if name is None:
            name = self.done[t] = _fresh(_class_name(hint), self.used)
            for fname, ft in t.fields:
                self.ann(ft, hint + "_" + fname)   # the classes of the fields first
            self.classes.append((name, t))
        return name

    def body(self, t: Struct, hint: str) -> List[str]:
        """The lines of one class (after every class is named), fields in wire order.

        An optional field defaults to ``None``.  Where a required field follows
        an optional one, a ``dataclasses.KW_ONLY`` marker stands before the
        first optional field: the fields before it are positional in wire
        order, the rest keyword-only, so no positional argument lands in a
        field other than the one at its place."""
        wire = [n for n, _ in t.fields]
        attrs = attribute_names(wire, self.used)
        optional = [isinstance(ft, Opt) for _, ft in t.fields]
        first = optional.index(True) if True in optional else len(optional)
        kw_at = first if not all(optional[first:]) else -1
        lines = []
        for i, (w, attr, (_, ft)) in enumerate(zip(wire, attrs, t.fields)):
            if i == kw_at:
                lines.append("    %s: dataclasses.KW_ONLY" % _fresh("_", set(attrs)))
            a = self.ann(ft, hint + "_" + w)
            args = ["default=None"] if optional[i] else []
            if attr != w:
                args.append("metadata={%r: %r}" % (WIRE_NAME, w))
            if not args:
                lines.append("    %s: %s" % (attr, a))
            elif attr == w:
                lines.append("    %s: %s = None" % (attr, a))
            else:
                lines.append("    %s: %s = dataclasses.field(%s)" % (attr, a, ", ".join(args)))
        return lines or ["    pass"]


def generate(doc: Any, root_name: Optional[str] = None) -> str:
    """The source of a module of dataclasses for the JSON Schema ``doc``.

    What ``kiln gen`` writes.  Each object becomes a ``@dataclass`` (named
    after its ``$defs`` entry, the root's ``title`` or ``root_name``, made
    unique) with its fields in wire order; the module ends with ``ROOT``
    (the root class) and ``TYPES`` (each class's struct).
    ``kiln.struct(ROOT)`` has the same canonical text and hash as
    ``schema_from_json(doc)``; arrays of numbers decode to Python lists
    (``list[int]``), binary strings to ``bytes``.  A property left out of
    ``required`` is ``Optional[...] = None``; where a required property
    follows one, a ``dataclasses.KW_ONLY`` marker stands before the first
    optional field (the fields before it positional, the rest keyword-only).
    A property whose name is no Python attribute (a keyword, a name starting
    ``__``, a name the module uses) gets the attribute ``name_`` (made
    unique) and keeps its wire name in the field's metadata.  The module
    imports only what it uses and passes pyflakes and ``mypy --strict``.

    Args:
        doc: the schema (a dict or JSON text, parsed once); its root must be
            an object.
        root_name: the root class's name (default: ``title``, else ``Root``).

    Returns:
        str: Python source.

    Raises:
        SchemaError: as :func:`schema_from_json`, or a root that is not an
            object.  A definition the root does not use and kiln cannot read
            gets no class (``schema_from_json`` does not read it either).

    Example:
        >>> from kiln.schema import generate
        >>> src = generate({"title": "point", "type": "object", "required": ["x", "y"],
        ...                 "properties": {"x": {"type": "number"},
        ...                                "class": {"type": "string"},
        ...                                "y": {"type": "integer"}}})
        >>> print(src.split("\\n\\n\\n")[1])
        @dataclasses.dataclass
        class Point:
            x: float
            _: dataclasses.KW_ONLY
            class_: Optional[str] = dataclasses.field(default=None, metadata={'kiln.name': 'class'})
            y: int
    """
    doc = document(doc)
    t = type_of(doc, "list")     # arrays as JSON has them: Python lists
    if not isinstance(t, Struct):
        raise SchemaError("#", "the generator needs an object at the root, not %s" % t.text)
    g = _Gen()
    reader = _Reader(doc, "list")
    sizer = _Sizer(reader.defs)
    for name in reader.defs:   # named definitions keep their names
        node = {"$ref": "#/$defs/" + name}
        try:
            sizer.size(node, "#", 0)     # sized before it is built, as the type was
            dt = reader.read(node, "#")
        except SchemaError:
            continue   # a definition the type does not use, which kiln cannot read
        if isinstance(dt, Struct):
            g.struct(dt, name)
    title = doc.get("title")
    root = g.struct(t, root_name or (title if isinstance(title, str) else None) or "Root")
    bodies = [(name, g.body(st, name)) for name, st in g.classes]
    out = ['"""Generated by kiln gen from a JSON Schema: edit the schema, not this file."""',
           "", "import dataclasses"] + (["from typing import Optional"] if g.optional else []) \
        + ["", "import kiln", ""]
    for name, lines in bodies:
        out += ["", "@dataclasses.dataclass", "class %s:" % name] + lines + [""]
    out += ["", "ROOT = %s" % root, "TYPES = {%s}" % ", ".join(
        "%r: kiln.struct(%s)" % (n, n) for n, _ in g.classes), ""]
    return "\n".join(out)
