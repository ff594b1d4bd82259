"""kiln.open of fsspec URLs: a real HTTP server with range requests and an S3 API
server (moto) on 127.0.0.1, both started here; bytes counted on the wire."""

import io
import os
import socket
import threading

import numpy as np
import pytest

import kiln

from _servers import RangeServer

fsspec = pytest.importorskip("fsspec")          # the [test] extra installs it
pytest.importorskip("aiohttp")                  # fsspec's HTTP filesystem
from kiln.remote import RemoteFile, RemoteFileChanged  # noqa: E402

MiB = 1 << 20


@pytest.fixture(scope="module")
def http(tmp_path_factory):
    root = tmp_path_factory.mktemp("www")
    with RangeServer(root) as server:
        yield server, root, server.url


def _big_file(path, big_mib=256):
    """A sparse file of ``big_mib`` MiB: one big tensor left as a hole, one
    4 KiB tensor, a boolean one and metadata."""
    small = np.arange(1024, dtype=np.float32)
    with kiln.TensorWriter(path, metadata={"step": 7, "name": "big"}) as w:
        w.add("big", "u8", (big_mib * MiB,))
        w.add("small", "f32", small.shape)
        w.add("flags", "bool", (5,))
        w.write("big", None)
        w.write("small", small)
        w.write("flags", np.array([True, False, True, True, False]))
    return small


def test_http_one_small_tensor_of_a_256_mib_file(api, http):
    server, root, base = http
    small = _big_file(root / "big.kiln")
    assert os.path.getsize(root / "big.kiln") > 256 * MiB
    with server.lock:
        server.sent = 0
    with kiln.open(base + "big.kiln") as f:
        assert isinstance(f, RemoteFile)
        assert f.keys() == ["big", "small", "flags"] and len(f) == 3 and "small" in f
        got = f["small"].numpy()
        assert np.array_equal(got, small) and not got.flags.writeable
        assert f["flags"].numpy().tolist() == [True, False, True, True, False]
        assert f.metadata == {"step": 7, "name": "big"}
        rows = f.rows("big", 1000, 1010)           # ten bytes of the hole
        assert rows.tolist() == [0] * 10
    sent = server.sent
    assert 4096 < sent < MiB, sent       # the table, three small payloads, heads: not 256 MiB
    assert got.tolist() == small.tolist()          # the view outlives the file


def test_http_rows_fetch_only_their_rows(api, http):
    server, root, base = http
    a = np.arange(4096 * 64, dtype=np.float64).reshape(4096, 64)    # 2 MiB, 512 B a row
    kiln.save_tensors(root / "rows.kiln", {"a": a})
    with kiln.open(base + "rows.kiln") as f:
        with server.lock:
            server.sent = 0
        part = f.rows("a", 100, 110)
        assert np.array_equal(part, a[100:110])
        first = server.sent
        assert first < 64 * 1024, first
        assert np.array_equal(f.rows("a", 105, 120), a[105:120])   # only rows 110..120 now
        assert np.array_equal(f.rows("a", -3, 4096), a[-3:])        # the tail and its gap
        assert f.rows("a", 10, 5).shape == (0, 64)
        assert np.array_equal(f["a"].numpy(), a)                    # the rest, once
    assert np.array_equal(part, a[100:110])


def test_http_truncated_and_replaced_objects(api, http):
    server, root, base = http
    p = root / "t.kiln"
    kiln.save_tensors(p, {"a": np.ones(10000, np.float32), "b": np.zeros(10, np.int8)})
    whole = p.read_bytes()
    p.write_bytes(whole[:20000])
    with pytest.raises(kiln.KilnError) as local:
        kiln.open(p)
    with pytest.raises(kiln.KilnError) as remote:
        kiln.open(base + "t.kiln")
    assert (remote.value.code, remote.value.offset) == (local.value.code, local.value.offset)
    assert remote.value.code == "EOF"
    p.write_bytes(whole)
    f = kiln.open(base + "t.kiln")
    assert f["b"].numpy().tolist() == [0] * 10
    os.utime(p, ns=(1, 1))                     # another version: the ETag changes
    with pytest.raises(RemoteFileChanged, match="changed after it was opened"):
        f["a"]
    f.close()
    with pytest.raises(ValueError, match="closed"):
        f["a"]
    with pytest.raises(FileNotFoundError):
        kiln.open(base + "missing.kiln")
    (root / "empty.kiln").write_bytes(b"")
    with pytest.raises(kiln.KilnError, match="empty"):
        kiln.open(base + "empty.kiln")


