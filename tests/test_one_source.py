"""One source for each fact: the packed dtypes, the directory alignment, the
golden cases and the version are each stated once, and every other place takes
them from there; the root holds no build output; skips are counted and named.

These read the tree (kiln/, src/, the root); the values themselves are checked
against hand-written expectations from spec/kiln-v2.md (6.2 dtypes, 6.4
placement).  In a run from an installed wheel the tree checks skip, saying so.
"""

import ast
import os
import re
import subprocess

import pytest

from kiln import _wire as W
from _util import CASES_PATH, ROOT

KILN = os.path.join(ROOT, "kiln")
SRC = os.path.join(ROOT, "src")
# generated from kiln/_wire.py by tools/gen_wire.py (test_house checks they are current)
GENERATED = {os.path.join(SRC, "kiln_wire.h"), os.path.join(SRC, "kernels", "wire.pxi")}


def _files(top, exts):
    if not os.path.isdir(top):   # an installed-wheel run has no kiln/ or src/ sources here
        pytest.skip("no source tree at %s (installed-wheel test run)" % top)
    for dirpath, dirnames, names in os.walk(top):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        for n in sorted(names):
            path = os.path.join(dirpath, n)
            if n.endswith(exts) and path not in GENERATED:
                yield path


def _code_lines(path):
    """(line number, line) without comments and blank lines."""
    with open(path) as f:
        for i, ln in enumerate(f, 1):
            code = ln.split("#", 1)[0] if not path.endswith(".h") else ln.split("/*", 1)[0]
            if code.strip():
                yield i, code


def test_the_packed_dtypes_are_the_spec_s_three():
    assert sorted(W.DTYPES[c][0] for c in W.PACKED) == ["e2m1", "i4", "u4"]   # spec 6.2
    assert {c for c, d in W.DTYPES.items() if d[1] == 0} == W.PACKED


def _dir_align_body():
    if not os.path.isdir(KILN):
        pytest.skip("no source tree at %s (installed-wheel test run)" % KILN)
    with open(os.path.join(KILN, "_wire.py")) as f:
        tree = ast.parse(f.read())
    (fn,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "dir_align"]
    return range(fn.lineno, fn.end_lineno + 1)


# rounding to the 64-byte directory alignment written out by hand
_ALIGN_ARITHMETIC = re.compile(r"DIR_ALIGN\s*-\s*1|\+\s*63\b|~\s*63\b|&\s*-\s*64\b|%\s*64\b"
                               r"|//\s*64\s*\*\s*64|_ALIGN\s*\)\s*&")


def test_the_alignment_is_computed_in_one_function():
    assert [W.dir_align(n) for n in (0, 1, 63, 64, 65, 128, 200)] == \
        [0, 64, 64, 64, 128, 128, 256]
    body = _dir_align_body()
    found = []
    for path in list(_files(KILN, (".py",))) + list(_files(SRC, (".pyx", ".pxi", ".h"))):
        for i, code in _code_lines(path):
            if path.endswith(os.path.join("kiln", "_wire.py")) and i in body:
                continue
            if _ALIGN_ARITHMETIC.search(code):
                found.append("%s:%d: %s" % (os.path.relpath(path, ROOT), i, code.strip()))
    assert found == [], "round up with kiln._wire.dir_align (C: dir_align from kiln_wire.h)"


def _packed_literals(path):
    """Tuples, lists and sets in a module that spell out the packed dtype names."""
    with open(path) as f:
        tree = ast.parse(f.read())
    names = {W.DTYPES[c][0] for c in W.PACKED}
    for node in ast.walk(tree):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            strs = {e.value for e in node.elts if isinstance(e, ast.Constant)}
            if len(names & strs) >= 2:
                yield node.lineno


def test_the_packed_dtype_list_lives_once():
    found = []
    for path in _files(KILN, (".py",)):
        found += ["%s:%d" % (os.path.relpath(path, ROOT), ln) for ln in _packed_literals(path)]
    # the compiled side reads the generated table PACKED, never "width 0" or codes
    for path in _files(SRC, (".pyx", ".pxi")):
        for i, code in _code_lines(path):
            if re.search(r"DW\[[^\]]*\]\s*==\s*0", code):
                found.append("%s:%d: %s" % (os.path.relpath(path, ROOT), i, code.strip()))
    assert found == [], "use kiln._wire.PACKED (Cython: PACKED[code] from kiln_wire.h)"


def test_the_generated_packed_table_is_wire_packed():
    if not os.path.isdir(SRC):
        pytest.skip("no source tree at %s (installed-wheel test run)" % SRC)
    with open(os.path.join(SRC, "kiln_wire.h")) as f:
        text = f.read()
    m = re.search(r"kiln_dtype_packed\[(\d+)\] = \{([^}]*)\}", text)
    table = [int(x) for x in m.group(2).split(",")]
    assert len(table) == W.DTYPE_MAX + 1
    assert {c for c, v in enumerate(table) if v} == {16, 17, 18}   # i4 u4 e2m1, spec 6.2


def test_the_packaged_golden_cases_are_spec_s_bytes():
    from kiln.data import cases_path
    with open(cases_path(), "rb") as a, open(CASES_PATH, "rb") as b:
        assert a.read() == b.read()


def test_the_case_generator_writes_one_file():
    with open(os.path.join(ROOT, "spec", "reference", "gen_v2_cases.py")) as f:
        text = f.read()
    code = "\n".join(ln.split("#", 1)[0] for ln in text.splitlines())
    assert not re.search(r'"kiln",\s*"data"|kiln/data', code)   # setup.py makes the wheel's copy


