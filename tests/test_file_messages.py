"""Messages that name the file and what it is (issue 60 items 8, 9, 10):
a tensor file's fault names the file and says "truncated" when it ends short;
a record file given to a tensor reader (and the reverse), a ``torch.save``
checkpoint, a tensor file given to ``kiln.load``: each named, with what reads
it; an empty folder is one answer for ``kiln.open`` and ``load_tensors``.

Real files (truncated with ``os.truncate``, a real ``torch.save`` zip, a real
``numpy.savez``); both kernels (``api``); the command line in a child on
each kernel.
"""

import os
import subprocess
import sys

import numpy as np
import pytest

import kiln

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _cli(impl, *args, cwd):
    env = dict(os.environ, PYTHONPATH=ROOT, KILN_PUREPYTHON="1" if impl.name == "python" else "0")
    return subprocess.run([sys.executable, "-m", "kiln"] + list(args), env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def _short(tmp_path, keep):
    path = str(tmp_path / "short.kiln")
    kiln.save_tensors(path, {"x": np.ones((12, 12))})
    os.truncate(path, keep)
    return path


@pytest.mark.parametrize("keep", [10, 700])
def test_a_truncated_tensor_file_is_named_and_called_truncated(api, tmp_path, keep):
    path = _short(tmp_path, keep)
    calls = [lambda: kiln.open(path), lambda: kiln.load_tensors(path),
             lambda: kiln.load_tensors(path, copy=True), lambda: kiln.load_metadata(path)]
    for call in calls:
        with pytest.raises(kiln.KilnError) as e:
            call()
        assert e.value.code == "EOF"
        assert str(e.value).count("short.kiln") == 1 and "short.kiln is truncated" in str(e.value)
        assert "Kiln tensor file" not in str(e.value)   # no hint to read it as it is read
    with open(path, "rb") as fh:   # a file object: its name
        with pytest.raises(kiln.KilnError, match="short.kiln is truncated"):
            kiln.load_tensors(fh)


def test_the_command_line_names_the_file_once(api, tmp_path):
    _short(tmp_path, 700)
    r = _cli(api, "inspect", "short.kiln", cwd=str(tmp_path))
    assert r.returncode == 1
    assert r.stderr.count("short.kiln") == 1 and "the file is truncated" in r.stderr, r.stderr


@pytest.mark.parametrize("keep", [10, 700])
def test_kiln_convert_of_a_truncated_file_says_truncated(api, tmp_path, keep):
    """The converters read a .kiln source as kiln.open does (review M6)."""
    from kiln.convert import convert
    path = _short(tmp_path, keep)
    for dst, checksum in (("o.safetensors", False), ("o.npz", False), ("o.kiln", True)):
        with pytest.raises(kiln.KilnError) as e:
            convert(path, str(tmp_path / dst), checksum=checksum)
        assert e.value.code == "EOF", dst
        assert str(e.value).count("short.kiln") == 1 and "short.kiln is truncated" in str(e.value)
        assert not os.path.exists(tmp_path / dst)
        r = _cli(api, "convert", "short.kiln", dst, *(["--checksum"] if checksum else []),
                 cwd=str(tmp_path))
        assert r.returncode == 1
        assert r.stderr.count("short.kiln") == 1 and "the file is truncated" in r.stderr, r.stderr
    folder = tmp_path / "set"   # a set's shard, named as the file the fault is in
    kiln.save_sharded({"a": np.ones(300), "b": np.zeros(300)}, folder, max_shard_size=3000)
    shard = sorted(p for p in os.listdir(folder) if p.endswith(".kiln"))[0]
    os.truncate(folder / shard, keep)
    with pytest.raises(kiln.KilnError, match="%s is truncated" % shard):
        convert(str(folder), str(tmp_path / "one.kiln"))


def test_other_formats_and_other_kiln_kinds_are_named(api, tmp_path, monkeypatch):
    torch = pytest.importorskip("torch", reason="torch is not installed (pip install torch)")
    d = str(tmp_path)
    torch.save({"w": torch.ones(2)}, os.path.join(d, "model.pt"))
    np.savez(os.path.join(d, "arrays.npz"), a=np.ones(2))
    kiln.save_tensors(os.path.join(d, "t.kiln"), {"x": np.ones(2)})
    with kiln.RecordWriter(os.path.join(d, "r.kilnr"), "i32") as w:
        w.write(1)
    monkeypatch.chdir(d)
    cases = [
        (lambda: kiln.open("r.kilnr"), "this is a Kiln record file, not a tensor file: read it "
                                        "with kiln.RecordFile"),
        (lambda: kiln.RecordFile("t.kiln", "i32"), "this is a Kiln tensor file: read it with "
                                                   "kiln.open"),
        (lambda: kiln.load("t.kiln", "i32"), "this is a Kiln tensor file"),
        (lambda: kiln.load("r.kilnr", "i32"), "this is a Kiln record file"),
        (lambda: kiln.open("model.pt"), "this is a PyTorch checkpoint, a torch.save zip"),
        (lambda: kiln.open("arrays.npz"), "this is an npz file, not Kiln: convert it"),
        # RecordFile reads enough of the file to tell the two zips apart (review L1)
        (lambda: kiln.RecordFile("model.pt", "i32"), "this is a PyTorch checkpoint, a "
                                                      "torch.save zip"),
        (lambda: kiln.RecordFile("arrays.npz", "i32"), "this is an npz file, not Kiln"),
        (lambda: kiln.RecordFile("arrays.npz"), "this is an npz file, not Kiln"),
    ]
    for call, words in cases:
        with pytest.raises(kiln.KilnError) as e:
            call()
        assert e.value.code == "FRAME" and e.value.offset == 0
        assert words in str(e.value), str(e.value)
    r = _cli(api, "inspect", "model.pt", cwd=d)
    assert r.returncode == 1 and "PyTorch checkpoint" in r.stderr and "npz" not in r.stderr, \
        r.stderr


def test_an_empty_folder_is_one_answer(api, tmp_path):
    folder = tmp_path / "empty"
    folder.mkdir()
    answers = []
    for call in (kiln.open, kiln.load_tensors, kiln.load_metadata):
        with pytest.raises(OSError) as e:
            call(str(folder))
        answers.append((type(e.value), str(e.value)))
    assert answers[0] == answers[1]
    assert answers[0][0] is IsADirectoryError and "holding no" in answers[0][1]


def test_convert_names_the_member_kiln_cannot_hold_once(api, tmp_path):
    np.savez(str(tmp_path / "meta.npz"), **{"__metadata__": np.ones(2)})
    r = _cli(api, "convert", "meta.npz", "meta.kiln", cwd=str(tmp_path))
    assert r.returncode == 1
    line = r.stderr.strip().splitlines()[-1]
    assert line.startswith("kiln convert: meta.npz: TYPE at byte 0: member '__metadata__'"), line
    assert line.count(" at byte ") == 1 and "($)" not in line, line
    assert not (tmp_path / "meta.kiln").exists()
