"""Sharded sets as checkpoints are written (issue 49, items 2, 5, 6 and 7):
a tensor saved under two names is stored once across a set, a set saved over
another is replaced whole or not at all (the writer killed at every step),
shard names never reach another path on a server, and every path kiln opens
is a regular file (a FIFO is refused at once, never waited on).

Oracles: the reference decoder for what each shard holds, hand-written
names, sizes and expectations, and a real child process killed by SIGKILL."""

import functools
import http.server
import json
import os
import subprocess
import sys
import threading
import textwrap

import numpy as np
import pytest

import kiln
from _util import kiln_ref


def _ref_tensors(path):
    with open(path, "rb") as f:
        ts, _ = kiln_ref.read_directory(f.read(), 0)
    return {t["name"]: bytes(t["payload"]) for t in ts if t["name"] != "__metadata__"}


def _index(folder, name="model.kiln.index.json"):
    with open(os.path.join(folder, name)) as f:
        return json.load(f)


# --- item 2: shared tensors stored once across a set ------------------------------

def test_the_same_array_under_two_names_is_stored_once(api, tmp_path):
    emb = np.arange(1000, dtype=np.float32)
    other = np.ones(1000, np.float32)
    kiln.save_sharded({"wte": emb, "lm_head": emb, "x": other}, tmp_path, max_shard_size=4000)
    ix = _index(tmp_path)
    # "lm_head" < "wte": the first name in sorted order is the stored one
    assert sorted(ix["weight_map"]) == ["lm_head", "x"]
    assert ix["metadata"] == {"total_size": 8000, "__kiln_aliases__": {"wte": "lm_head"}}
    stored = {}
    for shard in set(ix["weight_map"].values()):
        stored.update(_ref_tensors(tmp_path / shard))
    assert stored == {"lm_head": emb.tobytes(), "x": other.tobytes()}
    with kiln.open(tmp_path) as f:
        assert f.aliases == {"wte": "lm_head"}
        assert f.keys() == ["lm_head", "x"] and "wte" in f
        assert f["wte"].numpy().tolist() == emb.tolist()
        d = f.tensors()
        assert list(d) == ["lm_head", "x", "wte"] and d["wte"] is d["lm_head"]


def test_views_of_one_buffer_that_differ_are_stored_apart(api, tmp_path):
    base = np.arange(8, dtype=np.float32)
    kiln.save_sharded({"a": base[:4], "b": base[4:], "c": base.reshape(2, 4)}, tmp_path)
    ix = _index(tmp_path)
    assert sorted(ix["weight_map"]) == ["a", "b", "c"] and "__kiln_aliases__" not in ix["metadata"]


def test_explicit_aliases_are_checked_and_kept(api, tmp_path):
    t = {"a": np.zeros(3, np.float32)}
    kiln.save_sharded(t, tmp_path, aliases={"b": "a"})
    with kiln.open(tmp_path) as f:
        assert f.aliases == {"b": "a"} and f["b"].numpy().tolist() == [0.0, 0.0, 0.0]
    for bad in ({"a": "a"}, {"b": "nope"}, {"a": "b"}, {"": "a"}, {"c": "b", "b": "a"}):
        with pytest.raises(kiln.EncodeError):
            kiln.save_sharded(t, tmp_path / "bad", aliases=bad)


@pytest.mark.parametrize("aliases, why", [
    ([1], "is not an object"),
    ({"b": "zz"}, "which is not a stored tensor"),
    ({"a": "a"}, "a stored tensor's name"),
    ({"__metadata__": "a"}, "not a non-empty, unreserved name"),
])
def test_an_index_with_bad_aliases_is_refused(api, tmp_path, aliases, why):
    kiln.save_sharded({"a": np.zeros(3, np.float32)}, tmp_path)
    ix = _index(tmp_path)
    ix["metadata"]["__kiln_aliases__"] = aliases
    raw = json.dumps(ix).encode()
    (tmp_path / "model.kiln.index.json").write_bytes(raw)
    with pytest.raises(kiln.KilnError) as e:
        kiln.open(tmp_path)
    assert e.value.code == "TYPE" and why in str(e.value)
    assert e.value.offset == raw.index(b'"__kiln_aliases__"')


# --- item 5: a set is replaced whole or not at all --------------------------------

def _old_and_new(tmp_path):
    old = {"a": np.full(1000, 1.0, np.float32), "b": np.zeros(1000, np.bool_)}
    new = {"a": np.full(1000, 2.0, np.float32), "b": np.ones(1000, np.bool_)}
    return old, new


def _state(folder):
    """"old", "new", or what is wrong: the set must open whole and be one of them."""
    with kiln.open(folder) as f:
        got = {k: f[k].numpy() for k in f.keys()}
    if got["a"][0] == 1.0 and not got["b"].any():
        return "old"
    if got["a"][0] == 2.0 and got["b"].all():
        return "new"
    return "mixed: a=%s b=%s" % (got["a"][0], got["b"][0])


