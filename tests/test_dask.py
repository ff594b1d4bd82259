"""Kiln on a real Dask cluster: worker processes over TCP on 127.0.0.1."""

import numpy as np
import pytest

import kiln

distributed = pytest.importorskip("distributed")   # the [test] extra installs it
import kiln.dask  # noqa: E402  (registers the serializers)
from distributed.protocol import deserialize, serialize  # noqa: E402


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
