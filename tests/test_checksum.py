"""Opt-in payload checksums (issue 32, point 3): save_tensors / TensorWriter /
kiln convert with checksum=True record a CRC-32 per tensor in the metadata
under "__kiln_checksum__"; verify=True and `kiln check` compare them; a
flipped payload byte is CHECKSUM naming the tensor.  Both kernels.

Oracles: a table-driven CRC-32 written here (not zlib), and the metadata
read with the reference decoder (spec/reference/kiln_ref.py)."""

import subprocess
import sys

import numpy as np
import pytest

import kiln
from _util import kiln_ref

META_TYPE = ("list<struct{parent:u32,key:opt<str>,kind:u8,int:i64,float:f64,text:str,"
             "raw:list<u8>,}>")


def _table():
    out = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0xEDB88320 if c & 1 else c >> 1
        out.append(c)
    return out


_T = _table()


def crc32_oracle(data):
    c = 0xFFFFFFFF
    for b in bytes(data):
        c = _T[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def _ref_entry(path):
    """(tensors as the reference decoder reads them, the checksum entry's nodes)."""
    with open(path, "rb") as f:
        buf = f.read()
    ts, _ = kiln_ref.read_directory(buf, 0)
    assert ts[-1]["name"] == "__metadata__"
    nodes = kiln_ref.decode(ts[-1]["payload"], META_TYPE, True)
    top = [i for i, n in enumerate(nodes) if n["parent"] == 0 and n["key"] == "__kiln_checksum__"]
    assert len(top) == 1
    kids = {n["key"]: n for n in nodes if n["parent"] == top[0]}
    return ts[:-1], kids, buf


def _tensors():
    return {"a": np.arange(1000, dtype=np.float32).reshape(10, 100),
            "b": np.array([True, False, True]), "c": np.zeros(0, np.int64)}


def _assert_layout(path, tensors):
    ts, kids, _ = _ref_entry(path)
    assert set(kids) == {"algorithm", "crc32"}
    assert kids["algorithm"]["text"] == "crc32"
    raw = kids["crc32"]["raw"]
    assert len(raw) == 4 * len(ts)
    for i, t in enumerate(ts):
        want = crc32_oracle(np.ascontiguousarray(tensors[t["name"]]).tobytes())
        assert int.from_bytes(raw[4 * i:4 * i + 4], "little") == want
        assert crc32_oracle(t["payload"]) == want


def _flip(path, tensor_name):
    """Flip one payload byte of a tensor (its payload found with the reference decoder)."""
    ts, _, buf = _ref_entry(path)
    payload = next(t for t in ts if t["name"] == tensor_name)["payload"]
    at = buf.find(payload) + 5
    assert at > 5
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(bytes([buf[at] ^ 0x10]))
    return at


def test_save_tensors_records_a_crc32_per_tensor(api, tmp_path):
    p = tmp_path / "m.kiln"
    kiln.save_tensors(p, _tensors(), metadata={"step": 3}, checksum=True)
    _assert_layout(p, _tensors())
    assert kiln.load_metadata(p) == {"step": 3}          # the entry is not user metadata
    with kiln.open(p, verify=True) as f:
        assert f["a"].numpy().sum() == 499500.0
        f.verify()
    kiln.save_tensors(p, _tensors(), checksum=True)       # no user metadata: reads back None
    assert kiln.load_metadata(p) is None
    assert kiln.load_tensors(p, verify=True).keys() == ["a", "b", "c"]


def test_tensor_writer_records_digests_of_what_was_written(api, tmp_path):
    p = tmp_path / "w.kiln"
    t = _tensors()
    with kiln.TensorWriter(p, metadata={"k": "v"}, checksum=True) as w:
        for name, a in t.items():
            w.add(name, {"float32": "f32", "bool": "bool", "int64": "i64"}[a.dtype.name],
                  a.shape)
        w.write_rows("a", 5, t["a"][5:])                  # rows out of order
        w.write_rows("a", 0, t["a"][:5])
        w.write("b", t["b"])
        w.write("c", None)                                # a hole: zeros
    _assert_layout(p, t)
    assert kiln.load_metadata(p) == {"k": "v"}


def test_a_flipped_payload_byte_is_checksum_naming_the_tensor(api, tmp_path):
    p = tmp_path / "m.kiln"
    kiln.save_tensors(p, _tensors(), checksum=True)
    at = _flip(p, "a")
    assert kiln.load_tensors(p, verify=False)["b"].numpy().tolist() == [True, False, True]
    with pytest.raises(kiln.KilnError) as e:
        kiln.load_tensors(p, verify=True)
    assert e.value.code == "CHECKSUM" and "'a'" in e.value.reason
    assert e.value.offset <= at < e.value.offset + 4000
    for copied in ({"copy": True}, {"copy": True, "max_copy_bytes": 1 << 20}):
        with pytest.raises(kiln.KilnError) as e2:
            kiln.load_tensors(p, verify=True, **copied)
        assert (e2.value.code, e2.value.offset) == ("CHECKSUM", e.value.offset)   # file offset
    with kiln.open(p, verify=True) as f:
        assert f["b"].numpy().tolist() == [True, False, True]   # an intact tensor reads
        with pytest.raises(kiln.KilnError) as e3:
            f["a"]
        assert e3.value.code == "CHECKSUM" and e3.value.offset == e.value.offset
        for read in (f.values, f.items, f.tensors, lambda: f.rows("a", 0, 1),
                     lambda: f.get("a"), f.verify):
            with pytest.raises(kiln.KilnError, match="CHECKSUM"):
                read()
    with pytest.raises(kiln.KilnError):
        kiln.load_tensors(p, into={"a": np.empty((10, 100), np.float32),
                                   "b": np.empty(3, bool), "c": np.empty(0, np.int64)},
                          verify=True)


def test_the_reserved_key_is_refused_and_a_bad_entry_is_type(api, tmp_path):
    p = tmp_path / "m.kiln"
    with pytest.raises(kiln.EncodeError) as e:
        kiln.save_tensors(p, _tensors(), metadata={"__kiln_checksum__": 1})
    assert "reserved" in e.value.reason and not p.exists()
    with pytest.raises(kiln.EncodeError):
        kiln.TensorWriter(p, metadata={"__kiln_checksum__": 1}, checksum=True)
    with pytest.raises(kiln.EncodeError):
        kiln.save_tensors(p, [np.ones(2)], checksum=True)   # unnamed: no metadata possible
    # a file written by hand whose entry has the wrong length
    from kiln._files import save
    from kiln._files.atomic import AtomicFile
    from kiln._tensors import normalize_tensors
    from kiln._wire import R_PAYLOAD as P
    rec = save.meta_record({"__kiln_checksum__": {"algorithm": "crc32", "crc32": b"\0\0"}})
    records = normalize_tensors({"a": np.ones(2, np.float32)}) + [rec]
    with AtomicFile(p) as out:
        save.write_block(out, [r[:P] + (len(r[P]),) for r in records], [r[P] for r in records])
    with kiln.open(p) as f:   # the metadata (and its entry) is read when first used
        with pytest.raises(kiln.KilnError) as e:
            f.checksums
    assert e.value.code == "TYPE" and "__kiln_checksum__" in e.value.reason


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "kiln", *map(str, args)], capture_output=True,
                          text=True, timeout=120)


