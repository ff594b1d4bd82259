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

import pytest

from kiln import _kernel

from _util import ROOT

KERNEL_PARTS = ("reader", "decode", "encode", "directory", "dirwrite")
MAX_FUNCTION_LINES = 120


def _params(fn):
    return [(p.name, p.default) for p in inspect.signature(fn).parameters.values()]


@pytest.mark.parametrize("name", _kernel.INTERFACE)
def test_each_kernel_has_the_interface_signatures(impl, name):
    want = _params(getattr(_kernel.Kernels, name))[1:]  # without self
    assert _params(getattr(impl.kernels, name)) == want


def test_the_interface_is_exactly_what_the_kernels_export(impl):
    assert set(impl.kernels.__all__) == set(_kernel.INTERFACE)


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
    texts = [_src("src", "_kernels_c.pyx")] + [_src("src", "kernels", p) for p in
                                               sorted(os.listdir(os.path.join(ROOT, "src",
                                                                              "kernels")))]
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


# kernel sources over the house's module size, each with its reason
MAX_MODULE_LINES = 600
LONG_KERNEL_SOURCES = {"directory.pxi": "the 17 directory steps, one function each"}


def test_no_kernel_source_is_longer_than_the_house_allows():
    for fn in sorted(os.listdir(os.path.join(ROOT, "src", "kernels"))):
        n = len(_src("src", "kernels", fn).splitlines())
        assert n <= MAX_MODULE_LINES or fn in LONG_KERNEL_SOURCES, (fn, n)


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
