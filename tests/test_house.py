"""The house rules of the code (docs/architecture.md), checked.

Both kernels satisfy one interface with the same signatures; the compiled
kernel's constants are generated from kiln/_wire.py and up to date; the
compiled kernel imports nothing from the pure one; the two kernels have the
same parts; no function grows past the size the architecture doc allows.
"""

import ast
import inspect
import os
import re
import subprocess
import sys
import types

import pytest

from kiln import _kernel

from _util import ROOT

KERNEL_PARTS = ("reader", "decode", "encode", "directory", "dirwrite", "tensors")
# the checks of the source text need the tree, which an installed wheel's run lacks
needs_tree = pytest.mark.skipif(
    not os.path.isdir(os.path.join(ROOT, "src")),
    reason="no source tree here (an installed-wheel run: kiln/, src/, tools/ are not copied)")
MAX_FUNCTION_LINES = 120


def _params(fn):
    # (follow_wrapped=False: Tensor.numpy and TensorDirectory.to_dict wear the
    # Python methods' names and docstrings, __wrapped__ included)
    return [(p.name, p.default)
            for p in inspect.signature(fn, follow_wrapped=False).parameters.values()]


@pytest.mark.parametrize("name", _kernel.INTERFACE)
def test_each_kernel_has_the_interface_signatures(impl, name):
    want = _params(getattr(_kernel.Kernels, name))[1:]  # without self
    assert _params(getattr(impl.kernels, name)) == want


def test_the_interface_is_exactly_what_the_kernels_export(impl):
    assert set(impl.kernels.__all__) == set(_kernel.INTERFACE)
    assert set(_kernel.INTERFACE) == set(_kernel.INTERFACE_CODEC + _kernel.INTERFACE_RECORDS +
                                         _kernel.INTERFACE_TENSORS)


def _stub():
    """The .pyi's public names: {name: ("def", params) | ("class", members) | ("value",)}."""
    # the stub that ships: the checkout's, or the installed wheel's
    import kiln
    with open(os.path.join(os.path.dirname(os.path.abspath(kiln.__file__)), "_kernels_c.pyi"),
              encoding="utf-8") as f:
        tree = ast.parse(f.read())
    out = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            out[node.name] = ("def", _stub_params(node))
        elif isinstance(node, ast.ClassDef):
            members = {}
            for m in node.body:
                if isinstance(m, ast.FunctionDef) and not m.name.startswith("_"):
                    prop = any(isinstance(d, ast.Name) and d.id == "property"
                               for d in m.decorator_list)
                    members[m.name] = ("property",) if prop else ("def", _stub_params(m))
            out[node.name] = ("class", members)
        elif isinstance(node, ast.AnnAssign):
            out[node.target.id] = ("value",)
    return {k: v for k, v in out.items() if not k.startswith("_")}


def _stub_params(fn):
    args = fn.args.args
    defaults = [None] * (len(args) - len(fn.args.defaults)) + list(fn.args.defaults)
    return [(a.arg, inspect.Parameter.empty if d is None else ast.literal_eval(d))
            for a, d in zip(args, defaults)]


def _compiled_names(k):
    """The compiled module's own public names, by what Cython made: its
    functions, its classes and its constants (imports are neither)."""
    out = {}
    for name, obj in vars(k).items():
        if name.startswith("_") or isinstance(obj, types.ModuleType):
            continue
        if type(obj).__name__ == "cython_function_or_method":
            out[name] = ("def", _params(obj))
        elif isinstance(obj, type) and obj.__module__ == k.__name__:
            members = {}
            for m, v in vars(obj).items():
                if m.startswith("_"):
                    continue
                members[m] = ("def", _params(getattr(obj, m))) if callable(v) \
                    else ("property",)
            out[name] = ("class", members)
        elif isinstance(obj, (bool, int, str, tuple)):
            out[name] = ("value",)
    return out


def test_the_compiled_stub_matches_the_compiled_module(pytestconfig):
    """kiln/_kernels_c.pyi names exactly the compiled module's public names, with
    the same parameters (names and defaults) and the same class members."""
    from conftest import compiled_kernels
    got, want = _compiled_names(compiled_kernels(pytestconfig)), _stub()
    assert sorted(got) == sorted(want)
    for name in got:
        assert got[name] == want[name], name


