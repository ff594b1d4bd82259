"""Remote record files: the index checked as a local open checks it, bytes
fetched bounded by the file, servers that ignore ranges, and pickles that
keep the version they were opened at.  Real servers on 127.0.0.1 (the HTTP
server of tests/_servers.py, moto's S3 server), fsspec's memory filesystem;
expected offsets from tests/_records_util.py, an independent writer."""

import io
import os
import pickle
import random
import subprocess
import sys
import time
import tracemalloc

import pytest

import kiln
import _records_util as U
from _servers import RangeServer

T = "struct{id:i64,name:str,}"
H = kiln.parse_type(T).schema_hash
BLOCK = 64 << 10                 # the first read and read-ahead block of a remote file
HEADERS = 400                    # response header bytes of one answer, at most


def framed(v):
    return kiln.encode(v, T, frame=True)


def open_rf(impl, src, **kw):
    return kiln.RecordFile(src, T, kernels=impl.kernels, **kw)


def write(impl, path, vals):
    with kiln.RecordWriter(path, T, kernels=impl.kernels) as w:
        for v in vals:
            w.write(v)
    return os.path.getsize(path)


def code_at(fn, *args, **kw):
    with pytest.raises(kiln.KilnError) as ei:
        fn(*args, **kw)
    return ei.value.code, ei.value.offset


def body_bytes(server):
    """What the server sent less a bound on its response headers."""
    return server.sent - HEADERS * len(server.requests)


@pytest.fixture
def memfs():
    fsspec = pytest.importorskip("fsspec", reason="needs fsspec, the [remote] extra")
    fs = fsspec.filesystem("memory")
    yield fs
    if fs.exists("/rr"):
        fs.rm("/rr", recursive=True)


# --- item 3: an index that repeats records -----------------------------------------

def _repeating_index():
    """3 records (the middle one 100 KB) and an index of 2,001 entries that
    names records 1 and 2 over and over (its CRC right): entry 3 goes back."""
    vals = [{"id": 0, "name": "a"}, {"id": 1, "name": "b" * 100_000}, {"id": 2, "name": "c"}]
    fr = [framed(v) for v in vals]
    _, real = U.container(H, fr)
    offsets = real + [real[1], real[2]] * 999
    data, _ = U.container(H, fr, offsets=offsets)
    return data, vals


@pytest.mark.parametrize("where", ["http", "memory"])
def test_a_remote_index_that_repeats_records_is_refused_as_locally(impl, tmp_path, where,
                                                                   request):
    data, _ = _repeating_index()
    bad = ("FRAME", U.entry_at(data, 3))         # entry 3 is not after entry 2
    p = tmp_path / "rep.kilnr"
    p.write_bytes(data)
    assert code_at(open_rf, impl, p) == bad
    if where == "http":
        with RangeServer(tmp_path) as server:
            assert code_at(open_rf, impl, server.url + "rep.kilnr") == bad
            assert body_bytes(server) <= len(data)
    else:
        memfs = request.getfixturevalue("memfs")
        memfs.pipe("/rr/rep.kilnr", data)
        assert code_at(open_rf, impl, "memory://rr/rep.kilnr") == bad


@pytest.mark.parametrize("damage", ["index-crc", "entry-past-index"])
def test_a_remote_open_checks_the_index_crc_and_every_entry(impl, memfs, damage):
    """What a local open refuses, a remote open refuses, with the same code and
    offset: a flipped index byte under a right trailer (index CRC), an entry
    past the records."""
    vals = [{"id": i, "name": "n" * i} for i in range(5)]
    data, real = U.container(H, [framed(v) for v in vals])
    if damage == "index-crc":
        at = U.entry_at(data, 4)
        data = data[:at] + bytes([data[at] ^ 1]) + data[at + 1:]
        want = ("CHECKSUM", U.entry_at(data, 5))  # the index value's CRC, after entry 4
    else:
        data, _ = U.container(H, [framed(v) for v in vals], offsets=real[:4] + [1 << 40])
        want = ("FRAME", U.entry_at(data, 4))
    assert code_at(open_rf, impl, io.BytesIO(data)) == want
    memfs.pipe("/rr/d.kilnr", data)
    assert code_at(open_rf, impl, "memory://rr/d.kilnr") == want


