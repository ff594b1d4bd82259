"""Property tests of the converters (bounded: a few dozen examples each).

* Mutated source files (a valid file with bytes flipped, cut or inserted)
  only ever raise KilnError, and whatever kiln writes passes every check
  (the fuzzing oracle, fuzz/oracle.py, with its memory bound).
* Valid files written by the formats' own writers (safetensors.numpy,
  numpy.savez) convert bit for bit: the oracle is the arrays written."""

import io
import os
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import kiln
from kiln.convert import convert

from _util import ROOT

sys.path.insert(0, os.path.join(ROOT, "fuzz"))
import oracle  # noqa: E402

SETTINGS = settings(max_examples=40, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])
CORPUS = os.path.join(ROOT, "fuzz", "corpus")
DTYPES = [np.float32, np.float64, np.float16, np.int8, np.uint16, np.int64, np.bool_]


def _seeds(kind):
    out = []
    for name in sorted(os.listdir(os.path.join(CORPUS, kind))):
        if name.startswith("seed-valid"):
            with open(os.path.join(CORPUS, kind, name), "rb") as f:
                out.append(f.read())
    return out


@st.composite
def mutated(draw, kind):
    data = bytearray(draw(st.sampled_from(_seeds(kind))))
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "cut", "insert", "set"]))
        at = draw(st.integers(0, max(len(data) - 1, 0)))
        if op == "flip" and data:
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif op == "set" and data:
            data[at] = draw(st.sampled_from([0, 1, 2, 0x7F, 0x80, 0xFF]))
        elif op == "cut":
            del data[at:at + draw(st.integers(1, 16))]
        else:
            data[at:at] = draw(st.binary(min_size=1, max_size=8))
    return bytes(data)


@pytest.mark.parametrize("kind", oracle.CONVERT_KINDS)
def test_mutated_sources_raise_only_kiln_errors(kind):
    @SETTINGS
    @given(mutated(kind))
    def run(data):
        oracle.check_convert_input(kind, data)
    run()


@st.composite
def arrays(draw):
    out = {}
    for i in range(draw(st.integers(0, 4))):
        dt = np.dtype(draw(st.sampled_from(DTYPES)))
        shape = tuple(draw(st.lists(st.integers(0, 5), max_size=3)))
        n = int(np.prod(shape)) if shape else 1
        raw = draw(st.binary(min_size=n * dt.itemsize, max_size=n * dt.itemsize))
        a = np.frombuffer(raw, np.uint8).copy()
        if dt == np.bool_:
            a &= 1
        out["t%d" % i] = a.view(dt).reshape(shape)
    return out


@SETTINGS
@given(arrays())
def test_safetensors_files_convert_bit_for_bit(tmp_path_factory, arrs):
    stnp = pytest.importorskip("safetensors.numpy")
    folder = tmp_path_factory.mktemp("st")
    src, dst = folder / "a.safetensors", folder / "a.kiln"
    stnp.save_file(arrs, str(src))
    assert convert(str(src), str(dst)) == len(arrs)
    got = kiln.load_tensors(dst)
    assert sorted(got.keys()) == sorted(arrs)
    for k, a in arrs.items():
        assert got[k].shape == a.shape and bytes(got[k].data) == a.tobytes()


@SETTINGS
@given(arrays(), st.booleans(), st.booleans(), st.booleans())
def test_npz_files_convert_bit_for_bit(tmp_path_factory, arrs, compressed, fortran, swap):
    folder = tmp_path_factory.mktemp("npz")
    src, dst = folder / "a.npz", folder / "a.kiln"
    saved = {}
    for k, a in arrs.items():
        if fortran:
            a = np.asfortranarray(a)
        if swap:
            a = a.astype(a.dtype.newbyteorder(">"))
        saved[k] = a
    buf = io.BytesIO()
    (np.savez_compressed if compressed else np.savez)(buf, **saved)
    src.write_bytes(buf.getvalue())
    assert convert(str(src), str(dst)) == len(arrs)
    got = kiln.load_tensors(dst)
    for k, a in saved.items():   # (asfortranarray makes a 0-d array 1-d)
        want = np.ascontiguousarray(a.astype(a.dtype.newbyteorder("<")))
        assert got[k].shape == a.shape and bytes(got[k].data) == want.tobytes()
