"""A 4-bit tensor (i4, u4, e2m1) never becomes a packed uint8 array from
``numpy()`` (issue 32): with ml_dtypes its values come back unpacked, one
element per byte, in ml_dtypes' int4 / uint4 / float4_e2m1fn (a new array);
without ml_dtypes ``numpy()`` raises the ImportError bf16 raises.  The packed
bytes come only from ``bits()``.  Expected values are written out by hand.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import kiln

from _util import ROOT

# (dtype, packed payload, shape, the values, as Python numbers)
CASES = [
    ("u4", bytes([0x21, 0x03]), (3,), [1, 2, 3]),
    ("u4", bytes([0xF0, 0x87]), (2, 2), [[0, 15], [7, 8]]),
    ("i4", bytes([0xF7, 0x08]), (3,), [7, -1, -8]),
    ("i4", bytes([0x10, 0xFE]), (2, 2), [[0, 1], [-2, -1]]),
    # e2m1 codes: 0x1 0.5, 0x7 6.0, 0xF -6.0, 0x8 -0.0, 0x2 1.0
    ("e2m1", bytes([0x71, 0x8F, 0x02]), (5,), [0.5, 6.0, -6.0, -0.0, 1.0]),
    ("u4", b"", (0, 3), []),
]
ML_NAME = {"i4": "int4", "u4": "uint4", "e2m1": "float4_e2m1fn"}


def _tensors(impl):
    """Each case as a hand-made tensor and as a decoded one (impl's kernel)."""
    hand = [kiln.Tensor(p, dtype=dt, shape=s, name="t%d" % i)
            for i, (dt, p, s, _) in enumerate(CASES)]
    d = impl.decode_tensors(impl.encode_tensors(hand))
    return hand, d


@pytest.mark.parametrize("made", ["hand", "decoded", "to_dict"])
def test_numpy_of_a_4bit_tensor_is_its_values_in_ml_dtypes(impl, made):
    ml = pytest.importorskip("ml_dtypes")
    hand, d = _tensors(impl)
    arrays = [t.numpy() for t in hand] if made == "hand" else \
        [t.numpy() for t in d.values()] if made == "decoded" else list(d.to_dict().values())
    for (dt, payload, shape, want), t, a in zip(CASES, hand, arrays):
        assert a.dtype == np.dtype(getattr(ml, ML_NAME[dt])), dt
        assert a.shape == shape
        got = a.astype(np.float32 if dt == "e2m1" else np.int16).tolist()
        assert got == want, (dt, got)
        if dt == "e2m1":   # -0.0 keeps its sign
            assert np.signbit(a.astype(np.float32)).reshape(-1).tolist() == \
                [False, False, True, True, False]
        # a new array: writing to it leaves the payload alone
        assert a.flags.writeable and a.flags.c_contiguous
        if a.size:
            a.reshape(-1)[0] = a.reshape(-1)[1]
        assert bytes(t.data) == payload


def test_bits_of_a_4bit_tensor_is_the_packed_bytes(impl):
    hand, d = _tensors(impl)
    for (dt, payload, shape, _), t in zip(CASES, d.values()):
        b = t.bits()
        assert b.dtype == np.uint8 and b.shape == (len(payload),) and b.tobytes() == payload
        assert not b.flags.writeable or not payload   # a view, as for every other dtype


def test_numpy_dtype_of_the_4bit_codes_is_ml_dtypes(impl):
    ml = pytest.importorskip("ml_dtypes")
    for name, ml_name in ML_NAME.items():
        assert kiln.numpy_dtype(name) == np.dtype(getattr(ml, ml_name))
    hand, d = _tensors(impl)
    assert d[0].numpy().dtype == kiln.numpy_dtype(d[0].code)


def test_an_ml_dtypes_4bit_array_packs_into_a_tensor(impl):
    ml = pytest.importorskip("ml_dtypes")
    a = np.array([[7, -1, -8]], ml.int4)
    t = kiln.Tensor.from_numpy(a, name="q")
    assert t.dtype == "i4" and t.shape == (1, 3) and bytes(t.data) == bytes([0xF7, 0x08])
    u = kiln.Tensor.from_numpy(np.array([0.5, 6.0], ml.float4_e2m1fn))
    assert u.dtype == "e2m1" and bytes(u.data) == bytes([0x71])
    d = impl.decode_tensors(impl.encode_tensors({"q": a}))
    assert bytes(d["q"].data) == bytes([0xF7, 0x08])
    assert d["q"].numpy().astype(np.int8).tolist() == [[7, -1, -8]]


def test_asarray_without_a_copy_is_refused_for_a_4bit_tensor(impl):
    pytest.importorskip("ml_dtypes")
    hand, d = _tensors(impl)
    with pytest.raises(ValueError, match="bits"):
        d[0].__array__(copy=False)
    assert np.asarray(d[0]).astype(np.int16).tolist() == [1, 2, 3]


def test_without_ml_dtypes_numpy_of_a_4bit_tensor_raises_as_bf16_does(impl):
    # a child with "import ml_dtypes" failing, on impl's kernel (given explicitly)
    env = dict(os.environ, PYTHONPATH=ROOT, KILN_PUREPYTHON="1" if impl.name == "python" else "0")
    code = r"""
import sys, json
sys.modules["ml_dtypes"] = None
import kiln
hand = [kiln.Tensor(bytes([0x21, 0x03]), dtype=dt, shape=(3,), name=dt)
        for dt in ("i4", "u4", "e2m1")]
d = kiln.decode_tensors(kiln.encode_tensors(hand))
bf = kiln.Tensor(b"\x80\x3f", dtype="bf16", shape=(1,))
out = {"impl": kiln.IMPLEMENTATION, "refused": [], "bits": []}
calls = [("bf16", bf.numpy)] + [(t.name, t.numpy) for t in hand] + \
    [("decoded " + t.name, t.numpy) for t in d.values()] + [("dict", d.to_dict),
    ("code", lambda: kiln.numpy_dtype("u4"))]
for what, call in calls:
    try:
        call()
        out["refused"].append([what, None])
    except ImportError as e:
        m = str(e)
        out["refused"].append([what, "pip install 'kiln-wire[ml]'" in m and "Tensor.bits()" in m])
out["bits"] = [t.bits().tobytes().hex() for t in d.values()]
print(json.dumps(out))
"""
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["impl"] == impl.name
    assert out["refused"] == [[w, True] for w in ("bf16", "i4", "u4", "e2m1", "decoded i4",
                                                  "decoded u4", "decoded e2m1", "dict", "code")]
    assert out["bits"] == ["2103"] * 3