def test_programs_have_the_interface_methods(impl):
    import kiln
    enc = impl.kernels.compile_encoder(kiln.i32.plan(), None)
    dec = impl.kernels.compile_decoder(kiln.i32.plan(), None, False, 1, 1, False)
    for proto, obj in ((_kernel.EncodeProgram, enc), (_kernel.DecodeProgram, dec)):
        for name, fn in vars(proto).items():
            if callable(fn) and not name.startswith("_"):
                assert _params(getattr(obj, name)) == _params(fn)[1:], name


@needs_tree
def test_generated_wire_constants_are_up_to_date():
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "gen_wire.py"), "--check"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def _src(*parts):
    with open(os.path.join(ROOT, *parts)) as f:
        return f.read()


@needs_tree
def test_the_compiled_kernel_does_not_import_the_pure_one():
    texts = [_src("src", "_kernels_c.pyx")] + [_src("src", "kernels", p) for p in
                                               sorted(os.listdir(os.path.join(ROOT, "src",
                                                                              "kernels")))]
    for text in texts:
        code = "\n".join(ln for ln in text.splitlines() if not ln.lstrip().startswith("#"))
        assert not re.search(r"^\s*(from|import)\s+\S*_kernels_py", code, re.M)
        assert "_py." not in code


@needs_tree
def test_the_kernels_have_the_same_parts():
    for part in KERNEL_PARTS:
        assert os.path.exists(os.path.join(ROOT, "kiln", "_kernels_py", part + ".py")), part
        assert os.path.exists(os.path.join(ROOT, "src", "kernels", part + ".pxi")), part
        pxi = _src("src", "kernels", part + ".pxi")
        assert "kiln/_kernels_py/%s.py" % part in pxi.split("\n\n")[0], part


@needs_tree
def test_the_directory_steps_have_the_same_names_in_both_kernels():
    py = _src("kiln", "_kernels_py", "directory.py")
    c = _src("src", "kernels", "directory.pxi")
    py_steps = re.findall(r"^def (step\w+)\(", py, re.M)
    c_steps = re.findall(r"^cdef \w+ (step\w+)\(", c, re.M)
    assert py_steps == c_steps
    assert len(py_steps) == 17


def _python_functions():
    for dirpath, _, files in os.walk(os.path.join(ROOT, "kiln")):
        for fn in files:
            if fn.endswith(".py"):
                path = os.path.join(dirpath, fn)
                with open(path) as f:
                    tree = ast.parse(f.read())
                for node in ast.walk(tree):
                    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        yield path, node.name, node.end_lineno - node.lineno + 1


def _cython_functions():
    for fn in sorted(os.listdir(os.path.join(ROOT, "src", "kernels"))):
        lines = _src("src", "kernels", fn).splitlines()
        starts = [i for i, ln in enumerate(lines)
                  if re.match(r"(cdef|cpdef|def)\s.*\(", ln) and not ln.startswith("cdef extern")
                  or re.match(r"    (cdef |cpdef |)def \w+\(|    cdef \w+ \w+\(", ln)]
        for k, i in enumerate(starts):
            end = starts[k + 1] if k + 1 < len(starts) else len(lines)
            while end > i and not lines[end - 1].strip():
                end -= 1
            yield fn, lines[i].strip()[:60], end - i


# kernel sources over the house's module size, each with its reason
MAX_MODULE_LINES = 600
LONG_KERNEL_SOURCES = {}   # none today: a long one is named here with its reason


@needs_tree
def test_no_python_module_is_longer_than_the_house_allows():
    for dirpath, _, files in os.walk(os.path.join(ROOT, "kiln")):
        for fn in files:
            if fn.endswith(".py"):
                with open(os.path.join(dirpath, fn)) as f:
                    n = len(f.read().splitlines())
                assert n <= MAX_MODULE_LINES, (os.path.join(dirpath, fn), n)


@needs_tree
def test_no_kernel_source_is_longer_than_the_house_allows():
    for fn in sorted(os.listdir(os.path.join(ROOT, "src", "kernels"))):
        n = len(_src("src", "kernels", fn).splitlines())
        assert n <= MAX_MODULE_LINES or fn in LONG_KERNEL_SOURCES, (fn, n)


@needs_tree
def test_no_function_is_longer_than_the_house_allows():
    long = [(p, n, ln) for p, n, ln in list(_python_functions()) + list(_cython_functions())
            if ln > MAX_FUNCTION_LINES]
    assert long == []


