"""Issue 32, point 4: the command line's exit codes, closed pipes, foreign
files, file:// URLs, and the same hints from kiln.open."""
import gzip
import os
import struct
import subprocess
import sys

import numpy as np
import pytest

import kiln

from _util import ROOT


def run(*args, cwd=None):
    r = subprocess.run([sys.executable, "-m", "kiln", *map(str, args)], capture_output=True,
                       text=True, timeout=120, cwd=cwd, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    return r.returncode, r.stdout, r.stderr


def _safetensors(p):
    head = b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}'
    p.write_bytes(struct.pack("<Q", len(head)) + head + bytes(8))


def _gguf(p):
    p.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 0))


def _npz(p):
    np.savez(p, a=np.zeros(2))


FOREIGN = [("m.safetensors", _safetensors, "safetensors", ".safetensors"),
           ("m.gguf", _gguf, "GGUF", ".gguf"), ("m.npz", _npz, "npz", ".npz")]


@pytest.mark.parametrize("name, make, what, ext", FOREIGN)
def test_a_foreign_file_is_named_and_kiln_convert_suggested_alike(tmp_path, name, make, what,
                                                                  ext):
    p = tmp_path / name
    make(p)
    for cmd in ("inspect", "check"):
        code, out, err = run(cmd, p)
        assert code == 1, (cmd, code, err)                 # the same code for both
        line = err.strip()
        assert "\n" not in line and "Traceback" not in err
        assert "%s file" % what in line and "kiln convert FILE%s" % ext in line
        assert line.count(str(p)) == 1                     # named once
    with pytest.raises(kiln.KilnError) as e:
        kiln.open(p)
    assert (e.value.code, e.value.offset) == ("FRAME", 0)
    assert "%s file" % what in e.value.reason and "kiln convert" in e.value.reason
    with pytest.raises(kiln.KilnError) as e:
        kiln.load(p, "struct{id:i64,}")
    assert "%s file" % what in e.value.reason


def test_exit_codes_are_one_set(tmp_path):
    good = tmp_path / "m.kiln"
    kiln.save_tensors(good, {"w": np.ones(3, np.float32)})
    bare = tmp_path / "bare.bin"
    bare.write_bytes(b"\x01\x02\x03\x04\x05")
    cut = tmp_path / "cut.kiln"
    cut.write_bytes(good.read_bytes()[:100])
    missing = tmp_path / "none.kiln"
    for cmd in ("inspect", "check"):
        assert run(cmd, good)[0] == 0
        assert run(cmd, bare)[0] == 1       # neither a table nor a frame, no --type
        assert run(cmd, cut)[0] == 1        # invalid
        assert run(cmd, missing)[0] == 2    # cannot be read
        assert run(cmd, tmp_path)[0] == 2   # a folder
    assert run("hash", "struct{")[0] == 2   # bad type text: usage
    assert run("nosuchcommand")[0] == 2


def test_a_closed_pipe_exits_141_without_a_traceback(tmp_path):
    p = tmp_path / "many.kiln"
    kiln.save_tensors(p, {"t%d" % i: np.zeros(1, np.float32) for i in range(3000)})
    for extra in (["--json"], []):
        proc = subprocess.Popen([sys.executable, "-m", "kiln", "inspect", str(p)] + extra,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env=dict(os.environ, PYTHONPATH=str(ROOT)))
        try:
            first = proc.stdout.readline()
            proc.stdout.close()          # as `| head -1` does
            _, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert first and proc.returncode == 141, (proc.returncode, err)
        assert b"Traceback" not in err and b"BrokenPipe" not in err


