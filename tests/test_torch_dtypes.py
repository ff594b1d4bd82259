"""Every torch dtype with a Kiln twin reaches torch (issue 60 items 2 and 3):
DLPack 1.1's float8 and float4 type codes, bf16 and float8 over DLPack with
no ml_dtypes, and torch's ``float4_e2m1fn_x2`` as Kiln's ``e2m1`` both ways,
with the nibble order checked against torch's own packing.

The expected bytes are written by hand (the OCP MX FP4 table below) or made
by torch; never by kiln.  Both kernels (``impl``); the no-ml_dtypes cases run
in a child where ``import ml_dtypes`` fails.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import kiln
import kiln.torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# E2M1 (OCP MX v1.0, 5.3.3): code -> value; 8..15 are the negatives of 0..7
FP4 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
FP4 = FP4 + [-v for v in FP4]

# (torch dtype name, Kiln dtype, the values, their little-endian bits by hand)
HAND = [
    ("bfloat16", "bf16", [1.0, -2.0, 0.5], b"\x80\x3f\x00\xc0\x00\x3f"),
    ("float8_e4m3fn", "f8e4m3", [1.0, -2.0, 0.5], b"\x38\xc0\x30"),
    ("float8_e5m2", "f8e5m2", [1.0, -2.0, 0.5], b"\x3c\xc0\x38"),
    ("float8_e8m0fnu", "e8m0", [1.0, 2.0, 0.5], b"\x7f\x80\x7e"),
]


@pytest.fixture
def torch():
    return pytest.importorskip("torch", reason="torch is not installed (pip install torch)")


def _decoded(impl, tensors):
    """The tensors as a decoded directory gives them (the bound kernel's part)."""
    return impl.decode_tensors(bytes(impl.encode_tensors(tensors)))


@pytest.mark.parametrize("tname,kname,values,raw", HAND, ids=[h[1] for h in HAND])
def test_float8_and_bf16_reach_torch_through_dlpack(impl, torch, tname, kname, values, raw):
    d = _decoded(impl, [kiln.Tensor(raw, dtype=kname, shape=(3,), name="x")])
    x = torch.from_dlpack(d["x"])
    assert x.dtype == getattr(torch, tname)
    assert x.float().tolist() == values
    # and back: a torch tensor of that dtype is the same bytes in kiln
    assert kiln.Tensor.from_numpy(x).data.tobytes() == raw


def test_dlpack_capsule_says_1_1_for_a_float8_code(impl, torch):
    from kiln._tensors import dlpack as D
    t = _decoded(impl, [kiln.Tensor(b"\x38", dtype="f8e4m3", shape=(1,), name="x")])["x"]
    cap = t.__dlpack__(max_version=(1, 1))
    m = D._ManagedVersioned.from_address(D._PyCapsule_GetPointer(cap, D._NAME_VERSIONED))
    got = (m.version.major, m.version.minor, m.dl_tensor.dtype.code, m.dl_tensor.dtype.bits,
           m.dl_tensor.dtype.lanes)
    # kDLFloat8_e4m3fn is 10 in DLPack 1.1's dlpack.h; torch's own capsule says the same
    own = torch.tensor([1.0]).to(torch.float8_e4m3fn).__dlpack__(max_version=(1, 1))
    o = D._ManagedVersioned.from_address(D._PyCapsule_GetPointer(own, D._NAME_VERSIONED))
    del m, o
    assert got == (1, 1, 10, 8, 1)
    del cap, own


def test_without_ml_dtypes_every_float_kind_reaches_torch(impl, torch, tmp_path):
    env = dict(os.environ, PYTHONPATH=ROOT, KILN_PUREPYTHON="1" if impl.name == "python" else "0")
    code = r"""
import sys, json
sys.modules["ml_dtypes"] = None
import torch, kiln, kiln.torch
hand = %r
d = kiln.decode_tensors(kiln.encode_tensors(
    [kiln.Tensor(bytes.fromhex(raw), dtype=k, shape=(3,), name=k) for _, k, _, raw in hand]
    + [kiln.Tensor(bytes([0x21, 0xf3]), dtype="e2m1", shape=(1, 4), name="e2m1")]))
out = {"impl": kiln.IMPLEMENTATION, "got": {}}
for name, t in d.items():
    x = torch.from_dlpack(t)
    out["got"][name] = [str(x.dtype), list(x.shape), x.contiguous().view(torch.uint8).flatten().tolist()]
out["loaded"] = {k: [str(v.dtype), v.view(torch.uint8).tolist()] for k, v in kiln.torch.load_file(sys.argv[1]).items()}
print(json.dumps(out))
""" % ([(t, k, v, r.hex()) for t, k, v, r in HAND],)
    path = str(tmp_path / "w.kiln")
    kiln.torch.save_file({"w": torch.tensor([1.0, -2.0]).to(torch.bfloat16)}, path)
    r = subprocess.run([sys.executable, "-c", code, path], env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["impl"] == impl.name
    for tname, kname, _, raw in HAND:
        assert out["got"][kname] == ["torch." + tname, [3], list(raw)]
    assert out["got"]["e2m1"] == ["torch.float4_e2m1fn_x2", [1, 2], [0x21, 0xF3]]
    assert out["loaded"] == {"w": ["torch.bfloat16", [0x80, 0x3F, 0x00, 0xC0]]}


# --- item 3: float4_e2m1fn_x2 <-> e2m1 ------------------------------------------------

_TORCH_FP4 = ("_n_ones", "_f32_to_floatx_unpacked", "down_size", "pack_uint4",
              "_bfloat16_to_float4_e2m1fn_x2", "EBITS_F32", "MBITS_F32", "F32_EXP_BIAS",
              "FP4_EBITS", "FP4_MBITS")


def _torch_fp4(torch, values):
    """torch's own packing of ``values`` as float4_e2m1fn_x2: the functions of
    torch.testing._internal.common_quantized that torch's float4 tests use
    (which define the nibble order its kernels read), run from torch's source
    (that module imports expecttest, a test-only package, so its functions
    are taken out of it by name rather than imported)."""
    import ast
    src_path = os.path.join(os.path.dirname(torch.__file__), "testing", "_internal",
                            "common_quantized.py")
    with open(src_path) as fh:
        tree = ast.parse(fh.read())
    keep = [n for n in tree.body if
            (isinstance(n, ast.FunctionDef) and n.name in _TORCH_FP4) or
            (isinstance(n, ast.Assign) and all(isinstance(t, (ast.Name, ast.Tuple)) for t in
                                                n.targets) and
             {x.id for t in n.targets for x in ast.walk(t) if isinstance(x, ast.Name)}
             <= set(_TORCH_FP4))]
    ns = {"torch": torch, "Tensor": torch.Tensor}
    exec(compile(ast.Module(body=keep, type_ignores=[]), src_path, "exec"), ns)
    return ns["_bfloat16_to_float4_e2m1fn_x2"](torch.tensor(values, dtype=torch.bfloat16))


VALUES = [[0.5, -6.0, 1.5, 0.0], [3.0, -0.5, 4.0, 2.0]]


def test_torch_float4_is_kiln_e2m1_with_the_same_nibble_order(impl, torch):
    x = _torch_fp4(torch, VALUES)
    assert x.dtype == torch.float4_e2m1fn_x2 and tuple(x.shape) == (2, 2)
    t = kiln.Tensor.from_numpy(x, name="x")
    assert t.dtype == "e2m1" and t.shape == (2, 4)      # elements, not bytes
    got = _decoded(impl, [t])["x"]
    codes = kiln.unpack_nibbles(got.bits(), 8).tolist()  # low nibble first
    assert [FP4[c] for c in codes] == [v for row in VALUES for v in row]
    # and back: kiln's e2m1 bytes, packed by hand from the table, are torch's
    hand = bytes(FP4.index(a) | FP4.index(b) << 4
                 for row in VALUES for a, b in zip(row[::2], row[1::2]))
    y = torch.from_dlpack(_decoded(impl, [kiln.Tensor(hand, dtype="e2m1", shape=(2, 4),
                                                        name="h")])["h"])
    assert y.dtype == torch.float4_e2m1fn_x2 and tuple(y.shape) == (2, 2)
    assert torch.equal(y.view(torch.uint8), x.view(torch.uint8))


def test_float4_through_save_file_and_load_file(api, torch, tmp_path):
    x = _torch_fp4(torch, VALUES)
    path = str(tmp_path / "fp4.kiln")
    kiln.torch.save_file({"x": x, "f": torch.ones(2)}, path)
    with kiln.open(path) as f:
        assert f["x"].dtype == "e2m1" and f["x"].shape == (2, 4)
    back = kiln.torch.load_file(path)
    assert back["x"].dtype == torch.float4_e2m1fn_x2 and tuple(back["x"].shape) == (2, 2)
    assert torch.equal(back["x"].view(torch.uint8), x.view(torch.uint8))


def test_float4_edges_are_refused_with_reasons(api, torch, tmp_path):
    x = _torch_fp4(torch, [0.5, 1.0])[0]
    with pytest.raises(kiln.EncodeError, match="0-d float4_e2m1fn_x2"):
        kiln.torch.save_file({"x": x}, str(tmp_path / "a.kiln"))
    odd = kiln.Tensor(b"\x21\x03", dtype="e2m1", shape=(3,), name="odd")
    with pytest.raises(BufferError, match="even length"):
        odd.__dlpack__(max_version=(1, 1))
    path = str(tmp_path / "odd.kiln")
    kiln.save_tensors(path, [odd])
    with pytest.raises(kiln.KilnError, match="odd.kiln.*even length"):
        kiln.torch.load_file(path)


def test_float4_through_load_model(api, torch, tmp_path):
    x = _torch_fp4(torch, VALUES)
    path = str(tmp_path / "fp4.kiln")
    kiln.torch.save_file({"q": x}, path)
    m = torch.nn.Module()
    m.register_buffer("q", torch.zeros(2, 2, dtype=torch.uint8).view(torch.float4_e2m1fn_x2))
    kiln.torch.load_model(m, path)
    assert torch.equal(m.q.view(torch.uint8), x.view(torch.uint8))
    wrong = torch.nn.Module()
    wrong.register_buffer("q", torch.zeros(2, 4, dtype=torch.uint8).view(torch.float4_e2m1fn_x2))
    with pytest.raises(kiln.torch.LoadError, match=r"shape \[2, 2\] from checkpoint"):
        kiln.torch.load_model(wrong, path)


def _layouts(torch):
    """(label, tensor, its values in C order as a flat list, written by hand):
    layouts torch calls contiguous whatever the stride of a size-1 or empty
    axis, views with an offset, one element with any stride, 0-d."""
    a = torch.tensor([0.0, 1.0, 2.0])
    return [
        ("column of a transposed row", a.reshape(1, 3).t(), [0.0, 1.0, 2.0]),
        ("empty, transposed", torch.empty(0, 3).t(), []),
        ("offset view", torch.arange(8.0)[3:6], [3.0, 4.0, 5.0]),
        ("one element, stride 3", torch.arange(9.0).reshape(3, 3)[1:2, 2:3], [5.0]),
        ("0-d", torch.tensor(7.0), [7.0]),
        ("size-1 middle axis", torch.arange(6.0).reshape(2, 1, 3).transpose(0, 1)
         .transpose(0, 1), [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]),
    ]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32", "int16", "uint16",
                                   "float8_e4m3fn"])
def test_every_contiguous_layout_saves_its_values_in_c_order(api, torch, tmp_path, dtype):
    """kiln.torch.save_file reads a tensor's bytes straight from it (x.numpy()
    where numpy has the dtype, a byte view otherwise): each layout gives the
    file its values in C order, compared with the values written by hand."""
    import kiln.torch as kt
    dt = getattr(torch, dtype)
    sd = {}
    want = {}
    for i, (label, x, values) in enumerate(_layouts(torch)):
        sd["t%d" % i] = x.to(dt) if x.dtype != dt else x
        if sd["t%d" % i].shape != x.shape or sd["t%d" % i].stride() != x.stride():
            sd["t%d" % i] = torch.empty_strided(x.shape, x.stride(), dtype=dt).copy_(x)
        want["t%d" % i] = (label, tuple(x.shape), values)
    kt.save_file(sd, tmp_path / "l.kiln")
    got = kt.load_file(tmp_path / "l.kiln")
    for k, (label, shape, values) in want.items():
        assert (tuple(got[k].shape), got[k].dtype) == (shape, dt), label
        assert got[k].reshape(-1).float().tolist() == values, label