def test_kiln_check_says_what_it_verified(tmp_path):
    p = tmp_path / "m.kiln"
    kiln.save_tensors(p, _tensors())
    r = _cli("check", p)
    assert r.returncode == 0 and "NOT verified" in r.stdout and "bool bytes" in r.stdout
    kiln.save_tensors(p, _tensors(), checksum=True)
    r = _cli("check", p)
    assert r.returncode == 0 and "match the CRC-32 recorded for each of the 3 tensors" in r.stdout
    _flip(p, "a")
    r = _cli("check", p)
    assert r.returncode == 1 and "CHECKSUM at byte" in r.stdout and "'a'" in r.stdout


def test_kiln_convert_checksum(tmp_path):
    stnp = pytest.importorskip("safetensors.numpy")
    src, dst = tmp_path / "m.safetensors", tmp_path / "m.kiln"
    stnp.save_file({"a": np.arange(10, dtype=np.float32)}, str(src))
    r = _cli("convert", src, dst, "--checksum")
    assert r.returncode == 0, r.stderr
    _assert_layout(dst, {"a": np.arange(10, dtype=np.float32)})
    assert "match the CRC-32" in _cli("check", dst).stdout
    r = _cli("convert", dst, tmp_path / "back.safetensors", "--checksum")
    assert r.returncode != 0 and "only" in r.stderr
    npz = tmp_path / "m.npz"
    np.savez(npz, a=np.arange(4, dtype=np.int16))
    kiln.convert.convert(str(npz), str(tmp_path / "n.kiln"), checksum=True)
    _assert_layout(tmp_path / "n.kiln", {"a": np.arange(4, dtype=np.int16)})