# --- hostile payload bytes: the checks a local file gets, when the bytes arrive --

def _memory_pair(name, data):
    fs = fsspec.filesystem("memory")
    fs.pipe("/" + name, data)
    return "memory:///" + name


@pytest.mark.parametrize("what", ["bool byte", "gap byte", "nibble"])
def test_fetched_payloads_get_the_directory_checks(api, tmp_path, what):
    # a first payload of 128 KiB keeps the others out of the first range request
    t = {"a0": np.zeros(128 << 10, np.uint8), "f": np.ones(3, np.float32),
         "b": np.array([True, False]),
         "n": kiln.Tensor(kiln.pack_nibbles([1, 2, 3]), dtype="u4", shape=(3,))}
    data = bytearray(kiln.encode_tensors(t))
    d = kiln.decode_tensors(bytes(data))
    assert d.keys()[0] == "a0"
    base = (64 + 128 * 4 + len("a0fbn") + 63) // 64 * 64   # header, descriptors, names: aligned
    at = {k: base + (128 << 10) + 64 * (i - 1) for i, k in enumerate(d.keys())}
    assert bytes(data[at["f"]:at["f"] + 12]) == np.ones(3, np.float32).tobytes()
    if what == "bool byte":
        data[at["b"] + 1] = 2
    elif what == "gap byte":
        data[at["f"] + 12] = 1            # after f's 12 bytes
    else:
        data[at["n"] + 1] = 0x31          # the odd tail's high nibble
    assert d["f"].numpy().tolist() == [1, 1, 1]
    with pytest.raises(kiln.KilnError) as local:
        kiln.decode_tensors(bytes(data))
    url = _memory_pair("h-%s.kiln" % what.replace(" ", "-"), bytes(data))
    with kiln.open(url) as f:
        name = {"bool byte": "b", "gap byte": "f", "nibble": "n"}[what]
        with pytest.raises(kiln.KilnError) as remote:
            f[name]
        assert (remote.value.code, remote.value.offset) == (local.value.code, local.value.offset)
        others = [k for k in f.keys() if k != name]
        for k in others:                  # the other tensors are fine
            f[k]


def test_a_hostile_table_is_refused_before_any_payload_is_fetched(api, tmp_path):
    data = bytearray(kiln.encode_tensors({"a": np.ones(4, np.float32)}))
    data[8:12] = (10 ** 9).to_bytes(4, "little")          # a descriptor count the file cannot hold
    url = _memory_pair("hostile.kiln", bytes(data))
    with pytest.raises(kiln.KilnError) as remote:
        kiln.open(url)
    with pytest.raises(kiln.KilnError) as local:
        kiln.decode_tensors(bytes(data))
    assert (remote.value.code, remote.value.offset) == (local.value.code, local.value.offset)


def test_file_urls_open_the_local_file(api, tmp_path):
    p = tmp_path / "l.kiln"
    kiln.save_tensors(p, {"a": np.arange(3, dtype=np.int16)})
    with kiln.open("file://" + str(p)) as f:
        assert isinstance(f, kiln.KilnFile) and f["a"].numpy().tolist() == [0, 1, 2]


# --- S3: moto's server on 127.0.0.1 behind a counting relay ------------------------

