"""Hugging Face folders as save_pretrained writes them (issue 60 item 6):
``kiln convert FOLDER out.kiln`` converts the folder as a whole (its one
``model.safetensors``, or its index and shards), and a kiln reader given
such a folder says it holds safetensors and how to convert it.

Real transformers models saved by ``save_pretrained``; the expected
tensors are read by safetensors itself; both kernels (``api``).
"""

import os
import subprocess
import sys

import pytest

import kiln
import kiln.convert
import kiln.torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    pytest.importorskip("torch", reason="torch is not installed (pip install torch)")
    cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64,
                                  n_positions=32, bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel(cfg)
    base = tmp_path_factory.mktemp("hf")
    one, sharded = str(base / "one"), str(base / "sharded")
    model.save_pretrained(one)
    model.save_pretrained(sharded, max_shard_size="40KB")
    return one, sharded


def _expected(folder):
    from safetensors.torch import load_file
    out = {}
    for n in sorted(os.listdir(folder)):
        if n.endswith(".safetensors"):
            out.update(load_file(os.path.join(folder, n)))
    return out


def test_a_save_pretrained_folder_converts_as_a_whole(api, folders, tmp_path):
    import torch
    one, sharded = folders
    assert "model.safetensors.index.json" in os.listdir(sharded)
    for folder in (one, sharded):
        want = _expected(folder)
        out = str(tmp_path / (os.path.basename(folder) + ".kiln"))
        assert kiln.convert.convert(folder, out) == len(want)
        got = kiln.torch.load_file(out)
        assert got.keys() == want.keys()
        assert all(torch.equal(got[k], want[k]) for k in want)
    # to a kiln set too, from the folder of a safetensors set
    index = kiln.convert.convert(sharded, str(tmp_path / "set" / "model.kiln.index.json"))
    assert index == len(_expected(sharded))


def test_the_command_line_converts_a_folder(api, folders, tmp_path):
    one, _ = folders
    env = dict(os.environ, PYTHONPATH=ROOT, KILN_PUREPYTHON="1" if api.name == "python" else "0")
    r = subprocess.run([sys.executable, "-m", "kiln", "convert", one, "out.kiln"], env=env,
                       cwd=str(tmp_path), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "unknown format" not in r.stderr
    with kiln.open(str(tmp_path / "out.kiln")) as f:
        assert sorted(f.keys()) == sorted(_expected(one))


def test_a_kiln_reader_given_such_a_folder_says_how_to_convert_it(api, folders, tmp_path):
    import kiln.torch
    one, sharded = folders
    for folder, holds in ((one, "model.safetensors, a safetensors file"),
                          (sharded, "model.safetensors.index.json, a sharded set's index")):
        for call in (kiln.open, kiln.load_tensors, kiln.torch.load_file):
            with pytest.raises(IsADirectoryError) as e:
                call(folder)
            msg = str(e.value)
            assert holds in msg and "convert the folder with kiln convert %s OUT.kiln" % folder \
                in msg, msg
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(kiln.convert.UnsupportedConversion, match="nothing to convert"):
        kiln.convert.convert(str(empty), str(tmp_path / "x.kiln"))


def test_convert_help_lists_the_set_and_folder_conversions(api, tmp_path):
    env = dict(os.environ, PYTHONPATH=ROOT, KILN_PUREPYTHON="1" if api.name == "python" else "0")
    r = subprocess.run([sys.executable, "-m", "kiln", "convert", "--help"], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0
    for words in (".safetensors.index.json -> .kiln.index.json",
                  ".kiln.index.json -> .safetensors.index.json", "the set in one file",
                  "save_pretrained folder"):
        assert words in r.stdout, words
