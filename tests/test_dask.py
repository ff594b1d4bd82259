"""Kiln on a real Dask cluster: ``dask scheduler`` and ``dask worker`` processes
over TCP on 127.0.0.1 (tests/_cluster.py) that import nothing of ours but the
kiln package: no preload, the tests not importable there, so whatever
registers kiln's serializers on a worker is kiln itself.  What the workers
run is kiln's, numpy's, dask's or the standard library's code (this module's
functions would not unpickle there) or a client script's own ``__main__``
functions, and which serializer ran is read from a log the workers keep of
every kiln value distributed serialized or deserialized (``SPY``).
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import kiln

distributed = pytest.importorskip("distributed")   # the [test] extra installs it
from distributed.protocol import deserialize, serialize  # noqa: E402

from _cluster import Cluster, plain_env  # noqa: E402
from _util import ROOT  # noqa: E402

# Installed on each worker with client.run(exec, SPY, {}) (exec is importable
# there, this module is not) and in the client script: every kiln value that
# goes through distributed's "dask" or "pickle" serializer family is logged as
# [dumps|loads, family, class, the keys of the family's sub-header].
SPY = r"""
import sys, distributed.protocol.serialize
_s = sys.modules["distributed.protocol.serialize"]   # (the package's "serialize" is a function)
if not hasattr(_s, "_kiln_log"):
    _s._kiln_log = []
    def _name(x):
        t = type(x)
        return t.__module__ + "." + t.__qualname__ if t.__module__.split(".")[0] == "kiln" \
            else None
    def _wrap(family, dumps, loads, wants_context):
        def spy_dumps(x, *args, **kwargs):
            header, frames = dumps(x, *args, **kwargs)
            if _name(x):
                _s._kiln_log.append(["dumps", family, _name(x),
                                     sorted(header.get("sub-header", {}))])
            return header, frames
        def spy_loads(header, frames):
            x = loads(header, frames)
            if _name(x):
                _s._kiln_log.append(["loads", family, _name(x),
                                     sorted(header.get("sub-header", {}))])
            return x
        return (spy_dumps if dumps else None, spy_loads, wants_context)
    for _f in ("dask", "pickle"):
        _s.families[_f] = _wrap(_f, *_s.families[_f])
"""
LOG = "__import__('sys').modules['distributed.protocol.serialize'].__dict__.get('_kiln_log')"
DIRECTORY = "kiln._tensors.directory.TensorDirectory"
KILN_DASK = ["dask", DIRECTORY, ["kiln-tensors"]]     # kiln's serializer, in the log


def test_tensors_serialize_as_frames_without_copies():
    buf = kiln.encode_tensors({"w": np.arange(1000, dtype=np.float32), "b": np.ones(3, np.int8)})
    d = kiln.decode_tensors(buf)
    header, frames = serialize(d, serializers=["dask"])
    assert header["serializer"] == "dask" and len(frames) == 2
    src = np.frombuffer(buf, np.uint8)
    assert all(np.shares_memory(np.frombuffer(f, np.uint8), src) for f in frames)
    back = deserialize(header, [bytes(f) for f in frames])   # read-only frames, as received
    assert back == d and back.names == d.names
    h, fr = serialize(d["w"], serializers=["dask"])
    assert deserialize(h, [memoryview(bytearray(fr[0]))]) == d["w"]


def test_every_dtype_and_quantization_link_survives_the_dask_serializer():
    from _mutation import directory_tensors
    buf = kiln.encode_tensors(directory_tensors())
    d = kiln.decode_tensors(buf)
    header, frames = serialize(d, serializers=["dask"])
    back = deserialize(header, [bytes(f) for f in frames])
    assert kiln.encode_tensors(back) == buf          # bit for bit, links and layouts included
    one = d["i.q"]
    h, fr = serialize(one, serializers=["dask"])
    t = deserialize(h, fr)
    assert (t.quant_scheme, t.quant_axis, t.group_size) == (2, 1, 4)
    assert (t.scale_index, t.outer_index) == (one.scale_index, one.outer_index)


@pytest.fixture(scope="module")
def cluster():
    """One plain cluster for the module: two workers."""
    with Cluster(workers=2) as c:
        yield c


@pytest.fixture(scope="module")
def client(cluster):
    from distributed import Client
    c = Client(cluster.address, timeout=60)
    try:
        c.wait_for_workers(2, timeout=120)
        yield c
    finally:
        c.close()


# The client script, run from a folder outside the checkout with only the kiln
# package importable.  It imports kiln before distributed (a worker meets kiln
# the other way round), never kiln.dask, and reports as JSON.
CLIENT = r"""
import hashlib, json, sys
import numpy as np
import kiln
from distributed import Client
""" + SPY + "SPY = %r\nLOG = %r\n" % (SPY, LOG) + r"""

