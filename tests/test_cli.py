"""The kiln command, through subprocesses, on real files; conversions against
the real safetensors and gguf packages (test dependencies)."""

import json
import os
import struct
import subprocess
import sys

import numpy as np
import pytest

import kiln
from conftest import _compiled_or_none
from kiln import _compat


# the kernels a command runs on unless a test asks for one: the compiled ones
# whenever they are there (under --c-extensions they must be)
DEFAULT_IMPL = "python" if _compiled_or_none() is None else "cython"
_VERIFIED = set()


def version_line(impl):
    layer = impl == "cython" and not _compat.FREE_THREADED_BUILD
    return "kiln %s, %s kernels, compiled tensor layer %s" % (kiln.__version__, impl,
                                                              "on" if layer else "off")


def _child(args, impl, cwd, tmpdir=None):
    env = dict(os.environ)
    if tmpdir is not None:   # where the child's tempfile writes
        env["TMPDIR"] = str(tmpdir)
    env["KILN_PUREPYTHON"] = "1" if impl == "python" else "0"   # always explicit
    return subprocess.run([sys.executable, "-m", "kiln", *map(str, args)], capture_output=True,
                          text=True, timeout=300, env=env, cwd=cwd)


def run(*args, env_impl=None, cwd=None, tmpdir=None):
    """``kiln ARGS`` in a subprocess on the kernels ``env_impl`` (default DEFAULT_IMPL);
    the first time each kernel is used, ``kiln --version`` in the same environment
    must report it, so every command of this module ran the kernel it was given."""
    impl = env_impl or DEFAULT_IMPL
    if impl not in _VERIFIED:
        r = _child(["--version"], impl, cwd)
        assert (r.returncode, r.stdout.strip()) == (0, version_line(impl)), r.stderr
        _VERIFIED.add(impl)
    r = _child(args, impl, cwd, tmpdir)
    return r.returncode, r.stdout, r.stderr


def one_line_error(err):
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_version_reports_the_kernels_asked_for(impl):
    code, out, err = run("--version", env_impl=impl.name)
    assert (code, out.strip()) == (0, version_line(impl.name)), err


def test_help_has_examples():
    code, out, _ = run("--help")
    assert code == 0 and "examples:" in out and "kiln convert" in out


def test_demo(impl, tmp_path):
    # the demo keeps its file for the user to look at, in a new folder of the
    # temporary directory: here tmp_path (once: /tmp/kiln-demo-* left behind)
    code, out, err = run("demo", env_impl=impl.name, tmpdir=tmp_path, cwd=tmp_path)
    assert code == 0, err
    (kept,) = os.listdir(tmp_path)
    assert kept.startswith("kiln-demo-") and \
        os.listdir(tmp_path / kept) == ["sample.kiln"], os.listdir(tmp_path / kept)
    assert "saved %s" % (tmp_path / kept / "sample.kiln") in out
    assert "round trip bit for bit: ok" in out and "dense.q4" in out and "pickle" in out
    assert "%s kernels" % impl.name in out


def test_cases_ship_with_the_package(tmp_path):
    """``kiln cases`` without a file finds the cases from any directory: a wheel's
    copy (kiln/data/, built from spec/) or, from a checkout or an editable
    install, spec/ itself; either way the bytes of spec/kiln-v2-cases.json."""
    from _util import CASES_PATH
    code, out, err = run("cases", cwd=tmp_path)     # no spec/ folder here
    assert code == 0, err
    assert " 0 failed" in out
    (path,) = [ln[len("cases: "):] for ln in out.splitlines() if ln.startswith("cases: ")]
    pkg = os.path.dirname(os.path.abspath(kiln.__file__))
    assert os.path.realpath(path) in (
        os.path.realpath(os.path.join(pkg, "data", "kiln-v2-cases.json")),
        os.path.realpath(os.path.join(os.path.dirname(pkg), "spec", "kiln-v2-cases.json")))
    with open(path, "rb") as a, open(CASES_PATH, "rb") as b:
        assert a.read() == b.read()


def test_cases_errors_are_one_line(tmp_path):
    code, _, err = run("cases", tmp_path / "missing.json")
    assert code == 2 and "cannot read" in one_line_error(err)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    code, _, err = run("cases", bad)
    assert code == 1 and "not a Kiln case file" in one_line_error(err)   # invalid input


