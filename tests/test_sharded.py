"""Sharded checkpoints (issue 39, item 4): kiln.save_sharded writes shard files
and a Hugging Face-shaped index, kiln.open of the index (or its folder, or its
URL) reads the set as one mapping with each shard opened on first use, and
kiln convert takes a sharded safetensors set to a kiln set and back and to
one file.  The index is hostile input.  Both kernels.

Oracles: the reference decoder (spec/reference/kiln_ref.py) for what each
shard holds, the safetensors package for the safetensors side, hand-written
index JSON and expected names, offsets and sizes."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import kiln
from _util import kiln_ref


def _tensors():
    """Five f32 tensors of 4,000 bytes and one i8 tensor of 20,000 bytes."""
    t = {"l%d.w" % i: np.arange(1000, dtype=np.float32) + i for i in range(5)}
    t["z.big"] = (np.arange(20000) % 120).astype(np.int8)
    return t


def _ref_names(path):
    with open(path, "rb") as f:
        ts, _ = kiln_ref.read_directory(f.read(), 0)
    return [(t["name"], bytes(t["payload"])) for t in ts if t["name"] != "__metadata__"]


def test_save_sharded_writes_shards_and_an_index(api, tmp_path):
    t = _tensors()
    index = kiln.save_sharded(t, tmp_path / "set", max_shard_size=8000, metadata={"step": 3})
    assert index == str(tmp_path / "set" / "model.kiln.index.json")
    files = ["model-%05d-of-00004.kiln" % i for i in (1, 2, 3, 4)]
    assert sorted(os.listdir(tmp_path / "set")) == files + ["model.kiln.index.json"]
    with open(index) as f:
        doc = json.load(f)
    assert doc == {"metadata": {"total_size": 5 * 4000 + 20000}, "weight_map": {
        "l0.w": files[0], "l1.w": files[0], "l2.w": files[1], "l3.w": files[1],
        "l4.w": files[2], "z.big": files[3]}}   # the larger tensor alone in its shard
    for fn in files:   # every shard a standalone file: what the reference decoder reads
        got = _ref_names(tmp_path / "set" / fn)
        assert [n for n, _ in got] == [n for n, s in doc["weight_map"].items() if s == fn]
        for n, payload in got:
            assert payload == t[n].tobytes()
        assert kiln.load_metadata(tmp_path / "set" / fn) == {"step": 3}


@pytest.mark.parametrize("text, n", [("5GB", 5 * 10 ** 9), ("500MiB", 500 << 20),
                                     ("1.5kB", 1500), (12345, 12345), ("2 GiB", 2 << 30)])
def test_max_shard_size_takes_hugging_face_sizes(text, n):
    from kiln._files.sharded import parse_size
    assert parse_size(text) == n


@pytest.mark.parametrize("bad", ["5 parsecs", "", 0, -1, True, "GB", 1.5])
def test_a_bad_max_shard_size_is_refused_before_writing(tmp_path, bad):
    with pytest.raises(ValueError):
        kiln.save_sharded(_tensors(), tmp_path / "s", max_shard_size=bad)
    assert not (tmp_path / "s").exists()


def test_open_reads_the_set_as_one_mapping_lazily(api, tmp_path):
    t = _tensors()
    index = kiln.save_sharded(t, tmp_path, max_shard_size=8000, metadata={"step": 3})
    os.remove(tmp_path / "model-00003-of-00004.kiln")   # never opened unless l4.w is read
    for where in (index, tmp_path, str(tmp_path)):
        with kiln.open(where) as f:
            assert isinstance(f, kiln.ShardedFile)
            assert f.keys() == ["l0.w", "l1.w", "l2.w", "l3.w", "l4.w", "z.big"] and len(f) == 6
            assert f["l1.w"].numpy().tolist() == (np.arange(1000) + 1.0).tolist()
            assert f[5].numpy()[:3].tolist() == [0, 1, 2] and "z.big" in f and "q" not in f
            assert f.rows("l3.w", 2, 4).tolist() == [5.0, 6.0]
            assert f.metadata == {"step": 3} and f.total_size == 40000
            assert f.get("nope") is None
            with pytest.raises(FileNotFoundError):
                f["l4.w"]
    with pytest.raises(ValueError, match="sharded"):
        kiln.load_tensors(index)


def test_a_folder_without_one_kiln_index(tmp_path):
    with pytest.raises(IsADirectoryError, match="no"):
        kiln.open(tmp_path)
    (tmp_path / "a.kiln.index.json").write_text('{"weight_map": {}}')
    (tmp_path / "b.kiln.index.json").write_text('{"weight_map": {}}')
    with pytest.raises(ValueError, match="2"):
        kiln.open(tmp_path)


def test_checksums_of_a_set_are_verified_by_default(api, tmp_path):
    kiln.save_sharded(_tensors(), tmp_path, max_shard_size=8000, checksum=True)
    p = tmp_path / "model-00002-of-00004.kiln"
    buf = bytearray(p.read_bytes())
    at = buf.find((np.arange(1000, dtype=np.float32) + 2).tobytes()) + 100
    buf[at] ^= 1
    p.write_bytes(bytes(buf))
    with kiln.open(tmp_path) as f:
        assert f["l0.w"].numpy()[0] == 0.0
        with pytest.raises(kiln.KilnError) as e:
            f["l2.w"]
        assert e.value.code == "CHECKSUM" and "'l2.w'" in e.value.reason
        assert e.value.offset <= at < e.value.offset + 4000
    with kiln.open(tmp_path, verify=False) as f:
        assert f["l2.w"].numpy()[25] != 27.0   # the damaged byte reads as it is


def _index(tmp_path, weight_map, extra=None):
    doc = {"metadata": {"total_size": 0}, "weight_map": weight_map}
    doc.update(extra or {})
    p = tmp_path / "model.kiln.index.json"
    p.write_text(json.dumps(doc))
    return p


@pytest.mark.parametrize("shard", ["../outside.kiln", "/abs/outside.kiln", "sub/x.kiln",
                                   "sub\\x.kiln", "c:x.kiln", "..", "x.safetensors",
                                   ".kiln", "", "x.kiln\0", 7])
def test_an_index_naming_files_outside_its_folder_is_refused(api, tmp_path, shard):
    kiln.save_tensors(tmp_path / "outside.kiln", {"w": np.ones(2)})   # a valid file to lure
    (tmp_path / "in").mkdir()
    p = _index(tmp_path / "in", {"w": shard})
    with pytest.raises(kiln.KilnError) as e:
        kiln.open(p)
    assert e.value.code == "TYPE" and "'w'" in e.value.reason
    assert e.value.offset == p.read_bytes().find(b'"w"')


@pytest.mark.parametrize("text, code, offset", [
    (b'{"weight_map": {"a": "x.kiln", "a": "y.kiln"}}', "FRAME", 0),   # a repeated key
    (b'{"weight_map": {"a": "x.kiln"}', "FRAME", 30),                  # cut short
    (b'{"weight_map": ["x.kiln"]}', "TYPE", 0),
    (b'{"metadata": {"total_size": -1}, "weight_map": {}}', "TYPE", 14),
    (b'{"metadata": {"total_size": true}, "weight_map": {}}', "TYPE", 14),
    (b'{"metadata": {"total_size": NaN}, "weight_map": {}}', "FRAME", 0),
    (b'{"metadata": [], "weight_map": {}}', "TYPE", 1),
    (b'{"weight_map": {"__metadata__": "x.kiln"}}', "TYPE", 16),
    (b'\xff{"weight_map": {}}', "UTF8", 0),
    (b'[]', "TYPE", 0),
])
def test_a_malformed_index_is_a_kiln_error(tmp_path, text, code, offset):
    p = tmp_path / "model.kiln.index.json"
    p.write_bytes(text)
    with pytest.raises(kiln.KilnError) as e:
        kiln.open(p)
    assert (e.value.code, e.value.offset) == (code, offset), e.value


def test_an_index_above_the_cap_is_limit(tmp_path, monkeypatch):
    from kiln._files import sharded
    monkeypatch.setattr(sharded, "MAX_INDEX", 100)
    p = _index(tmp_path, {"w%d" % i: "x.kiln" for i in range(20)})
    with pytest.raises(kiln.KilnError) as e:
        kiln.open(p)
    assert e.value.code == "LIMIT"


def test_total_size_is_not_trusted(api, tmp_path):
    kiln.save_tensors(tmp_path / "a.kiln", {"w": np.ones(2)})
    p = _index(tmp_path, {"w": "a.kiln"}, {"metadata": {"total_size": 10 ** 15}})
    with kiln.open(p) as f:
        assert f["w"].numpy().tolist() == [1.0, 1.0] and f.total_size == 10 ** 15


def test_shards_must_hold_exactly_what_the_index_maps_to_them(api, tmp_path):
    kiln.save_tensors(tmp_path / "a.kiln", {"u": np.ones(2), "w": np.zeros(2)})
    kiln.save_tensors(tmp_path / "b.kiln", {"v": np.ones(3), "w": np.ones(4)})
    # "w" is in both shards: the index maps it to a.kiln, so b.kiln holds a stranger
    p = _index(tmp_path, {"u": "a.kiln", "w": "a.kiln", "v": "b.kiln"})
    with kiln.open(p) as f:
        assert f["u"].numpy().tolist() == [1.0, 1.0]
        with pytest.raises(kiln.KilnError) as e:
            f["v"]
        assert e.value.code == "TYPE" and "'w'" in e.value.reason and "b.kiln" in e.value.reason
        assert e.value.offset == 64 + 128 * 1 + 4   # b.kiln's second descriptor, its name field
    # the index lists a tensor the shard does not hold
    p = _index(tmp_path, {"u": "a.kiln", "w": "a.kiln", "ghost": "a.kiln",
                          "v": "b.kiln"})
    with kiln.open(p) as f:
        with pytest.raises(kiln.KilnError) as e:
            f["u"]
        assert e.value.code == "TYPE" and "'ghost'" in e.value.reason
    # a shard holding a tensor the index does not list at all
    p = _index(tmp_path, {"u": "a.kiln"})
    with kiln.open(p) as f:
        with pytest.raises(kiln.KilnError, match="'w'"):
            f["u"]


def test_reopening_an_index_rewritten_in_place_reads_the_new_one(api, tmp_path):
    # kiln remembers the last indexes it parsed by their bytes: an index another
    # process rewrote (same path, same size, same second) must be read anew
    kiln.save_tensors(tmp_path / "a.kiln", {"u": np.ones(2)})
    kiln.save_tensors(tmp_path / "b.kiln", {"v": np.full(3, 2.0)})
    kiln.save_tensors(tmp_path / "c.kiln", {"v": np.full(3, 7.0)})
    p = _index(tmp_path, {"u": "a.kiln", "v": "b.kiln"})
    first = p.read_bytes()
    with kiln.open(p) as f:
        assert f["v"].numpy().tolist() == [2.0, 2.0, 2.0]
        f.weight_map["v"] = "a.kiln"   # a copy: changes neither this open nor the next
        f.shards.append("x.kiln")
        f.keys().append("x")
    with open(p, "r+b") as out:   # in place: same inode, same length
        out.write(first.replace(b'"b.kiln"', b'"c.kiln"'))
    assert len(p.read_bytes()) == len(first)
    with kiln.open(p) as f:
        assert f["v"].numpy().tolist() == [7.0, 7.0, 7.0]
        assert f.weight_map == {"u": "a.kiln", "v": "c.kiln"}
        assert f.shards == ["a.kiln", "c.kiln"] and f.keys() == ["u", "v"]
    with open(p, "r+b") as out:
        out.write(first)
    with kiln.open(p) as f:
        assert f["v"].numpy().tolist() == [2.0, 2.0, 2.0]
        assert f.shards == ["a.kiln", "b.kiln"] and len(f) == 2


def test_a_remote_set_opens_each_shard_on_first_use(api, tmp_path):
    pytest.importorskip("fsspec", reason="needs fsspec, the [remote] extra")
    from _servers import RangeServer
    t = _tensors()
    kiln.save_sharded(t, tmp_path, max_shard_size=8000, checksum=True)
    os.remove(tmp_path / "model-00004-of-00004.kiln")
    with RangeServer(tmp_path) as server:
        with kiln.open(server.url + "model.kiln.index.json") as f:
            assert isinstance(f, kiln.ShardedFile) and len(f) == 6
            assert f["l3.w"].numpy().tolist() == t["l3.w"].tolist()
            assert f.rows("l0.w", 1, 3).tolist() == [1.0, 2.0]
            with pytest.raises(FileNotFoundError):
                f["z.big"]


# --- kiln convert --------------------------------------------------------------

def _st_set(tmp_path):
    """A sharded safetensors set written by the safetensors package, with a
    hand-written index (as transformers writes one)."""
    stnp = pytest.importorskip("safetensors.numpy")
    src = tmp_path / "st"
    src.mkdir()
    one = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "m": np.array([True, False])}
    two = {"b": np.arange(5, dtype=np.int16), "c": np.full(3, 0.5, np.float16)}
    stnp.save_file(one, str(src / "model-00001-of-00002.safetensors"), metadata={"format": "pt"})
    stnp.save_file(two, str(src / "model-00002-of-00002.safetensors"), metadata={"format": "pt"})
    index = {"metadata": {"total_size": 36, "total_parameters": 16}, "weight_map": {
        "a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors",
        "c": "model-00002-of-00002.safetensors", "m": "model-00001-of-00002.safetensors"}}
    (src / "model.safetensors.index.json").write_text(json.dumps(index))
    return src, dict(one, **two), index


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "kiln", *map(str, args)], capture_output=True,
                          text=True, timeout=120)


def test_convert_a_safetensors_set_to_kiln_and_back_bit_exact(tmp_path):
    stnp = pytest.importorskip("safetensors.numpy")
    src, tensors, index = _st_set(tmp_path)
    r = _cli("convert", src / "model.safetensors.index.json", tmp_path / "k" /
             "model.kiln.index.json", "--checksum")
    assert r.returncode == 0, r.stderr
    doc = json.loads((tmp_path / "k" / "model.kiln.index.json").read_text())
    assert doc == {"metadata": index["metadata"], "weight_map": {
        k: v.replace(".safetensors", ".kiln") for k, v in index["weight_map"].items()}}
    with kiln.open(tmp_path / "k") as f:
        for name, a in tensors.items():
            assert f[name].numpy().tobytes() == a.tobytes()
        assert f.metadata == {"format": "pt"}
        f.verify()
    r = _cli("convert", tmp_path / "k" / "model.kiln.index.json",
             tmp_path / "back" / "model.safetensors.index.json")
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "back" / "model.safetensors.index.json").read_text()) == index
    for shard in ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"):
        back = stnp.load_file(str(tmp_path / "back" / shard))
        orig = stnp.load_file(str(src / shard))
        assert list(back) == list(orig)
        for name in orig:
            assert back[name].dtype == orig[name].dtype and back[name].tobytes() == \
                orig[name].tobytes()


def test_convert_a_set_to_one_file(api, tmp_path):
    src, tensors, index = _st_set(tmp_path)
    r = _cli("convert", src / "model.safetensors.index.json", tmp_path / "one.kiln")
    assert r.returncode == 0, r.stderr        # before: FRAME at byte 0: unknown format '.json'
    assert [n for n, _ in _ref_names(tmp_path / "one.kiln")] == list(index["weight_map"])
    for n, payload in _ref_names(tmp_path / "one.kiln"):
        assert payload == tensors[n].tobytes()
    assert kiln.load_metadata(tmp_path / "one.kiln") == {"format": "pt"}
    # a kiln set to one file keeps its checksums
    ks = kiln.save_sharded(tensors, tmp_path / "ks", max_shard_size=20, checksum=True,
                           metadata={"step": 1})
    kiln.convert.convert(ks, str(tmp_path / "two.kiln"))
    with kiln.open(tmp_path / "two.kiln") as f:
        assert f.checksums is not None and f.metadata == {"step": 1}
        assert sorted(f.keys()) == sorted(tensors)
        f.verify()


def test_converting_a_hostile_set_writes_nothing(tmp_path):
    src, _, index = _st_set(tmp_path)
    (tmp_path / "evil.safetensors").write_bytes((src / "model-00001-of-00002.safetensors")
                                                .read_bytes())
    bad = dict(index, weight_map=dict(index["weight_map"], a="../evil.safetensors"))
    (src / "model.safetensors.index.json").write_text(json.dumps(bad))
    r = _cli("convert", src / "model.safetensors.index.json", tmp_path / "k" /
             "model.kiln.index.json")
    assert r.returncode == 1 and "TYPE" in r.stderr and "outside" in r.stderr
    assert not (tmp_path / "k").exists()
    # a shard holding a tensor its index does not list
    wm = dict(index["weight_map"])
    del wm["m"]
    (src / "model.safetensors.index.json").write_text(json.dumps(dict(index, weight_map=wm)))
    for dst in (tmp_path / "k" / "model.kiln.index.json", tmp_path / "one.kiln"):
        r = _cli("convert", src / "model.safetensors.index.json", dst)
        assert r.returncode == 1 and "'m'" in r.stderr, r.stderr
        assert not os.path.exists(dst)


def test_kiln_check_of_a_set_checks_every_shard(tmp_path):
    kiln.save_sharded(_tensors(), tmp_path, max_shard_size=8000, checksum=True)
    r = _cli("check", tmp_path)
    assert r.returncode == 0 and "a set of 4 shards" in r.stdout and \
        "match the CRC-32 recorded for each of the 6 tensors" in r.stdout, r.stdout + r.stderr
    p = tmp_path / "model-00004-of-00004.kiln"
    buf = bytearray(p.read_bytes())
    buf[buf.find(_tensors()["z.big"].tobytes()) + 100] ^= 1
    p.write_bytes(bytes(buf))
    r = _cli("check", tmp_path / "model.kiln.index.json")
    assert r.returncode == 1 and "CHECKSUM at byte" in r.stdout and "'z.big'" in r.stdout


def test_kiln_inspect_of_a_set_lists_every_shard_and_tensor(tmp_path):
    t = _tensors()
    kiln.save_sharded(t, tmp_path, max_shard_size=8000, metadata={"step": 3})
    wm = json.loads((tmp_path / "model.kiln.index.json").read_text())["weight_map"]
    r = _cli("inspect", tmp_path, "--json")
    assert r.returncode == 0, r.stderr     # before: "sh is a directory, not a Kiln file"
    rep = json.loads(r.stdout)
    assert rep["kind"] == "sharded set" and rep["metadata"] == {"step": 3}
    assert [(x["name"], x["shard"], x["bytes"]) for x in rep["tensors"]] == \
        [(n, wm[n], t[n].nbytes) for n in wm]
    assert [(s["file"], s["tensors"], s["size"]) for s in rep["shards"]] == [
        (s, list(wm.values()).count(s), os.path.getsize(tmp_path / s))
        for s in dict.fromkeys(wm.values())]
    r = _cli("inspect", tmp_path / "model.kiln.index.json")
    assert r.returncode == 0 and "6 tensors in 4 shards, 40000 payload bytes" in r.stdout
    for n, s in wm.items():
        assert any(ln.split()[0] == n and ln.split()[-1] == s for ln in r.stdout.splitlines())
    # a URL: each shard's first 64 KiB fetched (its header and table), not its payloads
    pytest.importorskip("fsspec", reason="needs fsspec, the [remote] extra")
    from _servers import RangeServer
    big = {"w%d" % i: np.full(1 << 18, i, dtype=np.uint8) for i in range(3)}
    kiln.save_sharded(big, tmp_path / "big", max_shard_size=300_000)
    with RangeServer(tmp_path / "big") as server:
        r = _cli("inspect", server.url + "model.kiln.index.json", "--json")
        assert r.returncode == 0, r.stderr
        assert [(x["name"], x["shard"]) for x in json.loads(r.stdout)["tensors"]] == [
            ("w%d" % i, "model-%05d-of-00003.kiln" % (i + 1)) for i in range(3)]
        assert server.sent < 3 * (64 << 10) + 8192, server.sent   # of 786,432 payload bytes
    # a shard that holds other names than the index says: exit 1 naming it
    os.remove(tmp_path / "model-00002-of-00004.kiln")
    kiln.save_tensors(tmp_path / "model-00002-of-00004.kiln", {"other": np.ones(2)})
    r = _cli("inspect", tmp_path)
    assert r.returncode == 1 and "model-00002-of-00004.kiln" in r.stderr, r.stderr
    # a shard whose header is damaged: the fault named in that shard, at its byte
    raw = bytearray((tmp_path / "model-00003-of-00004.kiln").read_bytes())
    raw[24:32] = (1 << 40).to_bytes(8, "little")
    (tmp_path / "model-00002-of-00004.kiln").write_bytes(bytes(raw))
    r = _cli("inspect", tmp_path)
    assert r.returncode == 1 and r.stderr.startswith(
        "kiln inspect: %s: " % (tmp_path / "model-00002-of-00004.kiln")) and \
        " at byte " in r.stderr and "Traceback" not in r.stderr, r.stderr
    # a folder holding two indexes: which one is asked, no traceback
    (tmp_path / "other.kiln.index.json").write_text("{}")
    for cmd in ("inspect", "check"):
        r = _cli(cmd, tmp_path)
        assert r.returncode == 2 and "holds 2" in r.stderr and "Traceback" not in r.stderr, \
            r.stderr


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_an_index_that_is_a_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "model.kiln.index.json"
    os.mkfifo(fifo)
    child = ("import sys, kiln\n"
             "try:\n    kiln.open(sys.argv[1])\n"
             "except OSError as e:\n    print(type(e).__name__, e)\n")
    r = subprocess.run([sys.executable, "-c", child, str(fifo)], capture_output=True,
                       text=True, timeout=30)   # a blocked open is killed here, and fails
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("NotAFile") and "a FIFO, not a regular file" in r.stdout, r.stdout