def _tests_taking_impl_unused():
    for fn in sorted(os.listdir(os.path.join(ROOT, "tests"))):
        if not (fn.startswith("test_") and fn.endswith(".py")):
            continue
        with open(os.path.join(ROOT, "tests", fn)) as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                    node.name.startswith("test"):
                args = [a.arg for a in node.args.args + node.args.kwonlyargs]
                used = any(isinstance(n, ast.Name) and n.id == "impl"
                           for stmt in node.body for n in ast.walk(stmt))
                if "impl" in args and not used:
                    yield "%s:%d %s" % (fn, node.lineno, node.name)


def test_every_test_taking_impl_uses_it():
    # a test run once per kernel that never touches the kernel tests one thing twice
    assert list(_tests_taking_impl_unused()) == []


# --- import circles -----------------------------------------------------------------
# The rule: every import statement under kiln/ counts, at module level and
# inside functions, `from . import x` in a package's __init__ and in its
# modules included (to the submodule x, else to the package).  A lazy import
# still runs, and a circle through it is still a circle.  Left out: imports
# under `if TYPE_CHECKING:` (they never run), and the deferred loads listed in
# DEFERRED, lazy imports whose only job is to keep `import kiln` cheap (each
# is checked to be there and inside a function).  kiln/__init__.py's PEP 562
# table loads its parts with importlib, not with a statement, after kiln is
# complete.  The compiled module is kiln._kernels_c, with its sources' imports.

DEFERRED = {
    # distributed asks for kiln's serializers: kiln.dask imports dask and distributed
    ("kiln._dask_hook", "kiln.dask"),
}

def _modules():
    """{module name: path} of every Python module under kiln/."""
    out = {}
    for dirpath, _, files in os.walk(os.path.join(ROOT, "kiln")):
        for fn in files:
            if fn.endswith(".py"):
                rel = os.path.relpath(os.path.join(dirpath, fn[:-3]), ROOT).split(os.sep)
                if rel[-1] == "__init__":
                    rel = rel[:-1]
                out[".".join(rel)] = os.path.join(dirpath, fn)
    out["kiln._kernels_c"] = None   # compiled: its imports are read from src/ (below)
    return out


def _target(base, name, modules):
    """What ``from base import name`` runs: the submodule base.name, else base."""
    full = base + "." + name if base else name
    return full if full in modules else base


def _resolve(module, is_package, level, name):
    if not level:
        return name or ""
    parts = module.split(".")
    if not is_package:
        parts = parts[:-1]
    parts = parts[:len(parts) - (level - 1)]
    return ".".join(parts + ([name] if name else []))