def test_remote_files_verify_too(api, tmp_path):
    pytest.importorskip("fsspec", reason="needs fsspec, the [remote] extra")
    pytest.importorskip("aiohttp")
    from _servers import RangeServer
    p = tmp_path / "m.kiln"
    kiln.save_tensors(p, _tensors(), metadata={"step": 1}, checksum=True)
    with RangeServer(tmp_path) as server:
        url = server.url + "m.kiln"
        with kiln.open(url, verify=True) as f:
            assert isinstance(f, kiln.remote.RemoteFile)
            assert f["a"].numpy().sum() == 499500.0 and f.metadata == {"step": 1}
            assert [k for k, _ in f.items()] == ["a", "b", "c"] and f.get("z") is None
        assert kiln.load_tensors(url, verify=True).keys() == ["a", "b", "c"]
        _flip(p, "a")
        with kiln.open(url, verify=True) as f:
            assert f["b"].numpy().tolist() == [True, False, True]
            with pytest.raises(kiln.KilnError) as e:
                f["a"]
        assert e.value.code == "CHECKSUM" and "'a'" in e.value.reason
        with pytest.raises(kiln.KilnError) as e:
            kiln.load_tensors(url, verify=True)
        assert e.value.code == "CHECKSUM"
        r = _cli("check", url)
        assert r.returncode == 1 and "CHECKSUM" in r.stdout


# --- issue 39, item 5: checksums protect by default ------------------------------

def test_a_flipped_byte_is_caught_without_asking(api, tmp_path):
    p = tmp_path / "m.kiln"
    kiln.save_tensors(p, _tensors(), metadata={"step": 3}, checksum=True)
    at = _flip(p, "a")
    for copied in ({}, {"copy": True}, {"copy": True, "max_copy_bytes": 1 << 20}):
        with pytest.raises(kiln.KilnError) as e:
            kiln.load_tensors(p, **copied)                # no verify=True
        assert e.value.code == "CHECKSUM" and "'a'" in e.value.reason
        assert e.value.offset <= at < e.value.offset + 4000
        d = kiln.load_tensors(p, verify=False, **copied)  # off when asked
        assert d["b"].numpy().tolist() == [True, False, True]
    with kiln.open(p) as f:
        assert f["b"].numpy().tolist() == [True, False, True]
        assert f.rows("a", 0, 1).shape == (1, 100)        # part of it: only those rows read
        for read in (lambda: f["a"], f.values, f.tensors, lambda: f.rows("a", 0, 10),
                     lambda: f.rows("a", None, None)):
            with pytest.raises(kiln.KilnError) as e:
                read()
            assert e.value.code == "CHECKSUM" and "'a'" in e.value.reason
    with kiln.open(p, verify=False) as f:
        assert f["a"].numpy().shape == (10, 100)
        assert len(f.tensors()) == 3


def test_verification_by_default_reads_an_intact_file_as_before(api, tmp_path):
    p = tmp_path / "m.kiln"
    kiln.save_tensors(p, _tensors(), checksum=True)
    assert kiln.load_tensors(p)["a"].numpy().sum() == 499500.0
    assert kiln.load_tensors(p, copy=True)["a"].numpy().sum() == 499500.0
    kiln.save_tensors(p, _tensors())                      # no checksums: nothing to compare
    assert kiln.load_tensors(p)["b"].numpy().tolist() == [True, False, True]


