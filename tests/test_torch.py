"""torch state dicts: torch tensors of every dtype with a Kiln twin saved by
their raw bytes (issue 39 item 1), writes through torch.from_dlpack landing in
private pages (item 2), and kiln.torch (item 3).

Needs torch (not in any extra; pip install torch): those tests skip naming it
where it is absent.  The expected bytes are written by hand or made by numpy,
never by kiln.
"""

import os
import struct
import subprocess
import sys

import numpy as np
import pytest

import kiln

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def torch():
    return pytest.importorskip("torch", reason="torch is not installed (pip install torch); "
                                               "kiln's torch support is tested where it is")


def _payload(path, name):
    with kiln.open(path) as f:
        t = f[name]
        return t.dtype, tuple(t.shape), bytes(t.data)


# --- item 1: torch tensors of every dtype with a Kiln twin ---------------------------

def _cases(torch):
    # (torch dtype, Kiln dtype, values, the little-endian bytes, by hand or by numpy)
    out = [
        (torch.bfloat16, "bf16", [1.0, -2.0, 0.5], b"\x80\x3f\x00\xc0\x00\x3f"),
        (torch.float8_e4m3fn, "f8e4m3", [1.0, -2.0, 0.5], b"\x38\xc0\x30"),
        (torch.float8_e5m2, "f8e5m2", [1.0, -2.0, 0.5], b"\x3c\xc0\x38"),
        (torch.bool, "bool", [True, False, True], b"\x01\x00\x01"),
    ]
    if hasattr(torch, "float8_e8m0fnu"):
        out.append((torch.float8_e8m0fnu, "e8m0", [1.0, 2.0, 0.5], b"\x7f\x80\x7e"))
    for tname, kname, np_dt in [("float64", "f64", "<f8"), ("float32", "f32", "<f4"),
                                ("float16", "f16", "<f2"), ("int8", "i8", "i1"),
                                ("uint8", "u8", "u1"), ("int16", "i16", "<i2"),
                                ("uint16", "u16", "<u2"), ("int32", "i32", "<i4"),
                                ("uint32", "u32", "<u4"), ("int64", "i64", "<i8"),
                                ("uint64", "u64", "<u8")]:
        if hasattr(torch, tname):
            out.append((getattr(torch, tname), kname, [1, 2, 3],
                        np.array([1, 2, 3], np_dt).tobytes()))
    return out


def test_save_tensors_takes_every_torch_dtype_with_a_kiln_twin(api, torch, tmp_path):
    cases = _cases(torch)
    sd = {"t%02d" % i: torch.tensor(vals).to(dt) for i, (dt, _, vals, _) in enumerate(cases)}
    sd["layer.weight"] = torch.ones(2, 2, dtype=torch.bfloat16)   # the issue's own case
    kiln.save_tensors(tmp_path / "x.kiln", sd)
    for i, (dt, kname, _, raw) in enumerate(cases):
        assert _payload(tmp_path / "x.kiln", "t%02d" % i) == (kname, (3,), raw), dt
    assert _payload(tmp_path / "x.kiln", "layer.weight") == ("bf16", (2, 2), b"\x80\x3f" * 4)


def test_torch_tensors_of_any_shape_layout_and_grad(api, torch, tmp_path):
    sd = {"scalar": torch.tensor(2.0),
          "empty": torch.zeros(0, 3, dtype=torch.bfloat16),
          "transposed": torch.arange(6, dtype=torch.int16).reshape(2, 3).t(),   # copied once
          "param": torch.nn.Parameter(torch.tensor([1.0, 2.0])),                # requires_grad
          "sliced": torch.arange(10, dtype=torch.int32)[2:5]}
    kiln.save_tensors(tmp_path / "x.kiln", sd)
    p = tmp_path / "x.kiln"
    assert _payload(p, "scalar") == ("f32", (), struct.pack("<f", 2.0))
    assert _payload(p, "empty") == ("bf16", (0, 3), b"")
    assert _payload(p, "transposed") == ("i16", (3, 2), struct.pack("<6h", 0, 3, 1, 4, 2, 5))
    assert _payload(p, "param") == ("f32", (2,), struct.pack("<2f", 1.0, 2.0))
    assert _payload(p, "sliced") == ("i32", (3,), struct.pack("<3i", 2, 3, 4))
    t = kiln.Tensor.from_numpy(torch.tensor([1.0], dtype=torch.bfloat16), name="w")
    assert (t.dtype, bytes(t.data)) == ("bf16", b"\x80\x3f")