def _type_checking(node):
    t = node.test
    return isinstance(node, ast.If) and (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING" or
                                         isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _edges_of(module, path, modules):
    """[(imported module, line, inside a function)] of one module."""
    with open(path) as f:
        tree = ast.parse(f.read())
    package = path.endswith("__init__.py")
    out = []
    todo = [(tree, False)]
    while todo:
        node, lazy = todo.pop()
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking(child):
                todo.extend((c, lazy) for c in child.orelse)   # the body never runs
                continue
            if isinstance(child, ast.Import):
                for a in child.names:
                    name = a.name
                    while name and name not in modules:
                        name = name.rpartition(".")[0]
                    if name:
                        out.append((name, child.lineno, lazy))
            elif isinstance(child, ast.ImportFrom):
                base = _resolve(module, package, child.level, child.module)
                if base == "kiln" or base.startswith("kiln."):
                    for a in child.names:
                        out.append((_target(base, a.name, modules), child.lineno, lazy))
            todo.append((child, lazy or isinstance(child, (ast.FunctionDef,
                                                           ast.AsyncFunctionDef, ast.Lambda))))
    return out


def _compiled_edges(modules):
    """The imports of src/_kernels_c.pyx and its parts, as kiln._kernels_c's."""
    out = []
    srcs = [os.path.join(ROOT, "src", "_kernels_c.pyx")] + sorted(
        os.path.join(ROOT, "src", "kernels", fn)
        for fn in os.listdir(os.path.join(ROOT, "src", "kernels")) if fn.endswith(".pxi"))
    for path in srcs:
        with open(path) as f:
            for i, line in enumerate(f, 1):
                m = re.match(r"\s*from\s+(\.+)([\w.]*)\s+import\s+(.+)", line)
                if m:
                    base = _resolve("kiln._kernels_c", False, len(m.group(1)), m.group(2))
                    for name in m.group(3).split(","):
                        name = name.split(" as ")[0].strip(" ()\\\n")
                        if name:
                            out.append((_target(base, name, modules), i))
    return out


def import_graph(deferred=DEFERRED):
    """{module: [the kiln modules it imports]}, the ``deferred`` lazy edges left out."""
    modules = _modules()
    graph = {}
    for m, p in modules.items():
        if p is not None:
            graph[m] = sorted(set(t for t, _, lazy in _edges_of(m, p, modules)
                                  if t != m and not (lazy and (m, t) in deferred)))
    graph["kiln._kernels_c"] = sorted(set(t for t, _ in _compiled_edges(modules)))
    return graph


def import_circles(graph):
    """Every circle of the graph, once each (as its strongly connected parts)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):   # Tarjan's algorithm; the graph is a few dozen modules deep at most
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                on.discard(w)
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                out.append(sorted(part))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


@needs_tree
def test_the_import_graph_is_read_the_way_python_runs_it():
    # the reader itself, on the cases a circle hides in
    graph = import_graph()
    assert "kiln._files.base" in graph["kiln._files.kilnfile"]      # from .base import ...
    assert "kiln._wire" in graph["kiln._files.base"]                # from .. import _wire as W
    assert "kiln" in graph["kiln.dask"]                             # from . import Tensor
    assert "kiln.convert._common" in graph["kiln.convert"]          # a package's __init__
    assert "kiln._files.remote" in graph["kiln._files.load"]        # a lazy import counts
    assert "kiln._types" not in graph["kiln._files.load"]           # under TYPE_CHECKING
    assert "kiln._errors" in graph["kiln._kernels_c"]               # the compiled module's
    assert import_circles({"a": ["b"], "b": ["c"], "c": ["a"], "d": ["a"]}) == [["a", "b", "c"]]


@needs_tree
def test_each_deferred_import_is_there_and_inside_a_function():
    modules = _modules()
    for m, target in DEFERRED:
        edges = _edges_of(m, modules[m], modules)
        assert [lazy for t, _, lazy in edges if t == target] == [True], (m, target)


@needs_tree
def test_no_import_circles_in_kiln():
    assert import_circles(import_graph()) == []


# --- the top floor uses public names --------------------------------------------------
# The command line, Dask support and the converters import kiln's public
# modules, their own package's modules, and of kiln's private modules only
# kiln._access (the one declared internal surface), kiln._wire (the constants)
# and kiln._errors (where kiln.KilnError lives); and they read no private
# attribute of another object (no t._off, f._tensors_view(), d._rows).

TOP_FLOOR = ("kiln.cli", "kiln._cli", "kiln.dask", "kiln.convert", "kiln.torch")
TOP_FLOOR_MAY_IMPORT = {"kiln._access", "kiln._wire", "kiln._errors"}


def _in(module, packages):
    return any(module == p or module.startswith(p + ".") for p in packages)


def test_the_top_floor_imports_public_modules_and_kiln_access_only():
    modules = _modules()
    wrong = []
    for m, path in sorted(modules.items()):
        if path is None or not _in(m, TOP_FLOOR):
            continue
        for t, line, _ in _edges_of(m, path, modules):
            private = any(part.startswith("_") for part in t.split("."))
            if private and t not in TOP_FLOOR_MAY_IMPORT and not _in(t, TOP_FLOOR):
                wrong.append("%s:%d imports %s" % (m, line, t))
        with open(path) as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):   # nor a private name of a public module
            if isinstance(node, ast.ImportFrom):
                base = _resolve(m, path.endswith("__init__.py"), node.level, node.module)
                for a in node.names:
                    if a.name[:1] == "_" and _target(base, a.name, modules) == base and \
                            not _in(base, TOP_FLOOR):
                        wrong.append("%s:%d imports %s from %s" % (m, node.lineno, a.name, base))
    assert wrong == []


def test_the_top_floor_reads_no_private_attribute():
    modules = _modules()
    wrong = []
    for m, path in sorted(modules.items()):
        if path is None or not _in(m, TOP_FLOOR):
            continue
        with open(path) as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr[:1] == "_" and \
                    node.attr[:2] != "__" and not (isinstance(node.value, ast.Name) and
                                                   node.value.id in ("self", "cls")):
                wrong.append("%s:%d %s" % (m, node.lineno, ast.unparse(node)))
    assert wrong == []


@needs_tree
def test_kiln_access_is_imported_by_the_top_floor_only():
    modules = _modules()
    users = sorted(m for m, p in modules.items() if p is not None and
                   "kiln._access" in [t for t, _, _ in _edges_of(m, p, modules)])
    assert users and all(_in(m, TOP_FLOOR) for m in users), users


@needs_tree
def test_an_atomic_replace_is_committed_or_discarded_in_one_place():
    # kiln._files.atomic.AtomicFile is a context manager: no module repeats
    # `except BaseException: out.discard(); raise` around a commit
    copies = []
    for m, path in sorted(_modules().items()):
        if path is None:
            continue
        with open(path) as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            if isinstance(node, ast.ExceptHandler) and any(
                    isinstance(n, ast.Attribute) and n.attr == "discard"
                    for stmt in node.body for n in ast.walk(stmt)):
                copies.append("%s:%d" % (m, node.lineno))
    assert copies == ["kiln._files.atomic:%d" % _discard_line()]


def _discard_line():
    from kiln._files import atomic
    src, start = inspect.getsourcelines(atomic.AtomicFile.__exit__)
    return start + next(i for i, ln in enumerate(src) if "except BaseException" in ln)


# --- one source for the wire's numbers in the files floor and the top floor --------

FILES_AND_TOP = ("kiln._files", "kiln.files", "kiln.remote") + TOP_FLOOR


def test_magics_come_from_the_wire_module():
    # a magic is kiln._wire's, never b"KLNT" typed again (rows: the next test)
    wrong = []
    for m, path in sorted(_modules().items()):
        if path is None or not _in(m, FILES_AND_TOP):
            continue
        with open(path) as f:
            for i, line in enumerate(f, 1):
                if re.search(r"""b["']KLN""", line.split("#", 1)[0]):
                    wrong.append("%s:%d %s" % (m, i, line.strip()))
    assert wrong == []


# --- rows, write records and descriptors are read by name ---------------------------
# The rule, over every module of kiln/: ``X[k]`` with an integer literal ``k`` is
# refused when, in the same function (or at module level), ``X`` is
#   - named as a row is (``row``, ``rec``, ``decl``, ``meta``, ``desc``, ``dsc``,
#     ``m``, ``r``, ``_row``, ``self._meta``),
#   - an item of a sequence of rows (``rows[i]``, ``metas[j]``; ``records[0]`` itself,
#     the first row, is not a field read),
#   - bound by a loop over such a sequence (``for m in metas``,
#     ``for i, m in enumerate(metas)``, comprehensions too), or
#   - read elsewhere in that function with a named position: kiln._wire's ``R_*``
#     (row, write record), ``I_*`` (a DESC tuple), ``TS_*``/``DS_*``, or a module
#     constant set from one (``_P = W.R_PAYLOAD``).
_ROW_HOLDERS = {"row", "rec", "decl", "meta", "desc", "dsc", "m", "r", "_row", "_meta"}
_ROW_SEQUENCES = {"rows", "records", "metas", "decls", "descs", "_rows", "_table_rows", "_decl"}
_NAMED_POSITION = re.compile(r"(?:R|I|TS|DS)_[A-Z0-9_]+$")
# positional reads the rule lets stand, "module: subscript": why (none today)
POSITIONAL_ROW_READS = {}


def _ident(node):
    return node.id if isinstance(node, ast.Name) else \
        node.attr if isinstance(node, ast.Attribute) else None


def _int_literal(node):
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        node = node.operand
    return isinstance(node, ast.Constant) and type(node.value) is int


def _position_aliases(tree):
    """Module-level names set from a named position (``_CODE, _P = W.R_CODE, W.R_PAYLOAD``)."""
    out = set()
    for node in tree.body:
        if isinstance(node, ast.Assign):
            values = node.value.elts if isinstance(node.value, ast.Tuple) else [node.value]
            targets = [t for tg in node.targets
                       for t in (tg.elts if isinstance(tg, ast.Tuple) else [tg])]
            out.update(t.id for t, v in zip(targets, values)
                       if isinstance(t, ast.Name) and _NAMED_POSITION.match(_ident(v) or ""))
    return out


def _row_holders(scope, named):
    """The expressions (as source text) that hold a row in ``scope``."""
    out = set()
    for n in ast.walk(scope):
        if isinstance(n, ast.Subscript) and named(n.slice):
            out.add(ast.unparse(n.value))
        if isinstance(n, (ast.For, ast.comprehension)):
            it, target = n.iter, n.target
            if isinstance(it, ast.Call) and _ident(it.func) == "enumerate" and it.args and \
                    isinstance(target, ast.Tuple) and len(target.elts) == 2:
                it, target = it.args[0], target.elts[1]
            if _ident(it) in _ROW_SEQUENCES and isinstance(target, ast.Name):
                out.add(target.id)
    return out


def positional_row_reads(source):
    """[(line, subscript text)] of the rule's positional reads in ``source``."""
    tree = ast.parse(source)
    aliases = _position_aliases(tree)

    def named(sl):
        i = _ident(sl) or ""
        return bool(_NAMED_POSITION.match(i)) or i in aliases

    out = set()
    for scope in [tree] + [n for n in ast.walk(tree)
                           if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))]:
        holders = _row_holders(scope, named)
        for n in ast.walk(scope):
            if isinstance(n, ast.Subscript) and _int_literal(n.slice):
                v = n.value
                if _ident(v) in _ROW_HOLDERS or ast.unparse(v) in holders or \
                        (isinstance(v, ast.Subscript) and _ident(v.value) in _ROW_SEQUENCES
                         and not _int_literal(v.slice)):
                    out.add((n.lineno, ast.unparse(n)))
    return sorted(out)


