"""The record container (kiln.records): writer, random access, recovery, streams.

Expected bytes and offsets come from tests/_records_util.py, an independent
writer built from spec/records.md with struct and zlib only, and from the
public kiln.encode of each value.
"""

import dataclasses
import io
import multiprocessing
import os
import pickle
import signal
import struct
import subprocess
import sys
import threading
import time
import tracemalloc
import typing
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import kiln
import _records_util as U

T = "struct{id:i64,name:str,}"
TT = "struct{id:i64,name:str,img:tensors,}"
H = kiln.parse_type(T).schema_hash
SETTINGS = settings(max_examples=40, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


def values(n):
    return [{"id": i, "name": "n" * (i % 7)} for i in range(n)]


def framed(v, t=T):
    return kiln.encode(v, t, frame=True)


def write(impl, target, vals, t=T, **kw):
    with kiln.RecordWriter(target, t, kernels=impl.kernels, **kw) as w:
        for i, v in enumerate(vals):
            assert w.write(v) == i


def open_rf(impl, src, t=T, **kw):
    return kiln.RecordFile(src, t, kernels=impl.kernels, **kw)


def read_all(impl, data, t=T, **kw):
    with open_rf(impl, io.BytesIO(data), t, **kw) as rf:
        return list(rf)


def expect(code, offset, fn, *args, **kw):
    with pytest.raises(kiln.KilnError) as ei:
        fn(*args, **kw)
    assert (ei.value.code, ei.value.offset) == (code, offset), str(ei.value)
    return ei.value


def stream(impl, data, t=T, chunks=None, recover=False, **kw):
    d = kiln.StreamDecoder(t, kernels=impl.kernels, **kw)
    out = []
    if chunks is None:
        out += d.feed(data)
    else:
        for a, b in zip([0] + chunks, chunks + [len(data)]):
            out += d.feed(data[a:b])
    d.eof(recover)
    return out


# --- the writer writes what the spec says ----------------------------------------

def test_writer_bytes_are_the_spec_layout(impl, tmp_path):
    vals = values(5)
    write(impl, tmp_path / "a.kilnr", vals, store_type=False)
    want, _ = U.container(H, [framed(v) for v in vals])
    assert (tmp_path / "a.kilnr").read_bytes() == want
    out = io.BytesIO()
    write(impl, out, vals, store_type=False)
    assert out.getvalue() == want
    empty = io.BytesIO()
    write(impl, empty, [], store_type=False)
    assert empty.getvalue() == U.container(H, [])[0]
    # the default head carries the type text (spec/records.md, "Type text")
    out = io.BytesIO()
    write(impl, out, vals)
    assert out.getvalue() == U.container(H, [framed(v) for v in vals], text=T)[0]
    assert out.getvalue()[:48] == (b"KLNR\x01\x01\x00\x00" + struct.pack("<Q", H) +
                                   b"\x18\x00\x00\x00struct{id:i64,name:str,}" +
                                   struct.pack("<I", zlib.crc32(out.getvalue()[:44])))


def test_random_access_slices_iteration(impl, tmp_path):
    vals = values(12)
    write(impl, tmp_path / "a.kilnr", vals)
    with open_rf(impl, str(tmp_path / "a.kilnr")) as rf:
        assert len(rf) == 12
        assert rf[0] == vals[0] and rf[-1] == vals[-1] and rf[-12] == vals[0]
        assert rf[3:9:2] == vals[3:9:2] and rf[::-1] == vals[::-1]
        assert list(rf) == vals
        for bad in (12, -13):
            with pytest.raises(IndexError):
                rf[bad]
    with pytest.raises(ValueError):
        rf[0]


@dataclasses.dataclass
class Sample:
    id: kiln.I64
    name: str


def test_bound_class_gives_instances(impl, tmp_path):
    p = tmp_path / "s.kilnr"
    with kiln.RecordWriter(p, Sample, kernels=impl.kernels) as w:
        w.write(Sample(1, "a"))
        w.write(Sample(2, "b"))
    with kiln.RecordFile(p, Sample, kernels=impl.kernels) as rf:
        assert rf[1] == Sample(2, "b") and list(rf) == [Sample(1, "a"), Sample(2, "b")]


def test_tensors_are_aligned_views_that_outlive_close(impl, tmp_path):
    p = tmp_path / "t.kilnr"
    vals = [{"id": i, "name": "x" * i,
             "img": {"a": np.arange(i + 1, dtype=np.float32), "b": np.full(3, i, np.int16)}}
            for i in range(9)]
    write(impl, p, vals, TT)
    rf = open_rf(impl, p, TT)
    arrays = []
    for i, r in enumerate(rf):
        for name in ("a", "b"):
            arr = r["img"][name].numpy()
            assert arr.__array_interface__["data"][0] % 64 == 0, (i, name)
            assert arr.tolist() == vals[i]["img"][name].tolist()
            arrays.append(arr)
    rf.close()
    del rf
    assert arrays[-2].tolist() == list(range(9))   # the mapping lives on under the views


def _sum_ids(args):
    rf, idx = args
    return sum(rf[i]["id"] for i in idx)


def test_pickled_to_worker_processes(impl, tmp_path):
    p = str(tmp_path / "a.kilnr")
    vals = values(40)
    write(impl, p, vals)
    rf = open_rf(impl, p)
    again = pickle.loads(pickle.dumps(rf))
    assert list(again) == vals
    pool = multiprocessing.get_context("fork").Pool(2)
    try:
        got = pool.map(_sum_ids, [(rf, range(k, 40, 4)) for k in range(4)])
    finally:
        pool.terminate()
        pool.join()
    assert sum(got) == sum(range(40))
    with pytest.raises(TypeError):
        pickle.dumps(open_rf(impl, io.BytesIO(open(p, "rb").read())))


# --- a file cut short, torn, or never closed -----------------------------------------

def test_every_truncation(impl):
    vals = values(3)
    data, offs = U.container(H, [framed(v) for v in vals])
    ends = offs[1:] + [offs[-1] + 20 + len(framed(vals[-1]))]
    for cut in range(len(data)):
        with pytest.raises(kiln.KilnError):
            read_all(impl, data[:cut])
        if cut < 16:
            with pytest.raises(kiln.KilnError):
                read_all(impl, data[:cut], recover=True)
            continue
        with open_rf(impl, io.BytesIO(data[:cut]), recover=True) as rf:
            n = sum(e <= cut for e in ends)
            assert list(rf) == vals[:n], cut
            assert rf.recovery.offset == ([16] + ends)[n]
            assert isinstance(rf.recovery.error, kiln.KilnError)


def test_recover_after_zeros_or_garbage_tail(impl):
    vals = values(4)
    body, offs = U.container(H, [framed(v) for v in vals], closed=False)
    end = len(body)
    with open_rf(impl, io.BytesIO(body + bytes(4096)), recover=True) as rf:
        assert list(rf) == vals
        assert rf.recovery.offset == end
        assert (rf.recovery.error.code, rf.recovery.error.offset) == ("CHECKSUM", end + 12)
    expect("FRAME", end + 4096 - 8, read_all, impl, body + bytes(4096))
    # a torn record: the right head, half of the value
    torn = body + U.record(framed(values(5)[4]))[:25]
    with open_rf(impl, io.BytesIO(torn), recover=True) as rf:
        assert list(rf) == vals and rf.recovery.error.code == "EOF"
        assert rf.recovery.error.offset == end


WRITER = """
import sys, kiln
with kiln.RecordWriter(sys.argv[1], "struct{id:i64,name:str,}") as w:
    i = 0
    while True:
        w.write({"id": i, "name": "n" * (i % 7)})
        if i % 50 == 0:
            w.flush()
        i += 1
"""


def test_writer_killed_leaves_recoverable_records(impl, tmp_path):
    # the records go to a new file beside the path (replaced at close): a
    # killed writer leaves them there, named by kiln.records.unfinished
    p = tmp_path / "k.kilnr"
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(kiln.__file__)))

    def writing():
        found = kiln.records.unfinished(p)
        return found[0] if found else None

    for wait in (20000, 70000):
        before = set(kiln.records.unfinished(p))
        proc = subprocess.Popen([sys.executable, "-c", WRITER, str(p)], env=env)
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                w = writing()
                if w is not None and w not in before and os.path.getsize(w) >= wait:
                    break
                time.sleep(0.01)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        assert not p.exists()   # never put in place
        w = writing()
        assert w not in before and w.endswith(".kilnr-writing")
        with pytest.raises(kiln.KilnError):
            open_rf(impl, w)
        with open_rf(impl, w, recover=True) as rf:
            assert len(rf) > 100
            assert list(rf) == values(len(rf))