def probe():
    import importlib.util, sys, dask
    return {"kiln": "kiln" in sys.modules, "kiln.dask": "kiln.dask" in sys.modules,
            "preload": list(dask.config.get("distributed.worker.preload", [])),
            "tests": [m for m in ("test_dask", "_cluster", "_util", "conftest")
                      if importlib.util.find_spec(m) is not None]}

def where():
    import os, sys
    k = sys.modules["kiln"]
    return [os.path.realpath(k.__file__), k.IMPLEMENTATION]

def describe(d):
    import hashlib
    return [type(d).__module__ + "." + type(d).__qualname__, list(d.keys()),
            [[t.dtype, list(t.shape), hashlib.sha256(t.data).hexdigest()] for t in d.values()]]

def make(seed):
    import kiln, numpy as np
    rng = np.random.default_rng(seed)
    return kiln.decode_tensors(kiln.encode_tensors({
        "w": rng.standard_normal((64, 64)).astype(np.float32),
        "i": np.arange(seed, seed + 5, dtype=np.int8)}))

def pair(seed):
    return [make(seed), make(seed + 1)]

def record(seed):
    return {"id": seed, "t": make(seed)}

c = Client(sys.argv[1], timeout=60)
c.wait_for_workers(2, timeout=120)
fresh, restarted = c.run(probe), False
if any(p["kiln"] for p in fresh.values()):   # (another test ran first) fresh workers
    c.restart()
    fresh, restarted = c.run(probe), True
a, b = sorted(c.scheduler_info()["workers"])
c.run(exec, SPY, {})
d = kiln.decode_tensors(kiln.encode_tensors({
    "w": np.arange(1000, dtype=np.float32).reshape(10, 100), "b": np.ones(3, np.int8),
    "h": kiln.Tensor(bytes(range(8)), dtype="bf16", shape=(2, 2))}))
fut = c.scatter(d, workers=[a])                                    # client -> a
out = {"fresh": fresh, "restarted": restarted, "want": describe(d),
       "on a": c.submit(describe, fut, workers=[a], pure=False).result(),
       "on b": c.submit(describe, fut, workers=[b], pure=False).result()}   # a -> b
