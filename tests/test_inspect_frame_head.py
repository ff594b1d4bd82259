"""`kiln inspect` of a framed file prints a schema hash only where the file
holds a whole frame head (issue 56 item 14): kiln.save's pad head with
nothing after it, or with part of a frame, is EOF at the byte the frame
starts, exit 1, as `kiln check --type` says; other bytes there are FRAME.
Both kernels (the command run with each).

Oracles: the file's own bytes read by hand (the frame magic b"KLN0" and the
hash at bytes 8-16 of the frame) and `kiln check --type`'s verdict."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import kiln
from _util import ROOT


def run(*args, kernels):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("KILN_PUREPYTHON", None)
    if kernels == "python":
        env["KILN_PUREPYTHON"] = "1"
    r = subprocess.run([sys.executable, "-m", "kiln", *map(str, args)], capture_output=True,
                       text=True, timeout=120, env=env)
    return r.returncode, r.stdout, r.stderr


@pytest.fixture(params=["python", "cython"])
def kernels(request):
    if request.param == "cython":
        from conftest import compiled_kernels
        compiled_kernels(request.config)   # an error under --c-extensions when missing
    return request.param


@pytest.fixture
def saved(tmp_path):
    """(the bytes kiln.save wrote, where its frame starts: after the pad head)."""
    p = tmp_path / "whole.kiln"
    kiln.save(p, {"a": np.arange(4, dtype=np.float32)}, "tensors", store_type=False)
    raw = p.read_bytes()
    at = raw.index(b"KLN0")   # the frame's magic, after the pad head and its pad
    assert at > 0 and raw[:4] != b"KLN0"
    return raw, at


@pytest.mark.parametrize("extra", [0, 5, 15])
def test_a_pad_head_without_a_whole_frame_is_eof_as_check_says(tmp_path, kernels, saved,
                                                                 extra):
    raw, at = saved
    p = tmp_path / "cut.kiln"
    p.write_bytes(raw[:at + extra])   # the pad head, then 0, 5 or 15 bytes of the frame
    code, out, err = run("inspect", p, kernels=kernels)
    assert code == 1 and "schema hash" not in out, (out, err)
    assert "EOF at byte %d" % at in err, err
    code_j, out_j, err_j = run("inspect", p, "--json", kernels=kernels)
    assert code_j == 1 and out_j == "" and "EOF at byte %d" % at in err_j
    code_c, out_c, err_c = run("check", p, "--type", "tensors", kernels=kernels)
    assert code_c == 1 and "EOF at byte %d" % at in out_c + err_c   # the same verdict


def test_a_short_frame_without_a_pad_head_is_eof(tmp_path, kernels, saved):
    raw, at = saved
    p = tmp_path / "short.kiln"
    p.write_bytes(raw[at:at + 10])   # a bare frame cut after 10 bytes
    code, out, err = run("inspect", p, kernels=kernels)
    assert code == 1 and "schema hash" not in out and "EOF at byte 0" in err, (out, err)


def test_a_pad_head_before_other_bytes_is_frame(tmp_path, kernels, saved):
    raw, at = saved
    p = tmp_path / "bad.kiln"
    p.write_bytes(raw[:at] + b"XXXX" + raw[at + 4:])
    code, out, err = run("inspect", p, kernels=kernels)
    assert code == 1 and "schema hash" not in out and "FRAME at byte %d" % at in err, err


def test_a_whole_frame_head_gives_its_hash(tmp_path, kernels, saved):
    raw, at = saved
    p = tmp_path / "whole.kiln"
    want = "0x%016x" % int.from_bytes(raw[at + 8:at + 16], "little")
    code, out, err = run("inspect", p, "--json", kernels=kernels)
    assert code == 0, err
    report = json.loads(out)
    assert report["schema_hash"] == want and report["value_offset"] == at
    # exactly the frame head, nothing after it: the hash is read, inspect says so
    (tmp_path / "head.kiln").write_bytes(raw[:at + 16])
    code, out, err = run("inspect", tmp_path / "head.kiln", kernels=kernels)
    assert code == 0 and "schema hash %s" % want in out, (out, err)


def test_a_typed_pad_head_without_its_value_is_eof_too(tmp_path, kernels):
    """kiln.save's default head stores the type (version 2): cut after the
    head, inspect decodes nothing and invents nothing, as check says."""
    p = tmp_path / "typed.kiln"
    kiln.save(p, {"a": np.arange(4, dtype=np.float32)}, "tensors")
    raw = p.read_bytes()
    at = raw.index(b"KLN0")
    p.write_bytes(raw[:at])
    code, out, err = run("inspect", p, kernels=kernels)
    assert code == 1 and out == "" and "EOF at byte %d" % at in err, (out, err)
    code_c, out_c, err_c = run("check", p, kernels=kernels)
    assert code_c == 1 and "EOF at byte %d" % at in out_c + err_c
