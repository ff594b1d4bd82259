"""The pipelined loader of kiln.torch (issue 50): the planner, the reader
threads, the staging ring and the copy step, run on the CPU with host memory
standing in for the device (``stage=True``: every byte goes through the ring
as it would to a GPU), and the direct reads into host tensors.

Oracles: ``kiln.load_tensors`` of the same file (the reference decoder's
bytes, through the other read path), numpy arrays the test wrote, and
hand-made truncations and corruptions at known offsets."""

import gc
import sys
import os
import threading
import weakref

import numpy as np
import pytest

import kiln

torch = pytest.importorskip("torch", reason="torch is not installed: kiln.torch is tested "
                                            "where it is")
import kiln.torch as kt  # noqa: E402
from kiln.torch import _pipeline as P, _sources as S  # noqa: E402
from kiln._access import file_offset, table  # noqa: E402


_OPEN = []   # the files the tests' items read, closed after each test


@pytest.fixture(autouse=True)
def _close_files():
    yield
    while _OPEN:
        _OPEN.pop().close()


def _items(path, targets=None):
    """The pipeline's items for every tensor of the file at ``path``."""
    out = []
    with kiln.open(path) as f:
        src = S.file_bytes(f)
        _OPEN.append(src)
        sums = f.checksums
        for i, (name, t) in enumerate(table(f).items()):
            crc = None if sums is None else int.from_bytes(sums[4 * i:4 * i + 4], "little")
            dt = getattr(torch, {"f32": "float32", "u8": "uint8", "i64": "int64",
                                 "bf16": "bfloat16", "bool": "bool", "i8": "int8"}[t.dtype])
            out.append(P.Item(name, src, file_offset(t), t.nbytes, crc, dt,
                              tuple(t.shape), None if targets is None else targets[name]))
    return out


def _reference(path):
    return {k: v.numpy().tobytes() for k, v in kiln.load_tensors(path, copy=True).items()}


def _bytes(t):
    return t.reshape(-1).view(torch.uint8).numpy().tobytes()


def _readers():
    return [t for t in threading.enumerate() if t.name == "kiln-torch-reader"]


@pytest.fixture
def mixed(tmp_path):
    """Tensors of many sizes (some larger than the tiny chunks), a zero-size
    one and a bool, saved with checksums."""
    rng = np.random.default_rng(5)
    t = {"big": rng.standard_normal(5000).astype(np.float32),
         "mid": rng.integers(0, 255, 777, dtype=np.uint8),
         "empty": np.zeros((0, 3), np.float32),
         "flag": rng.integers(0, 2, 33).astype(np.bool_),
         "i": np.arange(100, dtype=np.int64)}
    kiln.save_tensors(tmp_path / "m.kiln", t, checksum=True)
    return tmp_path / "m.kiln"


@pytest.mark.parametrize("stage", [False, True])
@pytest.mark.parametrize("chunk, slots, threads", [(64, 1, 1), (1000, 2, 3), (4096, 3, 2),
                                                   (1 << 20, 4, 4)])
def test_bytes_equal_the_reference_across_chunk_boundaries(api, mixed, stage, chunk, slots,
                                                           threads):
    items = _items(mixed)
    outs = P.load(items, "cpu", chunk_bytes=chunk, slots=slots, threads=threads, stage=stage)
    ref = _reference(mixed)
    assert [it.key for it in items] == sorted(ref)
    for it, t in zip(items, outs):
        assert tuple(t.shape) == it.shape and _bytes(t) == ref[it.key], it.key
    assert _readers() == []


def test_the_plan_cuts_payloads_and_coalesces_neighbours(api, mixed):
    items = _items(mixed)
    chunks = P.plan(items, [False] * len(items), 1000)
    covered = {}
    for c in chunks:
        assert c.size <= 1000
        for p in c.pieces:
            covered.setdefault(p.item, []).append((p.at, p.n))
            assert items[p.item].offset + p.at == c.start + p.where   # the file's byte
    for i, it in enumerate(items):   # every byte of every payload exactly once, in order
        got = covered.get(i, [])
        assert sum(n for _, n in got) == it.nbytes
        assert [a for a, _ in got] == list(np.cumsum([0] + [n for _, n in got])[:-1])
    assert max(len(c.pieces) for c in chunks) > 1   # small neighbours share a chunk


def test_ten_thousand_tiny_tensors(api, tmp_path):
    t = {"t%05d" % i: np.full(i % 7, i % 100, np.int8) for i in range(10000)}
    kiln.save_tensors(tmp_path / "tiny.kiln", t)
    items = _items(tmp_path / "tiny.kiln")
    chunks = P.plan(items, [False] * len(items), 1 << 16)
    assert len(chunks) < 20   # batched, not a read per tensor
    outs = P.load(items, "cpu", chunk_bytes=1 << 16, stage=True)
    for it, x in zip(items, outs):
        assert x.tolist() == t[it.key].tolist()