def test_garbage_after_the_trailer(impl):
    data, _ = U.container(H, [framed(v) for v in values(3)])
    expect("FRAME", len(data) + 1 - 8, read_all, impl, data + b"x")
    expect("TRAILING", len(data), stream, impl, data + b"x")


def test_lengths_past_the_end_and_near_2_64(impl):
    body, offs = U.container(H, [framed(v) for v in values(2)], closed=False)
    pos = len(body)
    for length in (2 ** 64 - 1, 2 ** 63, 10 ** 12, 100):
        bad = body + U.head(length) + b"\0" * 40
        with open_rf(impl, io.BytesIO(bad), recover=True) as rf:
            assert len(rf) == 2
            assert (rf.recovery.error.code, rf.recovery.error.offset) == ("EOF", pos)
        if length > 256 << 20:
            expect("LIMIT", pos, stream, impl, bad)
        else:
            expect("EOF", pos + 16 + 40, stream, impl, bad)
    # a closed file whose last record claims more than it has
    data, offs = U.container(H, [framed(v) for v in values(2)])
    bad = bytearray(data)
    bad[offs[1]:offs[1] + 16] = U.head(2 ** 64 - 1)
    with open_rf(impl, io.BytesIO(bytes(bad))) as rf:
        assert rf[0] == values(1)[0]
        expect("FRAME", offs[1], rf.__getitem__, 1)
        expect("FRAME", offs[1], list, rf)


def test_stream_limit_before_any_allocation(impl):
    data = U.header(H) + U.head(200 << 20) + b"\0" * 100
    tracemalloc.start()
    try:
        expect("EOF", len(data), stream, impl, data)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20
    d = kiln.StreamDecoder(T, max_record_bytes=1000, kernels=impl.kernels)
    expect("LIMIT", 16, d.feed, U.header(H) + U.head(1001))
    expect("LIMIT", 16, d.feed, b"more")          # a failed decoder stays failed


