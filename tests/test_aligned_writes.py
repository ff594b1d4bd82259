"""save_tensors writes a file in runs that end on 2 MiB boundaries of the file
(kiln._files.atomic.AlignedWriter), so that Linux caches it in 2 MiB folios a
mapping maps with one fault each; the bytes are those of the sequential
writer (save_tensors into a file object) and the reference decoder reads
every payload back.  Both implementations."""

import io
import os

import numpy as np
import pytest

import kiln
from kiln._files import atomic
from _util import kiln_ref

needs_pwritev = pytest.mark.skipif(getattr(os, "pwritev", None) is None,
                                   reason="no os.pwritev here: pieces are written as they come")

MiB = 1 << 20


def _tensors():
    rng = np.random.default_rng(2)
    return {"a": rng.integers(0, 256, 3 * MiB + 7, dtype=np.uint8),
            "b": np.array([True, False, True]),
            "c": rng.random(5 * MiB // 8),
            "d": rng.integers(0, 1 << 30, (MiB + 12) // 4, dtype=np.int32)}


def _expected(tensors, **kw):
    out = io.BytesIO()
    kiln.save_tensors(out, tensors, **kw)   # the sequential writer: zero gaps written
    return out.getvalue()


def _check(path, tensors):
    buf = path.read_bytes()
    ts, _ = kiln_ref.read_directory(buf, 0)
    got = {t["name"]: bytes(t["payload"]) for t in ts if t["name"] != "__metadata__"}
    assert got == {k: v.tobytes() for k, v in tensors.items()}
    return buf


def _recording(monkeypatch, cap=None):
    """Record (offset, bytes written) of each pwritev; with ``cap``, write at most
    that many bytes a call (a short write, as a signal or a full disk gives)."""
    calls = []
    real = os.pwritev

    def pwritev(fd, buffers, at):
        if cap is not None:
            first = bytes(memoryview(buffers[0]).cast("B"))[:cap]
            n = os.pwrite(fd, first, at)
        else:
            n = real(fd, buffers, at)
        calls.append((at, n, len(buffers)))
        return n

    monkeypatch.setattr(atomic, "_pwritev", pwritev)
    return calls


@needs_pwritev
def test_every_write_but_the_last_ends_on_a_2_mib_boundary(api, tmp_path, monkeypatch):
    calls = _recording(monkeypatch)
    t = _tensors()
    p = tmp_path / "m.kiln"
    kiln.save_tensors(p, t, metadata={"step": 3}, checksum=True)
    assert _check(p, t) == _expected(t, metadata={"step": 3}, checksum=True)
    ends = [at + n for at, n, _ in calls]
    assert len(calls) >= 3 and all(e % (2 * MiB) == 0 for e in ends[:-1]), calls
    assert [at for at, _, _ in calls] == [0] + ends[:-1]   # one run, no byte twice
    assert ends[-1] <= os.path.getsize(p)


@needs_pwritev
def test_short_writes_go_on_where_they_stopped(api, tmp_path, monkeypatch):
    calls = _recording(monkeypatch, cap=4099)
    t = _tensors()
    p = tmp_path / "m.kiln"
    kiln.save_tensors(p, t)
    assert _check(p, t) == _expected(t)
    assert len(calls) > 1000 and all(n <= 4099 for _, n, _ in calls)


@needs_pwritev
def test_more_pieces_than_one_pwritev_takes(api, tmp_path, monkeypatch):
    calls = _recording(monkeypatch)
    t = {"t%04d" % i: np.full(3, i, np.int16) for i in range(1500)}
    t["z"] = np.ones(3 * MiB, np.uint8)
    p = tmp_path / "m.kiln"
    kiln.save_tensors(p, t)
    assert _check(p, t) == _expected(t)
    assert max(k for _, _, k in calls) <= 1024 and len(calls) >= 3


def test_without_pwritev_each_piece_is_written_as_it_comes(api, tmp_path, monkeypatch):
    monkeypatch.setattr(atomic, "_pwritev", None)   # as on Windows
    t = _tensors()
    p = tmp_path / "m.kiln"
    kiln.save_tensors(p, t, metadata={"step": 1})
    assert _check(p, t) == _expected(t, metadata={"step": 1})


@needs_pwritev
def test_a_long_gap_is_a_hole_and_a_short_one_zeros(tmp_path, monkeypatch):
    calls = _recording(monkeypatch)
    p = tmp_path / "raw"
    with atomic.AtomicFile(p) as out:
        w = atomic.AlignedWriter(out)
        w.write(b"a" * (2 * MiB))            # ends on the boundary: written at once
        w.seek(2 * MiB + 100)                # short: zeros, in the next run
        w.write(b"b" * 10)
        w.seek(2 * MiB + 110 + 5000)         # long: the run ends, a hole
        w.write(b"c")
        w.flush()
        with pytest.raises(ValueError):
            w.seek(0)
    want = b"a" * (2 * MiB) + bytes(100) + b"b" * 10 + bytes(5000) + b"c"
    assert p.read_bytes() == want
    assert [(at, n) for at, n, _ in calls] == [(0, 2 * MiB), (2 * MiB, 110),
                                               (2 * MiB + 5110, 1)]


@needs_pwritev
def test_progress_counts_a_piece_once_its_bytes_are_in_the_file(api, tmp_path, monkeypatch):
    calls = _recording(monkeypatch)
    t = _tensors()
    seen = []
    kiln.save_tensors(tmp_path / "m.kiln", t, progress=lambda done, total: seen.append(
        (done, total, sum(n for _, n, _ in calls))))
    total = sum(a.nbytes for a in t.values())
    assert seen[-1][:2] == (total, total) and [d for d, _, _ in seen] == sorted(
        d for d, _, _ in seen)
    assert all(done <= in_file for done, _, in_file in seen), seen
    small = []   # two small tensors: both counted at the one write that holds them
    calls.clear()
    kiln.save_tensors(tmp_path / "p.kiln", {"a": np.zeros(1000, np.float32),
                                            "b": np.ones(24, np.int8)},
                      progress=lambda done, total: small.append((done, total, len(calls))))
    assert small == [(4000, 4024, 1), (4024, 4024, 1)]