def test_targets_are_filled_in_place(api, mixed):
    targets = {"big": torch.zeros(5000), "mid": torch.zeros(777, dtype=torch.uint8),
               "empty": torch.zeros(0, 3), "flag": torch.zeros(33, dtype=torch.bool),
               "i": torch.zeros(10, 10, dtype=torch.int64).t()[0:10].t()}   # strided
    ref = _reference(mixed)
    outs = P.load(_items(mixed, {k: v.reshape(-1) if k == "i" else v
                                 for k, v in targets.items()}), "cpu", chunk_bytes=512)
    assert outs[0] is targets["big"]
    for k in ("big", "mid", "flag"):
        assert _bytes(targets[k]) == ref[k]


def test_a_sharded_set_loads_as_one_plan(api, tmp_path):
    rng = np.random.default_rng(1)
    t = {"w%d" % i: rng.standard_normal(300).astype(np.float32) for i in range(6)}
    kiln.save_sharded(t, tmp_path / "set", max_shard_size=2500)
    assert len(kiln.open(tmp_path / "set").shards) == 3
    sd = kt.load_file(tmp_path / "set", device="cpu")
    for k, v in t.items():
        assert sd[k].numpy().tolist() == v.tolist()
    m = torch.nn.ParameterDict({k: torch.nn.Parameter(torch.zeros(300)) for k in t})
    assert kt.load_model(m, tmp_path / "set") == ([], [])
    for k, v in t.items():
        assert m[k].detach().numpy().tobytes() == v.tobytes()


def test_a_file_truncated_mid_load_is_eof_naming_file_and_offset(api, mixed):
    items = _items(mixed)
    cut = items[0].offset + 100   # inside the first payload ("big")
    seen = []

    def truncate(done, total):
        seen.append(done)
        if len(seen) == 1:
            os.truncate(mixed, cut)

    big = [it for it in items if it.key == "big"][0]
    with pytest.raises(kiln.KilnError) as e:
        P.load([big._replace(offset=big.offset, nbytes=big.nbytes)], "cpu", chunk_bytes=64,
               threads=1, slots=1, stage=True, progress=truncate)
    assert e.value.code == "EOF" and str(mixed) in e.value.reason
    assert "changed under the reader" in e.value.reason and e.value.offset >= cut
    assert _readers() == []


def test_a_file_already_shorter_fails_every_read_path(api, mixed):
    items = _items(mixed)
    os.truncate(mixed, items[0].offset + 10)
    for stage in (False, True):
        with pytest.raises(kiln.KilnError) as e:
            P.load(items, "cpu", stage=stage, chunk_bytes=256)
        assert e.value.code == "EOF" and e.value.offset == items[0].offset + 10
    m = torch.nn.ParameterDict({"big": torch.nn.Parameter(torch.zeros(5000))})
    with pytest.raises(kiln.KilnError) as e:   # the open sees a file too short for its table
        kt.load_model(m, mixed, strict=False)
    assert e.value.code == "EOF"


def test_a_checksum_mismatch_names_the_tensor(api, mixed):
    items = _items(mixed)
    mid = [it for it in items if it.key == "mid"][0]
    with open(mixed, "r+b") as f:
        f.seek(mid.offset + 500)
        b = f.read(1)
        f.seek(mid.offset + 500)
        f.write(bytes([b[0] ^ 1]))
    for stage in (False, True):
        with pytest.raises(kiln.KilnError) as e:
            P.load(items, "cpu", stage=stage, chunk_bytes=300)
        assert e.value.code == "CHECKSUM" and "'mid'" in e.value.reason
        assert e.value.offset == mid.offset
    target = torch.nn.ParameterDict({"mid": torch.nn.Parameter(
        torch.zeros(777, dtype=torch.uint8), requires_grad=False)})
    with pytest.raises(kiln.KilnError) as e:
        kt.load_model(target, mixed, strict=False)
    assert e.value.code == "CHECKSUM" and "partly written: mid" in e.value.reason


def test_a_bool_byte_other_than_0_or_1_is_refused(api, mixed):
    items = _items(mixed)
    flag = [it for it in items if it.key == "flag"][0]
    with open(mixed, "r+b") as f:
        f.seek(flag.offset + 5)
        f.write(b"\x07")
    with pytest.raises(kiln.KilnError) as e:
        P.load([flag._replace(crc=None)], "cpu", stage=True)
    assert e.value.code == "TYPE" and e.value.offset == flag.offset + 5


