"""Reading every tensor of a file checks their payloads together (issue 57
item 3): ``values()``, ``items()``, ``tensors()`` of a file or a set, and
``kiln.torch.load_file``, read the short spans with rules (alignment gaps,
bool and 4-bit payloads) one ``pread`` for each run within 1 MiB, not one a
tensor; a fault anywhere is the one the whole-buffer decode reports, at
the same byte offset."""

import os

import numpy as np
import pytest

import kiln
from kiln import _pread
from kiln._files.local import PayloadChecks


def _tensors(n=60):
    t = {}
    for i in range(n):
        kind = i % 4
        if kind == 0:
            t["t%03d" % i] = np.full(3, i, np.float32)    # 12 bytes, a 52-byte gap
        elif kind == 1:
            t["t%03d" % i] = np.array([True, False, i % 2 == 0])
        elif kind == 2:
            t["t%03d" % i] = kiln.Tensor(kiln.pack_nibbles([1, 2, i % 16]), dtype="u4",
                                         shape=(3,))
        else:
            t["t%03d" % i] = np.arange(5, dtype=np.int16) + i
    return t


def _offsets(data):
    d = kiln.decode_tensors(bytes(data))
    return {k: d._pb + d._rows[i][10] for i, k in enumerate(d.keys())}


def _faulty(what):
    data = bytearray(kiln.encode_tensors(_tensors()))
    off = _offsets(data)
    if what == "gap":
        data[off["t028"] + 12] = 9          # in the gap after t028's 12 bytes
    elif what == "bool":
        data[off["t033"] + 1] = 2
    else:
        data[off["t046"] + 1] |= 0x40       # the padding nibble of an odd count
    return bytes(data)


def _reads(api, path):
    import kiln.torch as kt
    yield "values", lambda: kiln.open(path).values()
    yield "items", lambda: kiln.open(path).items()
    yield "tensors", lambda: kiln.open(path).tensors()
    yield "load_tensors", lambda: kiln.load_tensors(path)


@pytest.mark.parametrize("what", ["gap", "bool", "nibble"])
def test_a_fault_found_by_the_batched_check_is_the_full_decodes(api, tmp_path, what):
    data = _faulty(what)
    with pytest.raises(kiln.KilnError) as full:
        api.decode_tensors(data)             # the whole-buffer check: the oracle
    p = tmp_path / "f.kiln"
    p.write_bytes(data)
    for label, read in _reads(api, p):
        with pytest.raises(kiln.KilnError) as e:
            read()
        assert (e.value.code, e.value.offset) == (full.value.code, full.value.offset), label
    with kiln.open(p) as f:                  # one by one: the same fault, at its tensor
        bad = [k for k in f.keys() if _fails(f, k)]
    assert len(bad) == 1


def _fails(f, k):
    try:
        f[k]
    except kiln.KilnError:
        return True
    return False


def test_a_set_reads_each_shard_in_one_pass(api, tmp_path):
    t = _tensors(80)
    kiln.save_sharded(t, tmp_path / "s", max_shard_size=150)
    with kiln.open(tmp_path / "s") as f:
        assert len(f.shards) > 2
        got = dict(f.items())
        assert list(got) == sorted(t)
        for k, v in t.items():
            want = v.numpy() if isinstance(v, kiln.Tensor) else v
            assert np.array_equal(got[k].numpy(), want), k
        assert [x.name for x in f.values()] == sorted(t)
    # a fault in the third shard: the same code and file offset as its own decode
    with kiln.open(tmp_path / "s") as f:
        victim = f.shards[2]
    path = tmp_path / "s" / victim
    data = bytearray(path.read_bytes())
    first = kiln.decode_tensors(bytes(data)).keys()[0]
    at = _offsets(data)[first]
    data[at + len(kiln.decode_tensors(bytes(data))[first].data)] = 5   # its gap
    path.write_bytes(bytes(data))
    with pytest.raises(kiln.KilnError) as full:
        api.decode_tensors(bytes(data))
    with kiln.open(tmp_path / "s") as f:
        with pytest.raises(kiln.KilnError) as e:
            f.items()
    assert (e.value.code, e.value.offset) == (full.value.code, full.value.offset)


