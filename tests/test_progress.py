"""Issue 32, point 4: progress= counts bytes, in save_tensors, TensorWriter,
load_tensors(copy=True) and kiln.convert.convert (expected totals by hand)."""
import os
import subprocess
import sys

import numpy as np
import pytest

import kiln
from kiln import _compat
from kiln.convert import convert

from _util import ROOT


@pytest.fixture
def kernels(impl, monkeypatch):
    monkeypatch.setattr(_compat, "kernels", impl.kernels)
    monkeypatch.setattr(_compat, "IMPLEMENTATION", impl.name)
    return impl


class Seen:
    def __init__(self):
        self.calls = []

    def __call__(self, done, total):
        self.calls.append((done, total))

    def check(self, total):
        assert self.calls, "no report"
        dones = [d for d, _ in self.calls]
        assert dones == sorted(dones) and dones[-1] == total
        assert {t for _, t in self.calls} == {total}
        return len(self.calls)


# 9 MiB + 10 bytes: the big payload is reported in more than one piece (8 MiB steps)
ARRAYS = {"a": np.zeros(9 << 18, np.float32), "b": np.ones(10, np.int8)}
PAYLOAD = (9 << 20) + 10


def test_save_tensors_counts_payload_bytes(kernels, tmp_path):
    seen = Seen()
    kiln.save_tensors(tmp_path / "m.kiln", ARRAYS, progress=seen)
    assert seen.check(PAYLOAD) >= 3        # 8 MiB, 1 MiB, 10 bytes


def test_tensor_writer_counts_each_write(kernels, tmp_path):
    seen = Seen()
    with kiln.TensorWriter(tmp_path / "w.kiln", progress=seen) as w:
        w.add("a", "f32", (4,))
        w.add("b", "i8", (2, 3))
        w.write("a", np.zeros(4, np.float32))
        w.write_rows("b", 0, np.ones((1, 3), np.int8))
        w.write_rows("b", 1, np.ones((1, 3), np.int8))
    assert seen.calls == [(16, 22), (19, 22), (22, 22)]


def test_load_tensors_copy_counts_the_file_read(kernels, tmp_path):
    p = tmp_path / "m.kiln"
    kiln.save_tensors(p, ARRAYS)
    seen = Seen()
    d = kiln.load_tensors(p, copy=True, progress=seen)
    assert seen.check(os.path.getsize(p)) >= 2
    assert d["b"].numpy().tolist() == [1] * 10
    with pytest.raises(ValueError, match="copy=True"):
        kiln.load_tensors(p, progress=seen)


@pytest.mark.parametrize("ext", [".safetensors", ".npz"])
def test_convert_counts_bytes_both_ways(tmp_path, ext):
    src = tmp_path / "m.kiln"
    kiln.save_tensors(src, ARRAYS)
    seen = Seen()
    convert(str(src), str(tmp_path / ("m" + ext)), progress=seen)
    seen.check(PAYLOAD)
    back = Seen()
    convert(str(tmp_path / ("m" + ext)), str(tmp_path / "back.kiln"), progress=back)
    back.check(PAYLOAD)
    assert kiln.load_tensors(tmp_path / "back.kiln")["b"].numpy().tolist() == [1] * 10


def test_progress_true_draws_a_tqdm_bar_in_bytes(tmp_path, capsys):
    pytest.importorskip("tqdm")
    kiln.save_tensors(tmp_path / "m.kiln", ARRAYS, progress=True)
    err = capsys.readouterr().err
    assert "100%" in err and "9.00M" in err          # bytes, scaled: 9 MiB + 10 B


def test_bad_progress_values_fail_before_a_file_is_written(tmp_path):
    for bad in (3, "yes", object()):
        with pytest.raises(TypeError):
            kiln.save_tensors(tmp_path / "x.kiln", ARRAYS, progress=bad)
        with pytest.raises(TypeError):
            kiln.TensorWriter(tmp_path / "y.kiln", progress=bad)
        with pytest.raises(TypeError):
            convert(str(tmp_path / "none.kiln"), str(tmp_path / "z.npz"), progress=bad)
    assert sorted(os.listdir(tmp_path)) == []


def test_progress_true_without_tqdm_says_what_to_install(tmp_path):
    code = ("import sys; sys.modules['tqdm'] = None\n"
            "import numpy as np, kiln\n"
            "try:\n"
            "    kiln.save_tensors(sys.argv[1], {'a': np.zeros(2)}, progress=True)\n"
            "except ImportError as e:\n"
            "    print('refused', 'kiln-wire[progress]' in str(e))\n")
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "m.kiln")],
                       capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert r.stdout.strip() == "refused True", r.stderr
    assert not (tmp_path / "m.kiln").exists()
