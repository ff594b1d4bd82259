"""Run every test against each kernel implementation.

``--c-extensions`` (or KILN_REQUIRE_EXTENSION=1, which .ci/run sets) says the
compiled kernels are expected: if ``kiln._kernels_c`` is then missing, the
tests that use it ERROR, they are never skipped.  Without the option a
missing extension is reported as an error too unless KILN_PUREPYTHON=1 is
set, in which case only the pure implementation is collected.
"""

import importlib
import os
import types

import pytest

import kiln
from kiln import _kernels_py


def pytest_addoption(parser):
    parser.addoption("--c-extensions", action="store_true", default=False,
                     help="the compiled kernels must be importable")


def _want_c(config):
    if config.getoption("--c-extensions") or os.environ.get("KILN_REQUIRE_EXTENSION") == "1":
        return True
    return os.environ.get("KILN_PUREPYTHON", "") in ("", "0")


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
    return Impl(name=request.param, kernels=load_kernels(request.param))


def compiled_kernels(config):
    """The compiled kernels module for a test that exercises it directly.

    It runs whenever the module is importable (KILN_PUREPYTHON=1 only changes
    the default).  Missing while expected: an error.  Missing in a pure-Python
    run: skipped, since that distribution (KILN_NO_EXTENSIONS=1, the
    py3-none-any wheel) ships no compiled kernels to test."""
    try:
        return importlib.import_module("kiln._kernels_c")
    except ImportError:
        if _want_c(config):
            raise
        pytest.skip("pure-Python distribution (KILN_PUREPYTHON=1, no kiln._kernels_c "
                    "installed): nothing compiled to test")


def both_kernels():
    out = [_kernels_py]
    try:
        out.append(importlib.import_module("kiln._kernels_c"))
    except ImportError:
        if os.environ.get("KILN_REQUIRE_EXTENSION") == "1":
            raise
    return out