def test_a_failing_reader_stops_the_load_and_its_threads(api, mixed, tmp_path):
    items = _items(mixed)
    k = [it.key for it in items].index("mid")
    gone = items[k]._replace(offset=1 << 30)   # past the file's end
    with pytest.raises(kiln.KilnError) as e:
        P.load(items[:k] + [gone] + items[k + 1:], "cpu", stage=True, chunk_bytes=128)
    assert e.value.code == "EOF"
    assert _readers() == []


def test_keyboard_interrupt_leaves_no_thread_and_no_buffer(api, mixed):
    items = _items(mixed)
    buffers = []
    real_empty = torch.empty

    def tracking_empty(*a, **k):   # the ring's buffers, to watch them go
        t = real_empty(*a, **k)
        buffers.append(weakref.ref(t))
        return t

    def interrupt(done, total):
        raise KeyboardInterrupt

    P.torch_module()   # (the module's torch is the test's)
    P.release()   # (no ring kept from an earlier load: this one makes its own)
    torch.empty = tracking_empty
    try:
        with pytest.raises(KeyboardInterrupt):
            P.load(items, "cpu", stage=True, chunk_bytes=128, slots=2, progress=interrupt)
    finally:
        torch.empty = real_empty
    gc.collect()
    assert buffers and all(r() is None for r in buffers)
    assert _readers() == []


def test_tqdm_progress_counts_every_byte(api, mixed):
    pytest.importorskip("tqdm", reason="tqdm is not installed: the bar is tested where it is")
    seen = []
    P.load(_items(mixed), "cpu", stage=True, chunk_bytes=256,
           progress=lambda done, total: seen.append((done, total)))
    total = seen[0][1]
    assert seen[-1] == (total, total) and [d for d, _ in seen] == sorted(d for d, _ in seen)
    P.load(_items(mixed), "cpu", progress=True)   # a tqdm bar, no error


def test_device_loads_go_through_the_pipeline(api, mixed, monkeypatch):
    calls = []
    real = P.load

    def spy(items, device, **kw):
        calls.append((len(items), str(device)))
        return real(items, device, **kw)

    monkeypatch.setattr(P, "load", spy)
    sd = kt.load_file(mixed, device="meta")
    assert calls == [(5, "meta")] and sd["big"].is_meta and tuple(sd["big"].shape) == (5000,)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: torch sees no GPU here")
def test_cuda_loads_equal_the_reference(api, mixed):
    ref = _reference(mixed)
    sd = kt.load_file(mixed, device="cuda")
    for k, v in sd.items():
        assert v.device.type == "cuda" and _bytes(v.cpu()) == ref[k], k
    outs = P.load(_items(mixed), "cuda", chunk_bytes=256, slots=2)   # tiny ring, many reuses
    for it, v in zip(_items(mixed), outs):
        assert _bytes(v.cpu()) == ref[it.key]
    m = torch.nn.ParameterDict({"big": torch.nn.Parameter(torch.zeros(5000, device="cuda"))})
    assert kt.load_model(m, mixed, strict=False)[0] == []
    assert _bytes(m["big"].detach().cpu()) == ref["big"]


@pytest.mark.parametrize("chunk", [64, 5000, 1 << 20])
def test_direct_io_reads_the_same_bytes_or_falls_back(api, mixed, chunk):
    # O_DIRECT where the file system takes it (whole aligned blocks read into an
    # aligned place of the slot), buffered where it refuses it (tmpfs): the
    # same bytes either way, chunk boundaries anywhere
    items = _items(mixed)
    outs = P.load(items, "cpu", stage=True, direct_io=True, chunk_bytes=chunk, slots=2)
    ref = _reference(mixed)
    for it, t in zip(items, outs):
        assert _bytes(t) == ref[it.key], it.key
    os.truncate(mixed, items[0].offset + 5000)
    with pytest.raises(kiln.KilnError) as e:
        P.load(items, "cpu", stage=True, direct_io=True, chunk_bytes=chunk)
    assert e.value.code == "EOF" and e.value.offset == items[0].offset + 5000
    assert _readers() == []


# --- issue 58 item 2: only the bytes that must cross the link --------------------------

def _ends(seed, hidden, vocab):
    """(a maker of random f32 arrays, the embedding, head and final norm)."""
    rng = np.random.default_rng(seed)
    f = lambda *s: rng.standard_normal(s).astype(np.float32)   # noqa: E731
    return f, {"model.embed_tokens.weight": f(vocab, hidden),
               "lm_head.weight": f(vocab, hidden), "model.norm.weight": f(hidden)}