def _refused(torch):
    import warnings
    out = [("complex64", torch.ones(2, dtype=torch.complex64), "complex64"),
           ("sparse", torch.ones(2).to_sparse(), "dense"),
           ("meta", torch.ones(2, device="meta"), "on the meta device holds no values")]
    if hasattr(torch, "float8_e4m3fnuz"):
        out.append(("fnuz", torch.ones(2).to(torch.float8_e4m3fnuz), "float8_e4m3fnuz"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # complex32 is experimental, quantized deprecated
        out.append(("complex32", torch.ones(2, dtype=torch.complex64).to(torch.complex32),
                    "complex32"))
        out.append(("quantized", torch.quantize_per_tensor(torch.ones(2), 0.1, 0, torch.qint8),
                    "quantized"))
    return out


def test_a_torch_tensor_kiln_cannot_store_is_a_kiln_error_naming_it(api, torch, tmp_path):
    for what, x, says in _refused(torch):
        name = "block.%s.weight" % what
        with pytest.raises(kiln.KilnError) as e:
            kiln.save_tensors(tmp_path / "x.kiln", {"ok": torch.ones(1), name: x})
        assert e.value.code == "TYPE" and name in str(e.value) and says in str(e.value), what
        assert not (tmp_path / "x.kiln").exists()


def test_a_dlpack_export_numpy_cannot_read_is_a_kiln_error_naming_it(api, tmp_path):
    # numpy says "Unsupported dtype in DLTensor." for a DLPack complex32 (or a
    # bf16 without ml_dtypes); kiln reports it as an EncodeError naming the tensor
    class Producer:
        def __dlpack__(self, **kw):
            raise BufferError("no export today")

        def __dlpack_device__(self):
            return (1, 0)

    with pytest.raises(kiln.EncodeError) as e:
        kiln.save_tensors(tmp_path / "x.kiln", {"odd.one": Producer()})
    assert "odd.one" in str(e.value) and "no export today" in str(e.value)


# --- item 2: a write through torch.from_dlpack lands in private pages ----------------

WRITE = r"""
import sys
import torch, kiln, kiln.torch
path = sys.argv[1]
x = torch.from_dlpack(kiln.open(path)["w"])
x.add_(1)
y = kiln.torch.load_file(path)["w"]
y.mul_(3)
print(kiln.IMPLEMENTATION, x.tolist(), y.tolist(), kiln.open(path)["w"].numpy().tolist())
"""


def test_writing_through_torch_from_dlpack_never_crashes_nor_changes_the_file(impl, torch,
                                                                              tmp_path):
    path = tmp_path / "small.kiln"
    kiln.save_tensors(path, {"w": np.arange(4, dtype=np.float32)})
    before = path.read_bytes()
    env = dict(os.environ, PYTHONPATH=ROOT, KILN_PUREPYTHON="1" if impl.name == "python" else "0")
    p = subprocess.Popen([sys.executable, "-c", WRITE, str(path)], env=env, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = p.communicate(timeout=300)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 0, "the writer died (%s): %s" % (p.returncode, err[-2000:])
    assert out.split(" ", 1) == [impl.name, "[1.0, 2.0, 3.0, 4.0] [0.0, 3.0, 6.0, 9.0] "
                                            "[0.0, 1.0, 2.0, 3.0]\n"]
    assert path.read_bytes() == before


# --- item 3: kiln.torch ----------------------------------------------------------------

def test_import_kiln_torch_does_not_import_torch():
    code = "import sys, kiln, kiln.torch; kiln.torch.save_file; print('torch' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120, env=dict(os.environ, PYTHONPATH=ROOT))
    assert r.stdout.strip() == "False", r.stderr


def test_kiln_torch_without_torch_says_so():
    code = ("import sys; sys.modules['torch'] = None\n"   # import torch fails, as uninstalled
            "import kiln.torch\n"
            "try:\n    kiln.torch.load_file('x.kiln')\n"
            "except ImportError as e:\n    print(e)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120, env=dict(os.environ, PYTHONPATH=ROOT))
    assert "kiln.torch needs PyTorch" in r.stdout, r.stdout + r.stderr


def test_save_file_and_load_file_round_trip_bit_exact(api, torch, tmp_path):
    import kiln.torch as kt
    cases = _cases(torch)
    sd = {"t%02d" % i: torch.tensor(vals).to(dt) for i, (dt, _, vals, _) in enumerate(cases)}
    kt.save_file(sd, tmp_path / "m.kiln", metadata={"step": 3, "cfg": {"lr": 0.1}})
    for i, (dt, kname, _, raw) in enumerate(cases):
        assert _payload(tmp_path / "m.kiln", "t%02d" % i) == (kname, (3,), raw)
    assert kiln.load_metadata(tmp_path / "m.kiln") == {"step": 3, "cfg": {"lr": 0.1}}
    back = kt.load_file(tmp_path / "m.kiln")
    assert list(back) == sorted(sd)
    for k, x in sd.items():
        y = back[k]
        assert y.dtype == x.dtype and y.shape == x.shape and y.device.type == "cpu"
        assert y.view(torch.uint8).tolist() == x.view(torch.uint8).tolist()
    on_meta = kt.load_file(tmp_path / "m.kiln", device="meta")
    assert {v.device.type for v in on_meta.values()} == {"meta"}


def test_load_file_views_the_mapping_without_a_copy(api, torch, tmp_path):
    import kiln.torch as kt
    a = torch.full((1000,), 7, dtype=torch.int32)
    b = torch.full((3000,), 9, dtype=torch.int16)
    kt.save_file({"a": a, "b": b}, tmp_path / "m.kiln")
    raw = (tmp_path / "m.kiln").read_bytes()
    off_a, off_b = raw.find(a.numpy().tobytes()), raw.find(b.numpy().tobytes())
    assert 0 < off_a < off_b
    sd = kt.load_file(tmp_path / "m.kiln")
    # both point into one mapping of the file, as far apart as in the file
    assert sd["b"].data_ptr() - sd["a"].data_ptr() == off_b - off_a
    # (a write into them: in a child process, test_writing_through_torch_from_dlpack_...)


def test_tied_weights_are_saved_once_and_come_back_shared(api, torch, tmp_path):
    import kiln.torch as kt
    m = torch.nn.Sequential(torch.nn.Embedding(8, 4), torch.nn.Linear(4, 8, bias=False))
    m[1].weight = m[0].weight
    kt.save_file(m.state_dict(), tmp_path / "m.kiln")
    with kiln.open(tmp_path / "m.kiln") as f:
        assert f.keys() == ["0.weight"]   # stored once
        assert f.metadata == {"__kiln_torch_aliases__": {"1.weight": "0.weight"}}
    sd = kt.load_file(tmp_path / "m.kiln")
    assert sd["1.weight"] is sd["0.weight"]
    m2 = torch.nn.Sequential(torch.nn.Embedding(8, 4), torch.nn.Linear(4, 8, bias=False))
    m2[1].weight = m2[0].weight
    assert kt.load_model(m2, tmp_path / "m.kiln") == ([], [])
    assert torch.equal(m2[0].weight, m[0].weight) and m2[1].weight is m2[0].weight
    untied = torch.nn.Sequential(torch.nn.Embedding(8, 4), torch.nn.Linear(4, 8, bias=False))
    kt.load_model(untied, tmp_path / "m.kiln")   # both names filled from the one tensor
    assert torch.equal(untied[1].weight, m[0].weight) and torch.equal(untied[0].weight, m[0].weight)


def test_tensors_that_partly_overlap_are_refused_naming_both(api, torch, tmp_path):
    import kiln.torch as kt
    base = torch.arange(10.0)
    with pytest.raises(kiln.EncodeError) as e:
        kt.save_file({"whole": base, "part": base[2:5]}, tmp_path / "m.kiln")
    assert "'part'" in str(e.value) and "'whole'" in str(e.value)
    kt.save_file({"lo": base[:5], "hi": base[5:]}, tmp_path / "m.kiln")   # disjoint: both stored
    assert kt.load_file(tmp_path / "m.kiln")["hi"].tolist() == [5.0, 6.0, 7.0, 8.0, 9.0]
    with pytest.raises(kiln.EncodeError, match="reserved"):
        kt.save_file({"w": base}, tmp_path / "m.kiln",
                     metadata={"__kiln_torch_aliases__": {}})


def _net(torch, out=3, bias=True, dtype=None):
    torch.manual_seed(out)
    m = torch.nn.Sequential(torch.nn.Linear(4, out, bias=bias), torch.nn.LayerNorm(out))
    return m.to(dtype) if dtype is not None else m


def test_load_model_fills_the_parameters_in_place(api, torch, tmp_path):
    import kiln.torch as kt
    src = _net(torch, dtype=torch.bfloat16)
    kt.save_file(src.state_dict(), tmp_path / "m.kiln")
    dst = _net(torch, out=3, dtype=torch.bfloat16)
    torch.nn.init.zeros_(dst[0].weight)
    ptrs = {k: v.data_ptr() for k, v in dst.state_dict().items()}
    assert kt.load_model(dst, tmp_path / "m.kiln") == kt.IncompatibleKeys([], [])
    for k, v in dst.state_dict().items():
        assert v.data_ptr() == ptrs[k]   # the model's own tensors, filled in place
        assert torch.equal(v, src.state_dict()[k])


def test_load_model_reports_keys_as_torch_does(api, torch, tmp_path):
    import kiln.torch as kt
    kt.save_file(_net(torch, bias=False).state_dict(), tmp_path / "m.kiln")
    kt.save_file(dict(_net(torch).state_dict(), extra=torch.ones(1)), tmp_path / "x.kiln")
    # the oracle: torch's own load_state_dict on the same two dicts
    for path, model in [(tmp_path / "m.kiln", _net(torch)), (tmp_path / "x.kiln", _net(torch))]:
        want = _net(torch).load_state_dict(kt.load_file(path), strict=False)
        before = {k: v.clone() for k, v in model.state_dict().items()}
        with pytest.raises(kt.LoadError) as e:
            kt.load_model(model, path)
        assert (e.value.missing_keys, e.value.unexpected_keys) == \
            (want.missing_keys, want.unexpected_keys)
        assert isinstance(e.value, RuntimeError)
        for k in want.missing_keys + want.unexpected_keys:
            assert '"%s"' % k in str(e.value)
        assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())  # untouched
        got = kt.load_model(model, path, strict=False)
        assert (got.missing_keys, got.unexpected_keys) == (want.missing_keys, want.unexpected_keys)


def test_load_model_checks_shapes_and_dtypes_before_copying(api, torch, tmp_path):
    import kiln.torch as kt
    kt.save_file(_net(torch).state_dict(), tmp_path / "m.kiln")
    for model, says in [(_net(torch, out=5), "size mismatch for 0.weight"),
                        (_net(torch, dtype=torch.float16), "dtype mismatch for 0.weight")]:
        before = {k: v.clone() for k, v in model.state_dict().items()}
        with pytest.raises(kt.LoadError, match=says) as e:
            kt.load_model(model, tmp_path / "m.kiln", strict=False)
        assert e.value.mismatched and all(torch.equal(v, before[k])
                                          for k, v in model.state_dict().items())


def test_load_file_of_a_dtype_torch_lacks_names_the_tensor(api, torch, tmp_path):
    import kiln.torch as kt
    kiln.save_tensors(tmp_path / "q.kiln", [kiln.Tensor(b"\x21", dtype="i4", shape=(2,),
                                                        name="q.packed")])
    with pytest.raises(kiln.KilnError, match="'q.packed' is i4"):
        kt.load_file(tmp_path / "q.kiln")


# --- typed: mypy --strict on user code ----------------------------------------------------

def test_mypy_strict_checks_kiln_torch_user_code(torch, mypy_cache):
    import importlib.util
    from _util import mypy_path
    if importlib.util.find_spec("mypy") is None:
        pytest.skip("mypy is not installed (pip install -e '.[test]' installs it)")
    here = os.path.join(ROOT, "tests", "typing")
    code, mistakes = os.path.join(here, "torch_code.py"), os.path.join(here, "torch_mistakes.py")
    r = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent",
                        "--cache-dir", str(mypy_cache), "--no-error-summary", code,
                        mistakes], capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, MYPYPATH=mypy_path()))
    errors = [line for line in r.stdout.splitlines() if ": error:" in line]
    assert not [e for e in errors if "torch_code.py" in e], r.stdout + r.stderr
    with open(mistakes) as f:
        want = [i for i, line in enumerate(f, 1) if "# E:" in line]
    got = sorted({int(e.split(":")[1]) for e in errors if "torch_mistakes.py" in e})
    assert got == want, r.stdout + r.stderr