made = c.submit(make, 3, workers=[a], pure=False)                  # a task's result
out["made on b"] = c.submit(describe, made, workers=[b], pure=False).result()
out["made want"] = describe(make(3))
out["made back"] = made.result() == make(3)                          # a -> client
out["pair back"] = c.submit(pair, 5, workers=[a], pure=False).result() == [make(5), make(6)]
out["record back"] = c.submit(record, 7, workers=[a], pure=False).result() == record(7)
out["logs"] = c.run(eval, LOG, {})
out["logs"]["client"] = eval(LOG)
out["kiln"] = c.run(where)
out["after"] = c.run(probe)
c.close()
print(json.dumps(out))
"""


def test_a_plain_cluster_takes_kiln_values_without_a_preload(cluster, tmp_path):
    """scatter, worker to worker, task results (alone and in a list) and gather, with
    kiln's serializers on both ends and nothing preloaded; a record (a dict whose
    first value is an int) goes by pickle as a whole, and arrives equal."""
    script = tmp_path / "client.py"
    script.write_text(CLIENT)
    env = plain_env(str(tmp_path))
    r = subprocess.run([sys.executable, str(script), cluster.address], cwd=str(tmp_path),
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-6000:] + cluster.logs()
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert len(out["fresh"]) == 2
    for p in out["fresh"].values():       # the workers had met nothing of ours
        assert p == {"kiln": False, "kiln.dask": False, "preload": [], "tests": []}
    ours = os.path.realpath(kiln.__file__)
    assert [k[0] for k in out["kiln"].values()] == [ours, ours]
    assert out["on a"] == out["want"] and out["on b"] == out["want"]
    assert out["want"][0] == DIRECTORY and out["want"][1] == ["b", "h", "w"]
    assert out["made on b"] == out["made want"]
    assert out["made back"] and out["pair back"] and out["record back"]
    a, b = sorted(out["fresh"])
    logs = out["logs"]
    assert ["dumps"] + KILN_DASK in logs["client"]       # scatter
    assert ["loads"] + KILN_DASK in logs["client"]       # gather of a task's result
    assert ["loads"] + KILN_DASK in logs[a] and ["dumps"] + KILN_DASK in logs[a]
    assert ["loads"] + KILN_DASK in logs[b]              # worker to worker
    for where, log in logs.items():                    # no kiln value by pickle, and
        for entry in log:                               # none by anything but kiln's
            assert entry[1:] == KILN_DASK, (where, entry)
    # the registration imported kiln.dask on the workers: no one else did
    assert all(p["kiln.dask"] for p in out["after"].values())


def test_kiln_registers_with_distributed_in_either_import_order(tmp_path):
    """distributed imported before kiln (a worker) or after it (a client script):
    kiln's serializer runs without kiln.dask imported by anyone but the hook, Dask's
    memory accounting counts the payload bytes, and the meta path finder that
    waited for distributed is gone."""
    body = r"""
import json, sys
ORDER
import numpy as np
from dask.sizeof import sizeof
from distributed.protocol import serialize, deserialize
d = kiln.decode_tensors(kiln.encode_tensors({"w": np.arange(1000, dtype=np.float32)}))
sizes = [sizeof(d), sizeof(d["w"])]     # before any serializer: the lazy sizeof hook
h, f = serialize(d, serializers=["dask"])
t, g = serialize(d["w"], serializers=["dask"])
back = deserialize(h, [bytes(x) for x in f])
print(json.dumps({"h": [h["serializer"], h["type"], sorted(h["sub-header"])],
                  "t": [t["serializer"], t["type"], sorted(t["sub-header"])],
                  "back": back == d and deserialize(t, g) == d["w"],
                  "sizes": [n >= 4000 for n in sizes],
                  "watching": any(type(x).__module__ == "kiln._dask_hook" or
                                  getattr(x, "__module__", "") == "kiln._dask_hook"
                                  for x in sys.meta_path)}))