def _llama(layers=2, hidden=512, inter=1024, vocab=600):
    """LLaMA's tensors (f32, small): projections of 1 MiB or more (straight
    across), two 2 KiB norms a layer between them in sorted order."""
    f, t = _ends(58, hidden, vocab)
    for i in range(layers):
        p = "model.layers.%d." % i
        t.update({p + "input_layernorm.weight": f(hidden),
                  p + "post_attention_layernorm.weight": f(hidden),
                  p + "mlp.gate_proj.weight": f(inter, hidden),
                  p + "mlp.up_proj.weight": f(inter, hidden),
                  p + "mlp.down_proj.weight": f(hidden, inter)})
        for k in "qkvo":
            t[p + "self_attn.%s_proj.weight" % k] = f(hidden, hidden)
    return t


def _moe(layers=2, hidden=512, experts=8, inter=96, vocab=600):
    """A mixture of experts: 1 MiB attention projections, and between them a
    run of small payloads a layer (norms, 8 experts x 3 projections of 192
    KiB, a router, and DeepSeek-V3's 32-byte router bias, padded to 64)."""
    f, t = _ends(59, hidden, vocab)
    for i in range(layers):
        p = "model.layers.%d." % i
        t.update({p + "input_layernorm.weight": f(hidden),
                  p + "post_attention_layernorm.weight": f(hidden),
                  p + "mlp.gate.weight": f(experts, hidden),
                  p + "mlp.gate.e_score_correction_bias": f(experts)})
        for e in range(experts):
            for k, shape in (("gate", (inter, hidden)), ("up", (inter, hidden)),
                             ("down", (hidden, inter))):
                t[p + "mlp.experts.%d.%s_proj.weight" % (e, k)] = f(*shape)
        for k in "qkvo":
            t[p + "self_attn.%s_proj.weight" % k] = f(hidden, hidden)
    return t


@pytest.mark.parametrize("shape", ["llama", "moe"])
def test_the_link_carries_the_payload_and_little_else(api, tmp_path, shape):
    t = _llama() if shape == "llama" else _moe()
    kiln.save_tensors(tmp_path / "m.kiln", t, checksum=True)
    payload = sum(v.nbytes for v in t.values())
    # by hand: in sorted order every LLaMA norm lies between two projections
    # and crosses alone; a MoE layer's small payloads (all but the projections
    # of attention) lie side by side, every size a multiple of 64 but the
    # 32-byte router bias, followed by the router: 32 bytes of padding a layer
    want = payload if shape == "llama" else payload + 32 * 2
    ref = _reference(tmp_path / "m.kiln")
    # the host standing in for the device, and CUDA itself where torch sees a GPU
    runs = [("cpu", 64 << 20), ("cpu", 3 << 20)] + (
        [("cuda", 64 << 20), ("cuda", 3 << 20)] if torch.cuda.is_available() else [])
    for dev, chunk in runs:
        items = _items(tmp_path / "m.kiln")
        counts = {}
        outs = P.load(items, dev, stage=True, counts=counts, chunk_bytes=chunk)
        for it, x in zip(items, outs):
            assert x.device.type == dev and _bytes(x.cpu()) == ref[it.key], it.key
        assert counts["payload_bytes"] == payload
        if chunk == 64 << 20:   # one chunk: every padding byte between small ones crosses
            assert counts["link_bytes"] == want
        else:   # a gap at a chunk's edge is not read at all
            assert payload <= counts["link_bytes"] <= want
        assert counts["link_bytes"] <= 1.05 * payload


# --- issue 58 item 5: every line of the device path runs on the CPU ----------------------

def _device_path_code():
    """The code objects the check covers, each with its nested ones: every
    method of the CUDA copy class (CudaCopy; its device calls go through
    HostDevice here, CudaDevice's one-line wrappers of torch.cuda aside), the
    stand-in's, and the device path of the pipeline (the run, its readers,
    ring and copies, the kept rings)."""
    import types
    from kiln.torch import _copy as C
    fns = [C.spans, C.copy_step, P._run, P._take_ring, P._keep_ring, P.release]
    for cls in (C.CudaCopy, C.StandInCopy, C.HostDevice, C._HostStream, C._HostEvent,
                P._Run, P._Slot):
        fns += [v for v in vars(cls).values() if isinstance(v, types.FunctionType)]
    out = set()

    def nested(code):
        out.add(code)
        for k in code.co_consts:
            if isinstance(k, types.CodeType):
                nested(k)
    for f in fns:
        nested(f.__code__)
    return out