def test_copy_into_a_torch_target_numpy_cannot_read_names_it(api, torch, tmp_path):
    kiln.save_tensors(tmp_path / "m.kiln", {"w": torch.ones(2, dtype=torch.bfloat16)})
    with kiln.open(tmp_path / "m.kiln") as f:
        with pytest.raises(TypeError, match="the target of tensor 'w'.*load_model"):
            f["w"].copy_into(torch.zeros(2, dtype=torch.bfloat16))
        out = torch.zeros(2, dtype=torch.float32)
        with pytest.raises(TypeError, match="float32"):   # numpy reads it: the dtype is wrong
            f["w"].copy_into(out)


def test_load_model_refuses_a_model_on_the_meta_device(api, torch, tmp_path):
    # copy_ into a meta tensor does nothing: the model would look loaded and hold no values
    import kiln.torch as kt
    kt.save_file(_net(torch).state_dict(), tmp_path / "m.kiln")
    with torch.device("meta"):
        model = _net(torch)
    with pytest.raises(kt.LoadError, match="meta device"):
        kt.load_model(model, tmp_path / "m.kiln")


def test_save_file_refuses_what_is_not_a_state_dict(api, torch, tmp_path):
    import kiln.torch as kt
    for bad, says in [({1: torch.ones(1), "a": torch.ones(1)}, "not a str"),   # (unsortable)
                      ({"w": [1.0]}, "not a torch.Tensor"),
                      ([torch.ones(1)], "mapping")]:
        with pytest.raises(kiln.EncodeError, match=says):
            kt.save_file(bad, tmp_path / "m.kiln")
        assert not (tmp_path / "m.kiln").exists()


def test_load_model_reads_into_every_kind_of_target(api, torch, tmp_path):
    # a bf16, a bool and a non-contiguous target, from a Path, a str and a
    # file:// URL: each copied from the mapping with the values saved
    import kiln.torch as kt
    src = {"w": torch.arange(12, dtype=torch.bfloat16).reshape(3, 4),
           "flag": torch.tensor([True, False, True]), "t": torch.arange(6.0).reshape(2, 3)}
    kt.save_file(src, tmp_path / "m.kiln")
    for where in [tmp_path / "m.kiln", str(tmp_path / "m.kiln"),
                  (tmp_path / "m.kiln").as_uri()]:
        model = torch.nn.ParameterDict({
            "w": torch.nn.Parameter(torch.zeros(3, 4, dtype=torch.bfloat16)),
            "flag": torch.nn.Parameter(torch.zeros(3, dtype=torch.bool), requires_grad=False),
            "t": torch.nn.Parameter(torch.zeros(3, 2).t())})   # non-contiguous
        assert not model["t"].is_contiguous()
        assert kt.load_model(model, where) == ([], [])
        for k, v in src.items():
            assert torch.equal(model[k].detach(), v), (where, k)