def test_the_positional_row_rule_reads_what_it_says():
    src = ("_P = W.R_PAYLOAD\n"
           "def f(records, metas, rows, names, x):\n"
           "    a = [rec[2] for rec in records]\n"            # 3: by its name
           "    for i, m in enumerate(metas):\n"
           "        b = m[10]\n"                              # 5: a loop over metas
           "    c = rows[i][3] + records[0][W.R_NAME]\n"     # 6: rows[i][3] only
           "    d = x[W.R_CODE] + x[1] + x[_P][0]\n"         # 7: x[1]; x[_P][0] is a field's
           "    return names[0], d[I_DTYPE], d[-1], row[W.R_SHAPE][0]\n")   # 8: d[-1]
    assert positional_row_reads(src) == [(3, "rec[2]"), (5, "m[10]"), (6, "rows[i][3]"),
                                         (7, "x[1]"), (8, "d[-1]")]


@needs_tree
def test_rows_and_records_are_read_by_name():
    # a table row, a write record or a descriptor tuple is read with
    # kiln._wire's R_* / I_*, never rec[2] or m[10]
    wrong = []
    for m, path in sorted(_modules().items()):
        if path is None:
            continue
        with open(path) as f:
            for line, text in positional_row_reads(f.read()):
                if "%s: %s" % (m, text) not in POSITIONAL_ROW_READS:
                    wrong.append("%s:%d %s" % (m, line, text))
    assert wrong == []