"""
    outs = []
    for order in ("import kiln\nimport distributed", "import distributed\nimport kiln"):
        r = subprocess.run([sys.executable, "-c", body.replace("ORDER", order)],
                           cwd=str(tmp_path), env=plain_env(str(tmp_path)),
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        outs.append(json.loads(r.stdout.strip().splitlines()[-1]))
    for out in outs:
        assert out == {"h": ["dask", DIRECTORY, ["kiln-tensors"]],
                       "t": ["dask", "kiln._tensors.tensor.Tensor", ["kiln-tensor"]],
                       "back": True, "sizes": [True, True], "watching": False}


def _installed_spies(client):
    client.run(exec, SPY, {})
    return lambda: client.run(eval, LOG, {})


def test_tensors_travel_between_workers(client):
    """Directories made by a task on one worker, used by a task on the other: the
    frames that cross are kiln's serializer's, on both workers."""
    logs = _installed_spies(client)
    before = {w: len(log) for w, log in logs().items()}
    a, b = sorted(client.scheduler_info()["workers"])
    rng = np.random.default_rng(1)
    bufs = [kiln.encode_tensors({"w": rng.standard_normal((64, 64)).astype(np.float32),
                                 "i": np.arange(s, s + 5, dtype=np.int8)}) for s in range(4)]
    made = client.map(kiln.decode_tensors, bufs, workers=[a], pure=False)   # on a
    again = client.gather(client.map(kiln.encode_tensors, made, workers=[b], pure=False))
    assert again == bufs                                 # worker to worker, bit for bit
    assert client.gather(made) == [kiln.decode_tensors(x) for x in bufs]   # to the client
    after = {w: log[before[w]:] for w, log in logs().items()}
    assert after[a].count(["dumps"] + KILN_DASK) >= 4
    assert after[b].count(["loads"] + KILN_DASK) == 4
    assert all(e[1:] == KILN_DASK for log in after.values() for e in log), after


def test_from_kiln_reads_chunks_on_the_workers(client, tmp_path):
    a = np.arange(1000 * 8, dtype=np.float64).reshape(1000, 8)
    p = tmp_path / "m.kiln"
    kiln.save_tensors(p, {"a": a, "b": np.ones(3, np.float32)})
    x = kiln.dask.from_kiln(p, "a", chunks=(100, 8))
    assert x.shape == (1000, 8) and x.numblocks == (10, 1)
    assert float(x.sum().compute()) == float(a.sum())
    assert np.array_equal(x[250:260].compute(), a[250:260])


def test_from_kiln_over_http_fetches_only_the_chunks_computed(client, tmp_path):
    pytest.importorskip("aiohttp")                  # fsspec's HTTP filesystem
    from _servers import RangeServer
    a = np.arange(20000 * 16, dtype=np.int32).reshape(20000, 16)   # 1.25 MiB, 64 B a row
    kiln.save_tensors(tmp_path / "m.kiln", {"a": a})
    with RangeServer(tmp_path) as server:
        x = kiln.dask.from_kiln(server.url + "m.kiln", "a", chunks=(1000, 16))
        assert x.shape == a.shape and x.dtype == a.dtype and x.numblocks == (20, 1)
        with server.lock:
            before = server.sent
        assert before < 80 * 1024     # building the array read the table (a 64 KiB first read)
        part = x[3000:5000].sum(axis=0).compute()    # two chunks, read by the workers
        assert np.array_equal(part, a[3000:5000].sum(axis=0))
        with server.lock:
            used = server.sent - before
        assert used < a.nbytes // 4, used            # two chunks of twenty, and small requests
        assert int(x.sum().compute()) == int(a.astype(np.int64).sum())
        assert np.array_equal(x[::-7, 3].compute(), a[::-7, 3])     # any index: the rows it spans
        assert x[19999, 2].compute() == a[19999, 2]


SAMPLE = kiln.parse_type("struct{id:i64,text:str,t:tensors,}")


def _sample(i):
    rng = np.random.default_rng(i)
    value = {"id": i, "text": "sample %d" % i,
             "t": {"x": rng.standard_normal((32, 32)).astype(np.float32),
                   "y": np.arange(i, i + 7, dtype=np.int64)}}
    return kiln.encode(value, SAMPLE)


def test_records_scatter_compute_gather_bit_exact(client):
    bufs = [_sample(i) for i in range(6)]
    recs = [kiln.decode(b, SAMPLE) for b in bufs]
    header, frames = serialize(recs, serializers=["dask", "pickle"])
    payloads = [np.frombuffer(t.data, np.uint8) for r in recs for t in r["t"].values()]
    shared = [f for f in frames if any(np.shares_memory(np.frombuffer(f, np.uint8), p)
                                       for p in payloads if len(f))]
    assert len(shared) >= len(payloads)       # every payload leaves as its own memory
    futures = client.scatter(recs)
    again = client.gather(client.map(kiln.encode, futures, [SAMPLE] * len(recs), pure=False))
    assert again == bufs                      # the records the workers got, bit for bit
    back = client.gather(futures)             # and back to the client
    for r, b in zip(recs, back):
        assert b["id"] == r["id"] and b["text"] == r["text"]
        assert b["t"].keys() == r["t"].keys()
        for k in r["t"].keys():
            assert b["t"][k].data.tobytes() == r["t"][k].data.tobytes()
            assert b["t"][k].dtype == r["t"][k].dtype and b["t"][k].shape == r["t"][k].shape


def _memory_url(name, data):
    fsspec = pytest.importorskip("fsspec")
    fsspec.filesystem("memory").pipe("/" + name, data)
    return "memory:///" + name


@pytest.mark.parametrize("index", [
    Ellipsis, (Ellipsis, 0), (Ellipsis, 1, 0), None, (None, 1), (None, slice(None, None, -2)),
    (slice(3, 1),), (slice(0, 3, -1),), (slice(None, None, -2),), (slice(4, 0, -3), Ellipsis, 1),
    -1, np.int64(-2), (), (1, Ellipsis), (slice(1, 3), None, 0), True, False,
    (slice(None), slice(None, None, -1)), (2, None, slice(1, None)),
], ids=repr)
def test_chunk_reads_index_like_numpy(api, tmp_path, index):
    from kiln.dask import _LazyTensor
    a = np.arange(5 * 3 * 2, dtype=np.int16).reshape(5, 3, 2)
    data = kiln.encode_tensors({"a": a})
    p = tmp_path / "i.kiln"
    p.write_bytes(data)
    url = _memory_url("index.kiln", data)
    with kiln.open(url) as f:
        rows = f.row_source("a")
    want = a[index]
    for lazy in (_LazyTensor(str(p), "a", a.shape, a.dtype),
                 _LazyTensor(url, "a", a.shape, a.dtype, rows)):
        got = lazy[index]
        assert isinstance(got, np.ndarray) and got.shape == want.shape
        assert np.array_equal(got, want)
    for bad in (5, -6, (0, 0, 0, 0)):
        with pytest.raises(IndexError):
            _LazyTensor(url, "a", a.shape, a.dtype, rows)[bad]


def test_from_kiln_of_a_url_takes_what_a_path_takes(api, tmp_path):
    t = {"s": np.array(2.5, np.float32), "e": np.zeros((0, 4), np.int8),
         "z": np.zeros((3, 0), np.float64)}
    data = kiln.encode_tensors(t)
    p = tmp_path / "s.kiln"
    p.write_bytes(data)
    for src in (p, "file://" + str(p), _memory_url("scalars.kiln", data)):
        s = kiln.dask.from_kiln(src, "s")           # rank 0
        assert s.shape == () and float(s.compute(scheduler="sync")) == 2.5
        for name in ("e", "z"):
            x = kiln.dask.from_kiln(src, name)
            got = x.compute(scheduler="sync")
            assert got.shape == t[name].shape and got.dtype == t[name].dtype


def test_to_kiln_writes_blocks_computed_on_the_cluster(client, tmp_path):
    import dask.array as da
    x = da.arange(3000 * 5, chunks=1000, dtype=np.int64).reshape(3000, 5).rechunk((400, 2))
    y = np.arange(6, dtype=np.float32)
    p = tmp_path / "w.kiln"
    kiln.dask.to_kiln(p, {"x": x * 3, "y": y}, metadata={"from": "dask"}, blocks_at_once=2)
    d = kiln.load_tensors(p)
    assert d.keys() == ["x", "y"]
    assert np.array_equal(d["x"].numpy(), np.arange(15000).reshape(3000, 5) * 3)
    assert d["y"].numpy().tolist() == y.tolist()
    assert kiln.load_metadata(p) == {"from": "dask"}
    with open(p, "rb") as fh:      # the same bytes as the one-shot writer
        raw = fh.read()
    kiln.save_tensors(tmp_path / "same.kiln", {"x": np.arange(15000).reshape(3000, 5) * 3,
                                                "y": y}, metadata={"from": "dask"})
    assert raw == (tmp_path / "same.kiln").read_bytes()
