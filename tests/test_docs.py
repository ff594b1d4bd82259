"""The documentation is tested like code.

* Every ```python block of README.md and docs/**/*.md runs, in both
  implementations (the ``impl`` fixture), in a fresh temporary directory.
  The blocks of one page share one namespace, in page order, as a reader
  would type them.  A block starting with ``>>>`` runs as a doctest.  A block
  preceded by ``<!-- requires: torch -->`` is left out when that module is not
  installed: the page's other blocks still run, then the test is reported as
  skipped, naming the blocks and modules.  Blocks that are not Python (sh,
  text, json) use another fence language and are not run.
* Every ``>>>`` example in the docstrings of kiln's public API runs, in both
  implementations.
* The site builds with ``sphinx-build -W -n --keep-going``: any warning,
  including a broken cross-reference (nitpicky), fails the test.  Every name
  in ``kiln.__all__`` and every public module has an entry in the reference.
"""

import dataclasses
import doctest
import glob
import importlib
import importlib.util
import os
import re
import subprocess
import sys
import typing

import numpy as np
import pytest

import kiln
from kiln import _compat

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(ROOT, "docs")

# the public modules of the reference (kiln itself covers kiln.__all__)
PUBLIC_MODULES = ["kiln", "kiln.files", "kiln.schema", "kiln.dask", "kiln.remote",
                  "kiln.convert", "kiln.cli", "kiln.torch"]
# where docstrings of public names live
DOCSTRING_MODULES = ["kiln", "kiln._api", "kiln._types", "kiln._typemodel", "kiln._typetext",
                     "kiln._annotations", "kiln._tensors.tensor", "kiln._tensors.directory",
                     "kiln._tensors.dtypes", "kiln._tensors.nibbles", "kiln._plan",
                     "kiln._errors", "kiln.files", "kiln._files.save", "kiln._files.writer",
                     "kiln._files.kilnfile", "kiln._files.load", "kiln._files.remote",
                     "kiln._files.sharded", "kiln._files.shardsave",
                     "kiln._record", "kiln.schema", "kiln._schema_read",
                     "kiln._schema_gen", "kiln.dask", "kiln.remote",
                     "kiln.convert", "kiln.cli", "kiln.torch", "kiln.torch._save",
                     "kiln.torch._load", "kiln.torch._safe_open", "kiln.torch._collate"]

FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`\s]*)")
REQUIRES = re.compile(r"<!--\s*requires:\s*(?P<mods>[\w., ]+?)\s*-->")


# --- markdown ---------------------------------------------------------------------

def markdown_files():
    files = [os.path.join(ROOT, "README.md")]
    files += sorted(glob.glob(os.path.join(DOCS, "**", "*.md"), recursive=True))
    return [f for f in files if os.path.exists(f) and "_build" not in f]


def python_blocks(path):
    """[(first line number, code, required modules)] of the ```python blocks."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    blocks = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if m is None:
            i += 1
            continue
        fence, info = m.group("fence"), m.group("info").lower()
        body = []
        j = i + 1
        while j < len(lines) and not (lines[j].lstrip().startswith(fence)
                                      and lines[j].strip().strip(fence[0]) == ""):
            body.append(lines[j])
            j += 1
        if info in ("python", "py", "python3"):
            prev = next((ln for ln in reversed(lines[:i]) if ln.strip()), "")
            req = REQUIRES.search(prev)
            mods = [s.strip() for s in req.group("mods").split(",")] if req else []
            blocks.append((i + 2, "\n".join(body) + "\n", mods))
        i = j + 1
    return blocks


def _rel(path):
    return os.path.relpath(path, ROOT)


MARKDOWN = [f for f in markdown_files() if python_blocks(f)]


@pytest.fixture
def use_impl(impl, monkeypatch, tmp_path):
    """kiln's module-level API (kiln.encode, kiln.open ...) on ``impl``'s kernels,
    in a fresh working directory."""
    monkeypatch.setattr(_compat, "kernels", impl.kernels)
    monkeypatch.setattr(_compat, "IMPLEMENTATION", impl.name)
    monkeypatch.setattr(kiln, "IMPLEMENTATION", impl.name)
    monkeypatch.chdir(tmp_path)
    return impl


