"""Files: save/load, kiln.open, the streaming writer, atomic replace, metadata,
mapping lifetimes, bad files, larger than memory; both implementations."""

import importlib.util
import os
import signal
import struct
import sys

import numpy as np
import pytest

import kiln
from kiln import _meta



def every_dtype():
    rng = np.random.default_rng(5)
    out = {
        "f64": rng.standard_normal((3, 2)), "f32": rng.standard_normal(7).astype(np.float32),
        "f16": rng.standard_normal(5).astype(np.float16),
        "bool": np.array([True, False, True]),
        "i8": np.array([-1, 2], np.int8), "u8": np.array([255, 0], np.uint8),
        "i16": np.array([-300], np.int16), "u16": np.array([60000], np.uint16),
        "i32": np.arange(-3, 3, dtype=np.int32), "u32": np.array([2 ** 32 - 1], np.uint32),
        "i64": np.array([-2 ** 63], np.int64), "u64": np.array([2 ** 64 - 1], np.uint64),
        "empty": np.zeros((0, 4), np.float32),
    }
    t = {k: kiln.Tensor.from_numpy(v, name=k) for k, v in out.items()}
    # the types numpy has only through ml_dtypes, as their raw bits
    for code, raw in (("bf16", b"\xc0\x3f\x00\xc0"), ("f8e4m3", b"\x38\xb0"),
                      ("f8e5m2", b"\x3c"), ("e8m0", b"\x7f\x80")):
        width = 2 if code == "bf16" else 1
        t[code] = kiln.Tensor(raw, dtype=code, shape=(len(raw) // width,), name=code)
    for code, vals in (("i4", [-8, 7, 0]), ("u4", [15, 0, 1, 2, 3]), ("e2m1", [1, 2, 3])):
        t[code] = kiln.Tensor(kiln.pack_nibbles(vals), dtype=code, shape=(len(vals),), name=code)
    return t


def test_every_dtype_round_trips(api, tmp_path):
    ts = every_dtype()
    p = tmp_path / "all.kiln"
    kiln.save_tensors(p, list(ts.values()))
    for d in (kiln.load_tensors(p), kiln.load_tensors(str(p), copy=True)):
        assert sorted(d.keys()) == sorted(ts)
        for name, t in ts.items():
            assert d[name] == t, name
    with kiln.open(p) as f:
        assert f.keys() == list(ts)          # file order: the sequence's order
        if importlib.util.find_spec("ml_dtypes") is not None:
            assert f["bf16"].numpy().dtype == kiln.numpy_dtype(4)
        else:   # no numpy form without it: the error names the package
            with pytest.raises(ImportError, match="ml_dtypes is not installed"):
                f["bf16"].numpy()
        assert f.metadata is None
    # the file is one standalone directory: a plain decode reads it
    with open(p, "rb") as fh:
        assert kiln.decode_tensors(fh.read()) == kiln.load_tensors(p)


def test_payloads_are_aligned_in_the_file_and_in_memory(api, tmp_path):
    p = tmp_path / "a.kiln"
    kiln.save_tensors(p, {"a": np.ones(3, np.int8), "b": np.ones(5, np.float64)},
                      metadata={"k": "v"})
    with kiln.open(p) as f:
        for name in f:
            assert f[name].numpy().ctypes.data % 64 == 0
    with open(p, "rb") as fh:
        raw = fh.read()
    count = struct.unpack_from("<I", raw, 8)[0]
    assert count == 3   # a, b and the metadata tensor, last
    for i in range(count):
        off = struct.unpack_from("<Q", raw, 64 + 128 * i + 32)[0]
        assert off % 64 == 0


METADATA = {"model": "tiny-llm", "step": 1200, "lr": 3e-4, "neg": -(2 ** 63),
            "scores": [0.5, -1.5, 2.0] * 100, "ids": list(range(-5, 1000)), "one": [7],
            "mixed": [1, 2.5, True],
            "flags": [True, False, None], "nested": {"a": {"b": [1, [2, [3]]], "c": ""}},
            "raw": b"\x00\xff", "unicode": "é✓", "nan": float("nan"), "empty": {}, "list": []}


def test_metadata_of_every_type_round_trips(api, tmp_path):
    p = tmp_path / "m.kiln"
    kiln.save_tensors(p, {"w": np.zeros(2, np.float32)}, metadata=METADATA)
    back = kiln.load_metadata(p)
    assert _meta.same(back, METADATA)
    c = kiln.load_tensors(p, copy=True)        # a copy is read from the copy, not the file
    assert list(c) == ["w"] and c["w"].numpy().tolist() == [0.0, 0.0]
    assert list(back) == list(METADATA)     # order kept
    assert "__metadata__" not in kiln.load_tensors(p)


_cycle = []
_cycle.append(_cycle)


@pytest.mark.parametrize("bad,words", [
    ({"s": {1, 2}}, "got set"), ({"big": 2 ** 63}, "does not fit i64"),
    ({"loop": _cycle}, "contains itself"),
    ({1: "x"}, "keys must be str"), (["not", "a", "dict"], "must be a dict"),
])
def test_metadata_that_cannot_be_stored_is_refused(api, tmp_path, bad, words):
    with pytest.raises(kiln.EncodeError, match=words):
        kiln.save_tensors(tmp_path / "x.kiln", {"w": np.zeros(1)}, metadata=bad)
    assert not os.listdir(tmp_path)   # nothing written, no temporary left


def _node(parent, key, kind, **kw):
    n = {"parent": parent, "key": key, "kind": kind, "int": 0, "float": 0.0, "text": "",
         "raw": b""}
    n.update(kw)
    return n


@pytest.mark.parametrize("nodes", [
    [],                                                           # no root
    [_node(0xFFFFFFFF, None, _meta.LIST)],                        # root not a dict
    [_node(0xFFFFFFFF, None, _meta.DICT), _node(5, "a", _meta.INT)],   # parent after
    [_node(0xFFFFFFFF, None, _meta.DICT), _node(0, None, _meta.INT)],  # dict item, no key
    [_node(0xFFFFFFFF, None, _meta.DICT), _node(0, "a", _meta.INT), _node(0, "a", _meta.INT)],
    [_node(0xFFFFFFFF, None, _meta.DICT), _node(0, "a", _meta.INT), _node(1, "b", _meta.INT)],
    [_node(0xFFFFFFFF, None, _meta.DICT), _node(0, "a", 99)],     # unknown kind
    [_node(0xFFFFFFFF, None, _meta.DICT), _node(0, "a", _meta.BOOL, int=2)],
])
def test_hostile_metadata_is_a_kiln_error(api, tmp_path, nodes):
    blob = kiln.encode(nodes, _meta.META_TYPE, frame=True)
    p = tmp_path / "h.kiln"
    p.write_bytes(kiln.encode_tensors([
        kiln.Tensor.from_numpy(np.zeros(2, np.float32), name="w"),
        kiln.Tensor(blob, dtype="u8", shape=(len(blob),), name="__metadata__")]))
    with kiln.open(p) as f:   # the table alone: the metadata is read when first used
        with pytest.raises(kiln.KilnError) as ei:
            f.metadata
    assert ei.value.code == "TYPE"
    with pytest.raises(kiln.KilnError) as e2:
        kiln.load_metadata(p)
    assert (e2.value.code, e2.value.offset) == (ei.value.code, ei.value.offset)


def test_the_metadata_name_is_reserved_for_the_last_tensor(api, tmp_path):
    p = tmp_path / "n.kiln"
    p.write_bytes(kiln.encode_tensors({"w": np.zeros(2, np.float32),   # sorted: it comes first
                                       "__metadata__": np.zeros(3, np.uint8)}))
    with pytest.raises(kiln.KilnError, match="reserved") as ei:
        kiln.open(p)
    assert (ei.value.code, ei.value.offset) == ("TYPE", 64 + 4)
    with pytest.raises(kiln.EncodeError, match="reserved"):
        kiln.save_tensors(p, {"__metadata__": np.zeros(1, np.uint8)})


def test_corrupt_metadata_bytes_are_a_kiln_error_at_their_offset(api, tmp_path):
    p = tmp_path / "c.kiln"
    p.write_bytes(kiln.encode_tensors([
        kiln.Tensor.from_numpy(np.zeros(2, np.float32), name="w"),
        kiln.Tensor(b"KLN0" + bytes(20), dtype="u8", shape=(24,), name="__metadata__")]))
    with kiln.open(p) as f, pytest.raises(kiln.KilnError) as ei:
        f.metadata
    assert ei.value.code == "SCHEMA"
    raw = p.read_bytes()
    assert raw[ei.value.offset - 8:ei.value.offset - 4] == b"KLN0"   # the frame's hash field
    with pytest.raises(kiln.KilnError) as ei2:
        kiln.load_tensors(p, copy=True)
    assert ei2.value.offset == ei.value.offset


def test_views_outlive_the_with_block_and_close(api, tmp_path):
    p = tmp_path / "v.kiln"
    w = np.arange(1000, dtype=np.float64)
    kiln.save_tensors(p, {"w": w})
    with kiln.open(p) as f:
        view = f["w"].numpy()
        rows = f.rows("w", 10, 20)
        t = f["w"]
    f.close()   # again: no error
    assert view.sum() == w.sum() and rows.tolist() == w[10:20].tolist()
    assert t.numpy()[999] == 999
    with pytest.raises(ValueError, match="closed"):
        f["w"]
    d = kiln.load_tensors(p)
    arr = d["w"].numpy()
    del d
    assert arr[500] == 500


def test_a_reader_keeps_the_old_file_while_a_writer_replaces_it(api, tmp_path):
    p = tmp_path / "r.kiln"
    kiln.save_tensors(p, {"w": np.zeros(4, np.float32)})
    with kiln.open(p) as old:
        before = old["w"].numpy()
        kiln.save_tensors(p, {"w": np.ones(4, np.float32), "x": np.ones(1, np.int8)})
        assert before.tolist() == [0.0] * 4
        with kiln.open(p) as new:
            assert new["w"].numpy().tolist() == [1.0] * 4 and "x" in new
    assert [n for n in os.listdir(tmp_path) if n.endswith(".kiln-tmp")] == []


def test_a_writer_killed_mid_write_leaves_the_old_file(api, tmp_path):
    p = tmp_path / "k.kiln"
    kiln.save_tensors(p, {"w": np.full(8, 7.0, np.float32)})
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child dies by SIGKILL
        try:
            w = kiln.TensorWriter(p)
            w.add("w", "f32", (1 << 20,))
            w.add("v", "f32", (4,))
            w.write("w", np.zeros(1 << 20, np.float32))
            os.kill(os.getpid(), signal.SIGKILL)
        finally:
            os._exit(3)
    try:
        _, status = os.waitpid(pid, 0)
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    assert kiln.load_tensors(p)["w"].numpy().tolist() == [7.0] * 8
    stale = [n for n in os.listdir(tmp_path) if n.endswith(".kiln-tmp")]
    assert len(stale) == 1                      # the dead writer's temporary file
    kiln.save_tensors(p, {"w": np.zeros(2, np.float32)})
    assert [n for n in os.listdir(tmp_path) if n.endswith(".kiln-tmp")] == []


def test_the_streaming_writer(api, tmp_path):
    p = tmp_path / "s.kiln"
    layers = [np.full((4, 4), i, np.float32) for i in range(5)]
    with kiln.TensorWriter(p, metadata={"layers": 5}) as w:
        for i, a in enumerate(layers):
            w.add("layer%d" % i, "f32", a.shape)
        w.add("zeros", "i8", (100,))
        for i, a in reversed(list(enumerate(layers))):   # any order
            w.write("layer%d" % i, a)
        w.write("zeros", None)
    d = kiln.load_tensors(p)
    assert [d["layer%d" % i].numpy()[0, 0] for i in range(5)] == [0, 1, 2, 3, 4]
    assert d["zeros"].numpy().tolist() == [0] * 100
    assert kiln.load_metadata(p) == {"layers": 5}
    with open(p, "rb") as fh:   # the same bytes as the one-shot writer
        assert fh.read() == kiln.encode_tensors(
            [kiln.Tensor.from_numpy(a, name="layer%d" % i) for i, a in enumerate(layers)]
            + [kiln.Tensor.from_numpy(np.zeros(100, np.int8), name="zeros"),
               _meta_tensor({"layers": 5})])


@pytest.mark.parametrize("in_kernel", [True, False], ids=["copy_file_range", "through-memory"])
def test_the_writer_copies_payloads_file_to_file(api, tmp_path, monkeypatch, in_kernel):
    from kiln._files import atomic
    if not in_kernel:
        monkeypatch.setattr(atomic, "_copy_file_range", None)
    rng = np.random.default_rng(3)
    a = rng.standard_normal((300, 7)).astype(np.float32)
    b = np.array([True, False, True, True])
    src = tmp_path / "src.bin"
    src.write_bytes(b"HEAD" + a.tobytes() + bytes([1, 0, 1, 1]) + kiln.pack_nibbles([1, 2, 3]))
    p = tmp_path / "c.kiln"
    with kiln.TensorWriter(p) as w, open(src, "rb") as fh:
        w.add("a", "f32", a.shape)
        w.add("b", "bool", b.shape)
        w.add("n", "u4", (3,))
        w.write_from("a", src, 4)                    # a path
        w.write_from("b", fh, 4 + a.nbytes)          # an open file
        w.write_from("n", fh, 4 + a.nbytes + 4)
    d = kiln.load_tensors(p)
    assert d["a"].numpy().tobytes() == a.tobytes()
    assert d["b"].numpy().tolist() == b.tolist()
    assert kiln.unpack_nibbles(d["n"].data, 3, signed=False).tolist() == [1, 2, 3]
    with open(p, "rb") as fh:                        # the same bytes as the one-shot writer
        assert fh.read() == kiln.encode_tensors({"a": a, "b": b, "n": kiln.Tensor(
            kiln.pack_nibbles([1, 2, 3]), dtype="u4", shape=(3,))})
    # what the directory check would refuse is refused on the way, and nothing is left
    bad = tmp_path / "bad.bin"
    bad.write_bytes(bytes([0, 1, 2, 0]) + bytes([0x31]))
    for name, dtype, shape, at, words in (("b", "bool", (4,), 0, "payload byte 2: bool byte is 2"),
                                          ("n", "u4", (1,), 4, "high nibble"),
                                          ("f", "f32", (4,), 0, "ended 11 bytes short")):
        with pytest.raises(ValueError, match=words):
            with kiln.TensorWriter(p) as w:
                w.add(name, dtype, shape)
                w.write_from(name, bad, at)
        assert sorted(os.listdir(tmp_path)) == ["bad.bin", "c.kiln", "src.bin"]
    assert kiln.load_tensors(p)["a"].shape == a.shape   # the old file is intact
    w = kiln.TensorWriter(tmp_path / "x.kiln")
    w.add("f", "f32", (1,))
    with pytest.raises(ValueError, match="offset"):
        w.write_from("f", bad, -1)
    with pytest.raises(KeyError):
        w.write_from("nope", bad, 0)
    w.discard()


def test_many_payloads_copied_at_once_are_the_bytes_each_copy_would_write(api, tmp_path,
                                                                          monkeypatch):
    """write_from_many: runs of small plain payloads in one read and one write,
    the rest as write_from; the file equals the one-shot encoder's (the oracle),
    and the run is really one write (counted)."""
    from kiln._files import atomic
    rng = np.random.default_rng(5)
    names = ["t%03d" % i for i in range(32)]   # declared in sorted order, as the encoder's
    values = {k: rng.standard_normal(int(rng.integers(1, 40))).astype(np.float32)
              for k in names}
    values["t012"] = rng.standard_normal(20000).astype(np.float32)   # > 64 KiB: its own copy
    values["t021"] = np.array([True, False, True])                    # bool: write_from's check
    small = names[:12]
    blob, offsets = b"", {}
    for k in names:                                                # the source, 8-byte padded
        offsets[k] = len(blob)
        raw = values[k].tobytes()
        blob += raw + bytes(-len(raw) % 8)
    src = tmp_path / "src.bin"
    src.write_bytes(blob)
    writes = []
    real = atomic.AtomicFile.pwrite
    monkeypatch.setattr(atomic.AtomicFile, "pwrite",
                        lambda self, data, at: (writes.append(len(data)), real(self, data, at)))
    p = tmp_path / "m.kiln"
    with kiln.TensorWriter(p) as w:
        for k in names:
            w.add(k, "bool" if k == "t021" else "f32", values[k].shape)
        w.write_from_many([(k, offsets[k]) for k in names], src)
    with open(p, "rb") as fh:
        assert fh.read() == kiln.encode_tensors({k: values[k] for k in names})
    # the head, one write for each run of small payloads (12, 8 and 10 of them) and
    # the bool's checked copy (3 bytes); the big payload goes file to file (copy_in)
    assert len(writes) == 5 and writes[3] == 3, writes
    # a source that ends inside a run: ValueError naming the tensor; nothing left behind
    short = tmp_path / "short.bin"
    short.write_bytes(blob[:offsets["t005"] + 3])
    with pytest.raises(ValueError, match="'t005'.*ended"):
        with kiln.TensorWriter(tmp_path / "n.kiln") as w:
            for k in small:
                w.add(k, "f32", values[k].shape)
            w.write_from_many([(k, offsets[k]) for k in small], short)
    assert not (tmp_path / "n.kiln").exists()
    w = kiln.TensorWriter(tmp_path / "x.kiln")
    w.add("a", "f32", (1,))
    w.add("b", "f32", (1,))
    w.write_from_many([("a", 0)], src)
    with pytest.raises(ValueError, match="written already"):
        w.write_from_many([("b", 4), ("a", 0)], src)
    with pytest.raises(KeyError):
        w.write_from_many([("nope", 0)], src)
    w.discard()


@pytest.mark.parametrize("in_kernel", [True, False])
def test_the_writer_copies_row_blocks_file_to_file(api, tmp_path, monkeypatch, in_kernel):
    import threading
    from kiln._files import atomic
    if not in_kernel:
        monkeypatch.setattr(atomic, "_copy_file_range", None)
    a = np.arange(60, dtype=np.int32).reshape(12, 5)
    src = tmp_path / "rows.bin"
    src.write_bytes(b"XY" + a[4:].tobytes())   # rows 4..11, after two bytes
    p = tmp_path / "r.kiln"
    with kiln.TensorWriter(p) as w, open(src, "rb") as fh:
        w.add("a", "i32", a.shape)
        w.add("b", "bool", (2,))
        w.add("e", "f32", (0, 3))
        threads = [threading.Thread(target=w.write_rows_from,
                                    args=("a", 4 + 2 * k, 2, fh if k % 2 else src, 2 + 40 * k))
                   for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        with pytest.raises(ValueError, match="overlap"):
            w.write_rows_from("a", 5, 1, src, 2)
        with pytest.raises(ValueError, match="past its 12 rows"):
            w.write_rows_from("a", 11, 2, src, 2)
        with pytest.raises(ValueError, match="ended 40 bytes short"):   # 2 rows asked, 0 left
            w.write_rows_from("a", 0, 2, src, 2 + 8 * 20)
        with pytest.raises(ValueError, match="no whole-byte rows"):
            w.write_rows_from("b", 0, 2, src, 0)
        with pytest.raises(ValueError, match="rows must be"):
            w.write_rows_from("a", 0, -1, src, 0)
        w.write_rows("a", 0, a[:4])   # the failed copy's rows are free again
        w.write_rows_from("e", 0, 0, src, 0)
        w.write("b", np.array([True, False]))
    d = kiln.load_tensors(p)
    assert d["a"].numpy().tolist() == a.tolist() and d["e"].shape == (0, 3)


def test_the_writer_takes_rows_a_block_at_a_time(api, tmp_path):
    a = np.arange(40, dtype=np.int16).reshape(10, 4)
    p = tmp_path / "r.kiln"
    with kiln.TensorWriter(p) as w:
        w.add("a", "i16", a.shape)
        w.add("e", "f32", (0, 3))
        w.write_rows("a", 6, a[6:])
        w.write_rows("a", 0, a[:3])
        w.write_rows("a", 3, a[3:6])
        w.write_rows("e", 0, np.zeros((0, 3), np.float32))
    with open(p, "rb") as fh:
        assert fh.read() == kiln.encode_tensors({"a": a, "e": np.zeros((0, 3), np.float32)})
    w = kiln.TensorWriter(tmp_path / "bad.kiln")
    w.add("a", "i16", (10, 4))
    w.add("n", "u4", (4,))
    w.write_rows("a", 0, a[:5])
    for args, words in ((("a", 4, a[:2]), "overlap"), (("a", 9, a[:2]), "past its 10 rows"),
                        (("a", 5, a[:2, :3]), "trailing shape"),
                        (("a", 5, a[:2].astype(np.int32)), "must be i16"),
                        (("a", -1, a[:1]), "start"), (("n", 0, np.zeros(4, np.uint8)), "whole-byte")):
        with pytest.raises(ValueError, match=words):
            w.write_rows(*args)
    with pytest.raises(ValueError, match="written already"):
        w.write("a", a)                      # part of it went in by rows
    with pytest.raises(ValueError, match="not written: a, n"):
        w.close()
    assert sorted(os.listdir(tmp_path)) == ["r.kiln"]


def _meta_tensor(meta):
    blob = kiln.encode(_meta.to_nodes(meta), _meta.META_TYPE, frame=True)
    return kiln.Tensor(blob, dtype="u8", shape=(len(blob),), name="__metadata__")


def test_numeric_metadata_arrays_are_compact(api, tmp_path):
    p = tmp_path / "a.kiln"
    kiln.save_tensors(p, {"w": np.zeros(1, np.float32)},
                      metadata={"scores": [0.25] * 100000, "ids": list(range(100000))})
    assert os.path.getsize(p) < 2 * 8 * 100000 + 4096    # 8 bytes an item, not a node each
    back = kiln.load_metadata(p)
    assert back["ids"][99999] == 99999 and back["scores"][5] == 0.25


def test_a_failing_writer_leaves_no_temporary_file(api, tmp_path):
    p = tmp_path / "w.kiln"
    with pytest.raises(kiln.EncodeError):
        kiln.TensorWriter(p, metadata={"bad": {1}})
    with pytest.raises(kiln.EncodeError):
        with kiln.TensorWriter(p) as w:
            w.add("", "u8", (1,))   # (an empty name; a long one is a wide file now)
    d = tmp_path / "adir.kiln"
    d.mkdir()
    w = kiln.TensorWriter(d)
    w.add("a", "u8", (1,))
    w.write("a", np.zeros(1, np.uint8))
    with pytest.raises(OSError):
        w.close()                       # the target is a directory: the replace fails
    assert sorted(os.listdir(tmp_path)) == ["adir.kiln"]


def test_writer_mistakes(api, tmp_path):
    p = tmp_path / "w.kiln"
    with pytest.raises(ValueError, match="not written: b"):
        with kiln.TensorWriter(p) as w:
            w.add("a", "f32", (2,))
            w.add("b", "f32", (2,))
            w.write("a", np.zeros(2, np.float32))
    assert not p.exists() and os.listdir(tmp_path) == []
    w = kiln.TensorWriter(p)
    w.add("a", "f32", (2,))
    with pytest.raises(ValueError, match="declared f32"):
        w.write("a", np.zeros(3, np.float32))
    with pytest.raises(KeyError):
        w.write("nope", np.zeros(2, np.float32))
    with pytest.raises(RuntimeError, match="before the first write"):
        w.add("late", "f32", (1,))
    w.discard()
    assert os.listdir(tmp_path) == []
    with pytest.raises(ValueError, match="reserved"):
        kiln.TensorWriter(p).add("__metadata__", "u8", (1,))


def test_bad_files_are_clear_errors(api, tmp_path):
    p = tmp_path / "b.kiln"
    kiln.save_tensors(p, {"w": np.arange(100, dtype=np.float64)})
    raw = p.read_bytes()
    p.write_bytes(raw[:-8])                       # truncated on disk
    with pytest.raises(kiln.KilnError) as ei:
        kiln.open(p)
    assert ei.value.code == "EOF"
    bad = bytearray(raw)
    bad[64 + 40] ^= 1                             # a descriptor's byte_length
    p.write_bytes(bytes(bad))
    with pytest.raises(kiln.KilnError) as ei:
        kiln.load_tensors(p)
    assert ei.value.code == "TYPE" and ei.value.offset == 64 + 40
    p.write_bytes(b"")
    with pytest.raises(kiln.KilnError, match="b.kiln is empty"):
        kiln.open(p)
    with pytest.raises(FileNotFoundError) as ei2:
        kiln.load_tensors(tmp_path / "missing.kiln")
    assert "missing.kiln" in str(ei2.value)
    with pytest.raises(IsADirectoryError):
        kiln.open(tmp_path)
    with pytest.raises(OSError) as ei3:
        kiln.save_tensors("/proc/kiln-test.kiln", {"w": np.zeros(1)})
    assert "/proc" in str(ei3.value)


def test_save_and_load_any_value(api, tmp_path):
    t = kiln.parse_type("struct{id:i64,name:str,batch:tensors,}")
    p = tmp_path / "r.kiln"
    kiln.save(p, {"id": 5, "name": "x", "batch": {"w": np.eye(2, dtype=np.float32)}}, t)
    v = kiln.load(p, t)
    assert v["id"] == 5 and v["batch"]["w"].numpy().tolist() == [[1, 0], [0, 1]]
    with pytest.raises(kiln.KilnError) as ei:
        kiln.load(p, "struct{id:i64,}")
    assert ei.value.code == "SCHEMA"
    kiln.save(p, [1, 2], "list<i32>", frame=False)
    assert kiln.load(p, "list<i32>", frame=False).tolist() == [1, 2]


def _rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/statm")
def test_a_file_larger_than_memory_opens_and_reads_one_tensor(api, tmp_path):
    p = tmp_path / "huge.kiln"
    big = 32 << 30   # 32 GiB, more than this machine's memory; a hole on disk
    with kiln.TensorWriter(p) as w:
        w.add("big", "u8", (big,))
        w.add("small", "f32", (256,))
        w.write("big", None)
        w.write("small", np.arange(256, dtype=np.float32))
    assert os.path.getsize(p) > big
    before = _rss()
    with kiln.open(p) as f:
        s = f["small"].numpy()
        assert s[255] == 255.0
        rows = f.rows("big", 1 << 30, (1 << 30) + 4096)
        assert int(rows.sum()) == 0
        grown = _rss() - before
    assert grown < (64 << 20), grown   # pages of the table, one tensor and one slice


def test_binary_file_objects(api, tmp_path):
    import io
    buf = io.BytesIO()
    kiln.save_tensors(buf, {"w": np.arange(3, dtype=np.float32)}, metadata={"k": [1]})
    raw = buf.getvalue()
    assert kiln.decode_tensors(raw).keys() == ["w", "__metadata__"]
    buf.seek(0)
    with kiln.open(buf) as f:                   # no fileno: read into memory
        assert f["w"].numpy().tolist() == [0, 1, 2] and f.metadata == {"k": [1]}
    p = tmp_path / "f.kiln"
    with open(p, "wb") as fh:
        kiln.save_tensors(fh, {"w": np.arange(3, dtype=np.float32)}, metadata={"k": [1]})
    assert p.read_bytes() == raw
    with open(p, "rb") as fh:                   # a real file: mapped
        d = kiln.load_tensors(fh)
    assert d["w"].numpy()[2] == 2
    out = io.BytesIO()
    kiln.save(out, {"id": 1}, "struct{id:i64,}")
    out.seek(0)
    assert kiln.load(out, "struct{id:i64,}") == {"id": 1}


def test_the_golden_metadata_file(api, tmp_path):
    """kpy-file-metadata is built field by field by the standard-library case
    generator from spec section 12; kiln reads the same metadata out of it."""
    from _util import CASE_BY_NAME
    p = tmp_path / "golden.kiln"
    p.write_bytes(bytes.fromhex(CASE_BY_NAME["kpy-file-metadata"]["hex"]))
    assert kiln.load_metadata(p) == {"model": "m", "step": 3, "ids": [5, 6]}
    assert kiln.load_tensors(p)["w"].numpy().tolist() == [1.0, 2.0]
    # and kiln writes those very bytes for that input
    out = tmp_path / "again.kiln"
    kiln.save_tensors(out, {"w": np.array([1.0, 2.0], np.float32)},
                      metadata={"model": "m", "step": 3, "ids": [5, 6]})
    assert out.read_bytes() == p.read_bytes()