def test_a_remote_file_is_verified_by_default(api, tmp_path):
    pytest.importorskip("fsspec", reason="needs fsspec, the [remote] extra")
    from _servers import RangeServer
    p = tmp_path / "m.kiln"
    kiln.save_tensors(p, _tensors(), checksum=True)
    _flip(p, "a")
    with RangeServer(tmp_path) as server:
        url = server.url + "m.kiln"
        with kiln.open(url) as f:
            with pytest.raises(kiln.KilnError, match="CHECKSUM"):
                f["a"]
        with pytest.raises(kiln.KilnError, match="CHECKSUM"):
            kiln.load_tensors(url)
        with kiln.open(url, verify=False) as f:
            assert f["a"].numpy().shape == (10, 100)
        assert kiln.load_tensors(url, verify=False).keys() == ["a", "b", "c"]


def test_kiln_convert_checksum_adds_checksums_to_a_kiln_file(tmp_path):
    src, dst = tmp_path / "a.kiln", tmp_path / "b.kiln"
    t = dict(_tensors(), d=np.arange(6, dtype=np.uint8))
    kiln.save_tensors(src, t, metadata={"step": 3, "cfg": {"lr": 0.1}})
    r = _cli("convert", src, dst, "--checksum")         # before: no conversion from kiln to kiln
    assert r.returncode == 0, r.stderr
    _assert_layout(dst, t)
    assert kiln.load_metadata(dst) == {"step": 3, "cfg": {"lr": 0.1}}
    assert "match the CRC-32 recorded for each of the 4 tensors" in _cli("check", dst).stdout
    r = _cli("convert", src, tmp_path / "c.kiln")         # without --checksum: nothing to do
    assert r.returncode == 2 and "--checksum" in r.stderr   # a usage error
    assert not (tmp_path / "c.kiln").exists()
    r = _cli("convert", dst, dst, "--checksum")
    assert r.returncode == 2 and "source" in r.stderr
    _flip(dst, "a")                                      # damage is not blessed with new sums
    r = _cli("convert", dst, tmp_path / "d.kiln", "--checksum")
    assert r.returncode == 1 and "CHECKSUM" in r.stderr and "'a'" in r.stderr
    assert not (tmp_path / "d.kiln").exists()


def test_the_kernel_crc32_is_zlibs(api):
    from kiln._files import checksum
    rng = np.random.default_rng(5)
    for n in (0, 1, 7, 63, 64, 65, 1000, 4099):
        data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        assert checksum.crc32(data) == crc32_oracle(data)


# --- a file read into memory is summed while it is read (overlap.Overlapped) ---