def _executable(codes):
    """(file, line) of every line with code, from the code objects (a line a
    ``# pragma: no cover`` comment marks is left out, with the block under it)."""
    import linecache
    lines = set()
    for code in codes:
        lines.update((code.co_filename, n) for _, _, n in code.co_lines() if n is not None)
    skip = set()
    for f, n in lines:
        src = linecache.getline(f, n)
        if "pragma: no cover" in src:
            indent = len(src) - len(src.lstrip())
            skip.add((f, n))
            k = n + 1
            while (f, k) in lines or not linecache.getline(f, k).strip():
                got = linecache.getline(f, k)
                if got.strip() and len(got) - len(got.lstrip()) <= indent:
                    break
                skip.add((f, k))
                k += 1
                if k > n + 50:
                    break
    return lines - skip


class _Lines:
    """The lines of ``codes`` run while it is installed (every thread)."""

    def __init__(self, codes):
        self.codes, self.seen = codes, set()

    def _local(self, frame, event, arg):
        if event == "line":
            self.seen.add((frame.f_code.co_filename, frame.f_lineno))
        return self._local

    def _global(self, frame, event, arg):
        if frame.f_code in self.codes:
            self.seen.add((frame.f_code.co_filename, frame.f_code.co_firstlineno))
            return self._local
        return None

    def __enter__(self):
        self.old = sys.gettrace()
        threading.settrace(self._global)
        sys.settrace(self._global)
        return self

    def __exit__(self, *exc):
        sys.settrace(self.old)
        threading.settrace(None)


class _SlowFirst(S.Descriptor):
    """A file whose first read takes ``pause`` seconds, so that the other
    threads of the load come to wait: the consumer for that chunk, a reader
    for the one slot it holds."""

    def __init__(self, path, pause):
        super().__init__(os.open(path, os.O_RDONLY), str(path))
        _OPEN.append(self)
        self.pause, self.n = pause, 0

    def read(self, view, at, what):
        self.n += 1
        if self.n == 1:
            import time
            time.sleep(self.pause)
        super().read(view, at, what)


class _Refusing(S.Descriptor):
    """A file on a file system that opens it with O_DIRECT and then refuses
    the read (``EINVAL``: the loader reads it buffered), or fails it (``EIO``)."""

    def __init__(self, path, errno_):
        super().__init__(os.open(path, os.O_RDONLY), str(path))
        _OPEN.append(self)
        self.errno = errno_

    def read_direct(self, fd, view, at, what, need):
        raise OSError(self.errno, os.strerror(self.errno))