def test_the_batched_check_reads_a_few_runs_not_one_a_tensor(api, tmp_path, monkeypatch):
    p = tmp_path / "many.kiln"
    kiln.save_tensors(p, _tensors(400))
    calls = []
    real = os.pread

    def counting(fd, n, at):
        calls.append((n, at))
        return real(fd, n, at)

    with kiln.open(p) as f:
        monkeypatch.setattr(os, "pread", counting)
        f.values()
        monkeypatch.setattr(os, "pread", real)
    assert 1 <= len(calls) <= 2, calls       # 400 spans within 1 MiB of the file: one read
    with kiln.open(p) as f:                  # one by one: one read a span
        monkeypatch.setattr(os, "pread", counting)
        calls.clear()
        for k in f.keys():
            f[k]
        monkeypatch.setattr(os, "pread", real)
    assert len(calls) == 399                 # every span but the last payload's (no gap
    #                                          after it: the block ends there)


def test_a_run_the_file_no_longer_holds_is_checked_span_by_span(api, tmp_path):
    """A file cut between the open and the read: the run's read meets the end,
    and each span is read alone, so the fault is ``EOF`` at the first span the
    file no longer holds, as ``tensor()`` reports it."""
    p = tmp_path / "cut.kiln"
    kiln.save_tensors(p, _tensors(40))
    data = p.read_bytes()
    with kiln.open(p) as f:
        ts = f._tensors_view().values()
        off = _offsets(data)
        cut = off["t020"] + 5                # inside t020's payload
        os.truncate(p, cut)
        fd = os.open(p, os.O_RDONLY)
        try:
            block_end = f._checks.block_end
            one = PayloadChecks(block_end, _pread.SharedFd(os.dup(fd)), str(p))
            with pytest.raises(kiln.KilnError) as batched:
                one.tensors(ts)
            alone = PayloadChecks(block_end, _pread.SharedFd(os.dup(fd)), str(p))
            with pytest.raises(kiln.KilnError) as single:
                for t in ts:
                    alone.tensor(t)
        finally:
            os.close(fd)
    assert batched.value.code == "EOF"
    assert (batched.value.code, batched.value.offset) == (single.value.code,
                                                          single.value.offset)
    assert off["t020"] <= batched.value.offset <= cut + 64


def test_an_empty_tensor_read_first_does_not_stand_for_the_next(api, tmp_path):
    """An empty payload sits at the offset of the payload after it: reading
    the empty tensor first must not count the next one as checked (its bad
    bool byte is TYPE at that byte, read alone, after the empty one, or with
    every tensor)."""
    p = tmp_path / "e.kiln"
    kiln.save_tensors(p, {"a": np.zeros(0, np.float32), "b": np.array([True, False])})
    data = bytearray(p.read_bytes())
    at = _offsets(data)["b"]
    assert _offsets(data)["a"] == at         # the layout the case is about
    data[at] = 2
    p.write_bytes(bytes(data))
    for first in ([], ["a"]):
        with kiln.open(p) as f:
            for k in first:
                assert f[k].numpy().size == 0
            with pytest.raises(kiln.KilnError) as e:
                f["b"]
            assert (e.value.code, e.value.offset) == ("TYPE", at)
    with kiln.open(p) as f:
        f["a"]
        with pytest.raises(kiln.KilnError) as e:
            f.values()
        assert (e.value.code, e.value.offset) == ("TYPE", at)


class _LoopWriter:
    """A file object whose write() loops while the buffer it was given is
    not empty (as hand-written writers do): it needs a bytes-like object with
    a length and a truth value, never a numpy array."""

    def __init__(self):
        self.out = bytearray()

    def write(self, b):
        view = b
        while view:
            self.out += view[:7]
            view = view[7:]
        return len(b)


def test_a_file_object_is_given_memoryviews_of_torch_payloads(api):
    torch = pytest.importorskip("torch", reason="torch is not installed (pip install torch)")
    sd = {"w": torch.arange(6, dtype=torch.bfloat16), "x": torch.arange(3.0)}
    w = _LoopWriter()
    kiln.save_tensors(w, sd)
    back = kiln.decode_tensors(bytes(w.out))
    assert back["x"].numpy().tolist() == [0.0, 1.0, 2.0]
    assert bytes(back["w"].data) == sd["w"].view(torch.uint8).numpy().tobytes()