class _Relay:
    """A TCP relay on 127.0.0.1 counting the bytes the server sends."""

    def __init__(self, port):
        self.target, self.sent, self.lock = port, 0, threading.Lock()
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.closed:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            s = socket.create_connection(("127.0.0.1", self.target))
            threading.Thread(target=self._pump, args=(c, s, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(s, c, True), daemon=True).start()

    def _pump(self, src, dst, count):
        try:
            while True:
                data = src.recv(1 << 16)
                if not data:
                    break
                if count:
                    with self.lock:
                        self.sent += len(data)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self):
        self.closed = True
        self.sock.close()


@pytest.fixture(scope="module")
def s3():
    pytest.importorskip("s3fs")
    server_mod = pytest.importorskip("moto.server")
    server = server_mod.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    relay = None
    try:
        host, port = server.get_host_and_port()
        relay = _Relay(port)
        opts = {"key": "testing", "secret": "testing", "skip_instance_cache": True,
                "client_kwargs": {"endpoint_url": "http://127.0.0.1:%d" % relay.port,
                                  "region_name": "eu-west-1"}}
        import s3fs
        fs = s3fs.S3FileSystem(**opts)
        fs.mkdir("kiln-test")
        yield fs, relay, opts
    finally:
        if relay is not None:
            relay.close()
        server.stop()


def test_s3_one_small_tensor_of_a_256_mib_object(api, s3, tmp_path):
    fs, relay, opts = s3
    p = tmp_path / "big.kiln"
    small = _big_file(p)
    if not fs.exists("kiln-test/big.kiln"):
        fs.put_file(str(p), "kiln-test/big.kiln")
    assert fs.info("kiln-test/big.kiln")["size"] > 256 * MiB
    with relay.lock:
        relay.sent = 0
    with kiln.open("s3://kiln-test/big.kiln", storage_options=opts) as f:
        assert np.array_equal(f["small"].numpy(), small)
        assert f.metadata == {"step": 7, "name": "big"}
    assert relay.sent < MiB, relay.sent


def test_s3_truncated_and_replaced_objects(api, s3):
    fs, relay, opts = s3
    whole = kiln.encode_tensors({"a": np.ones(5000, np.float32), "b": np.zeros(10, np.int8)})
    fs.pipe("kiln-test/short.kiln", whole[:9000])
    with pytest.raises(kiln.KilnError) as e:
        kiln.open("s3://kiln-test/short.kiln", storage_options=opts)
    assert e.value.code == "EOF"
    fs.pipe("kiln-test/r.kiln", whole)
    with kiln.open("s3://kiln-test/r.kiln", storage_options=opts) as f:
        assert f["b"].numpy().tolist() == [0] * 10
        other = kiln.encode_tensors({"a": np.full(5000, 2, np.float32),
                                     "b": np.ones(10, np.int8)})
        fs.pipe("kiln-test/r.kiln", other)         # same size, another ETag
        with pytest.raises(RemoteFileChanged):
            f["a"]
    with pytest.raises(FileNotFoundError):
        kiln.open("s3://kiln-test/nothing.kiln", storage_options=opts)


def test_views_outlive_a_closed_remote_file(api):
    buf = io.BytesIO()
    kiln.save_tensors(buf, {"x": np.arange(6, dtype=np.uint16).reshape(2, 3)})
    url = _memory_pair("plain.kiln", buf.getvalue())
    f = kiln.open(url)
    assert repr(f).endswith("1 tensor>")
    d = f.tensors()
    f.close()
    assert d["x"].numpy().tolist() == [[0, 1, 2], [3, 4, 5]]    # views outlive close
    assert "closed" in repr(f)
    with pytest.raises(ValueError, match="closed"):
        len(f)                                                   # as a closed KilnFile says
    buf = io.BytesIO()
    kiln.save_tensors(buf, {"a": np.arange(3, dtype=np.int8), "b": np.ones(2, np.float32)})
    with kiln.open(_memory_pair("two.kiln", buf.getvalue())) as f:
        two = f[0:2]                                             # slices as a directory's do
        assert [t.name for t in two] == ["a", "b"] and two[1].numpy().tolist() == [1.0, 1.0]
        assert f[-1].name == "b"