_KILLER = textwrap.dedent("""
    import os, signal, sys
    import numpy as np
    import kiln
    from kiln._files import shardsave as sharded
    steps = {"n": 0}
    stop_at = int(sys.argv[2])
    def step(fn):
        def wrapped(*a, **k):
            out = fn(*a, **k)
            steps["n"] += 1
            if steps["n"] == stop_at:
                os.kill(os.getpid(), signal.SIGKILL)
            return out
        return wrapped
    import kiln._files.save as save
    save.save_records = step(save.save_records)   # save_sharded imports it when called
    sharded.write_index = step(sharded.write_index)
    real_remove = os.remove
    os.remove = step(real_remove)
    new = {"a": np.full(1000, 2.0, np.float32), "b": np.ones(1000, np.bool_)}
    kiln.save_sharded(new, sys.argv[1], max_shard_size=4000)
    print("done", steps["n"])
""")


def test_a_writer_killed_at_each_step_leaves_the_old_set_or_the_new(tmp_path):
    old, _ = _old_and_new(tmp_path)
    seen = []
    for stop_at in range(1, 10):
        folder = tmp_path / ("s%d" % stop_at)
        kiln.save_sharded(old, folder, max_shard_size=4000)
        assert _state(folder) == "old"
        r = subprocess.run([sys.executable, "-c", _KILLER, str(folder), str(stop_at)],
                           capture_output=True, text=True, timeout=120)
        state = _state(folder)
        seen.append(state)
        if r.returncode == 0:   # ran past the last step: done, new set, old shards gone
            assert r.stdout.startswith("done"), r.stderr
            assert state == "new"
            assert sorted(os.listdir(folder)) == sorted(
                set(_index(folder)["weight_map"].values()) | {"model.kiln.index.json"})
            break
        assert r.returncode == -9, r.stderr
        assert state in ("old", "new"), (stop_at, state)
    # steps: two shards, the index, two removals: killed after 1 and 2 the old set
    # is whole; after the index (3) and each removal the new one is
    assert seen[:5] == ["old", "old", "new", "new", "new"] and seen[-1] == "new", seen


def test_a_refused_save_leaves_the_old_set_and_no_new_files(api, tmp_path):
    old, new = _old_and_new(tmp_path)
    kiln.save_sharded(old, tmp_path, max_shard_size=4000)
    before = sorted(os.listdir(tmp_path))
    bad = dict(new, z=np.zeros(3, np.complex64))   # refused in the last shard
    with pytest.raises((kiln.EncodeError, TypeError)):
        kiln.save_sharded(bad, tmp_path, max_shard_size=4000)
    assert _state(tmp_path) == "old" and sorted(os.listdir(tmp_path)) == before


def test_a_second_save_replaces_the_set_and_removes_the_old_shards(api, tmp_path):
    old, new = _old_and_new(tmp_path)
    kiln.save_sharded(old, tmp_path, max_shard_size=4000)
    kiln.save_sharded(new, tmp_path, max_shard_size=4000)
    assert _state(tmp_path) == "new"
    shards = sorted(set(_index(tmp_path)["weight_map"].values()))
    assert len(shards) == 2 and all(".kiln" in s and "-of-00002" in s for s in shards)
    assert sorted(os.listdir(tmp_path)) == sorted(shards + ["model.kiln.index.json"])
    kiln.save_sharded({"a": old["a"]}, tmp_path)   # one shard now: the two others removed
    (one,) = set(_index(tmp_path)["weight_map"].values())
    assert sorted(os.listdir(tmp_path)) == [one, "model.kiln.index.json"]
    # a name of the first set (the plain one) never comes back (issue 56 item 4)
    assert one.startswith("model-00001-of-00001.") and one != "model-00001-of-00001.kiln"