def test_no_second_copy_of_the_golden_cases_is_tracked():
    try:
        out = subprocess.run(["git", "ls-files", "kiln/data"], cwd=ROOT, capture_output=True,
                             text=True, check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout (git ls-files failed)")
    if not out:
        pytest.skip("not a git checkout (no tracked files under kiln/data)")
    assert [n for n in out if not n.endswith(".py")] == []


def _pyproject():
    import sys
    path = os.path.join(ROOT, "pyproject.toml")
    if sys.version_info < (3, 11):
        pytest.importorskip("tomli", reason="reads pyproject.toml on Python 3.10")
        import tomli as tomllib
    else:
        import tomllib
    with open(path, "rb") as f:
        return tomllib.load(f)


def test_the_version_is_written_once():
    import kiln
    project = _pyproject()["project"]
    assert "version" not in project and "version" in project["dynamic"]
    assert _pyproject()["tool"]["setuptools"]["dynamic"]["version"] == \
        {"attr": "kiln.__version__"}
    assert re.fullmatch(r"\d+\.\d+\.\d+", kiln.__version__)


def test_the_changelog_is_in_release_sections():
    import kiln
    path = os.path.join(ROOT, "CHANGELOG.md")
    if not os.path.exists(path):
        pytest.skip("no CHANGELOG.md here (it is not in the sdist)")
    with open(path, encoding="utf-8") as f:
        heads = [ln.rstrip("\n") for ln in f if ln.startswith("## ")]
    releases = [re.match(r"## (\d+)\.(\d+)\.(\d+)( \(not yet published\)| - \d{4}-\d\d-\d\d)$", h)
                for h in heads]
    assert heads and all(releases), "every ## section is a release: ## X.Y.Z - YYYY-MM-DD " \
        "or ## X.Y.Z (not yet published); got %s" % heads
    versions = [tuple(map(int, m.groups()[:3])) for m in releases]
    assert versions == sorted(versions, reverse=True) and len(set(versions)) == len(versions)
    assert "%d.%d.%d" % versions[0] == kiln.__version__   # the newest is the package's
    assert [m.group(4) for m in releases[1:]] == \
        [m.group(4) for m in releases[1:] if m.group(4).startswith(" - ")]   # one unpublished


def _git(*args):
    """git's output lines; check-ignore exits 1 when it ignores nothing."""
    try:
        r = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
    except OSError:
        pytest.skip("git is not installed")
    if r.returncode not in ((0, 1) if args[0] == "check-ignore" else (0,)):
        pytest.skip("not a git checkout (git %s: %s)" % (args[0], r.stderr.strip()))
    return r.stdout.split("\n")


# what example and demo runs and builds leave at the top of a checkout
OUTPUTS = ["big.kiln", "model.kiln", "record.kiln", "part-0.kilnr", "model.safetensors",
           "model.gguf", "arrays.npz", "build/lib/kiln/__init__.py", "dist/kiln_wire-0.1.0.tar.gz",
           "wheelhouse/x.whl", "kiln_wire.egg-info/PKG-INFO", "kiln/data/kiln-v2-cases.json",
           "src/_kernels_c.c", "kiln/_kernels_c.cpython-311-x86_64-linux-gnu.so"]


def test_the_root_holds_no_build_or_example_output():
    top = [n for n in _git("ls-files") if n and "/" not in n]
    if not top:
        pytest.skip("not a git checkout (nothing tracked)")
    assert not [n for n in top if n.endswith((".kiln", ".kilnr", ".safetensors", ".gguf",
                                              ".npz", ".whl", ".tar.gz"))], top
    ignored = [n for n in _git("check-ignore", "--no-index", *OUTPUTS) if n]
    assert sorted(ignored) == sorted(OUTPUTS)


# -- skips are counted and named (issue 29 item 5) ------------------------------

def test_every_run_counts_its_skips():
    # the README's command and .ci/run are plain "python -m pytest": -ra comes from here
    assert "-ra" in _pyproject()["tool"]["pytest"]["ini_options"]["addopts"].split()


def _module_level_skips():
    """(test file, package) for each importorskip at the top of a test module."""
    tests = os.path.join(ROOT, "tests")
    for n in sorted(os.listdir(tests)):
        if not (n.startswith("test_") and n.endswith(".py")):
            continue
        with open(os.path.join(tests, n), encoding="utf-8") as f:
            tree = ast.parse(f.read())
        for node in tree.body:
            value = getattr(node, "value", None)
            if isinstance(value, ast.Call) and getattr(value.func, "attr", "") == "importorskip":
                yield "tests/" + n, value.args[0].value.split(".")[0]


def test_the_wheel_workflow_names_each_module_it_skips():
    path = os.path.join(ROOT, ".github", "workflows", "wheels.yml")
    if not os.path.exists(path):
        pytest.skip("no .github/ here (installed-wheel test run)")
    with open(path, encoding="utf-8") as f:
        head = f.read()
    comment = " ".join(ln.lstrip("# ").strip() for ln in head.split("\nname:", 1)[0].splitlines())
    skips = list(_module_level_skips())
    assert ("tests/test_remote.py", "fsspec") in skips   # the scan finds them
    required = set(_pyproject()["tool"]["cibuildwheel"]["test-requires"])
    for test_file, package in skips:
        if any(r.split(">")[0].split("=")[0].strip() == package for r in required):
            continue
        assert test_file in comment and package in comment, (test_file, package)