def test_load_tensors_and_metadata_of_a_url(api, http):
    server, root, base = http
    kiln.save_tensors(root / "lt.kiln", {"a": np.arange(5, dtype=np.int16)},
                      metadata={"who": "remote"})
    d = kiln.load_tensors(base + "lt.kiln")
    assert d.keys() == ["a"] and d["a"].numpy().tolist() == [0, 1, 2, 3, 4]
    assert kiln.load_tensors(base + "lt.kiln", copy=True)["a"].numpy().tolist() == [0, 1, 2, 3, 4]
    assert kiln.load_metadata(base + "lt.kiln") == {"who": "remote"}


def test_counts_above_the_caps_fetch_nothing_more(api, http):
    server, root, base = http
    data = bytearray(kiln.encode_tensors({"a": np.zeros(2 * MiB, np.uint8)}))
    data[8:12] = (10000).to_bytes(4, "little")     # 1.2 MiB of descriptors: inside the file
    (root / "caps.kiln").write_bytes(bytes(data))
    with server.lock:
        server.sent = 0
    with pytest.raises(kiln.KilnError) as remote:
        kiln.open(base + "caps.kiln", max_count=100)
    assert (remote.value.code, remote.value.offset) == ("LIMIT", 8)
    assert server.sent < 80 * 1024, server.sent    # the first 64 KiB only


# --- review: row sources, empty ranges, the copy cap --------------------------------

def test_a_row_source_reads_only_rows_of_its_tensor(api):
    a = np.arange(12, dtype=np.int32).reshape(4, 3)
    url = _memory_pair("rs.kiln", kiln.encode_tensors(
        {"a": a, "b": np.full(3, 99, np.int32), "s": np.array(5.0, np.float32)}))
    with kiln.open(url) as f:
        rs = f.row_source("a")
        assert np.frombuffer(rs.read(1, 3), np.int32).tolist() == a[1:3].ravel().tolist()
        assert rs.read(2, 2) == b"" and rs.read(4, 4) == b""
        # past the last row are the gap and tensor b; before the first, the table
        for start, stop in ((3, 6), (-2, 0), (2, 1), (0, 5)):
            with pytest.raises(IndexError, match="rows"):
                rs.read(start, stop)
        s = f.row_source("s")          # rank 0: one row, the value
        assert np.frombuffer(s.read(0, 1), np.float32).tolist() == [5.0]
        with pytest.raises(IndexError):
            s.read(0, 2)


def test_s3_empty_row_ranges_make_no_request(api, s3):
    pytest.importorskip("distributed")
    import kiln.dask
    fs, relay, opts = s3
    a = np.arange(12, dtype=np.int32).reshape(4, 3)
    fs.pipe("kiln-test/e.kiln", kiln.encode_tensors(
        {"a": a, "z": np.zeros((5, 0), np.float32), "pad": np.zeros(MiB, np.uint8)}))
    url = "s3://kiln-test/e.kiln"
    with kiln.open(url, storage_options=opts) as f:
        rs, z = f.row_source("a"), f.row_source("z")
        with relay.lock:
            relay.sent = 0
        # S3 reads the range bytes=N-(N-1) as no range: the whole object, or 416
        assert rs.read(2, 2) == b"" and z.read(0, 5) == b""
        with relay.lock:
            assert relay.sent == 0, relay.sent
    x = kiln.dask.from_kiln(url, "z", chunks=(2, -1), storage_options=opts)
    assert x.compute(scheduler="sync").shape == (5, 0)
    y = kiln.dask.from_kiln(url, "a", chunks=(2, -1), storage_options=opts)
    assert np.array_equal(y.compute(scheduler="sync"), a)