def _device_path_workload(tmp_path, enough):
    """Stand-in loads that take every branch of the device path (a slow
    first read repeated, slower, until ``enough()``)."""
    import errno
    from kiln.torch._copy import SMALL
    rng = np.random.default_rng(7)
    t = {"a": rng.standard_normal(SMALL // 4 + 8).astype(np.float32),   # straight across
         "b": np.arange(10, dtype=np.float32), "c": np.arange(7, dtype=np.int8),
         "d": rng.standard_normal(SMALL // 4).astype(np.float32),
         "e": np.arange(3, dtype=np.int64), "f": np.array([1, 0, 1], np.bool_)}
    tmp_path.mkdir()
    path = tmp_path / "cover.kiln"
    kiln.save_tensors(path, t, checksum=True)
    ref = _reference(path)
    P.release()
    seen = []
    for chunk, slots, threads, direct in ((1 << 16, 2, 2, False), (64 << 20, 4, 4, True),
                                          (1 << 18, 1, 2, False), (1 << 20, 8, 1, True)):
        counts = {}
        items = _items(path)
        outs = P.load(items, "cpu", stage=True, chunk_bytes=chunk, slots=slots,
                      threads=threads, direct_io=direct, counts=counts,
                      progress=lambda done, total: seen.append(done))
        assert [_bytes(x) for x in outs] == [ref[it.key] for it in items]
    assert seen[-1] == os.path.getsize(path) - items[0].offset - 64 or seen
    targets = {k: torch.zeros(v.shape, dtype=x.dtype) for (k, v), x in
               zip(sorted(t.items()), outs)}
    for chunk in (None, 1 << 16):   # the host path: large payloads in place (one read for
        for x in targets.values():  # "a" and "d"; then "a" cut in chunks of its own)
            x.zero_()
        P.load(_items(path, targets), "cpu", chunk_bytes=chunk)
        assert [_bytes(targets[k]) for k in "abcdef"] == [ref[k] for k in "abcdef"]
    for code in (errno.EINVAL, errno.EIO):   # O_DIRECT refused: buffered; failed: an error
        items = [it._replace(src=_Refusing(path, code)) for it in _items(path)]
        if code == errno.EINVAL:
            outs = P.load(items, "cpu", stage=True, direct_io=True, chunk_bytes=1 << 16)
            assert [_bytes(x) for x in outs] == [ref[it.key] for it in items]
        else:
            with pytest.raises(OSError):
                P.load(items, "cpu", stage=True, direct_io=True)
    for pause in (0.2, 0.5, 1.0, 2.0):   # a slow first read: the others wait for it
        src = _SlowFirst(path, pause)
        items = [it._replace(src=src) for it in _items(path)]
        outs = P.load(items, "cpu", stage=True, chunk_bytes=1 << 18, slots=1, threads=2)
        assert [_bytes(x) for x in outs] == [ref[it.key] for it in items]
        if enough():
            break
    with open(path, "r+b") as f:   # a payload changed: CHECKSUM after targets were written
        f.seek(_items(path)[3].offset + 1)
        f.write(b"\xff\xfe")
    with pytest.raises(kiln.KilnError) as e:
        P.load(_items(path, targets), "cpu", stage=True, chunk_bytes=1 << 16, slots=1)
    assert e.value.code == "CHECKSUM" and "partly written" in e.value.reason
    items = _items(path)
    os.truncate(path, items[0].offset + 100)   # EOF in a reader, others waiting
    for pause in (0.2, 0.5, 1.0, 2.0):
        src = _SlowFirst(path, pause)
        with pytest.raises(kiln.KilnError) as e:
            P.load([it._replace(src=src) for it in items], "cpu", stage=True,
                   chunk_bytes=1 << 16, slots=1, threads=3)
        assert e.value.code == "EOF" and e.value.offset == items[0].offset + 100
        if enough():
            break
    with pytest.raises(kiln.KilnError) as e:   # EOF in an in-place read: its tensor named
        P.load([it._replace(target=targets[it.key]) for it in items if it.key in "ad"], "cpu")
    assert e.value.code == "EOF" and e.value.offset == items[0].offset + 100 and \
        "tensor %r" % items[0].key in e.value.reason
    assert _readers() == []
    P.release()


def test_every_line_of_the_cuda_copy_path_runs_on_the_stand_in(api, tmp_path):
    import linecache
    codes = _device_path_code()
    want = _executable(codes)
    with _Lines(codes) as lines:
        for k in range(3):   # (again where a wait a slow read sets up was not seen)
            _device_path_workload(tmp_path / str(k), lambda: not want - lines.seen)
            if not want - lines.seen:
                break
    missing = sorted(want - lines.seen)
    assert not missing, "lines of the device path no test runs:\n" + "\n".join(
        "%s:%d: %s" % (os.path.basename(f), n, linecache.getline(f, n).strip())
        for f, n in missing)


def test_the_ring_is_kept_between_loads_and_reused_when_large_enough(api, mixed):
    # (the host stand-in keeps its ring as a device load keeps its pinned one)
    P.release()
    assert P._KEPT == {}
    P.load(_items(mixed), "cpu", stage=True, chunk_bytes=4096, slots=3)
    (key, ring), = P._KEPT.items()
    assert key == ("stand-in", "cpu") and len(ring) == 3
    hosts = [s.host.data_ptr() for s in ring]
    assert all(s.host.numel() == 4096 for s in ring)   # (the file's chunks fill 4 KiB)
    ref = _reference(mixed)
    for chunk, slots in ((4096, 3), (1000, 2), (4000, 1)):   # no more than the kept: reused
        outs = P.load(_items(mixed), "cpu", stage=True, chunk_bytes=chunk, slots=slots)
        assert [s.host.data_ptr() for s in P._KEPT[key]] == hosts
        assert [_bytes(x) for x in outs] == [ref[it.key] for it in _items(mixed)]
    P.load(_items(mixed), "cpu", stage=True, chunk_bytes=8192, slots=3)   # larger: a new ring
    assert P._KEPT[key][0].host.numel() > 4096
    P.load(_items(mixed), "cpu", chunk_bytes=4096)   # a host load keeps nothing of its own
    assert list(P._KEPT) == [key]
    kt.release()
    assert P._KEPT == {}


@pytest.mark.parametrize("cpus, total, want", [
    # (readers, slots, chunk MiB), worked out by hand from the rule in the docstring
    (1, 1 << 20, (1, 3, 8)),                # one CPU: one reader; small load: 8 MiB chunks
    (2, 100 << 20, (1, 3, 25)),             # 100 MiB / (4 x 1) = 25 MiB
    (4, 8 << 30, (2, 4, 32)),               # large: 32 MiB chunks, ring 128 MiB
    (8, 200 << 20, (4, 6, 12)),             # 200 / 16 = 12.5: 12 MiB
    (16, int(7.8 * (1 << 30)), (12, 18, 32)),   # the H200 host: ring 576 MiB
    (64, int(7.8 * (1 << 30)), (16, 24, 32)),   # readers capped at 16: ring 768 MiB
])
def test_concurrency_is_chosen_from_the_cpus_and_the_load(api, cpus, total, want):
    threads, slots, chunk = P.concurrency(cpus, total)
    assert (threads, slots, chunk >> 20) == want and chunk % (1 << 20) == 0
    assert slots > threads and slots * chunk <= 1 << 30


@pytest.mark.parametrize("cpus, total, want", [
    # a load into host memory: a reader a CPU (the consumer copies only small payloads)
    (1, 1 << 20, (1, 3, 8)),
    (2, 100 << 20, (2, 4, 12)),             # 100 MiB / (4 x 2) = 12.5: 12 MiB
    (8, 8 << 30, (8, 12, 32)),
    (64, 8 << 30, (16, 24, 32)),            # capped at 16
])
def test_a_host_load_takes_a_reader_a_cpu(api, cpus, total, want):
    threads, slots, chunk = P.concurrency(cpus, total, host=True)
    assert (threads, slots, chunk >> 20) == want


# --- issue 58 item 6: several devices at once -------------------------------------------

def test_each_device_gets_its_own_load_all_at_once(api, tmp_path):
    rng = np.random.default_rng(6)
    t = {"model.layers.%d.w" % i: rng.standard_normal(3000).astype(np.float32)
         for i in range(4)}
    t["lm_head.weight"] = rng.standard_normal(500).astype(np.float32)
    kiln.save_tensors(tmp_path / "m.kiln", t, checksum=True)
    ref = _reference(tmp_path / "m.kiln")
    # the host standing in for two devices: "cpu" and "cpu:0" are two devices to the loader
    items = _items(tmp_path / "m.kiln")
    parts = {torch.device("cpu"): items[:3], torch.device("cpu:0"): items[3:]}
    seen = []
    real = P.load

    def spy(its, dev, **kw):   # which thread runs each device's load, with how many readers
        seen.append((str(dev), threading.current_thread().name, kw["threads"]))
        return real(its, dev, **kw)

    P.release()
    P.load = spy
    try:
        got = P.load_each(parts, stage=True, chunk_bytes=4096, threads=4)
    finally:
        P.load = real
    assert sorted(seen) == [("cpu", "kiln-torch-device", 2), ("cpu:0", "kiln-torch-device", 2)]
    assert set(P._KEPT) == {("stand-in", "cpu"), ("stand-in", "cpu:0")}   # a ring each
    for dev, its in parts.items():
        assert [_bytes(x) for x in got[dev]] == [ref[it.key] for it in its]
    P.release()
    sd = kt.load_file(tmp_path / "m.kiln", device={"model.layers.1": "cpu", "": "cpu:0",
                                                   "model.layers": "cpu"})
    assert sorted(sd) == sorted(t) and all(_bytes(v) == ref[k] for k, v in sd.items())
    with pytest.raises(ValueError, match="lm_head.weight"):   # a name the map does not place
        kt.load_file(tmp_path / "m.kiln", device={"model": "cpu"})


# --- in-place chunks of many payloads: one scattered preadv -------------------------

def test_many_small_payloads_are_read_in_place_with_few_reads(api, tmp_path, monkeypatch):
    """600 payloads of 70-90 KB (in place: from IN_PLACE) are read into their
    targets and into new tensors with one ``preadv`` per chunk of up to
    GROUP_BYTES of them, their gaps skipped, every byte as the reference
    decoder reads it, the recorded CRC-32s checked."""
    from kiln import _pread
    from kiln.torch import _plan
    rng = np.random.default_rng(3)
    t = {"t%03d" % i: rng.integers(0, 255, int(rng.integers(70_000, 90_000)), np.uint8)
         for i in range(600)}
    path = tmp_path / "many.kiln"
    kiln.save_tensors(path, t, checksum=True)
    ref = _reference(path)
    calls = []
    real = os.preadv

    def counted(fd, views, at):
        calls.append(len(views))
        return real(fd, views, at)
    monkeypatch.setattr(_pread.os, "preadv", counted)
    targets = {k: torch.zeros(len(v), dtype=torch.uint8) for k, v in t.items()}
    chunk = 8 << 20
    for tg in (targets, None):
        calls.clear()
        outs = P.load(_items(path, tg), "cpu", chunk_bytes=chunk)
        assert [_bytes(x) for x in outs] == [ref[k] for k in sorted(t)]
        assert len(calls) == len(P.plan(_items(path), [True] * 600, chunk))
        # payloads of 4 MiB together: 12 to 14 reads of about 50 payloads each
        assert sum(x.nbytes for x in t.values()) // _plan.GROUP_BYTES + 1 <= len(calls) <= 14
        assert max(calls) <= 2 * _plan.MAX_PIECES and min(calls[:-1]) > 40, calls
    with open(path, "r+b") as f:   # one byte changed in the 500th payload
        at = _items(path)[499].offset + 7
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 1]))
    with pytest.raises(kiln.KilnError) as e:
        P.load(_items(path), "cpu")
    assert e.value.code == "CHECKSUM" and "'t499'" in e.value.reason