def test_file_urls_work_where_paths_do(tmp_path):
    folder = tmp_path / "a b"
    folder.mkdir()
    p = folder / "m.kiln"
    url = "file://" + str(p).replace(" ", "%20")
    kiln.save_tensors(url, {"w": np.arange(3, dtype=np.float32)}, metadata={"k": 1})
    assert p.exists()
    assert kiln.load_tensors(url)["w"].numpy().tolist() == [0.0, 1.0, 2.0]
    assert kiln.load_tensors(url, copy=True)["w"].numpy().tolist() == [0.0, 1.0, 2.0]
    assert kiln.load_metadata(url) == {"k": 1}
    with kiln.open(url) as f:
        assert f["w"].numpy().tolist() == [0.0, 1.0, 2.0]
    with kiln.TensorWriter(url) as w:
        w.add("v", "i8", (2,))
        w.write("v", np.ones(2, np.int8))
    assert kiln.load_tensors(p)["v"].numpy().tolist() == [1, 1]
    r = folder / "r.kiln"
    kiln.save("file://localhost" + str(r).replace(" ", "%20"), {"id": 7}, "struct{id:i64,}")
    assert kiln.load("file://" + str(r).replace(" ", "%20"), "struct{id:i64,}") == {"id": 7}
    code, out, err = run("check", url)
    assert code == 0 and out.startswith(url + ": valid: structure checked"), (out, err)
    assert run("inspect", url)[0] == 0
    st = folder / "m.safetensors"
    from kiln.convert import convert
    convert(url, "file://" + str(st).replace(" ", "%20"))
    assert st.exists()
    code, out, err = run("convert", "file://" + str(st).replace(" ", "%20"),
                         "file://" + str(folder / "back.kiln").replace(" ", "%20"))
    assert code == 0, err
    with pytest.raises(ValueError, match="local file"):
        kiln.load_tensors("file://otherhost/m.kiln")


@pytest.mark.parametrize("dtype, raw", [("bf16", b"\x80\x3f"), ("f8e4m3", b"\x38"),
                                        ("e8m0", b"\x7f")])
def test_kiln_to_npz_refuses_what_npz_cannot_read_back(tmp_path, dtype, raw):
    from kiln.convert import ConvertError, convert
    src = tmp_path / "m.kiln"
    kiln.save_tensors(src, {"ok": np.ones(2, np.float32),
                            "w": kiln.Tensor(raw, dtype=dtype, shape=(1,))})
    dst = tmp_path / "m.npz"
    with pytest.raises(ConvertError) as e:
        convert(str(src), str(dst))
    assert e.value.code == "TYPE" and dtype in e.value.reason and "safetensors" in e.value.reason
    assert not dst.exists()
    code, _, err = run("convert", src, dst)
    assert code == 1 and err.count(str(src)) == 1 and dtype in err and not dst.exists()
    convert(str(src), str(tmp_path / "m.safetensors"))    # the way that keeps it
    convert(str(tmp_path / "m.safetensors"), str(tmp_path / "back.kiln"))
    assert bytes(kiln.load_tensors(tmp_path / "back.kiln")["w"].data) == raw


def test_demo_keeps_the_file_it_names_and_takes_out(tmp_path):
    import re
    import shutil
    code, out, err = run("demo", cwd=tmp_path)
    assert code == 0, err
    m = re.match(r"saved (\S+) \((\d+) bytes\)", out)
    assert m, out
    try:
        path = m.group(1)
        assert os.path.isfile(path) and os.path.getsize(path) == int(m.group(2))
        assert kiln.load(path, "struct{id:i64,text:str,weights:tensors,}")["id"] == 42
    finally:
        shutil.rmtree(os.path.dirname(m.group(1)))
    target = tmp_path / "here.kiln"
    code, out, err = run("demo", "--out", target)
    assert code == 0 and out.startswith("saved %s " % target) and target.is_file()
    assert "pickle dumps (record)" in out and "kiln encode (record)" in out


def test_demo_runs_without_ml_dtypes(tmp_path):
    code = ("import sys; sys.modules['ml_dtypes'] = None\n"
            "from kiln.cli import main\n"
            "sys.exit(main(['demo', '--out', sys.argv[1]]))\n")
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "d.kiln")],
                       capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert "round trip bit for bit: ok" in r.stdout and "pickle dumps (record)" in r.stdout
