"""The path is part of the claim: the kernels and the compiled tensor layer that
run are the ones this run says it tests.

Under ``--c-extensions`` (and without ``KILN_PUREPYTHON``) ``import kiln`` must
pick the compiled kernels, and the compiled kernels' tensor part
(``Tensor.numpy``, ``TensorDirectory.values()``/``to_dict()``, the view
directories, the arrays' held buffer, the DLPack destructor; bound by
kiln/_tensors/bind.py when the compiled setup calls accept the classes) must
serve the tensor objects, except where kiln/_compat.py declares it off
(free-threaded builds).  Under ``impl`` the part bound is the tested kernel's.
A slot renamed on one side, an entry point renamed or dropped, or a setup
that declines fails here (and the entry points' signatures in
tests/test_house.py).  With the fallback selected nothing compiled is
imported at all.
"""

import os
import subprocess
import sys
import sysconfig
import types

import numpy as np

import kiln
import pytest

from kiln import _compat, _tensors
from kiln import _wire as W
from kiln._tensors import directory
from kiln._tensors.arrays import numpy_py
from kiln._tensors.dtypes import SHAPED
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


def _part_name(compiled):
    return "kiln._kernels_c" if compiled else "kiln._kernels_py"


def _assert_bound(kernels, part):
    """Every crossing of the tensor part goes to ``part`` (and the construction
    checks to ``kernels``): the methods the objects wear, the fast paths, the
    DLPack destructor."""
    from kiln._tensors import checks, directory, dlpack
    assert _tensors.BOUND.kernels is kernels and _tensors.BOUND.part is part
    assert kiln.Tensor.numpy is part.tensor_numpy_method
    assert kiln.TensorDirectory.to_dict is part.tensors_dict_method
    assert directory._fill is part.tensors_fill and directory._hold is part.hold_buffer
    assert set(dlpack._DESTROY.values()) == {part.dlpack_destructor()}
    assert checks._kernels is kernels
    if part.__name__ == "kiln._kernels_c":
        assert isinstance(part.dlpack_destructor(), int) and part.dlpack_destructor()
        assert part.hold_buffer(memoryview(b"x")) is not None
    else:
        assert part.dlpack_destructor() is None and part.hold_buffer(memoryview(b"x")) is None


def test_the_compiled_tensor_part_is_bound_exactly_when_declared():
    # the process default: what kiln/_tensors/__init__.py bound at import
    # (the impl fixture binds its own kernel per test, and restores this one)
    part = _tensors.BOUND.part
    assert part.__name__ == _part_name(_compat.COMPILED_TENSOR_LAYER)
    _assert_bound(_compat.kernels, part)
    if not _compat.COMPILED_TENSOR_LAYER:
        assert isinstance(kiln.Tensor.numpy, types.FunctionType)
        assert isinstance(kiln.TensorDirectory.to_dict, types.FunctionType)


def test_impl_binds_its_kernels_tensor_part(impl):
    """``impl`` decides the tensor objects' path: the part bound is the tested
    kernel's, except where kiln._compat declares the compiled one off."""
    part = _tensors.BOUND.part
    assert part.__name__ == _part_name(impl.compiled_tensors)
    _assert_bound(impl.kernels, part)
    # the compiled part accepted exactly the classes and slots kiln/_wire.py names
    if impl.name == "cython":
        assert impl.kernels.TENSOR_SLOTS == W.TENSOR_SLOTS == kiln.Tensor.__slots__
        assert impl.kernels.DIRECTORY_SLOTS == W.DIRECTORY_SLOTS
        assert kiln.TensorDirectory.__slots__[:len(W.DIRECTORY_SLOTS)] == W.DIRECTORY_SLOTS
        ok = impl.kernels.tensor_setup(kiln.Tensor, SHAPED, numpy_py) and \
            impl.kernels.directory_setup(kiln.TensorDirectory, _tensors.HOOKS)
        assert ok == (not _compat.FREE_THREADED_BUILD)


def test_decoded_arrays_come_from_the_declared_path(impl, monkeypatch):
    """The arrays of a decoded directory have a HeldBuffer base exactly when the
    compiled tensor part serves, and the compiled kernels build a view
    directory in C (never through HOOKS.build) exactly then."""
    calls = []
    build = _tensors.HOOKS.build
    monkeypatch.setattr(_tensors.HOOKS, "build", lambda *a: calls.append(a[4]) or build(*a))
    buf = impl.encode_tensors(ARRAYS)
    for copy in (False, True):
        del calls[:]
        d = impl.decode_tensors(buf, copy=copy, max_copy_bytes=1 << 20) if copy \
            else impl.decode_tensors(buf)
        arrays = [t.numpy() for t in d.values()] + list(d.to_dict().values())
        bases = {type(root_base(a)).__name__ for a in arrays}
        if impl.compiled_tensors:
            assert bases == {"HeldBuffer"}
        else:
            assert "HeldBuffer" not in bases and directory._hold(buf) is None
        in_c = impl.compiled_tensors and not copy
        assert calls == ([] if in_c else [copy])
        for a in arrays:
            assert a.tobytes() == ARRAYS["a" if a.dtype == np.float32 else "b"].tobytes()


def test_hand_made_tensors_are_checked_by_the_tested_kernel(impl, monkeypatch):
    """A Tensor or TensorDirectory built by hand runs the bound kernel's
    check_payload and check_links (a spy around the real functions)."""
    seen = []
    for name in ("check_payload", "check_links"):
        real = getattr(impl.kernels, name)
        monkeypatch.setattr(impl.kernels, name,
                            lambda *a, _r=real, _n=name: seen.append(_n) or _r(*a))
    w = kiln.Tensor(bytes(8), dtype="u4", shape=(4, 4), name="w", quant_scheme=1,
                    quant_axis=1, group_size=2, scale_index="s")
    s = kiln.Tensor(bytes(32), dtype="f32", shape=(4, 2), name="s")
    kiln.TensorDirectory([w, s])
    assert seen == ["check_payload", "check_links"]
    with pytest.raises(kiln.EncodeError) as e:   # scales of 4 x 3, not 4 x (4 / 2)
        kiln.TensorDirectory([w, kiln.Tensor(bytes(48), dtype="f32", shape=(4, 3),
                                             name="s")])
    assert (e.value.code, e.value.offset, e.value.path, e.value.reason) == \
        ("TYPE", 0, "['w']", "tensor 0: scale tensor has 12 elements, 8 groups need 8")


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
    import importlib.util
    nothing_compiled = importlib.util.find_spec("kiln._kernels_c") is None
    if nothing_compiled or (expected_implementation(pytestconfig) == "python" and
                            not os.environ.get("KILN_PUREPYTHON")):
        assert _child(CHILD, purepython=False) == ["python", "False", "False"]
        return
    layer = str(not _compat.FREE_THREADED_BUILD)
    assert _child(CHILD, purepython=False) == ["cython", "True", layer]
