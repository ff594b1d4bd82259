"""Tied names (one stored tensor under several names), issue 56: one check of
an alias map (kiln._files.tied.alias_fault) for a set's index and a file's
metadata, one rule for "two values are one tensor" (same_memory_key), the
two keys named for where each lives, and `kiln convert` of a set into one
.kiln file keeping the set's aliases (item 11).  Both kernels.

Oracles: hand-written alias maps and expected faults, the reference decoder
for what the converted file stores, torch's own tensors for load_file."""

import json
import subprocess
import sys

import numpy as np
import pytest

import kiln
from _util import kiln_ref
from kiln._files.tied import FILE_ALIASES_KEY, SET_ALIASES_KEY, alias_fault, same_memory_key


def test_the_two_keys_are_named_for_where_they_live():
    assert SET_ALIASES_KEY == "__kiln_aliases__"          # a set's index metadata
    assert FILE_ALIASES_KEY == "__kiln_torch_aliases__"   # one file's metadata
    import kiln._files.sharded as sharded
    assert not hasattr(sharded, "ALIASES_KEY")   # no second constant of that name


@pytest.mark.parametrize("found, why", [
    ({"b": "a"}, None),
    ({"b": "a", "c": "a"}, None),
    ({}, None),
    ([["b", "a"]], "is not an object"),
    ({"a": "a"}, "a stored tensor's name"),
    ({"b": "c"}, "'c', which is not a stored tensor"),
    ({"c": "b", "b": "a"}, "'b', which is not a stored tensor"),   # an alias of an alias
    ({"": "a"}, "not a non-empty, unreserved name"),
    ({"__metadata__": "a"}, "not a non-empty, unreserved name"),
    ({1: "a"}, "not a non-empty, unreserved name"),
    ({"b": 1}, "1, which is not a stored tensor"),
])
def test_one_rule_for_an_alias_map(found, why):
    got = alias_fault(found, {"a"})
    assert got is None if why is None else why in got, got


def test_same_memory_key_is_one_tensor_rule():
    base = np.arange(8, dtype=np.float32)
    assert same_memory_key(base) == same_memory_key(base[:])        # one memory, one shape
    assert same_memory_key(base[:4]) != same_memory_key(base[4:])   # other memory
    assert same_memory_key(base) != same_memory_key(base.reshape(2, 4))
    assert same_memory_key(base) != same_memory_key(base.view(np.int32))
    assert same_memory_key(np.zeros(0, np.float32)) is None          # nothing to share
    obj = object()
    assert same_memory_key(obj) == same_memory_key(obj) != same_memory_key(object())


def test_same_memory_key_of_torch_tensors():
    torch = pytest.importorskip("torch")
    w = torch.arange(6.0)
    assert same_memory_key(w) == same_memory_key(w.view(6))
    assert same_memory_key(w) != same_memory_key(w.view(2, 3))
    assert same_memory_key(w.neg().neg()) != same_memory_key(w)
    assert same_memory_key(torch._neg_view(w)) is None   # stored as its values, apart
    assert same_memory_key(torch.empty(0)) is None
    assert same_memory_key(torch.empty(3, device="meta")) is None


def test_save_sharded_refuses_a_bad_alias_map_by_the_one_rule(api, tmp_path):
    t = {"a": np.zeros(3, np.float32)}
    for bad, why in (({"b": "nope"}, "not a stored tensor"), ({"a": "a"}, "stored tensor's"),
                     ({"__metadata__": "a"}, "unreserved")):
        with pytest.raises(kiln.EncodeError) as e:
            kiln.save_sharded(t, tmp_path / "bad", aliases=bad)
        assert e.value.code == "TYPE" and why in str(e.value)


def _ref(path):
    with open(path, "rb") as f:
        ts, _ = kiln_ref.read_directory(f.read(), 0)
    return {t["name"]: bytes(t["payload"]) for t in ts}


def _tied_set(folder, metadata=None):
    emb = np.arange(12, dtype=np.float32)
    bias = np.full(3, 7.0, np.float32)
    index = kiln.save_sharded({"bias": bias, "emb.weight": emb, "head.weight": emb}, folder,
                              max_shard_size=16, metadata=metadata)
    with open(index) as f:
        assert json.load(f)["metadata"][SET_ALIASES_KEY] == {"head.weight": "emb.weight"}
    return index, emb, bias


