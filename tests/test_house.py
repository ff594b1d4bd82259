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
    assert set(_kernel.INTERFACE) == set(_kernel.INTERFACE_CODEC + _kernel.INTERFACE_TENSORS)


def _stub():
    """The .pyi's public names: {name: ("def", params) | ("class", members) | ("value",)}."""
    tree = ast.parse(_src("kiln", "_kernels_c.pyi"))
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


def test_generated_wire_constants_are_up_to_date():
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "gen_wire.py"), "--check"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def _src(*parts):
    with open(os.path.join(ROOT, *parts)) as f:
        return f.read()


def test_the_compiled_kernel_does_not_import_the_pure_one():
    texts = [_src("src", "_kernels_c.pyx")] + [_src("src", "kernels", p + ".pxi")
                                               for p in KERNEL_PARTS]
    for text in texts:
        code = "\n".join(ln for ln in text.splitlines() if not ln.lstrip().startswith("#"))
        assert not re.search(r"^\s*(from|import)\s+\S*_kernels_py", code, re.M)
        assert "_py." not in code


def test_the_kernels_have_the_same_parts():
    for part in KERNEL_PARTS:
        assert os.path.exists(os.path.join(ROOT, "kiln", "_kernels_py", part + ".py")), part
        assert os.path.exists(os.path.join(ROOT, "src", "kernels", part + ".pxi")), part
        pxi = _src("src", "kernels", part + ".pxi")
        assert "kiln/_kernels_py/%s.py" % part in pxi.split("\n\n")[0], part


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


def _module_files():
    """{module name: (path, is a package)} for every module under kiln/ (a
    compiled module by its .pyi stub, path None: its imports are not Python's)."""
    out = {}
    for dirpath, _, files in os.walk(os.path.join(ROOT, "kiln")):
        for fn in files:
            if fn.endswith(".pyi"):
                rel = os.path.relpath(os.path.join(dirpath, fn), ROOT)[:-4].split(os.sep)
                out.setdefault(".".join(rel), (None, False))
            if fn.endswith(".py"):
                rel = os.path.relpath(os.path.join(dirpath, fn), ROOT)[:-3].split(os.sep)
                pkg = rel[-1] == "__init__"
                out[".".join(rel[:-1] if pkg else rel)] = (os.path.join(dirpath, fn), pkg)
    return out


def _import_graph():
    """module -> the kiln modules it imports (anywhere in it: a lazy import
    inside a function is an edge too).  ``from . import x`` is an edge to the
    submodule x when there is one, else to the package itself."""
    mods = _module_files()
    graph = {}
    for name, (path, pkg) in mods.items():
        if path is None:
            graph[name] = set()
            continue
        with open(path) as f:
            tree = ast.parse(f.read())
        edges = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                edges.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    parts = name.split(".") if pkg else name.split(".")[:-1]
                    base = ".".join(parts[:len(parts) - node.level + 1])
                    target = base + ("." + node.module if node.module else "")
                else:
                    target = node.module
                subs = [target + "." + a.name for a in node.names if target + "." + a.name in mods]
                edges.update(subs)
                if len(subs) < len(node.names):
                    edges.add(target)
        graph[name] = {e for e in edges if e in mods and e != name}
    return graph


def _cycles_through(graph, start):
    """The import circles that pass through ``start`` (as paths back to it)."""
    found, stack = [], [(start, [start])]
    while stack:
        node, path = stack.pop()
        for nxt in graph.get(node, ()):
            if nxt == start:
                found.append(path + [start])
            elif nxt not in path and len(path) < 12:
                stack.append((nxt, path + [nxt]))
    return found


def test_the_tensor_layer_has_no_import_circle():
    # the package kiln/_tensors (its __init__ and its own modules included), the
    # old path kiln/_tensor.py and the pure tensor part: no module of theirs is
    # on an import circle anywhere in kiln/
    graph = _import_graph()
    mine = [m for m in graph if m.startswith("kiln._tensors") or
            m in ("kiln._tensor", "kiln._kernels_py.tensors", "kiln._kernel", "kiln._compat")]
    assert "kiln._tensors.bind" in mine
    assert {m: _cycles_through(graph, m) for m in mine if _cycles_through(graph, m)} == {}
