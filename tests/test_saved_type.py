"""kiln.save stores the value's type (issue 60 item 13): version 2 of the pad
head holds the type text (spec/kiln-v2.md section 13), kiln.load and kiln
inspect/check read it back without a type, the type comes from a value's
class where it has one, and files without it (older, store_type=False) read
as before.  Expected bytes are written by hand from the spec's table; both
kernels (``api``); the command line in a child on each kernel."""

import dataclasses
import os
import struct
import subprocess
import sys
import typing

import numpy as np
import pytest

import kiln

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
T = "struct{id:i64,x:tensors,}"


def _head(text, pad):
    raw = text.encode()
    return b"KLNP" + bytes([2, pad, 0, 0]) + struct.pack("<I", len(raw)) + raw + bytes(pad)


def test_the_type_head_by_hand(api, tmp_path):
    p = tmp_path / "v.kiln"
    kiln.save(p, [1, 2], "list<i32>")
    framed = kiln.encode(np.array([1, 2], np.int32), "list<i32>", frame=True)
    assert p.read_bytes() == _head("list<i32>", 0) + framed      # no tensors: no pad
    assert kiln.load(p).tolist() == [1, 2]
    # with tensors: the pad puts the directory on a 64-byte boundary of the file
    kiln.save(p, {"id": 7, "x": {"w": np.ones(3, np.float32)}}, T)
    data = p.read_bytes()
    h = 12 + len(T)
    pad = data[5]
    assert data[:12 + len(T) + pad] == _head(T, pad)
    at = data.index(b"KLNT")
    assert at % 64 == 0 and at == h + pad + 16 + 8   # head, pad, frame, the i64
    got = kiln.load(p)
    assert got["id"] == 7 and got["x"]["w"].numpy().tolist() == [1.0, 1.0, 1.0]
    assert kiln.load(p, T)["id"] == 7
    with pytest.raises(kiln.KilnError) as e:   # another type: the frame's hash says so
        kiln.load(p, "struct{id:i64,}")
    assert e.value.code == "SCHEMA"


def test_the_type_comes_from_the_class(api, tmp_path):
    @dataclasses.dataclass
    class Event:
        id: kiln.I64
        message: str

    class Pair(typing.NamedTuple):
        a: kiln.I32
        b: str

    p = tmp_path / "e.kiln"
    kiln.save(p, Event(3, "hi"))
    assert kiln.load(p) == {"id": 3, "message": "hi"}
    assert kiln.load(p, Event) == Event(3, "hi")
    kiln.save(p, Pair(1, "x"))
    assert kiln.load(p, Pair) == Pair(1, "x")
    with pytest.raises(TypeError, match="needs a type for a dict value"):
        kiln.save(p, {"a": 1})


def test_files_without_the_type_read_as_before(api, tmp_path):
    p = tmp_path / "old.kiln"
    kiln.save(p, [1, 2], "list<i32>", store_type=False)
    assert p.read_bytes() == kiln.encode(np.array([1, 2], np.int32), "list<i32>", frame=True)
    assert kiln.load(p, "list<i32>").tolist() == [1, 2]
    with pytest.raises(TypeError, match="stores no type"):
        kiln.load(p)
    kiln.save(p, [1, 2], "list<i32>", frame=False)
    with pytest.raises(TypeError, match="stores no type"):
        kiln.load(p, frame=False)


def test_hostile_type_heads_are_kiln_errors_at_their_byte(api, tmp_path):
    p = tmp_path / "h.kiln"
    kiln.save(p, [1, 2], "list<i32>")
    good = p.read_bytes()
    n = len("list<i32>")
    cases = [
        (good[:10], "EOF", 10),                                       # inside the length
        (good[:8] + struct.pack("<I", 1 << 21) + good[12:], "LIMIT", 8),
        (good[:8] + struct.pack("<I", len(good)) + good[12:], "EOF", len(good)),
        (good[:12] + b"\xff" + good[13:], "UTF8", 12),
        (good[:5] + b"\x01" + good[6:], "FRAME", 12 + n),             # a pad byte not 0
        (good[:4] + b"\x03" + good[5:], "FRAME", 4),                  # an unknown version
        (good[:12] + b"list<i64>" + good[12 + n:], "SCHEMA", 12 + n + 8),  # the frame hash
    ]
    for bad, code, off in cases:
        p.write_bytes(bad)
        with pytest.raises(kiln.KilnError) as e:
            kiln.load(p)
        assert (e.value.code, e.value.offset) == (code, off), (bad[:16], e.value)


def test_inspect_and_check_read_the_stored_type(api, tmp_path):
    p = tmp_path / "rec.kiln"
    kiln.save(p, {"id": 5, "x": {"w": np.arange(3, dtype=np.float32)}}, T)
    env = dict(os.environ, PYTHONPATH=ROOT, KILN_PUREPYTHON="1" if api.name == "python" else "0")
    run = [sys.executable, "-m", "kiln"]
    r = subprocess.run(run + ["check", str(p)], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and "decodes in full as %s" % T in r.stdout, r.stderr
    r = subprocess.run(run + ["inspect", str(p)], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and "stored type %s" % T in r.stdout and '"id": 5' in r.stdout, \
        r.stderr


def test_a_file_that_is_no_saved_value_says_what_it_is_without_a_type(api, tmp_path):
    """kiln.load(path) with no type, of a file that holds no frame (another
    format, junk, a save cut or damaged at its start): the KilnError the
    typed call gives, with its hint, never 'pass the type'."""
    np.save(tmp_path / "x.npy", np.zeros(3))
    kiln.save_tensors(tmp_path / "t.kiln", {"a": np.zeros(2)})
    (tmp_path / "junk.bin").write_bytes(b"hello world, junk")
    kiln.save(tmp_path / "v.kiln", [1.5], "list<f64>")
    raw = (tmp_path / "v.kiln").read_bytes()
    (tmp_path / "cut.kiln").write_bytes(raw[:2])
    (tmp_path / "bent.kiln").write_bytes(b"X" + raw[1:])
    want = {"x.npy": ("FRAME", "npy file"), "t.kiln": ("FRAME", "Kiln tensor file"),
            "junk.bin": ("FRAME", "frame magic"), "cut.kiln": ("EOF", "truncated"),
            "bent.kiln": ("FRAME", "frame magic")}
    for name, (code, words) in want.items():
        with pytest.raises(kiln.KilnError) as typed:
            kiln.load(tmp_path / name, "list<f64>")
        with pytest.raises(kiln.KilnError) as untyped:
            kiln.load(tmp_path / name)
        assert (untyped.value.code, untyped.value.offset) == (code, 0), name
        assert words in str(untyped.value) and str(untyped.value) == str(typed.value), name
    kiln.save(tmp_path / "old.kiln", [1.5], "list<f64>", store_type=False)
    with pytest.raises(TypeError, match="stores no type"):   # a whole frame, no type stored
        kiln.load(tmp_path / "old.kiln")