def _big(tmp_path, name="big.kiln"):
    """A checksummed file past OVERLAP_MIN, random payloads (so that each is found
    once in the file), and each tensor's (start, length) per the reference decoder."""
    from kiln._files import overlap as checksum
    rng = np.random.default_rng(39)
    n = checksum.OVERLAP_MIN // 4
    tensors = {"a": rng.random(n // 2, dtype=np.float32),
               "b": rng.integers(0, 1 << 30, n // 2, dtype=np.int64),
               "c": rng.random(3, dtype=np.float32)}
    p = tmp_path / name
    kiln.save_tensors(p, tensors, metadata={"step": 1}, checksum=True)
    buf = p.read_bytes()
    ts, _ = kiln_ref.read_directory(buf, 0)
    spans = {t["name"]: (buf.find(t["payload"]), len(t["payload"])) for t in ts}
    assert all(at > 0 for at, _ in spans.values()) and len(buf) > checksum.OVERLAP_MIN
    return p, tensors, buf, spans


def _crc_threads():
    import threading
    return [t for t in threading.enumerate() if t.name == "kiln-crc32"]


def test_the_crcs_computed_during_the_read_are_those_of_the_bytes_kept(api, tmp_path):
    import zlib
    from kiln._files import local, overlap as checksum
    p, _, buf, spans = _big(tmp_path)
    early = checksum.Overlapped(False, 1 << 20, 1 << 20)
    out = local.read_owned(str(p), None, early)
    assert bytes(out) == buf and not _crc_threads()
    # every payload, the metadata's too, summed by the thread (zlib as the oracle)
    assert early.known == {s: zlib.crc32(buf[s[0]:s[0] + s[1]]) for s in spans.values()}


def test_a_file_with_metadata_but_no_checksums_is_not_summed(api, tmp_path):
    """The thread reads the metadata ahead of the read and sums nothing when it
    holds no checksum entry; a user value that only looks like the key makes
    it sum (a cache: the file still loads, with nothing to compare)."""
    import zlib
    from kiln._files import local, overlap as checksum
    rng = np.random.default_rng(3)
    t = {"a": rng.random(checksum.OVERLAP_MIN // 8)}
    for meta, summed in (({"step": 1}, False), ({"note": "__kiln_checksum__"}, True)):
        p = tmp_path / "m.kiln"
        kiln.save_tensors(p, t, metadata=meta)
        early = checksum.Overlapped(False, 1 << 20, 1 << 20)
        out = local.read_owned(str(p), None, early)
        buf = p.read_bytes()
        assert bytes(out) == buf and not _crc_threads()
        ts, _ = kiln_ref.read_directory(buf, 0)
        want = {(buf.find(x["payload"]), len(x["payload"])): zlib.crc32(x["payload"])
                for x in ts}
        assert early.known == (want if summed else {})
        assert np.array_equal(kiln.load_tensors(p, copy=True)["a"].numpy(), t["a"])


def test_a_read_that_stops_leaves_only_whole_payloads_summed(api, tmp_path):
    import zlib
    from kiln._files import overlap as checksum
    _, _, buf, spans = _big(tmp_path)
    a_end = sum(spans["a"])
    early = checksum.Overlapped(False, 1 << 20, 1 << 20)
    out = np.zeros(len(buf), np.uint8)
    early.start(out)
    out[:a_end + 100] = np.frombuffer(buf, np.uint8)[:a_end + 100]
    early.advance(a_end + 100)   # "a" in, "b" begun: then the read ends (an error, say)
    early.finish()
    assert not _crc_threads()
    assert early.known == {spans["a"]: zlib.crc32(buf[spans["a"][0]:a_end])}


def test_a_flipped_byte_in_a_large_file_read_into_memory_is_checksum(api, tmp_path):
    p, tensors, buf, spans = _big(tmp_path)
    d = kiln.load_tensors(p, copy=True)
    assert np.array_equal(d["b"].numpy(), tensors["b"]) and not _crc_threads()
    for name, back in (("a", 9), ("b", 1), ("c", 1)):   # near each payload's end
        at = sum(spans[name]) - back
        bad = bytearray(buf)
        bad[at] ^= 0x01
        p.write_bytes(bytes(bad))
        with pytest.raises(kiln.KilnError) as e:
            kiln.load_tensors(p, copy=True)
        assert e.value.code == "CHECKSUM" and "%r" % name in e.value.reason
        assert e.value.offset == spans[name][0]
        other = "a" if name != "a" else "c"
        assert np.array_equal(kiln.load_tensors(p, copy=True, verify=False)[other].numpy(),
                              tensors[other])
        assert not _crc_threads()


def test_a_hostile_table_in_a_large_file_is_the_decoders_error(api, tmp_path):
    import struct
    p, _, buf, _ = _big(tmp_path)
    for at, value in ((24, (1 << 64) - 1), (24, len(buf) - 64), (8, 1 << 31), (16, 1 << 40)):
        bad = bytearray(buf)
        bad[at:at + 8 if at != 8 else at + 4] = struct.pack("<Q" if at != 8 else "<I", value)
        p.write_bytes(bytes(bad))
        with pytest.raises(kiln.KilnError) as e:
            kiln.load_tensors(p, copy=True)
        want = kiln.KilnError
        with pytest.raises(want) as ref:
            kiln.decode_tensors(bytes(bad))       # what the decoder says of the same bytes
        assert (e.value.code, e.value.offset) == (ref.value.code, ref.value.offset)
        assert not _crc_threads()


# --- from 8 MiB, two threads each sum half of the bytes (checksum.crcs) ---------

def test_crc32_combine_joins_two_crcs_as_zlib_does(api):
    from kiln._files import checksum
    rng = np.random.default_rng(7)
    for n1, n2 in ((0, 0), (0, 5), (5, 0), (1, 1), (3, 64), (1000, 4099), (77, 1 << 12)):
        a = rng.integers(0, 256, n1, dtype=np.uint8).tobytes()
        b = rng.integers(0, 256, n2, dtype=np.uint8).tobytes()
        assert checksum.crc32_combine(crc32_oracle(a), crc32_oracle(b), n2) == \
            crc32_oracle(a + b)


def _gf2_times(mat, vec):
    out, i = 0, 0
    while vec:
        if vec & 1:
            out ^= mat[i]
        vec >>= 1
        i += 1
    return out


def _combine_by_matrices(crc1, crc2, len2):
    """zlib 1.2.11's crc32_combine (32x32 bit matrices over GF(2), squared once a
    bit of the length): another method than kiln's powers of x, for an oracle."""
    mat = [0xEDB88320] + [1 << n for n in range(31)]   # appending one zero bit
    for _ in range(3):                                    # ... then eight: one byte
        mat = [_gf2_times(mat, mat[n]) for n in range(32)]
    while len2:
        if len2 & 1:
            crc1 = _gf2_times(mat, crc1)
        len2 >>= 1
        mat = [_gf2_times(mat, mat[n]) for n in range(32)]   # twice as many bytes
    return crc1 ^ crc2


def test_crc32_combine_of_lengths_past_32_bits(api):
    from kiln._files import checksum
    rng = np.random.default_rng(11)
    for n in [1, 3, 4099, (1 << 32) - 1, 1 << 32, (1 << 32) + 1, (1 << 40) + 12345,
              (1 << 63) - 1] + [int(x) for x in rng.integers(1, 1 << 62, 6)]:
        a, b = (int(x) for x in rng.integers(0, 1 << 32, 2))
        assert checksum.crc32_combine(a, b, n) == _combine_by_matrices(a, b, n), n
    with pytest.raises(ValueError):
        checksum.crc32_combine(1, 2, -1)


@pytest.mark.parametrize("sizes", [[9 << 20], [1, 9 << 20, 3], [4 << 20, 4 << 20, 1],
                                   [0, 5 << 20, 0, 5 << 20], [(4 << 20) + 1] * 2, [7, 2, 3]])
def test_crcs_of_many_buffers_are_zlibs_wherever_the_half_falls(api, sizes):
    import zlib
    from kiln._files import checksum
    rng = np.random.default_rng(len(sizes))
    views = [rng.integers(0, 256, n, dtype=np.uint8) for n in sizes]
    assert checksum.crcs(views) == [zlib.crc32(v) for v in views]
    assert not _crc_threads()


def test_a_flipped_byte_anywhere_in_a_large_file_read_as_views_is_checksum(api, tmp_path):
    """10 MiB: the half of the bytes falls 2 MiB into "b", so "a" and b's head are
    summed by the caller's thread, b's tail and "c" by the second one."""
    rng = np.random.default_rng(8)
    tensors = {"a": rng.integers(0, 256, 3 << 20, dtype=np.uint8),
               "b": rng.integers(0, 256, 6 << 20, dtype=np.uint8),
               "c": rng.integers(0, 256, 1 << 20, dtype=np.uint8)}
    p = tmp_path / "big.kiln"
    kiln.save_tensors(p, tensors, checksum=True)
    buf = p.read_bytes()
    ts, _ = kiln_ref.read_directory(buf, 0)
    spans = {t["name"]: buf.find(t["payload"]) for t in ts}
    assert np.array_equal(kiln.load_tensors(p)["b"].numpy(), tensors["b"])
    for name, into in (("a", 100), ("b", 1 << 20), ("b", 5 << 20), ("c", 9)):
        bad = bytearray(buf)
        bad[spans[name] + into] ^= 0x04
        p.write_bytes(bytes(bad))
        for read in (lambda: kiln.load_tensors(p), lambda: kiln.open(p).verify(),
                     lambda: kiln.open(p)[name].numpy(),
                     lambda: kiln.open(p).tensors()):
            with pytest.raises(kiln.KilnError) as e:
                read()
            assert e.value.code == "CHECKSUM" and "%r" % name in e.value.reason
            assert e.value.offset == spans[name]
        with kiln.open(p) as f:   # the others still read, each checked
            for other in set(tensors) - {name}:
                assert np.array_equal(f[other].numpy(), tensors[other])
        assert not _crc_threads()
