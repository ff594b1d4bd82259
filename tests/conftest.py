"""Run every test against each kernel implementation.

One rule, with no environment variable involved:

* ``--c-extensions``: the compiled kernels must be importable.  Every test
  runs against both implementations; if ``kiln._kernels_c`` is missing, the
  tests that use it ERROR, they are never skipped.
* without it: every test runs against the pure kernels, and against the
  compiled ones too when they are importable (the pytest header says which).
  A pure-Python distribution (``KILN_NO_EXTENSIONS=1``, the py3-none-any
  wheel) runs this way.

``KILN_PUREPYTHON=1`` changes only which kernels ``import kiln`` picks (the
tests of that choice run in subprocesses), not which kernels are tested.

``impl`` decides the path: for the length of a test it binds the tensor
objects to its kernel's tensor part (``kiln._tensors.bind``), so
``Tensor.numpy``, ``values()``, ``to_dict()``, view directories, DLPack and
the construction checks run that kernel, and its ``decode``/``encode`` go
through it.  ``api`` is ``impl`` for the module-level API as well
(``kiln.save``, ``kiln.open``, remote reads, Dask, schemas): it sets the
kernels ``import kiln`` picked (``kiln._compat.kernels``) to ``impl``'s.
"""

import importlib
import os
import tempfile
import types

import pytest

import kiln
from kiln import _compat, _kernels_py, _tensors


# --- temporary files: every test writes under pytest's base temporary folder ----

_KILN_PREFIX = "kiln"                 # kiln-demo-*, kiln-cluster-*, kiln-fuzz-*, ...
_OWN_TMP = []                         # the run's own temporary folder (the fixture below)


def _kiln_entries(folder):
    try:
        return {n for n in os.listdir(folder) if n.startswith(_KILN_PREFIX)}
    except OSError:
        return set()


@pytest.fixture(scope="session")
def mypy_cache(tmp_path_factory):
    """One mypy cache for the run's type checks of user code against the
    checkout: the first check analyses numpy's and kiln's stubs (about 20 s),
    the others reuse them (about 1 s).  mypy re-reads a module whose file, path
    or size changed, and reports the errors of the files checked each time."""
    return tmp_path_factory.mktemp("mypy-cache")


@pytest.fixture(scope="session", autouse=True)
def _tempfile_under_basetemp(tmp_path_factory):
    """``tempfile`` (in this process and, through ``TMPDIR``, in every child a
    test starts: the CLI, Dask's processes, stress children) writes under
    pytest's base temporary folder, which pytest prunes, never in /tmp."""
    folder = str(tmp_path_factory.mktemp("tempfile"))
    _OWN_TMP.append(folder)
    saved_env, saved_dir = os.environ.get("TMPDIR"), tempfile.tempdir
    os.environ["TMPDIR"] = folder
    tempfile.tempdir = folder
    try:
        yield folder
    finally:
        tempfile.tempdir = saved_dir
        if saved_env is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = saved_env


