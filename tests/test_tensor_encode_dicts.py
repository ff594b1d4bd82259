"""Encoding {name: ndarray}: the compiled kernels describe plain arrays
themselves (no normalize_tensors); the bytes (read back by the reference
decoder) and every error must be the ones written out here, and what the pure
kernels give, for plain arrays and for everything that is not plain."""

import numpy as np
import pytest

import kiln
from kiln import _kernels_py
from _util import kiln_ref

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


# what each case must give, written out: the error (type, code, offset, words) ...
ERRORS = {
    "a list": ("EncodeError", "TYPE", 0, "($['a']): expected a numpy array, a kiln.Tensor, or "
               "an object with __dlpack__ or the buffer protocol, got list"),
    "complex": ("EncodeError", "TYPE", 0, "no Kiln tensor dtype for numpy dtype complex64"),
    "datetime": ("EncodeError", "TYPE", 0, "no Kiln tensor dtype for numpy dtype datetime64[s]"),
    "empty name": ("EncodeError", "TYPE", 0, "tensor 0: an empty name is not allowed"),
    "heap too big": ("EncodeError", "LIMIT", 0, "name heap of 120000 bytes does not fit u16 "
                     "offsets"),
    "int key": ("EncodeError", "TYPE", 0, "tensor mapping key 1 is not a str"),
    "no utf-8": ("EncodeError", "UTF8", 0, "tensor 0: name has no UTF-8 form"),
    "rank 9": ("EncodeError", "TYPE", 0, "rank 9 is above 8"),
}
# ... or the tensors the bytes hold: dtype codes of the numpy dtypes used here
CODES = {np.dtype(np.float64): 1, np.dtype(np.float32): 2, np.dtype(np.float16): 3,
         np.dtype(bool): 7, np.dtype(np.int8): 8, np.dtype(np.uint8): 9, np.dtype(np.int16): 10,
         np.dtype(np.int32): 12, np.dtype(np.int64): 14}


def expected_tensors(value):
    """(name, dtype code, shape, little-endian payload) per tensor, in the order the
    encoder must write them: by the names' UTF-8 bytes."""
    out = []
    for name, x in sorted(value.items(), key=lambda kv: kv[0].encode("utf-8")):
        if isinstance(x, kiln.Tensor):
            out.append((name, x.code, list(x.shape), bytes(x.data)))
        else:
            le = x.dtype.newbyteorder("<")
            out.append((name, CODES[x.dtype.newbyteorder("=")], list(x.shape),
                        np.ascontiguousarray(x).astype(le).tobytes()))
    return out


def check_against_expectations(case, got):
    if case in ERRORS:
        kind, code, offset, words = ERRORS[case]
        assert isinstance(got, tuple) and got[0] == kind and (got[2], got[3]) == (code, offset)
        assert got[1].endswith(words), got[1]
        return
    assert isinstance(got, bytes), got
    tensors, end = kiln_ref.read_directory(got, 0)      # the reference's checks, and values
    assert end == len(got)
    assert [(t["name"], t["dtype"], t["shape"], t["payload"]) for t in tensors] == \
        expected_tensors(CASES[case]())


@pytest.mark.parametrize("case", sorted(CASES))
def test_like_the_pure_kernels(impl, case):
    value = CASES[case]()
    got = outcome(lambda: impl.encode(value, kiln.tensors))
    check_against_expectations(case, got)
    # the same again (the compiled kernels remember dtypes they have seen)
    assert outcome(lambda: impl.encode(value, kiln.tensors)) == got
    # and the same as the pure kernels, words included (added to the above, not instead)
    assert got == outcome(lambda: kiln.Encoder(kiln.tensors, kernels=_kernels_py).encode(value))


@pytest.mark.skipif(ml_dtypes is None, reason="needs ml_dtypes (the kiln[ml] extra), not installed")
def test_ml_dtypes(impl):
    value = {"a": np.zeros(3, ml_dtypes.bfloat16), "b": np.zeros(3, np.float64)}
    got = outcome(lambda: impl.encode(value, kiln.tensors))
    tensors, _ = kiln_ref.read_directory(got, 0)
    assert [(t["name"], t["dtype_name"], t["shape"], t["payload"]) for t in tensors] == \
        [("a", "bf16", [3], bytes(6)), ("b", "f64", [3], bytes(24))]
    assert got == outcome(lambda: kiln.Encoder(kiln.tensors, kernels=_kernels_py).encode(value))


def test_round_trip_inside_a_struct(impl):
    t = kiln.struct({"id": kiln.i64, "batch": kiln.tensors})
    arrays = {"tok": np.arange(512, dtype=np.int32), "emb": np.ones((4, 8), np.float16)}
    out = impl.decode(impl.encode({"id": 3, "batch": arrays}, t), t)
    assert out["id"] == 3
    for k, a in arrays.items():
        np.testing.assert_array_equal(out["batch"][k].numpy(), a)