def test_convert_of_a_set_into_one_file_keeps_its_tied_names(api, tmp_path):
    index, emb, bias = _tied_set(tmp_path / "set", metadata={"step": 4})
    with kiln.open(index) as f:
        set_names = sorted(f.tensors())
    assert set_names == ["bias", "emb.weight", "head.weight"]
    kiln.convert.convert(index, str(tmp_path / "one.kiln"))
    stored = _ref(tmp_path / "one.kiln")
    assert stored.pop("__metadata__")            # the metadata is there
    assert stored == {"bias": bias.tobytes(), "emb.weight": emb.tobytes()}   # stored once
    assert kiln.load_metadata(tmp_path / "one.kiln") == {
        "step": 4, FILE_ALIASES_KEY: {"head.weight": "emb.weight"}}
    # the command line does the same
    r = subprocess.run([sys.executable, "-m", "kiln", "convert", index,
                        str(tmp_path / "cli.kiln")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert kiln.load_metadata(tmp_path / "cli.kiln") == kiln.load_metadata(tmp_path / "one.kiln")


def test_convert_of_a_set_without_metadata_gives_the_aliases_only(api, tmp_path):
    index, _, _ = _tied_set(tmp_path / "set")
    kiln.convert.convert(index, str(tmp_path / "one.kiln"))
    assert kiln.load_metadata(tmp_path / "one.kiln") == {
        FILE_ALIASES_KEY: {"head.weight": "emb.weight"}}   # was None: the tied name lost


def test_kiln_torch_reads_every_name_of_the_converted_set(api, tmp_path):
    torch = pytest.importorskip("torch")
    import kiln.torch as kt
    index, emb, bias = _tied_set(tmp_path / "set")
    kiln.convert.convert(index, str(tmp_path / "one.kiln"))
    sd = kt.load_file(str(tmp_path / "one.kiln"))
    assert sorted(sd) == ["bias", "emb.weight", "head.weight"]
    assert torch.equal(sd["head.weight"], torch.from_numpy(emb))
    assert sd["head.weight"] is sd["emb.weight"]
    assert torch.equal(sd["bias"], torch.from_numpy(bias))


def test_kiln_torch_uses_the_file_key_and_the_one_rule(api, tmp_path):
    """kiln.torch's public ALIASES_KEY is the file key, and load_file / load
    (bytes) check a file's alias map by alias_fault: an empty or reserved
    alias, an alias of an alias, a non-object are refused (load took an empty
    name and a reserved one before, and `load` a list as "no aliases")."""
    torch = pytest.importorskip("torch")
    import kiln.torch as kt
    assert kt.ALIASES_KEY == FILE_ALIASES_KEY
    a = np.arange(3, dtype=np.float32)
    for bad, why in (({"": "a"}, "unreserved"), ({"__metadata__": "a"}, "unreserved"),
                     ({"c": "b", "b": "a"}, "not a stored tensor"), ([], "not an object")):
        p = tmp_path / "bad.kiln"
        kiln.save_tensors(p, {"a": a}, metadata={FILE_ALIASES_KEY: bad})
        with pytest.raises(kiln.KilnError) as e:
            kt.load_file(str(p))
        assert e.value.code == "TYPE" and why in str(e.value), str(e.value)
        with pytest.raises(kiln.KilnError) as e:
            kt.load(p.read_bytes())
        assert e.value.code == "TYPE" and why in str(e.value), str(e.value)
    kiln.save_tensors(tmp_path / "ok.kiln", {"a": a}, metadata={FILE_ALIASES_KEY: {"b": "a"}})
    sd = kt.load((tmp_path / "ok.kiln").read_bytes())
    assert sorted(sd) == ["a", "b"] and sd["b"] is sd["a"]
    assert torch.equal(kt.load_file(str(tmp_path / "ok.kiln"))["b"], torch.from_numpy(a))


def test_the_set_writer_and_kiln_torch_find_the_same_tied_names(api, tmp_path):
    """One "same tensor" rule (same_memory_key) for kiln.save_sharded and
    kiln.torch's writers, each checked against a hand-written alias map (a
    tensor with its negation bit set is stored apart by both; the set writer
    shared two such names before), and every loaded value against the input."""
    torch = pytest.importorskip("torch")
    import kiln.torch as kt
    w = torch.arange(8.0)
    neg = torch._neg_view(w)
    cases = [
        ({"a": w, "b": w}, {"b": "a"}),                              # tied
        ({"a": w[:4], "b": w[4:]}, {}),                              # other memory: apart
        ({"n1": neg, "n2": neg, "w": torch.ones(2)}, {}),            # negation bit: apart
        ({"e1": torch.empty(0), "e2": torch.empty(0), "x": torch.ones(1)}, {}),
    ]
    for i, (sd, expected) in enumerate(cases):
        folder = tmp_path / ("set%d" % i)
        kiln.save_sharded(sd, folder)
        with kiln.open(folder) as f:
            assert f.aliases == expected, (i, f.aliases)
            for name, value in sd.items():
                assert f[name].numpy().tolist() == value.tolist(), (i, name)
        path = str(tmp_path / ("f%d.kiln" % i))
        kt.save_file(sd, path)
        meta = kiln.load_metadata(path) or {}
        assert meta.get(FILE_ALIASES_KEY, {}) == expected, (i, meta)
        loaded = kt.load_file(path)
        assert sorted(loaded) == sorted(sd)
        for name, value in sd.items():
            assert loaded[name].tolist() == value.tolist(), (i, name)


def test_safe_open_checks_a_file_alias_map_by_the_one_rule(api, tmp_path):
    pytest.importorskip("torch")
    import kiln.torch as kt
    a = np.arange(3, dtype=np.float32)
    for bad, why in (({"": "a"}, "unreserved"), ({"__metadata__": "a"}, "unreserved"),
                     ({"c": "b", "b": "a"}, "not a stored tensor")):
        p = tmp_path / "bad.kiln"
        kiln.save_tensors(p, {"a": a}, metadata={FILE_ALIASES_KEY: bad})
        with pytest.raises(kiln.KilnError) as e:
            with kt.safe_open(str(p), framework="pt") as f:
                f.keys()
        assert e.value.code == "TYPE" and why in str(e.value), str(e.value)
    kiln.save_tensors(tmp_path / "ok.kiln", {"a": a}, metadata={FILE_ALIASES_KEY: {"b": "a"}})
    with kt.safe_open(str(tmp_path / "ok.kiln"), framework="pt") as f:
        assert f.get_tensor("b").tolist() == a.tolist()