def pytest_sessionfinish(session, exitstatus):
    """A kiln-named entry the run left in its own temporary folder (where
    ``tempfile`` wrote for it and its children) fails the run (test_demo once
    left kiln-demo-* behind).  The system's temporary folder is not looked at:
    what other processes write there (a ``kiln demo`` run meanwhile) is theirs."""
    left = sorted(n for folder in _OWN_TMP for n in _kiln_entries(folder))
    if left:
        session.config.get_terminal_writer().line(
            "the suite left %d entries in %s: %s" % (len(left), _OWN_TMP[0], ", ".join(left[:10])),
            red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_addoption(parser):
    parser.addoption("--c-extensions", action="store_true", default=False,
                     help="the compiled kernels must be importable, and are tested")
    parser.addoption("--require-torch", action="store_true", default=False,
                     help="torch and transformers are installed: a test skipped for "
                          "want of either fails (a skip naming CUDA stays a skip)")


# The torch and transformers tests: every test of a module that imports or
# asks for either.  `-m torch` selects them (.ci/run runs them with
# --require-torch after installing both).
_TORCH_WORDS = ("import torch", 'importorskip("torch"', "importorskip('torch'",
                'importorskip("transformers"', "import transformers")
_torch_modules = {}


def _mentions_torch(path):
    found = _torch_modules.get(path)
    if found is None:
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except OSError:
            text = ""
        found = _torch_modules[path] = any(w in text for w in _TORCH_WORDS)
    return found


def pytest_configure(config):
    config.addinivalue_line("markers", "torch: needs torch or transformers (chosen by "
                                       "tests/conftest.py from what the module imports)")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if _mentions_torch(str(item.fspath)):
            item.add_marker(pytest.mark.torch)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.skipped and item.config.getoption("--require-torch"):
        reason = str(rep.longrepr[-1] if isinstance(rep.longrepr, tuple) else rep.longrepr)
        low = reason.lower()
        if ("torch" in low or "transformers" in low) and "cuda" not in low:
            rep.outcome = "failed"
            rep.longrepr = "skipped under --require-torch: " + reason


def _compiled_or_none():
    try:
        return importlib.import_module("kiln._kernels_c")
    except ImportError:
        return None


def _want_c(config):
    """Are the compiled kernels tested in this run?"""
    return config.getoption("--c-extensions") or _compiled_or_none() is not None


def pytest_report_header(config):
    if config.getoption("--c-extensions"):
        return "kiln kernels under test: python and cython (required)"
    if _compiled_or_none() is None:
        return "kiln kernels under test: python only (no kiln._kernels_c importable)"
    return "kiln kernels under test: python and cython"


def pytest_generate_tests(metafunc):
    if "impl" in metafunc.fixturenames:
        names = ["python"]
        if _want_c(metafunc.config):
            names.append("cython")
        metafunc.parametrize("impl", names, indirect=True)


class Impl(types.SimpleNamespace):
    """kiln's API bound to one kernel module."""

    def encoder(self, t, frame=False):
        return kiln.Encoder(t, frame, kernels=self.kernels)

    def decoder(self, t, frame=False, **kw):
        return kiln.Decoder(t, frame, kernels=self.kernels, **kw)

    def encode(self, value, t, *, frame=False):
        return self.encoder(t, frame).encode(value)

    def decode(self, buf, t, *, frame=False, **kw):
        return self.decoder(t, frame, **kw).decode(buf)

    def encode_tensors(self, tensors):
        return self.encode(tensors, kiln.tensors)

    def decode_tensors(self, buf, **kw):
        return self.decode(buf, kiln.tensors, **kw)


def load_kernels(name):
    if name == "python":
        return _kernels_py
    # an ImportError here is a test ERROR, never a skip
    return importlib.import_module("kiln._kernels_c")


@pytest.fixture
def impl(request):
    kernels = load_kernels(request.param)
    before = _tensors.BOUND.kernels
    _tensors.bind(kernels)   # the tensor objects run on this kernel's tensor part
    try:
        # compiled_tensors: the compiled tensor part serves the objects; what
        # kiln._compat declares (tests/test_paths.py checks the bound part is that one)
        yield Impl(name=request.param, kernels=kernels,
                   compiled_tensors=request.param == "cython" and not _compat.FREE_THREADED_BUILD)
    finally:
        _tensors.bind(before)


@pytest.fixture
def api(impl, monkeypatch):
    """``impl`` for the module-level API too: files, remote reads, Dask, schemas
    run on ``impl``'s kernels (and the tensor objects, through ``impl``)."""
    monkeypatch.setattr(_compat, "kernels", impl.kernels)
    monkeypatch.setattr(_compat, "IMPLEMENTATION", impl.name)
    return impl


def compiled_kernels(config):
    """The compiled kernels module for a test that exercises it directly.

    Missing under ``--c-extensions``: an error.  Missing otherwise: skipped,
    since that distribution ships no compiled kernels to test."""
    if config.getoption("--c-extensions"):
        return importlib.import_module("kiln._kernels_c")
    k = _compiled_or_none()
    if k is None:
        pytest.skip("pure-Python distribution (no kiln._kernels_c installed): nothing "
                    "compiled to test")
    return k


def both_kernels(config=None):
    """The kernel modules under test (see the module doc)."""
    k = _compiled_or_none()
    if k is None and config is not None and config.getoption("--c-extensions"):
        return [_kernels_py, importlib.import_module("kiln._kernels_c")]
    return [_kernels_py] + ([] if k is None else [k])