def test_reading_every_record_once_fetches_about_the_file(impl, tmp_path):
    vals = [{"id": i, "name": "x" * (500 + i % 900)} for i in range(2500)]
    size = write(impl, tmp_path / "g.kilnr", vals)
    assert size > 2_000_000
    order = list(range(len(vals)))
    random.Random(5).shuffle(order)
    with RangeServer(tmp_path) as server:
        with open_rf(impl, server.url + "g.kilnr") as rf:
            assert len(rf) == 2500
            for i in order:                      # at random, each once
                assert rf[i] == vals[i]
            assert rf.bytes_fetched <= size + BLOCK
        assert body_bytes(server) <= size + BLOCK
        sent, asked = server.sent, len(server.requests)
        with open_rf(impl, server.url + "g.kilnr") as rf:
            assert list(rf) == vals
            assert rf[5:9] == vals[5:9]
            assert rf.bytes_fetched <= size + BLOCK + 4 * 2000
        assert server.sent - sent <= size + BLOCK + 4 * 2000 + HEADERS * (
            len(server.requests) - asked)
        # iteration fetches the records in reads of up to a block, not one each
        assert len(server.requests) - asked <= size // (BLOCK // 2) + 8


def test_remote_records_read_as_local_ones_in_both_orders(impl, memfs, tmp_path):
    vals = [{"id": i, "name": "z" * (i * 37 % 3000)} for i in range(300)]
    write(impl, tmp_path / "o.kilnr", vals)
    memfs.pipe("/rr/o.kilnr", (tmp_path / "o.kilnr").read_bytes())
    with open_rf(impl, "memory://rr/o.kilnr") as rf:
        assert [rf[i] for i in range(299, -1, -1)] == vals[::-1]
        assert rf[-3:] == vals[-3:] and rf[::50] == vals[::50]
        assert list(rf) == vals


# --- item 4: a server that ignores range requests ------------------------------------

def test_a_server_without_ranges_serves_a_small_record_file_whole(impl, tmp_path):
    vals = [{"id": i, "name": "s" * i} for i in range(3)]
    size = write(impl, tmp_path / "s.kilnr", vals)
    assert size < 400
    with RangeServer(tmp_path, behave="ignore-range") as server:
        with open_rf(impl, server.url + "s.kilnr") as rf:
            assert list(rf) == vals and rf[1] == vals[1] and rf[-1] == vals[-1]
            assert rf.bytes_fetched == size
        assert len(server.requests) == 1          # one answer: the whole object
        assert body_bytes(server) <= size


def test_a_server_without_ranges_on_a_bigger_record_file_is_refused_unread(impl, tmp_path):
    vals = [{"id": i, "name": "b" * 1000} for i in range(400)]
    size = write(impl, tmp_path / "b.kilnr", vals)
    assert size > 4 * BLOCK
    with RangeServer(tmp_path, behave="ignore-range") as server:
        with pytest.raises(kiln.remote.RemoteError, match="ignored the range request"):
            open_rf(impl, server.url + "b.kilnr")


def test_a_server_that_floods_a_small_record_file_costs_no_memory(impl, tmp_path):
    """A 268-byte file whose server ignores the range and streams 64 MiB (no
    Content-Length): refused after the answer's headers, the reader's traced
    peak far below what was sent."""
    vals = [{"id": i, "name": "f" * i} for i in range(3)]
    size = write(impl, tmp_path / "f.kilnr", vals)
    assert size < 400   # a few hundred bytes (268 without the stored type text)
    with RangeServer(tmp_path, behave="flood", flood=64 << 20) as server:
        tracemalloc.start()
        try:
            with pytest.raises(kiln.remote.RemoteError, match="ignored the range request"):
                open_rf(impl, server.url + "f.kilnr")
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 4 << 20, peak
        time.sleep(0.2)
        assert server.sent < 32 << 20            # the server stopped when the reader hung up


# --- item 10: a pickle keeps the version ------------------------------------------------

