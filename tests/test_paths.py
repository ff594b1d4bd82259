"""The path is part of the claim: the kernels and the compiled tensor layer that
run are the ones this run says it tests.

Under ``--c-extensions`` (and without ``KILN_PUREPYTHON``) ``import kiln`` must
pick the compiled kernels, and the compiled tensor layer (``Tensor.numpy``,
``TensorDirectory.values()``/``to_dict()`` and the view directories, installed
by kiln/_tensor.py when the compiled setup hooks accept the classes) must be
on, except where kiln/_compat.py declares it off (free-threaded builds).  With
the fallback selected nothing compiled is imported at all.
"""

import os
import subprocess
import sys
import sysconfig
import types

import numpy as np

import kiln
from kiln import _compat, _tensor
from conftest import _compiled_or_none
from _util import root_base

ARRAYS = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.arange(3, dtype=np.int16)}


def expected_implementation(config):
    """What ``import kiln`` must have picked in this run."""
    if os.environ.get("KILN_PUREPYTHON", "") not in ("", "0"):
        return "python"
    if config.getoption("--c-extensions") or _compiled_or_none() is not None:
        return "cython"
    return "python"


def test_the_kernels_asked_for_are_imported(pytestconfig):
    assert kiln.IMPLEMENTATION == expected_implementation(pytestconfig)
    assert _compat.kernels.__name__ == ("kiln._kernels_c" if kiln.IMPLEMENTATION == "cython"
                                        else "kiln._kernels_py")


def test_free_threading_is_declared_in_one_place():
    # the one exception, stated in kiln/_compat.py, checked against the interpreter
    assert _compat.FREE_THREADED_BUILD == bool(sysconfig.get_config_var("Py_GIL_DISABLED"))
    assert _compat.COMPILED_TENSOR_LAYER == (kiln.IMPLEMENTATION == "cython"
                                             and not _compat.FREE_THREADED_BUILD)


def test_the_compiled_tensor_layer_is_installed_exactly_when_declared():
    k = _compat.kernels
    if _compat.COMPILED_TENSOR_LAYER:
        # tensor_setup and directory_setup accepted the classes at import
        assert kiln.Tensor.numpy is k.tensor_numpy_method
        assert kiln.TensorDirectory.to_dict is k.tensors_dict_method
        assert _tensor._fill is k.tensors_fill and _tensor._hold is k.hold_buffer
    else:
        assert isinstance(kiln.Tensor.numpy, types.FunctionType)
        assert isinstance(kiln.TensorDirectory.to_dict, types.FunctionType)
        assert _tensor._fill is None and _tensor._hold is _tensor._no_hold


def test_decoded_arrays_come_from_the_declared_path(impl, monkeypatch):
    """The arrays of a decoded directory have a HeldBuffer base exactly when the
    compiled layer is on, and the compiled kernels build a view directory in C
    (never through HOOKS.build) exactly then."""
    calls = []
    build = _tensor.HOOKS.build
    monkeypatch.setattr(_tensor.HOOKS, "build", lambda *a: calls.append(a[4]) or build(*a))
    buf = impl.encode_tensors(ARRAYS)
    for copy in (False, True):
        del calls[:]
        d = impl.decode_tensors(buf, copy=copy, max_copy_bytes=1 << 20) if copy \
            else impl.decode_tensors(buf)
        arrays = [t.numpy() for t in d.values()] + list(d.to_dict().values())
        bases = {type(root_base(a)).__name__ for a in arrays}
        if _compat.COMPILED_TENSOR_LAYER:
            assert bases == {"HeldBuffer"}
        else:
            assert "HeldBuffer" not in bases and _tensor._hold(buf) is None
        in_c = impl.name == "cython" and _compat.COMPILED_TENSOR_LAYER and not copy
        assert calls == ([] if in_c else [copy])
        for a in arrays:
            assert a.tobytes() == ARRAYS["a" if a.dtype == np.float32 else "b"].tobytes()


def _child(code, purepython):
    env = dict(os.environ)
    env["KILN_PUREPYTHON"] = "1" if purepython else "0"
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout.split()


CHILD = """
import sys, numpy as np, kiln
from kiln import _compat
t = kiln.struct({"id": kiln.i64, "w": kiln.tensors, "v": kiln.list_(kiln.f32)})
buf = kiln.encode({"id": 1, "w": {"x": np.ones(3, np.float32)}, "v": [1.0]}, t)
d = kiln.decode(buf, t)["w"]
assert d["x"].numpy().tolist() == [1.0] * 3 and list(d.to_dict()) == ["x"]
print(kiln.IMPLEMENTATION, "kiln._kernels_c" in sys.modules, _compat.COMPILED_TENSOR_LAYER)
"""


def test_with_the_fallback_nothing_compiled_is_imported():
    assert _child(CHILD, purepython=True) == ["python", "False", "False"]


def test_by_default_the_compiled_kernels_run(pytestconfig):
    if expected_implementation(pytestconfig) == "python" and \
            not os.environ.get("KILN_PUREPYTHON"):
        assert _child(CHILD, purepython=False) == ["python", "False", "False"]
        return
    layer = str(not _compat.FREE_THREADED_BUILD)
    assert _child(CHILD, purepython=False) == ["cython", "True", layer]


def test_tensor_objects_on_the_python_path_too():
    """``impl`` cannot choose the tensor layer (it is installed once, at import):
    the tensor-object tests run once more in a child on the pure kernels, so the
    Python Tensor.numpy/values()/to_dict() are tested in a compiled run too."""
    if kiln.IMPLEMENTATION == "python":
        # this process is the pure one: its own run of these files is that run
        assert not _compat.COMPILED_TENSOR_LAYER
        return
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, KILN_PUREPYTHON="1")
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                        os.path.join(root, "tests", "test_tensor_arrays.py"),
                        os.path.join(root, "tests", "test_tensors.py")],
                       cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert " passed" in r.stdout and "skipped" not in r.stdout.splitlines()[-1], r.stdout[-500:]