def test_a_scattered_read_goes_on_after_short_reads_and_names_where_the_file_ends(
        api, tmp_path, monkeypatch):
    from kiln import _pread
    data = bytes(range(256)) * 4
    p = tmp_path / "f"
    p.write_bytes(data)
    real = os.preadv
    monkeypatch.setattr(_pread.os, "preadv", lambda fd, views, at: real(
        fd, [memoryview(views[0])[:5]] if len(views[0]) > 5 else views[:2], at))
    fd = os.open(p, os.O_RDONLY)
    try:
        bufs = [bytearray(n) for n in (7, 1, 12, 3, 40)]
        _pread.read_scattered(fd, [memoryview(b) for b in bufs], 100, "f", lambda end: "x")
        assert b"".join(bufs) == data[100:163]
        bufs = [bytearray(n) for n in (900, 200)]
        with pytest.raises(kiln.KilnError) as e:
            _pread.read_scattered(fd, [memoryview(b) for b in bufs], 20, "f",
                                  lambda end: "part %d" % (end >= 920))
        assert e.value.code == "EOF" and e.value.offset == 1024 and "part 1" in e.value.reason
        assert bytes(bufs[0]) == data[20:920] and bytes(bufs[1][:104]) == data[920:]
    finally:
        os.close(fd)


