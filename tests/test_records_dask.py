"""Record files as Dask bags: read_records and to_records, synchronously and on
a real cluster of worker processes on 127.0.0.1."""

import numpy as np
import pytest

import kiln

pytest.importorskip("distributed")
import dask  # noqa: E402
import kiln.dask  # noqa: E402

T = "struct{id:i64,x:list<f32>,}"


def _vals(n, base=0):
    return [{"id": base + i, "x": [float(i), 0.5]} for i in range(n)]


def _write(impl, path, vals):
    with kiln.RecordWriter(path, T, kernels=impl.kernels) as w:
        for v in vals:
            w.write(v)


def test_read_records_a_partition_per_file_or_per_index_range(impl, tmp_path):
    for k in range(3):
        _write(impl, tmp_path / ("p-%d.kilnr" % k), _vals(10, 100 * k))
    with dask.config.set(scheduler="sync"):
        bag = kiln.dask.read_records(str(tmp_path / "p-*.kilnr"), T, kernels=impl.kernels)
        assert bag.npartitions == 3
        got = bag.map(lambda r: r["id"]).compute()
        assert got == [100 * k + i for k in range(3) for i in range(10)]
        bag = kiln.dask.read_records([str(tmp_path / "p-1.kilnr")], T, records_per_partition=4)
        assert bag.npartitions == 3
        assert bag.map(lambda r: r["x"].tolist()).compute() == [[float(i), 0.5]
                                                                for i in range(10)]
    with pytest.raises(FileNotFoundError):
        kiln.dask.read_records(str(tmp_path / "none-*.kilnr"), T)


def test_to_records_writes_a_file_per_partition(impl, tmp_path):
    import dask.bag as db
    vals = _vals(25)
    with dask.config.set(scheduler="sync"):
        paths = kiln.dask.to_records(db.from_sequence(vals, npartitions=3),
                                     str(tmp_path / "out-*.kilnr"), T, kernels=impl.kernels)
    assert [p.rsplit("/", 1)[1] for p in paths] == ["out-0.kilnr", "out-1.kilnr",
                                                    "out-2.kilnr"]
    back = []
    for p in paths:
        with kiln.RecordFile(p, T, kernels=impl.kernels) as rf:
            back += [{"id": r["id"], "x": r["x"].tolist()} for r in rf]
    assert back == vals


def test_on_a_cluster_of_worker_processes(impl, tmp_path):
    from distributed import Client, LocalCluster
    _write(impl, tmp_path / "a.kilnr", _vals(30))
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=None) as cluster, Client(cluster) as client:
        bag = kiln.dask.read_records(str(tmp_path / "a.kilnr"), T, records_per_partition=7)
        total = bag.map(lambda r: float(np.sum(r["x"]))).sum().compute()
        paths = kiln.dask.to_records(bag, str(tmp_path / "copy-*.kilnr"), T)
        assert client.run(lambda: 1)                      # two live worker processes
    assert total == sum(i + 0.5 for i in range(30))
    ids = [r["id"] for p in paths for r in kiln.RecordFile(p, T, kernels=impl.kernels)]
    assert ids == list(range(30))