def test_hash():
    code, out, _ = run("hash", "struct{id:i64, batch:tensors}")
    assert code == 0 and out.split() == ["struct{id:i64,batch:tensors,}", "0xe58aadc7552f0d82"]
    code, _, err = run("hash", "list<")
    assert code == 2 and one_line_error(err).startswith("kiln hash: TYPE")


@pytest.fixture
def model(tmp_path):
    p = tmp_path / "m.kiln"
    kiln.save_tensors(p, {"w": np.ones((2, 3), np.float32), "b": np.zeros(3, np.float16)},
                      metadata={"name": "m", "step": 3})
    return p


def test_inspect_a_tensor_file(model):
    code, out, _ = run("inspect", model)
    assert code == 0 and "tensor directory" in out and "metadata" in out
    code, out, _ = run("inspect", model, "--json")
    doc = json.loads(out)
    assert [t["name"] for t in doc["tensors"]] == ["b", "w"]
    assert doc["tensors"][1]["shape"] == [2, 3] and doc["metadata"] == {"name": "m", "step": 3}
    assert doc["header"]["tensor_count"] == 3


def test_inspect_and_check_a_record(tmp_path):
    p = tmp_path / "r.kiln"
    kiln.save(p, {"id": 1, "values": list(range(100))}, "struct{id:i64,values:list<i32>}", store_type=False)
    code, out, _ = run("inspect", p)
    assert code == 0 and "framed record" in out and "--type" in out
    code, out, _ = run("inspect", p, "--type", "struct{id:i64,values:list<i32>}", "--json")
    v = json.loads(out)["value"]
    assert v["id"] == 1 and v["values"]["shape"] == [100] and len(v["values"]["first"]) == 9
    assert run("check", p, "--type", "struct{id:i64,values:list<i32>}")[0] == 0
    code, out, _ = run("check", p, "--type", "struct{id:i64,}")
    assert code == 1 and "SCHEMA at byte 8" in out


def test_check(model, tmp_path):
    assert run("check", model)[0] == 0
    raw = bytearray(model.read_bytes())
    raw[64 + 40] ^= 1
    bad = tmp_path / "bad.kiln"
    bad.write_bytes(bytes(raw))
    code, out, _ = run("check", bad)
    # descriptor 0 (b, f16[3]) starts at 64; its byte_length word at +40, 6 -> 7
    assert code == 1 and out.strip() == "%s: TYPE at byte 104: byte length is 7, 3 elements " \
        "of f16 need 6" % bad
    code, _, err = run("check", tmp_path / "nope.kiln")
    assert code == 2 and "cannot read" in one_line_error(err)


def test_safetensors_round_trip(tmp_path):
    stnp = pytest.importorskip("safetensors.numpy")
    ml_dtypes = pytest.importorskip("ml_dtypes")   # bf16 and float8 arrays to save
    arrays = {"f64": np.arange(3.0), "f32": np.ones((2, 2), np.float32),
              "f16": np.ones(5, np.float16), "bf16": np.ones(4, ml_dtypes.bfloat16),
              "f8": np.ones(3, ml_dtypes.float8_e4m3fn), "f8b": np.ones(3, ml_dtypes.float8_e5m2),
              "i64": np.array([-1], np.int64), "u8": np.array([7], np.uint8),
              "bool": np.array([True, False]), "i16": np.array([3], np.int16)}
    src = tmp_path / "a.safetensors"
    stnp.save_file(arrays, str(src), metadata={"format": "np", "note": "é"})
    code, out, err = run("convert", src, tmp_path / "a.kiln")
    assert code == 0, err
    d = kiln.load_tensors(tmp_path / "a.kiln")
    for k, a in arrays.items():
        assert bytes(d[k].data) == a.tobytes() and d[k].shape == a.shape, k
    assert kiln.load_metadata(tmp_path / "a.kiln") == {"format": "np", "note": "é"}
    assert run("convert", tmp_path / "a.kiln", tmp_path / "b.safetensors")[0] == 0
    from safetensors import safe_open
    with safe_open(str(tmp_path / "b.safetensors"), framework="np") as f:
        assert f.metadata() == {"format": "np", "note": "é"}
        assert sorted(f.keys()) == sorted(arrays)
        for k in ("f64", "f32", "f16", "i64", "u8", "bool", "i16"):   # numpy's own dtypes
            assert f.get_tensor(k).tobytes() == arrays[k].tobytes(), k
    # every tensor, bf16 and float8 included, bit for bit through kiln's reader
    back = kiln.load_tensors(tmp_path / "c.kiln") if run(
        "convert", tmp_path / "b.safetensors", tmp_path / "c.kiln")[0] == 0 else None
    for k, a in arrays.items():
        assert bytes(back[k].data) == a.tobytes(), k