def _two_versions(impl, tmp_path):
    """Two files of the same size, larger than the first block (so that a
    read after the open asks the store)."""
    v1 = [{"id": i, "name": "one" * 10_000} for i in range(4)]
    v2 = [{"id": i, "name": "two" * 10_000} for i in range(4)]
    write(impl, tmp_path / "v1", v1)
    write(impl, tmp_path / "v2", v2)
    a, b = (tmp_path / "v1").read_bytes(), (tmp_path / "v2").read_bytes()
    assert len(a) == len(b) > BLOCK and a != b   # same size: only the version tells
    return v1, a, b


def test_a_pickled_remote_file_reads_only_its_version_over_http(impl, tmp_path):
    v1, a, b = _two_versions(impl, tmp_path)
    www = tmp_path / "www"
    www.mkdir()
    (www / "p.kilnr").write_bytes(a)
    with RangeServer(www) as server:
        url = server.url + "p.kilnr"
        rf = open_rf(impl, url)
        blob = pickle.dumps(rf)
        copy = pickle.loads(blob)                # not changed: reads v1
        assert list(copy) == v1 and copy[3] == v1[3]
        copy.close()
        time.sleep(0.01)
        (www / "p.kilnr").write_bytes(b)          # a new version (its ETag), same size
        with pytest.raises(kiln.remote.RemoteFileChanged):
            rf[3]
        with pytest.raises(kiln.remote.RemoteFileChanged):
            pickle.loads(blob)
        # a worker process receives the pickle as a data loader's does
        child = subprocess.Popen(
            [sys.executable, "-c", _CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, cwd=str(tmp_path),
            env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
        try:
            out, err = child.communicate(blob, timeout=120)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
        assert out.decode().strip() == "RemoteFileChanged", err.decode()[-2000:]
        # a pickle of the new version reads it
        fresh = open_rf(impl, url)
        assert pickle.loads(pickle.dumps(fresh))[3]["name"][:3] == "two"
        fresh.close()
        rf.close()


_CHILD = """
import pickle, sys
import kiln
try:
    rf = pickle.loads(sys.stdin.buffer.read())
    print([r["name"][:3] for r in rf])
except kiln.remote.RemoteFileChanged:
    print("RemoteFileChanged")
"""


def test_a_pickled_remote_file_reads_only_its_version_over_fsspec(impl, tmp_path, memfs):
    v1, a, b = _two_versions(impl, tmp_path)
    memfs.pipe("/rr/p.kilnr", a)
    rf = open_rf(impl, "memory://rr/p.kilnr")
    blob = pickle.dumps(rf)
    assert list(pickle.loads(blob)) == v1
    time.sleep(0.01)
    memfs.pipe("/rr/p.kilnr", b)                  # same size, another creation time
    with pytest.raises(kiln.remote.RemoteFileChanged):
        rf[3]
    with pytest.raises(kiln.remote.RemoteFileChanged):
        pickle.loads(blob)
    rf.close()


@pytest.fixture(scope="module")
def s3():
    pytest.importorskip("s3fs")
    server_mod = pytest.importorskip("moto.server")
    server = server_mod.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        opts = {"key": "testing", "secret": "testing", "skip_instance_cache": True,
                "client_kwargs": {"endpoint_url": "http://127.0.0.1:%d" % port,
                                  "region_name": "eu-west-1"}}
        import s3fs
        fs = s3fs.S3FileSystem(**opts)
        fs.mkdir("kiln-rr")
        yield fs, opts
    finally:
        server.stop()


def test_a_pickled_remote_file_reads_only_its_version_over_s3(impl, tmp_path, s3):
    fs, opts = s3
    v1, a, b = _two_versions(impl, tmp_path)
    fs.pipe("kiln-rr/p.kilnr", a)
    rf = open_rf(impl, "s3://kiln-rr/p.kilnr", storage_options=opts)
    blob = pickle.dumps(rf)
    assert list(pickle.loads(blob)) == v1
    fs.pipe("kiln-rr/p.kilnr", b)                 # same size, another ETag
    with pytest.raises(kiln.remote.RemoteFileChanged):
        rf[3]
    with pytest.raises(kiln.remote.RemoteFileChanged):
        pickle.loads(blob)
    rf.close()