# --- the index and the trailer ---------------------------------------------------------

def test_index_out_of_order_out_of_range_inconsistent(impl):
    vals = values(4)
    fr = [framed(v) for v in vals]
    _, offs = U.container(H, fr)
    swapped = [offs[0], offs[2], offs[1], offs[3]]
    data, _ = U.container(H, fr, offsets=swapped)
    expect("FRAME", U.entry_at(data, 2), read_all, impl, data)
    data, _ = U.container(H, fr, offsets=[17] + offs[1:])
    expect("FRAME", U.entry_at(data, 0), read_all, impl, data)
    data, _ = U.container(H, fr, offsets=offs[:3] + [2 ** 63])
    expect("FRAME", U.entry_at(data, 3), read_all, impl, data)
    data, _ = U.container(H, fr, offsets=offs[:3] + [2 ** 64 - 1])
    expect("FRAME", U.entry_at(data, 3), read_all, impl, data)
    # increasing and in range, but not where the records are
    data, _ = U.container(H, fr, offsets=[offs[0], offs[2], offs[3]], count=3)
    with open_rf(impl, io.BytesIO(data)) as rf:
        expect("FRAME", offs[0], rf.__getitem__, 0)
        assert rf[2] == vals[3]
    # the count and the index disagree
    data, _ = U.container(H, fr, count=3)
    expect("FRAME", offs[3] + 20 + len(fr[3]), read_all, impl, data)
    expect("FRAME", len(data) - 40, stream, impl, data)