@pytest.mark.parametrize("header", [
    struct.pack("<Q", 1 << 63),                       # a header length past any file
    None,                                             # overlapping offsets
    struct.pack("<Q", 10) + b"not json!!",
])
def test_hostile_safetensors_is_a_one_line_error(tmp_path, header):
    p = tmp_path / "h.safetensors"
    if header is None:
        h = json.dumps({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                        "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}).encode()
        header = struct.pack("<Q", len(h)) + h + bytes(16)
    p.write_bytes(header)
    code, _, err = run("convert", p, tmp_path / "o.kiln")
    assert code == 1
    line = one_line_error(err)
    assert "h.safetensors" in line
    assert not (tmp_path / "o.kiln").exists()


def _gguf_file(path):
    gguf = pytest.importorskip("gguf")
    from gguf.quants import quantize
    Q = gguf.GGMLQuantizationType
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 64)).astype(np.float32)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_uint32("count", 7)
    w.add_array("list", [1, 2, 3])
    w.add_string("text", "hé")
    w.add_float32("lr", 0.5)
    q4, q8 = quantize(x, Q.Q4_0), quantize(x, Q.Q8_0)
    w.add_tensor("q4", q4, raw_dtype=Q.Q4_0)
    w.add_tensor("q8", q8, raw_dtype=Q.Q8_0)
    w.add_tensor("f32", x)
    w.add_tensor("f16", x.astype(np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return {"q4": (q4, Q.Q4_0), "q8": (q8, Q.Q8_0)}, x


def test_gguf_to_kiln(tmp_path):
    pytest.importorskip("gguf", reason="gguf is not installed (the [test] extra installs it)")
    from gguf.quants import dequantize
    quants, x = _gguf_file(tmp_path / "m.gguf")
    code, _, err = run("convert", tmp_path / "m.gguf", tmp_path / "m.kiln")
    assert code == 0, err
    with kiln.open(tmp_path / "m.kiln") as f:
        meta = f.metadata["gguf"]
        assert meta["count"] == 7 and meta["list"] == [1, 2, 3] and meta["text"] == "hé"
        assert meta["lr"] == 0.5 and meta["general.architecture"] == "llama"
        assert np.array_equal(f["f32"].numpy(), x) and f["f32"].shape == (4, 64)
        assert np.array_equal(f["f16"].numpy(), x.astype(np.float16))
        for name, (raw, qtype) in quants.items():
            t = f[name]
            assert t.layout == "ggml." + qtype.name and t.shape == (4, 64)
            assert bytes(t.data) == raw.tobytes()
            got = dequantize(np.frombuffer(t.data, np.uint8).reshape(raw.shape), qtype)
            assert np.array_equal(got, dequantize(raw, qtype))


@pytest.mark.parametrize("what", ["tensor count", "string length"])
def test_hostile_gguf_is_a_one_line_error(tmp_path, what):
    p = tmp_path / "h.gguf"
    if what == "tensor count":
        p.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 1 << 62, 0) + bytes(64))
    else:
        p.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 1 << 60)
                      + bytes(64))
    code, _, err = run("convert", p, tmp_path / "o.kiln")
    assert code == 1 and "cannot fit" in one_line_error(err)
    assert not (tmp_path / "o.kiln").exists()