# --- the architecture page names every module ---------------------------------------

def _named_in(doc_sections, rel):
    """Is ``kiln/<rel>`` named: its whole path anywhere, or its file name in a
    section of the page that names its folder (``kiln/_files/`` ... ``atomic.py``)."""
    if "kiln/" + rel in "".join(doc_sections):
        return True
    folder, _, name = rel.rpartition("/")
    if not folder:
        return False
    return any("kiln/%s/" % folder in sec and re.search(r"`%s`" % re.escape(name), sec)
               for sec in doc_sections)


@needs_tree
def test_the_architecture_page_names_every_module():
    with open(os.path.join(ROOT, "docs", "architecture.md"), encoding="utf-8") as f:
        text = f.read()
    # a section: a table row or a paragraph (the floors table names a folder
    # and its files in one row; the tensor layer's table follows its heading)
    sections = re.split(r"\n(?=## )", text)
    rows = [line for sec in sections for line in sec.split("\n") if line.startswith("|")]
    missing = []
    for dirpath, _, files in os.walk(os.path.join(ROOT, "kiln")):
        for fn in files:
            if fn.endswith((".py", ".pyx")) and fn != "__init__.py":
                rel = os.path.relpath(os.path.join(dirpath, fn), os.path.join(ROOT, "kiln"))
                if not _named_in(rows + sections, rel.replace(os.sep, "/")):
                    missing.append(rel)
    assert sorted(missing) == []