def _spread(tmp_path, n=40):
    """A file of ``n`` payloads of 64-80 KiB and odd sizes (alignment gaps
    between them), saved with CRC-32s; its reference bytes."""
    rng = np.random.default_rng(11)
    t = {"t%02d" % i: rng.integers(0, 255, int(rng.integers(65_537, 80_000)), np.uint8)
         for i in range(n)}
    path = tmp_path / "spread.kiln"
    kiln.save_tensors(path, t, checksum=True)
    return path, _reference(path)


def test_in_place_chunks_from_a_file_object_and_a_short_one(api, tmp_path):
    """A file object's bytes (no descriptor) read into many in-place
    payloads a chunk: every byte as the reference decoder reads it; a file
    object shorter than its table is EOF at its end, naming the tensor the
    bytes end in (and with a payload changed, CHECKSUM naming it)."""
    path, ref = _spread(tmp_path)
    data = path.read_bytes()
    items = _items(path)
    mem = [it._replace(src=S.Memory(data, "<bytes>")) for it in items]
    outs = P.load(mem, "cpu")
    assert [_bytes(x) for x in outs] == [ref[it.key] for it in items]
    cut = items[25].offset + 1000
    short = S.Memory(data[:cut], "<bytes>")
    with pytest.raises(kiln.KilnError) as e:
        P.load([it._replace(src=short) for it in items], "cpu")
    assert e.value.code == "EOF" and e.value.offset == cut and "'t25'" in e.value.reason
    bad = bytearray(data)
    bad[items[31].offset + 5] ^= 1
    with pytest.raises(kiln.KilnError) as e:
        P.load([it._replace(src=S.Memory(bytes(bad), "<bytes>")) for it in items], "cpu")
    assert e.value.code == "CHECKSUM" and "'t31'" in e.value.reason


def test_in_place_chunks_from_a_remote_file(api, tmp_path):
    """A remote file's in-place chunk: one range fetched, split into its
    payloads (FileBytes.read_many's own path), every byte as the reference
    decoder reads it."""
    fsspec = pytest.importorskip("fsspec")   # (the README's test extras install it)
    path, ref = _spread(tmp_path)
    fsspec.filesystem("memory").pipe("/spread-%s.kiln" % api.name, path.read_bytes())
    remote = _items("memory:///spread-%s.kiln" % api.name)
    assert isinstance(remote[0].src, S.Remote)
    assert [_bytes(x) for x in P.load(remote, "cpu")] == [ref[it.key] for it in remote]


def test_gaps_wider_than_the_scratch_buffer_are_skipped_whole(api, tmp_path, monkeypatch):
    """The bytes between two in-place payloads go to a scratch buffer; a gap
    wider than it takes as many slices of it as it needs (here 16 bytes for
    gaps of up to 63): never a short skip that shifts the next payload."""
    path, ref = _spread(tmp_path)
    monkeypatch.setattr(P, "_GAP", 16)
    items = _items(path)
    assert max(b.offset - a.offset - a.nbytes for a, b in zip(items, items[1:])) > 16
    outs = P.load([it._replace(crc=None) for it in items], "cpu")
    assert [_bytes(x) for x in outs] == [ref[it.key] for it in items]