def test_npz_round_trip(tmp_path):
    arrays = {"a": np.arange(6, dtype=np.int16).reshape(2, 3), "b": np.ones(3, np.float64)}
    np.savez(tmp_path / "a.npz", **arrays)
    assert run("convert", tmp_path / "a.npz", tmp_path / "a.kiln")[0] == 0
    assert run("convert", tmp_path / "a.kiln", tmp_path / "b.npz")[0] == 0
    with np.load(tmp_path / "b.npz") as z:
        for k, a in arrays.items():
            assert np.array_equal(z[k], a) and z[k].dtype == a.dtype
    code, _, err = run("convert", tmp_path / "a.npz", tmp_path / "a.txt")
    assert code == 2 and "unknown format" in one_line_error(err)


def _st(entries, data=b""):
    h = json.dumps(entries).encode()
    return struct.pack("<Q", len(h)) + h + data


@pytest.mark.parametrize("raw", [
    struct.pack("<Q", 100000) + b"[" * 100000,                           # deep JSON
    _st({"a": {"dtype": ["U8"], "shape": [1], "data_offsets": [0, 1]}}, b"\0"),
    _st({"": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}, b"\0"),
    _st({"a": {"dtype": "U8", "shape": [True], "data_offsets": [0, 1]}}, b"\0"),
    _st({"a": {"dtype": "U8", "shape": [100], "data_offsets": [0, 100]},   # hidden overlap
         "z": {"dtype": "U8", "shape": [0], "data_offsets": [50, 50]},
         "c": {"dtype": "U8", "shape": [10], "data_offsets": [60, 70]}}, bytes(100)),
    _st({"__metadata__": 0, "a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}},
        b"\0"),
])
def test_more_hostile_safetensors(tmp_path, raw):
    p = tmp_path / "h.safetensors"
    p.write_bytes(raw)
    code, _, err = run("convert", p, tmp_path / "o.kiln")
    assert code == 1 and "h.safetensors" in one_line_error(err)
    assert sorted(os.listdir(tmp_path)) == ["h.safetensors"]


def test_hostile_npz(tmp_path):
    np.save(tmp_path / "one.npy", np.arange(3))
    os.rename(tmp_path / "one.npy", tmp_path / "one.npz")
    code, _, err = run("convert", tmp_path / "one.npz", tmp_path / "o.kiln")
    assert code == 1 and "not an .npz archive" in one_line_error(err)
    import io
    import zipfile
    member = io.BytesIO()
    np.lib.format.write_array_header_1_0(member, {"descr": "<f8", "fortran_order": False,
                                                   "shape": (10 ** 12,)})
    member.write(b"\0")
    with zipfile.ZipFile(tmp_path / "lie.npz", "w") as zf:
        zf.writestr("x.npy", member.getvalue())
    code, _, err = run("convert", tmp_path / "lie.npz", tmp_path / "o.kiln")
    assert code == 1 and "holds" in one_line_error(err)


@pytest.mark.parametrize("which", ["python", "cython"])
def test_inspect_and_check_a_url(tmp_path, which, pytestconfig):
    pytest.importorskip("aiohttp")                  # fsspec's HTTP filesystem
    if which == "cython":
        # the one rule of the suite: an error under --c-extensions, a skip only
        # in a pure-Python distribution
        from conftest import compiled_kernels
        compiled_kernels(pytestconfig)
    from _servers import RangeServer
    big = np.zeros(4 << 20, np.uint8)
    kiln.save_tensors(tmp_path / "m.kiln", {"big": big, "flags": np.array([True, False])},
                      metadata={"step": 3})
    with RangeServer(tmp_path) as server:
        url = server.url + "m.kiln"
        code, out, err = run("inspect", url, "--json", env_impl=which)
        assert code == 0, err
        rep = json.loads(out)
        assert rep["kind"] == "tensor directory" and rep["metadata"] == {"step": 3}
        assert [t["name"] for t in rep["tensors"]] == ["big", "flags"]
        assert rep["size"] == os.path.getsize(tmp_path / "m.kiln")
        assert server.sent < 200 * 1024, server.sent       # the table, not the 4 MiB payload
        assert run("check", url, env_impl=which)[0] == 0
        raw = bytearray((tmp_path / "m.kiln").read_bytes())
        at = rep["tensors"][1]["offset"]
        raw[at] = 7                                           # a bool byte
        (tmp_path / "m.kiln").write_bytes(bytes(raw))
        code, out, err = run("check", url, env_impl=which)
        assert code == 1 and "TYPE at byte %d" % at in out, (out, err)
