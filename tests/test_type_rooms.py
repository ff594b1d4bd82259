"""The type and schema layer (issue 30, point 5): each module holds one job and
at most about 600 lines, and no module of the layer is in an import circle,
counting every import statement in a module (those inside functions too).
The graph is read from the sources with ``ast``, not from what ran."""

import ast
import os

import kiln

KILN = os.path.dirname(os.path.abspath(kiln.__file__))
ROOT = os.path.dirname(KILN)

# the type layer (model, text, annotations, the facade) and the schema modules
LAYER = ["kiln._typemodel", "kiln._typetext", "kiln._annotations", "kiln._types",
         "kiln._schema_read", "kiln._schema_gen", "kiln.schema"]


def _modules():
    """{module name: path or None (a compiled module)} of the kiln package."""
    mods = {}
    for dirpath, _, files in os.walk(KILN):
        for f in files:
            rel = os.path.relpath(os.path.join(dirpath, f), ROOT)
            if f.endswith(".py"):
                name = rel[:-3].replace(os.sep, ".")
                mods[name[:-9] if name.endswith(".__init__") else name] = os.path.join(
                    dirpath, f)
            elif f.endswith((".so", ".pyd", ".pyi")):
                # a compiled module, or its stub where the pure distribution has none
                mods.setdefault(rel.split(".")[0].replace(os.sep, "."), None)
    return mods


def _imports(name, path, mods):
    package = name if path.endswith("__init__.py") else name.rsplit(".", 1)[0]
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1]
                                + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for a in node.names:
                full = base + "." + a.name
                out.add(full if full in mods else base)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return {m for m in out if m in mods and m != name}


def _graph():
    mods = _modules()
    return {m: (_imports(m, p, mods) if p else set()) for m, p in mods.items()}


def _reaches(graph, start, goal):
    seen, todo = set(), [start]
    while todo:
        v = todo.pop()
        if v == goal:
            return True
        if v not in seen:
            seen.add(v)
            todo.extend(graph[v])
    return False


def test_no_module_of_the_layer_is_in_an_import_circle():
    g = _graph()
    circles = [(m, dep) for m in LAYER for dep in sorted(g[m]) if _reaches(g, dep, m)]
    assert circles == []


def test_the_rooms_import_in_one_direction():
    g = _graph()
    order = LAYER[:4]   # each type room imports only the ones before it
    for i, m in enumerate(order):
        assert not (g[m] & set(order[i + 1:])), (m, g[m])


def test_the_rooms_are_small():
    for m in LAYER:
        path = os.path.join(ROOT, *m.split(".")) + ".py"
        with open(path, encoding="utf-8") as f:
            assert sum(1 for _ in f) <= 600, m


def test_the_public_names_are_where_they_were():
    from kiln import _types
    for name in ("Type", "parse_type", "as_type", "struct", "list_", "opt", "dict_",
                 "bool_", "i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64", "int_",
                 "uint", "f32", "f64", "str_", "bytes_", "tensors", "MAX_DEPTH"):
        assert getattr(kiln, name) is getattr(_types, name)
    assert kiln.struct({"a": "i64", "b": int, "c": kiln.opt(list[float])}).text == \
        "struct{a:i64,b:i64,c:opt<list<f64>>,}"
