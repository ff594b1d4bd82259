"""Kiln on a real Dask cluster: worker processes over TCP on 127.0.0.1."""

import numpy as np
import pytest

import kiln

distributed = pytest.importorskip("distributed")   # the [test] extra installs it
import kiln.dask  # noqa: E402  (registers the serializers)
from distributed.protocol import deserialize, serialize  # noqa: E402
from kiln import _compat  # noqa: E402


@pytest.fixture
def api(impl, monkeypatch):
    """The module-level API running on ``impl``'s kernels (local, synchronous tests)."""
    monkeypatch.setattr(_compat, "kernels", impl.kernels)
    monkeypatch.setattr(_compat, "IMPLEMENTATION", impl.name)
    return impl


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
def client():
    from distributed import Client, LocalCluster
    cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                           host="127.0.0.1", dashboard_address=None)
    c = Client(cluster)
    try:
        yield c
    finally:
        c.close()
        cluster.close()


def _make(seed):
    rng = np.random.default_rng(seed)
    return kiln.decode_tensors(kiln.encode_tensors(
        {"w": rng.standard_normal((64, 64)).astype(np.float32), "i": np.arange(5, dtype=np.int8)}))


def _total(d):
    return float(d["w"].numpy().sum()) + int(d["i"].numpy().sum())


def test_tensors_travel_between_workers(client):
    futures = client.map(_make, range(4))
    totals = client.gather(client.map(_total, futures))    # worker to worker
    want = [_total(_make(s)) for s in range(4)]
    assert totals == pytest.approx(want)
    local = client.gather(futures)
    assert local[2] == _make(2)


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
    return kiln.decode(kiln.encode(value, SAMPLE), SAMPLE)


def _bump(rec):
    return {"id": rec["id"] + 1, "text": rec["text"].upper(), "t": rec["t"]}


def test_records_scatter_compute_gather_bit_exact(client):
    recs = [_sample(i) for i in range(6)]
    header, frames = serialize(recs, serializers=["dask", "pickle"])
    payloads = [np.frombuffer(t.data, np.uint8) for r in recs for t in r["t"].values()]
    shared = [f for f in frames if any(np.shares_memory(np.frombuffer(f, np.uint8), p)
                                       for p in payloads if len(f))]
    assert len(shared) >= len(payloads)       # every payload leaves as its own memory
    futures = client.scatter(recs)
    back = client.gather(client.map(_bump, futures))
    for r, b in zip(recs, back):
        assert b["id"] == r["id"] + 1 and b["text"] == r["text"].upper()
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