def _run_doctest(code, name, path, lineno, globs):
    parser = doctest.DocTestParser()
    test = parser.get_doctest(code, globs, name, path, lineno)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    out = []
    runner.run(test, out=out.append, clear_globs=False)
    assert runner.failures == 0, "".join(out)


@pytest.mark.parametrize("path", MARKDOWN, ids=_rel)
def test_markdown_examples(path, use_impl):
    ns = {"__name__": "__doc_example__"}
    not_run = []
    for lineno, code, mods in python_blocks(path):
        where = "%s:%d" % (_rel(path), lineno)
        missing = [mod for mod in mods if importlib.util.find_spec(mod) is None]
        if missing:
            not_run.append("%s (needs %s)" % (where, ", ".join(missing)))
            continue   # only this block: the rest of the page still runs, then the skip
        if code.lstrip().startswith(">>>"):
            _run_doctest(code, where, path, lineno, ns)
            continue
        try:
            exec(compile(code, where, "exec"), ns)
        except Exception as e:
            raise AssertionError("the example at %s (%s kernels) failed: %s: %s"
                                 % (where, use_impl.name, type(e).__name__, e)) from e
    if not_run:
        pytest.skip("the other blocks passed; not run, an optional package is not "
                    "installed: " + "; ".join(not_run))


def test_the_readme_and_the_guide_have_examples():
    names = [_rel(p) for p in MARKDOWN]
    assert "README.md" in names
    if os.path.exists(os.path.join(DOCS, "conf.py")):   # a checkout, not a wheel's tests
        assert len(names) >= 10, names


def test_block_extraction():
    text = ("```sh\nkiln demo\n```\n\n<!-- requires: torch -->\n```python\nx = 1\n```\n"
            "````md\n```python\nnot run\n```\n````\n")
    import tempfile
    with tempfile.NamedTemporaryFile("w", suffix=".md", delete=False) as f:
        f.write(text)
    try:
        assert python_blocks(f.name) == [(7, "x = 1\n", ["torch"])]
    finally:
        os.unlink(f.name)


# --- docstrings -------------------------------------------------------------------

def _docstring_tests():
    finder = doctest.DocTestFinder(exclude_empty=True)
    seen = {}
    for modname in DOCSTRING_MODULES:
        try:
            mod = importlib.import_module(modname)
        except ImportError as e:   # kiln.dask without dask installed: reported as skipped
            UNIMPORTABLE.append((modname, e.name or str(e)))
            continue
        for t in finder.find(mod, modname):
            seen.setdefault(t.name, t)
    for name in kiln.__all__:   # public objects whose __module__ is "kiln"
        obj = getattr(kiln, name)
        if getattr(obj, "__module__", None) == "kiln" and isinstance(obj, type):
            for t in finder.find(obj, "kiln." + name):
                seen.setdefault(t.name, t)
    return sorted((t for t in seen.values() if t.examples), key=lambda t: t.name)


UNIMPORTABLE = []
DOCTESTS = _docstring_tests()


def test_docstrings_of_every_module_are_collected():
    if UNIMPORTABLE:   # counted in the summary, naming what is missing
        pytest.skip("docstring examples not run, an optional package is not installed: "
                    + "; ".join("%s (needs %s)" % mp for mp in UNIMPORTABLE))
    assert any(t.name.startswith("kiln.dask.") for t in DOCTESTS)


def test_every_public_callable_has_an_example():
    names = {t.name for t in DOCTESTS}
    public = {"encode", "decode", "Encoder", "Decoder", "encode_tensors", "decode_tensors",
              "parse_type", "as_type", "struct", "list_", "opt", "dict_", "Type", "Some",
              "Tensor", "TensorDirectory", "unpack_nibbles", "pack_nibbles", "numpy_dtype",
              "save_tensors", "load_tensors", "load_metadata", "save", "load", "open",
              "KilnFile", "TensorWriter", "save_sharded", "ShardedFile", "SchemaError", "schema_from_json", "to_json_schema",
              "KilnError", "EncodeError"}
    missing = sorted(p for p in public if not any(n.endswith("." + p) for n in names))
    assert missing == []


