"""Encoding {name: ndarray}: the compiled kernels describe plain arrays
themselves (no normalize_tensors); the bytes and every error must be what the
pure kernels give, for plain arrays and for everything that is not plain."""

import numpy as np
import pytest

import kiln
from kiln import _kernels_py

try:
    import ml_dtypes
except ImportError:  # pragma: no cover
    ml_dtypes = None


def outcome(fn):
    try:
        return fn()
    except Exception as e:
        return (type(e).__name__, str(e), getattr(e, "code", None), getattr(e, "offset", None))


CASES = {
    "plain": lambda: {"b": np.arange(6, dtype=np.float32).reshape(2, 3),
                      "a": np.arange(3, dtype=np.int64), "c": np.array(5, np.int16)},
    "big-endian and empty": lambda: {"b": np.arange(6, dtype=">f4"), "a": np.zeros(0, np.uint8)},
    "empty name": lambda: {"": np.arange(6, dtype=np.float32)},
    "strided": lambda: {"x": np.arange(6, dtype=np.float32)[::2]},
    "utf-8 names and bools": lambda: {"é": np.arange(6, dtype=np.float32),
                                      "e": np.ones((2, 2), bool)},
    "no utf-8": lambda: {"\udc80": np.arange(6, dtype=np.float32)},
    "rank 9": lambda: {"a": np.zeros((1,) * 9, np.float32)},
    "a list": lambda: {"a": [1, 2]},
    "int key": lambda: {1: np.zeros(2)},
    "unsorted": lambda: {"a%d" % (i * 7919 % 100): np.full(2, i, np.float16) for i in range(100)},
    "heap too big": lambda: {"t%05d" % i: np.zeros(0, np.float32) for i in range(20000)},
    "complex": lambda: {"a": np.zeros(3, np.complex64)},
    "datetime": lambda: {"a": np.zeros(3, "M8[s]")},
    "a Tensor among arrays": lambda: {"a": np.zeros(2, np.float32),
                                      "b": kiln.Tensor.from_numpy(np.ones(2, np.int8))},
    "empty dict": lambda: {},
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_like_the_pure_kernels(impl, case):
    value = CASES[case]()
    want = outcome(lambda: kiln.Encoder(kiln.tensors, kernels=_kernels_py).encode(value))
    assert outcome(lambda: impl.encode(value, kiln.tensors)) == want
    # the same again (the compiled kernels remember dtypes they have seen)
    assert outcome(lambda: impl.encode(value, kiln.tensors)) == want


@pytest.mark.skipif(ml_dtypes is None, reason="needs ml_dtypes")
def test_ml_dtypes(impl):
    value = {"a": np.zeros(3, ml_dtypes.bfloat16), "b": np.zeros(3, np.float64)}
    want = outcome(lambda: kiln.Encoder(kiln.tensors, kernels=_kernels_py).encode(value))
    assert outcome(lambda: impl.encode(value, kiln.tensors)) == want


def test_round_trip_inside_a_struct(impl):
    t = kiln.struct({"id": kiln.i64, "batch": kiln.tensors})
    arrays = {"tok": np.arange(512, dtype=np.int32), "emb": np.ones((4, 8), np.float16)}
    out = impl.decode(impl.encode({"id": 3, "batch": arrays}, t), t)
    assert out["id"] == 3
    for k, a in arrays.items():
        np.testing.assert_array_equal(out["batch"][k].numpy(), a)