def _crc_twin(entries, k):
    """``entries`` with entry ``k`` moved by 8 and its high 4 bytes chosen so
    that the CRC-32 of all of them (8 little-endian bytes each) stays what it
    was: a forged index that a check by CRC alone cannot tell from the real one."""
    raw = bytearray(b"".join(struct.pack("<Q", e) for e in entries))
    want = zlib.crc32(bytes(raw))
    base = bytearray(raw)
    base[8 * k:8 * k + 8] = struct.pack("<Q", entries[k] + 8)
    at = 8 * k + 4
    base[at:at + 4] = bytes(4)
    c0 = zlib.crc32(bytes(base))
    cols = []
    for bit in range(32):
        b = bytearray(base)
        b[at + bit // 8] ^= 1 << (bit % 8)
        cols.append(zlib.crc32(bytes(b)) ^ c0)
    # solve sum(x_i * cols[i]) == want ^ c0 over GF(2), Gaussian elimination
    rows = [(cols[i], 1 << i) for i in range(32)]
    target, x, pivots = want ^ c0, 0, []
    for bit in range(32):
        m = 1 << bit
        j = next((j for j, (c, _) in enumerate(rows) if c & m), None)
        if j is None:
            continue
        pc, pm = rows.pop(j)
        rows = [(c ^ pc, v ^ pm) if c & m else (c, v) for c, v in rows]
        pivots = [(c ^ pc, v ^ pm) if c & m else (c, v) for c, v in pivots]
        pivots.append((pc, pm))
    for c, v in pivots:
        if target & (c & -c):
            target ^= c
            x ^= v
    assert target == 0
    base[at:at + 4] = struct.pack("<I", x)
    out = [struct.unpack_from("<Q", base, 8 * i)[0] for i in range(len(entries))]
    assert zlib.crc32(bytes(base)) == want and out != list(entries)
    return out


def test_a_stream_checks_its_index_as_strictly_as_a_file(impl):
    # issue 38 item 5: entries whose CRC matches the records' offsets passed
    # the stream (done=True) where RecordFile refuses them
    vals = values(3)
    fr = [framed(v) for v in vals]
    _, offs = U.container(H, fr)
    for k in range(3):
        forged = _crc_twin(offs, k)
        data, _ = U.container(H, fr, offsets=forged)
        e = expect("FRAME", U.entry_at(data, k), read_all, impl, data)
        assert "index entry %d" % k in e.reason
        for size in (1, 7, len(data)):
            got, count, err = _feed_in_chunks(impl, data, size)
            assert (got, count, err) == (vals, 3, ("FRAME", U.entry_at(data, k))), (k, size)
    # each rule of the file's check, at the entry it names
    ip = offs[-1] + 20 + len(fr[-1])
    for entries, k in (([offs[0], offs[2], offs[1]], 2), ([17, offs[1], offs[2]], 0),
                       ([offs[0], offs[0] + 35, offs[2]], 1), ([offs[0], offs[1], ip - 35], 2),
                       ([offs[0], 2 ** 64 - 1, offs[2]], 1), ([offs[0], offs[1], ip + 1], 2)):
        data, _ = U.container(H, fr, offsets=entries)
        expect("FRAME", U.entry_at(data, k), read_all, impl, data)
        for size in (1, 5, len(data)):
            assert _feed_in_chunks(impl, data, size)[2] == ("FRAME", U.entry_at(data, k))
    # the index's own CRC comes first, as in a file, and whatever verify says
    data, _ = U.container(H, fr, offsets=[17, offs[1], offs[2]])
    bad = bytearray(data)
    bad[len(data) - 44] ^= 1
    crc_at = len(data) - 44
    expect("CHECKSUM", crc_at, read_all, impl, bytes(bad))
    for verify in (True, False):
        assert _feed_in_chunks(impl, bytes(bad), 3, verify=verify)[2] == ("CHECKSUM", crc_at)


@SETTINGS
@given(ip=st.integers(0, 2 ** 64 - 1), count=st.integers(0, 2 ** 64 - 1))
def test_trailer_pointing_anywhere(impl, ip, count):
    fr = [framed(v) for v in values(3)]
    good, offs = U.container(H, fr)
    data, _ = U.container(H, fr, index_pos=ip, count=count)
    if data == good:
        return
    with pytest.raises(kiln.KilnError) as ei:
        read_all(impl, data)
    assert 0 <= ei.value.offset < len(data)
    with pytest.raises(kiln.KilnError):
        stream(impl, data)


def test_records_of_another_schema(impl):
    data, offs = U.container(H, [framed(v) for v in values(2)])
    expect("SCHEMA", 8, read_all, impl, data, "struct{id:i64,name:list<u8>,}")
    expect("SCHEMA", 8, stream, impl, data, "struct{id:i64,name:list<u8>,}")
    other = kiln.encode(7, "i64", frame=True)
    data, offs = U.container(H, [framed(values(1)[0]), other])
    expect("SCHEMA", offs[1] + 16 + 8, read_all, impl, data)
    expect("SCHEMA", offs[1] + 16 + 8, stream, impl, data)


def test_a_bad_value_names_its_byte_in_the_file(impl):
    t = "struct{a:i32,b:bool,}"
    h = kiln.parse_type(t).schema_hash
    good = kiln.encode({"a": 1, "b": True}, t, frame=True)
    bad = good[:-1] + b"\x02"
    data, offs = U.container(h, [good, bad])
    expect("TYPE", offs[1] + 16 + 16 + 4, read_all, impl, data, t)
    expect("TYPE", offs[1] + 16 + 16 + 4, stream, impl, data, t)


def test_checksums_and_verify_false(impl):
    vals = [{"id": 1, "name": "abc"}]
    data, offs = U.container(H, [framed(v) for v in vals])
    bad = bytearray(data)
    at = offs[0] + 16 + 16 + 8 + 4           # the first char of the name
    bad[at] = ord("x")
    crc_at = offs[0] + 16 + len(framed(vals[0]))
    expect("CHECKSUM", crc_at, read_all, impl, bytes(bad))
    expect("CHECKSUM", crc_at, stream, impl, bytes(bad))
    assert read_all(impl, bytes(bad), verify=False) == [{"id": 1, "name": "xbc"}]


@SETTINGS
@given(st.data())
def test_any_single_byte_change_is_caught(impl, data):
    fr = [framed(v) for v in values(3)]
    good, _ = U.container(H, fr)
    at = data.draw(st.integers(0, len(good) - 1))
    byte = data.draw(st.integers(0, 255).filter(lambda b: b != good[at]))
    bad = good[:at] + bytes([byte]) + good[at + 1:]
    with pytest.raises(kiln.KilnError):
        read_all(impl, bad)
    with pytest.raises(kiln.KilnError):
        stream(impl, bad)


# --- streams ---------------------------------------------------------------------------

@SETTINGS
@given(st.data())
def test_any_chunking_gives_the_same_records(impl, data):
    vals = values(6)
    raw, _ = U.container(H, [framed(v) for v in vals])
    cuts = sorted(set(data.draw(st.lists(st.integers(0, len(raw)), max_size=30))))
    assert stream(impl, raw, chunks=cuts) == vals
    # with recover=True a stream may end after any complete record, and only
    # there; without it, only after its trailer (a killed writer's file must not
    # pass for a whole one)
    _, offs = U.container(H, [framed(v) for v in vals])
    index_at = offs[-1] + 20 + len(framed(vals[-1]))
    end = data.draw(st.one_of(st.integers(16, len(raw)), st.sampled_from(offs + [index_at])))
    ends = set(offs) | {index_at, len(raw)}
    if end in ends:
        assert stream(impl, raw[:end], chunks=[c for c in cuts if c < end], recover=True) == \
            vals[:sum(o < end for o in offs)]
        if end != len(raw):
            with pytest.raises(kiln.KilnError) as ei:
                stream(impl, raw[:end], chunks=[c for c in cuts if c < end])
            assert (ei.value.code, ei.value.offset) == ("EOF", end)
    else:
        with pytest.raises(kiln.KilnError) as ei:
            stream(impl, raw[:end], chunks=[c for c in cuts if c < end])
        assert (ei.value.code, ei.value.offset) == ("EOF", end)


def test_eof_inside_a_record_names_it(impl):
    vals = values(3)
    raw, offs = U.container(H, [framed(v) for v in vals], closed=False)
    for cut in range(offs[1] + 1, offs[2]):
        e = expect("EOF", cut, lambda: list(kiln.iter_records(io.BytesIO(raw[:cut]), T,
                                                              kernels=impl.kernels)))
        assert "record 1 (from byte %d)" % offs[1] in e.reason


def test_iter_records_over_a_pipe(impl):
    vals = values(300)
    r, w = os.pipe()
    rf, wf = os.fdopen(r, "rb"), os.fdopen(w, "wb")

    def produce():
        with wf:
            write(impl, wf, vals)
    th = threading.Thread(target=produce)
    th.start()
    try:
        with rf:
            assert list(kiln.iter_records(rf, T, kernels=impl.kernels)) == vals
    finally:
        th.join()


class _Source:
    """A stream of ``n`` records made on the fly (never all in memory)."""

    def __init__(self, n, size):
        self.n, self.size, self.i, self.buf = n, size, 0, b""

    def read(self, k):
        while len(self.buf) < k and (self.i <= self.n):
            if self.i == 0:
                self.buf += U.header(kiln.parse_type("list<u8>").schema_hash)
            else:
                v = bytes([self.i % 256]) * self.size
                self.buf += U.record(kiln.encode(v, "list<u8>", frame=True))
            self.i += 1
        out, self.buf = self.buf[:k], self.buf[k:]
        return out


def test_iter_records_memory_stays_flat(impl):
    tracemalloc.start()
    try:
        n = 0
        for v in kiln.iter_records(_Source(3000, 4000), "list<u8>", kernels=impl.kernels,
                                   recover=True):   # the source writes no index
            assert len(v) == 4000
            n += 1
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert n == 3000
    assert peak < 1 << 20            # the stream is 12 MB


# --- remote files --------------------------------------------------------------------

def test_remote_reads_move_only_what_they_need(impl, tmp_path):
    fsspec = pytest.importorskip("fsspec", reason="needs fsspec, the [remote] extra")
    vals = [{"id": i, "name": "r" * 900} for i in range(3000)]
    out = io.BytesIO()
    write(impl, out, vals)
    data = out.getvalue()
    fs = fsspec.filesystem("memory")
    fs.pipe("/records/r.kilnr", data)
    try:
        rf = open_rf(impl, "memory://records/r.kilnr")
        assert len(rf) == 3000
        opened = rf.bytes_fetched
        ip = struct.unpack_from("<Q", data, len(data) - 40)[0]
        # the first 64 KiB block, the trailer, the index record (every entry is checked)
        assert opened == (64 << 10) + 40 + (len(data) - 40 - ip)
        assert rf[1234] == vals[1234]
        rec = 20 + len(framed(vals[1234]))
        assert rf.bytes_fetched - opened == rec           # exactly the record
        assert rf[1235] == vals[1235]
        assert rf.bytes_fetched - opened == 2 * rec
        assert rf[-1] == vals[-1]
        assert pickle.loads(pickle.dumps(rf))[7] == vals[7]
        assert len(data) > 2_500_000
        assert rf.bytes_fetched < 300_000
        rf.close()
    finally:
        fs.rm("/records", recursive=True)


def test_writer_rejects_bad_values_and_writes_after_close(impl):
    out = io.BytesIO()
    w = kiln.RecordWriter(out, T, kernels=impl.kernels)
    w.write(values(1)[0])
    with pytest.raises(kiln.EncodeError):
        w.write({"id": "x", "name": ""})
    w.close()
    w.close()
    with pytest.raises(ValueError):
        w.write(values(1)[0])
    assert read_all(impl, out.getvalue()) == values(1)


def test_records_before_a_fault_come_out_in_any_chunking(impl):
    vals = values(3)
    data, offs = U.container(H, [framed(v) for v in vals])
    bad = bytearray(data)
    bad[offs[2] + 3] ^= 1                     # record 2's head is damaged
    for chunks in ([], [offs[2] + 5], list(range(1, len(bad), 3))):
        d = kiln.StreamDecoder(T, kernels=impl.kernels)
        got = []
        with pytest.raises(kiln.KilnError) as ei:
            for a, b in zip([0] + chunks, chunks + [len(bad)]):
                got += d.feed(bytes(bad[a:b]))
            d.eof()
        assert got == vals[:2]
        assert (ei.value.code, ei.value.offset) == ("CHECKSUM", offs[2] + 12)


def _feed_in_chunks(impl, data, size, **kw):
    """Feed ``data`` ``size`` bytes at a time: the records handed out, the
    decoder's count, and the error (code, offset) or None."""
    d = kiln.StreamDecoder(T, kernels=impl.kernels, **kw)
    got = []
    try:
        for a in range(0, len(data), size):
            got += d.feed(data[a:a + size])
        d.eof()
        err = None
    except kiln.KilnError as e:
        err = (e.code, e.offset)
    return got, d.count, err


def test_the_count_after_a_fault_is_the_records_handed_out_in_any_chunking(impl):
    # issue 38 item 17: one feed counted 0 where a byte-by-byte feed counted 2
    vals = values(4)
    data, offs = U.container(H, [framed(v) for v in vals])
    value_crc = offs[3] - 4
    cases = []
    bad = bytearray(data)
    bad[offs[2] + 3] ^= 1                                 # record 2's head
    cases.append((bytes(bad), {}, 2, ("CHECKSUM", offs[2] + 12)))
    bad = bytearray(data)
    bad[offs[2] + 20] ^= 1                                # record 2's value
    cases.append((bytes(bad), {}, 2, ("CHECKSUM", value_crc)))
    bad = bytearray(data)
    bad[offs[2] + 16 + 4] = 0x99                          # its frame profile (CRC made right)
    end = offs[3] - 4
    bad[end:end + 4] = struct.pack("<I", zlib.crc32(bytes(bad[offs[2]:end])))
    cases.append((bytes(bad), {}, 2, ("FRAME", offs[2] + 16 + 4)))
    cases.append((data, {"max_record_bytes": len(framed(vals[0]))}, 1,
                  ("LIMIT", offs[1])))                    # record 1 is one byte longer
    for hostile, kw, n, err in cases:
        for size in range(1, len(hostile) + 1):
            got, count, e = _feed_in_chunks(impl, hostile, size, **kw)
            assert (got, count, e) == (vals[:n], n, err), (size, err)


ZT = "struct{id:i64,e:list<struct{}>,}"        # elements of wire size 0


def _zero_size_file(n, claim):
    """``n`` records of ZT whose lists each claim ``claim`` empty structs:
    28 value bytes a record, whatever the claim."""
    h = kiln.parse_type(ZT).schema_hash
    val = struct.pack("<4sBBHQ", b"KLN0", 0, 0, 0, h) + struct.pack("<qI", 7, claim)
    return U.container(h, [val] * n)


def _peak(fn):
    tracemalloc.start()
    try:
        try:
            keep = fn()
        except kiln.KilnError as e:
            keep = e
        return tracemalloc.get_traced_memory()[1], keep
    finally:
        tracemalloc.stop()


def test_one_zero_size_budget_bounds_a_whole_read(impl):
    # issue 38 item 2: each record had the whole max_count budget, so a
    # 2 KB file cost the budget times the records a read decoded at once
    cap = 1 << 15
    data, offs = _zero_size_file(60, cap)
    assert len(data) < 3500                  # 60 records: 56 bytes each, and the index
    one, _ = _peak(lambda: open_rf(impl, io.BytesIO(data), ZT, max_count=cap)[0])
    assert one > cap * 8                      # one record's list is at least its pointers
    bound = 2 * one + (1 << 20)
    reads = {
        "rf[0]": lambda: open_rf(impl, io.BytesIO(data), ZT, max_count=cap)[0],
        "next(iter(rf))": lambda: next(iter(open_rf(impl, io.BytesIO(data), ZT,
                                                    max_count=cap))),
        "list(rf)": lambda: list(open_rf(impl, io.BytesIO(data), ZT, max_count=cap)),
        "rf[:]": lambda: open_rf(impl, io.BytesIO(data), ZT, max_count=cap)[:],
        "rf[::2]": lambda: open_rf(impl, io.BytesIO(data), ZT, max_count=cap)[::2],
        "next(iter_records)": lambda: next(kiln.iter_records(
            io.BytesIO(data), ZT, kernels=impl.kernels, max_count=cap)),
        "stream": lambda: stream(impl, data, ZT, max_count=cap),
        "stream by 7": lambda: stream(impl, data, ZT, list(range(7, len(data), 7)),
                                      max_count=cap),
    }
    for what, read in reads.items():
        peak, got = _peak(read)
        assert peak < bound, (what, peak >> 20, one >> 20)
        if what in ("list(rf)", "rf[:]", "rf[::2]", "stream", "stream by 7"):
            # the second record's list is above what the first left: LIMIT at its count
            at = offs[2] + 16 + 16 + 8 if what == "rf[::2]" else offs[1] + 16 + 16 + 8
            assert isinstance(got, kiln.KilnError), what
            assert (got.code, got.offset) == ("LIMIT", at), (what, str(got))
    # the budget is one read's: each rf[i], each new iteration starts afresh
    with open_rf(impl, io.BytesIO(data), ZT, max_count=cap) as rf:
        assert [len(rf[i]["e"]) for i in (0, 1, 59)] == [cap] * 3
        for _ in range(2):
            it = iter(rf)
            assert len(next(it)["e"]) == cap
    half, _ = _zero_size_file(4, cap // 4)
    assert [len(r["e"]) for r in read_all(impl, half, ZT, max_count=cap)] == [cap // 4] * 4
    assert [len(r["e"]) for r in stream(impl, half, ZT, [5, 50], max_count=cap)] == \
        [cap // 4] * 4


class _RecT(kiln.Record):
    id: int
    name: str
    img: kiln.TensorDirectory


@dataclasses.dataclass
class _DCT:
    id: int
    name: str
    img: kiln.TensorDirectory


class _NTT(typing.NamedTuple):
    id: int
    name: str
    img: kiln.TensorDirectory


@pytest.mark.parametrize("cls", [_RecT, "pure-base Record", _DCT, _NTT])
def test_every_record_class_writes_aligned_payloads(impl, tmp_path, cls):
    """Issue 38 item 11: the writer pads each record so its first tensor
    payload sits on a 64-byte boundary whatever class the records are given
    as (kiln.Record on either base, a dataclass, a NamedTuple), not for dataclasses only."""
    if cls == "pure-base Record":
        cls = type("_PyRecT", (kiln._record.PyRecord,), {"__annotations__": dict(
            _RecT.__annotations__)})
    p = tmp_path / "al.kilnr"
    with kiln.RecordWriter(p, cls, kernels=impl.kernels) as w:
        for i in range(6):   # names of varying length shift every payload
            w.write(cls(i, "n" * (3 * i + 1), {"a": np.arange(i + 2, dtype=np.float32),
                                               "b": np.full(5, i, np.int16)}))
    with open_rf(impl, p, cls) as rf:
        got = [r.img for r in rf]
    assert len(got) == 6
    for i, d in enumerate(got):
        for name in ("a", "b"):
            assert np.frombuffer(d[name].data, np.uint8).__array_interface__["data"][0] % 64 == 0, \
                (cls, i, name)
        assert d["a"].numpy().tolist() == list(range(i + 2))


def test_alignment_needs_no_dtype_support_and_covers_packed_tensors(impl, tmp_path):
    p = tmp_path / "q.kilnr"
    with kiln.RecordWriter(p, TT, kernels=impl.kernels) as w:
        for i in range(5):
            w.write({"id": i, "name": "q" * (3 * i),
                     "img": [kiln.Tensor(bytes([i]) * 6, dtype="bf16", shape=(3,), name="h"),
                             kiln.Tensor(bytes([0x21]) * 2, dtype="u4", shape=(4,), name="n")]})
    with open_rf(impl, p, TT) as rf:
        for i, r in enumerate(rf):
            for name in ("h", "n"):
                view = np.frombuffer(r["img"][name].data, np.uint8)
                assert view.__array_interface__["data"][0] % 64 == 0, (i, name)
            assert bytes(r["img"]["h"].data) == bytes([i]) * 6


def test_remote_index_frame_is_checked_and_remote_recovery(impl):
    fsspec = pytest.importorskip("fsspec", reason="needs fsspec, the [remote] extra")
    fr = [framed(v) for v in values(3)]
    good, offs = U.container(H, fr)
    ip = offs[-1] + 20 + len(fr[-1])
    pad = good[ip + 9]
    value = bytearray(U.index_value(offs))
    value[16:20] = struct.pack("<I", 2)          # the list's own count disagrees
    bad = good[:ip] + U.record(bytes(value), kind=1, pad=pad) + good[-40:]
    fs = fsspec.filesystem("memory")
    try:
        fs.pipe("/rec/bad.kilnr", bad)
        expect("FRAME", ip + 16 + pad, open_rf, impl, "memory://rec/bad.kilnr")
        expect("FRAME", ip + 16 + pad, read_all, impl, bad)
        expect("FRAME", ip + 16 + pad, stream, impl, bad)
        fs.pipe("/rec/torn.kilnr", good[:offs[2] + 30])
        with open_rf(impl, "memory://rec/torn.kilnr", recover=True) as rf:
            assert list(rf) == values(2) and rf.recovery.offset == offs[2]
    finally:
        fs.rm("/rec", recursive=True)


def test_remote_over_http_counts_the_bytes_on_the_wire(impl, tmp_path):
    pytest.importorskip("fsspec", reason="needs fsspec, the [remote] extra")
    pytest.importorskip("aiohttp")
    from _servers import RangeServer
    from kiln.remote import RemoteFileChanged
    vals = [{"id": i, "name": "h" * 2000} for i in range(2000)]
    write(impl, tmp_path / "h.kilnr", vals)
    size = (tmp_path / "h.kilnr").stat().st_size
    rec = 20 + len(framed(vals[0]))
    with RangeServer(tmp_path) as server:
        with open_rf(impl, server.url + "h.kilnr") as rf:
            assert rf[1500] == vals[1500] and rf[-2] == vals[-2]
            # the first 64 KiB block, the trailer, the index record (2,000 entries), two
            # records, and the response headers of a few requests
            assert server.sent < (64 << 10) + 40 + (16 + 63 + 20 + 8 * 2000 + 4) + 2 * rec + 8000
            assert size > 4_000_000
            time.sleep(0.01)
            (tmp_path / "h.kilnr").write_bytes(b"x" * size)     # same size, a new version
            with pytest.raises(RemoteFileChanged):
                rf[700]          # a record past the first block: asked of the server


def test_a_wrong_head_crc_is_caught_by_every_reader(impl):
    fr = [framed(v) for v in values(3)]
    good, offs = U.container(H, fr)
    bad = bytearray(good)
    at = offs[1]
    bad[at + 12:at + 16] = struct.pack("<I", zlib.crc32(bytes(bad[at:at + 12])) ^ 1)
    end = at + 16 + len(fr[1])
    bad[end:end + 4] = struct.pack("<I", zlib.crc32(bytes(bad[at:end])))   # record CRC right
    bad = bytes(bad)
    for verify in (True, False):
        expect("CHECKSUM", at + 12, read_all, impl, bad, verify=verify)
        with open_rf(impl, io.BytesIO(bad), verify=verify) as rf:
            expect("CHECKSUM", at + 12, rf.__getitem__, 1)
        expect("CHECKSUM", at + 12, stream, impl, bad, verify=verify)


def test_faults_in_a_later_block_of_a_long_file(impl):
    vals = [{"id": i, "name": ""} for i in range(5000)]
    fr = [framed(v) for v in vals]
    good, offs = U.container(H, fr)
    for at, where in ((offs[4500] + 12, offs[4500] + 12),              # head CRC field
                      (offs[4700] + 16 + 16, offs[4700] + 16 + len(fr[4700]))):   # value
        bad = bytearray(good)
        bad[at] ^= 0x40
        got = []
        with open_rf(impl, io.BytesIO(bytes(bad))) as rf:
            with pytest.raises(kiln.KilnError) as ei:
                for r in rf:
                    got.append(r)
        assert (ei.value.code, ei.value.offset) == ("CHECKSUM", where)
        assert got == vals[:len(got)] and len(got) in (4500, 4700)


class _Full:
    """A target that takes ``room`` bytes, then fails like a full disk."""

    def __init__(self, room):
        self.room, self.data = room, bytearray()

    def write(self, b):
        if len(self.data) + len(b) > self.room:
            take = self.room - len(self.data)
            self.data += bytes(b)[:take]
            raise OSError(28, "No space left on device")
        self.data += b
        return len(b)

    def flush(self):
        pass


def test_a_failed_write_leaves_a_recoverable_file_and_no_index(impl):
    vals = values(10)
    full, offs = U.container(H, [framed(v) for v in vals], closed=False, text=T)
    target = _Full(offs[6] + 10)
    w = kiln.RecordWriter(target, T, kernels=impl.kernels)
    with pytest.raises(OSError):
        for v in vals:
            w.write(v)
    with pytest.raises(ValueError):
        w.write(vals[0])
    w.close()
    assert bytes(target.data) == full[:offs[6] + 10]     # no index after the torn record
    with open_rf(impl, io.BytesIO(bytes(target.data)), recover=True) as rf:
        assert list(rf) == vals[:6] and rf.recovery.offset == offs[6]


def test_several_threads_read_one_file(impl, tmp_path):
    vals = values(500)
    write(impl, tmp_path / "m.kilnr", vals)
    rf = open_rf(impl, tmp_path / "m.kilnr")
    bad = []

    def read(k):
        for j in range(300):
            i = (k * 131 + j * 17) % 500
            if rf[i] != vals[i]:
                bad.append(i)
        if list(rf) != vals:
            bad.append("iteration")
    threads = [threading.Thread(target=read, args=(k,)) for k in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    rf.close()
    assert bad == []


def test_iteration_stops_when_the_file_is_closed(impl, tmp_path):
    vals = values(3000)
    write(impl, tmp_path / "c.kilnr", vals)
    for stop in (0, 5, 40, 2999):
        rf = open_rf(impl, tmp_path / "c.kilnr")
        it = iter(rf)
        got = [next(it) for _ in range(stop + 1)]
        rf.close()
        if stop + 1 < len(vals):
            with pytest.raises(ValueError):
                next(it)
        else:
            assert list(it) == []
        assert got == vals[:stop + 1]


def test_a_pickle_reopens_the_file_from_another_directory(impl, tmp_path, monkeypatch):
    (tmp_path / "d").mkdir()
    monkeypatch.chdir(tmp_path / "d")
    write(impl, "rel.kilnr", values(5))
    blob = pickle.dumps(open_rf(impl, "rel.kilnr"))
    monkeypatch.chdir(tmp_path)
    with pickle.loads(blob) as again:
        assert list(again) == values(5)


def test_a_container_starts_where_the_file_object_stands(impl, tmp_path):
    """A container at byte 32 of a file: RecordFile(open file), RecordFile(BytesIO)
    and iter_records(open file) all read it from the object's position (once:
    RecordFile(open file) said FRAME at 0)."""
    import io
    out = io.BytesIO()
    with kiln.RecordWriter(out, "str", kernels=impl.kernels) as w:
        for s in ("a", "bc", "def"):
            w.write(s)
    p = tmp_path / "inner.bin"
    p.write_bytes(b"\xaa" * 32 + out.getvalue())
    with open(p, "rb") as f:
        f.seek(32)
        with kiln.RecordFile(f, "str", kernels=impl.kernels) as rf:
            assert list(rf) == ["a", "bc", "def"] and rf[2] == "def"
    b = io.BytesIO(p.read_bytes())
    b.seek(32)
    with kiln.RecordFile(b, "str", kernels=impl.kernels) as rf:
        assert list(rf) == ["a", "bc", "def"]
    with open(p, "rb") as f:
        f.seek(32)
        assert list(kiln.iter_records(f, "str", kernels=impl.kernels)) == ["a", "bc", "def"]


def test_iter_records_of_a_killed_writers_file_raises_unless_recovering(impl, tmp_path):
    """A file cut after complete records (a writer killed before close): its
    records come out, then EOF at the cut, so a crash never looks like a clean
    end (once: the iteration just ended); recover=True ends quietly."""
    p = tmp_path / "k.kilnr"
    w = kiln.RecordWriter(p, "str", kernels=impl.kernels, replace="open")
    for s in ("a", "bc", "def"):
        w.write(s)
    w.flush()
    data = p.read_bytes()                 # what a killed writer leaves: no index, no trailer
    w.close()
    got = []
    with open(p, "wb") as f:
        f.write(data)
    with open(p, "rb") as f:
        with pytest.raises(kiln.KilnError) as ei:
            for v in kiln.iter_records(f, "str", kernels=impl.kernels):
                got.append(v)
    assert got == ["a", "bc", "def"]
    assert (ei.value.code, ei.value.offset) == ("EOF", len(data))
    assert "3 complete records" in str(ei.value)
    with open(p, "rb") as f:
        assert list(kiln.iter_records(f, "str", kernels=impl.kernels, recover=True)) == \
            ["a", "bc", "def"]