def test_kiln_convert_into_an_existing_set_replaces_it_whole(tmp_path):
    stnp = pytest.importorskip("safetensors.numpy")
    src = tmp_path / "st"
    src.mkdir()
    for i, v in enumerate((3.0, 4.0)):
        stnp.save_file({"t%d" % i: np.full(4, v, np.float32)},
                       str(src / ("model-%05d-of-00002.safetensors" % (i + 1))))
    (src / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": {
        "t0": "model-00001-of-00002.safetensors", "t1": "model-00002-of-00002.safetensors"}}))
    dst = tmp_path / "out"
    kiln.save_sharded({"t0": np.zeros(4, np.float32), "t1": np.zeros(4, np.float32)}, dst,
                      max_shard_size=16)
    old_files = sorted(os.listdir(dst))
    r = subprocess.run([sys.executable, "-m", "kiln", "convert",
                        str(src / "model.safetensors.index.json"),
                        str(dst / "model.kiln.index.json")], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    with kiln.open(dst) as f:
        assert f["t0"].numpy().tolist() == [3.0] * 4 and f["t1"].numpy().tolist() == [4.0] * 4
    now = sorted(os.listdir(dst))
    assert not set(now) & set(old_files) - {"model.kiln.index.json"}, (old_files, now)
    assert len(now) == 3


# --- item 6: shard names are never paths on a server -------------------------------

class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture
def decoding_server(tmp_path):
    """Python's own http.server over tmp_path: it decodes %-escapes in paths
    (and answers without ranges)."""
    handler = functools.partial(_Quiet, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield "http://127.0.0.1:%d/" % server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


@pytest.mark.parametrize("name", ["%2e%2e%2f%2e%2e%2fprivate%2fsecret.kiln",
                                  "..%2Fsecret.kiln", "%2E%2E", "a%5Cb.kiln", "a%00.kiln",
                                  "%ff.kiln"])
def test_an_encoded_path_in_a_shard_name_is_refused(api, tmp_path, decoding_server, name):
    (tmp_path / "private").mkdir()
    kiln.save_tensors(tmp_path / "private" / "secret.kiln", {"s": np.ones(2, np.float32)})
    sets = tmp_path / "sets" / "a"
    sets.mkdir(parents=True)
    raw = json.dumps({"metadata": {}, "weight_map": {"s": name}}).encode()
    (sets / "model.kiln.index.json").write_bytes(raw)
    for where in (str(sets), decoding_server + "sets/a/model.kiln.index.json"):
        with pytest.raises(kiln.KilnError) as e:
            kiln.open(where)
        assert e.value.code == "TYPE" and "not a file name" in str(e.value)


def test_shard_names_are_percent_encoded_and_the_query_kept(api, tmp_path, decoding_server):
    pytest.importorskip("fsspec", reason="needs fsspec, the [remote] extra")
    t = {"a": np.arange(3, dtype=np.float32), "b": np.ones(3, np.float32)}
    kiln.save_sharded(t, tmp_path, prefix="my model#1", max_shard_size=12)
    shards = sorted(set(_index(tmp_path, "my model#1.kiln.index.json")["weight_map"].values()))
    assert shards == ["my model#1-00001-of-00002.kiln", "my model#1-00002-of-00002.kiln"]
    url = decoding_server + "my%20model%231.kiln.index.json?token=x"
    assert kiln.files.ShardedFile is type(kiln.open(url))
    with kiln.open(url) as f:
        assert f.shard_path(shards[0]) == \
            decoding_server + "my%20model%231-00001-of-00002.kiln?token=x"
        assert f["b"].numpy().tolist() == [1.0, 1.0, 1.0]
        assert f["a"].numpy().tolist() == [0.0, 1.0, 2.0]


# --- item 7: a FIFO anywhere kiln opens a path is refused at once ------------------

def _fifo(path):
    os.mkfifo(path)
    return str(path)


def _in_child(code, timeout=60):
    """Run ``code`` in a child (a call that blocks on the FIFO would hang the
    test otherwise); the child is killed at ``timeout``."""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=timeout)
    return r.returncode, r.stdout + r.stderr


def test_a_fifo_shard_is_refused_by_kiln_convert(tmp_path):
    stnp = pytest.importorskip("safetensors.numpy")
    src = tmp_path / "st"
    src.mkdir()
    stnp.save_file({"a": np.ones(3, np.float32)}, str(src / "model-00001-of-00002.safetensors"))
    _fifo(src / "model-00002-of-00002.safetensors")
    (src / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": {
        "a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}))
    for dst in ("out/model.kiln.index.json", "one.kiln"):
        rc, out = _in_child("import sys; from kiln.cli import main; sys.exit(main(["
                            "'convert', %r, %r]))" % (str(src / "model.safetensors.index.json"),
                                                      str(tmp_path / dst)))
        assert rc == 2 and "is a FIFO, not a regular file" in out, out


@pytest.mark.parametrize("call", [
    "kiln.RecordFile(P, 'i64')",
    "kiln.convert.convert(P + '.kiln', P + '.out.safetensors')",
    "kiln.convert.convert(P + '.gguf', P + '.kiln')",
    "kiln.convert.convert(P + '.safetensors', P + '.kiln')",
    "kiln.convert.convert(P + '.npz', P + '.kiln')",
    "w = kiln.TensorWriter(P + '.out', ); w.add('a', 'f32', (1,)); w.write_from('a', P, 0)",
    "from kiln.cli import main; main(['gen', P])",
    "from kiln.cli import main; main(['cases', P])",
])
def test_a_fifo_is_refused_at_once_everywhere(tmp_path, call):
    p = str(tmp_path / "f")
    for q in (p, p + ".kiln", p + ".safetensors", p + ".npz", p + ".gguf"):
        _fifo(q)
    rc, out = _in_child("import kiln, kiln.convert\nP = %r\ntry:\n    %s\nexcept "
                        "(OSError, kiln.KilnError, SystemExit) as e:\n    print('refused', e)\n"
                        % (p, call))
    assert "FIFO" in out and rc == 0, out