@pytest.mark.parametrize("test", DOCTESTS, ids=lambda t: t.name)
def test_docstring_examples(test, use_impl):
    if test.name.startswith("kiln.dask"):
        pytest.importorskip("distributed")
        importlib.import_module("kiln.dask")   # kiln.dask in the examples
    globs = {"kiln": kiln, "np": np, "dataclasses": dataclasses, "typing": typing}
    if test.name.startswith("kiln.torch"):
        globs["torch"] = pytest.importorskip("torch", reason="torch is not installed: the "
                                             "kiln.torch examples run where it is")
        importlib.import_module("kiln.torch")
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    test = doctest.DocTest(test.examples, dict(globs), test.name, test.filename, test.lineno,
                           test.docstring)
    out = []
    runner.run(test, out=out.append)
    assert runner.failures == 0, "".join(out)


# --- the site ---------------------------------------------------------------------

def sphinx_build(src, out, *extra):
    return subprocess.run([sys.executable, "-m", "sphinx", "-W", "-n", "--keep-going", "-q",
                           "-b", "html", *extra, src, out],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)


@pytest.fixture(scope="module")
def built_site(tmp_path_factory):
    if not os.path.exists(os.path.join(DOCS, "conf.py")):
        pytest.skip("no docs/ here (the tests of an installed wheel)")
    pytest.importorskip("sphinx", reason="the docs extra is not installed: "
                        "pip install -e '.[test,docs]'")
    pytest.importorskip("myst_parser", reason="the docs extra is not installed")
    out = str(tmp_path_factory.mktemp("html"))
    r = sphinx_build(DOCS, out, "-d", os.path.join(out, ".doctrees"))
    return r, out


def test_docs_build_without_warnings(built_site):
    r, out = built_site
    assert r.returncode == 0, "sphinx-build -W -n failed:\n" + r.stdout + r.stderr
    assert os.path.exists(os.path.join(out, "index.html"))


def test_reference_covers_the_public_api(built_site):
    r, out = built_site
    assert r.returncode == 0, r.stderr
    from sphinx.util.inventory import InventoryFile
    with open(os.path.join(out, "objects.inv"), "rb") as f:
        inv = InventoryFile.load(f, "", os.path.join)
    documented = set()
    for kind, entries in inv.data.items() if hasattr(inv, "data") else inv.items():
        if kind.startswith("py:"):
            documented.update(entries)
    missing = sorted("kiln." + n for n in kiln.__all__ if "kiln." + n not in documented)
    assert missing == []
    assert sorted(m for m in PUBLIC_MODULES if m not in documented) == []


def _code_lines(path):
    """[(line number, text)] of every fenced code line of a markdown file
    (not the {eval-rst} directives, whose lines are not shown as code)."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    out, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if m is None:
            i += 1
            continue
        fence, info = m.group("fence"), m.group("info")
        j = i + 1
        while j < len(lines) and not (lines[j].lstrip().startswith(fence)
                                      and lines[j].strip().strip(fence[0]) == ""):
            if not info.startswith("{"):
                out.append((j + 1, lines[j]))
            j += 1
        i = j + 1
    return out


def test_code_examples_fit_their_column():
    # docs/conf.py sets the theme's width for MAX_CODE_LINE characters of code
    if not os.path.exists(os.path.join(DOCS, "conf.py")):
        pytest.skip("no docs/ here (the tests of an installed wheel)")
    spec = importlib.util.spec_from_file_location("_kiln_docs_conf", os.path.join(DOCS, "conf.py"))
    conf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conf)
    width = conf.MAX_CODE_LINE
    assert conf.html_theme_options["body_max_width"] == "none"
    too_long = ["%s:%d (%d)" % (_rel(f), n, len(s)) for f in markdown_files()
                for n, s in _code_lines(f) if len(s) > width]
    for t in DOCTESTS:   # docstring examples: the >>> lines as the site shows them
        too_long += ["%s (%d)" % (t.name, len(">>> " + ln)) for e in t.examples
                     for ln in e.source.splitlines() if len(">>> " + ln) > width]
    assert too_long == []


def test_the_site_uses_the_wider_column(built_site):
    r, out = built_site
    assert r.returncode == 0, r.stderr
    with open(os.path.join(out, "_static", "alabaster.css"), encoding="utf-8") as f:
        css = f.read()
    assert "1260px" in css and "max-width: 800px" not in css