def test_load_tensors_of_a_url_keeps_the_copy_cap(api, http):
    server, root, base = http
    kiln.save_tensors(root / "cap.kiln", {"a": np.zeros(10, np.uint8),
                                          "big": np.zeros(MiB, np.uint8)})
    with pytest.raises(kiln.KilnError) as local:
        kiln.load_tensors(root / "cap.kiln", copy=True, max_copy_bytes=1000)
    with server.lock:
        server.sent = 0
    with pytest.raises(kiln.KilnError) as remote:
        kiln.load_tensors(base + "cap.kiln", copy=True, max_copy_bytes=1000)
    assert (remote.value.code, remote.value.offset) == (local.value.code, local.value.offset)
    assert (remote.value.code, remote.value.offset) == ("LIMIT", 64 + 128 + 40)
    with server.lock:
        assert server.sent < 80 * 1024, server.sent     # the table, not the megabyte
    with pytest.raises(ValueError):
        kiln.load_tensors(base + "cap.kiln", copy=True, max_copy_bytes=-1)
    d = kiln.load_tensors(base + "cap.kiln", copy=True, max_copy_bytes=MiB)
    assert d["big"].shape == (MiB,)


def test_a_server_that_ignores_range_requests_is_a_clear_error(api, tmp_path):
    kiln.save_tensors(tmp_path / "n.kiln", {"a": np.zeros(200_000, np.uint8)})
    with RangeServer(tmp_path) as server:
        server.ranges = False           # 200 and the whole file for every range
        with pytest.raises(OSError, match="ignored the range request") as e:
            kiln.open(server.url + "n.kiln")
        size = os.path.getsize(tmp_path / "n.kiln")
        assert "200 with the whole object (%d bytes) for bytes 0..65536" % size in str(e.value)
        assert isinstance(e.value, kiln.remote.RemoteError)


def _outcome(opener):
    """What reading a whole file gives: its tensors' bytes and metadata, or the
    first KilnError's code and offset."""
    try:
        with opener() as f:
            data = {k: bytes(f[k].data) for k in f.keys()}
            return ("ok", data, f.metadata)
    except kiln.KilnError as e:
        return ("error", e.code, e.offset)


@pytest.mark.parametrize("where", ["memory", "http"])
def test_one_byte_changed_anywhere_reads_as_the_local_file_does(api, tmp_path, where, request):
    """A differential: every single-byte change of a file (table, padding,
    payloads, gaps, metadata, trailing bytes) gives the remote reader the
    outcome the local reader has: the same bytes, or the same code at the same
    offset (payload faults surface, in both, when that tensor is read), over
    fsspec's memory filesystem and over the loopback HTTP server."""
    from _mutation import directory_tensors
    t = [kiln.Tensor(np.zeros(80 << 10, np.uint8).tobytes(), dtype="u8", shape=(80 << 10,),
                     name="0.first")] + directory_tensors()   # payloads past the first read
    p = tmp_path / "m.kiln"
    kiln.save_tensors(p, t, metadata={"k": [1, 2.5, "x"], "n": None})
    base = p.read_bytes()
    rng = np.random.default_rng(11)
    spots = list(rng.integers(0, len(base), 150))
    spots += list(range(0, 64)) + list(range(len(base) - 700, len(base)))   # header, tail
    if where == "http":
        server, root, url = request.getfixturevalue("http")
    fs = fsspec.filesystem("memory")
    differ = []
    for k, at in enumerate(spots):
        data = bytearray(base)
        data[at] ^= int(rng.integers(1, 256))
        p.write_bytes(bytes(data))
        if where == "http":
            (root / ("mut-%d.kiln" % k)).write_bytes(bytes(data))
            remote_url = url + "mut-%d.kiln" % k
        else:
            fs.pipe("/mut-%d.kiln" % k, bytes(data))
            remote_url = "memory:///mut-%d.kiln" % k
        local = _outcome(lambda: kiln.open(p))
        remote = _outcome(lambda: kiln.open(remote_url))
        if where == "http":
            os.unlink(root / ("mut-%d.kiln" % k))
        else:
            fs.rm("/mut-%d.kiln" % k)
        if local != remote:
            differ.append((at, local[:3] if local[0] == "error" else "ok",
                           remote[:3] if remote[0] == "error" else "ok"))
    assert not differ, differ[:5]
