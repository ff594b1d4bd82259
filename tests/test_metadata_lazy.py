"""A tensor file's metadata is read and decoded when it is first used, a run
of nodes at a time from a window of its bytes (issue 51, item 7).

The oracle for every value and every fault is the one-shot decode: the whole
metadata payload decoded by ``kiln.decode`` as one framed ``META_TYPE`` value,
then the tree built by ``kiln._meta.from_nodes`` (both kernels).  The window
and the run are made small here so that a few hundred nodes cross many of
them; the benchmark ``benchmarks/metadata_open.py`` times and weighs the
real sizes.
"""

import numpy as np
import pytest

import kiln
from kiln import _meta
from kiln import _wire as W


@pytest.fixture
def small_windows(monkeypatch):
    monkeypatch.setattr(_meta, "WINDOW", 256)
    monkeypatch.setattr(_meta, "RUN", 7)


def _file(tmp_path, blob, name="m.kiln"):
    """A file of one f32 tensor and ``blob`` as its metadata payload; the
    payload's file offset."""
    data = kiln.encode_tensors([kiln.Tensor.from_numpy(np.arange(3, dtype=np.float32), name="w"),
                                kiln.Tensor(bytes(blob), dtype="u8", shape=(len(blob),),
                                            name="__metadata__")])
    p = tmp_path / name
    p.write_bytes(data)
    d = kiln.decode_tensors(data)
    return p, d._pb + d._rows[1][W.R_BYTE_OFFSET]


def _one_shot(blob, at):
    """The metadata as the whole payload decoded at once gives it, or its
    (code, file offset)."""
    try:
        nodes = kiln.decode(bytes(blob), _meta.META_TYPE, frame=True,
                            max_count=1 << 24, max_bytes=1 << 24)
    except kiln.KilnError as e:
        return ("fault", e.code, at + e.offset)
    try:
        return ("ok", _meta.from_nodes(nodes, at))
    except kiln.KilnError as e:
        return ("fault", e.code, e.offset)


def _lazy(p):
    with kiln.open(p) as f:
        try:
            return ("ok", f.metadata)
        except kiln.KilnError as e:
            return ("fault", e.code, e.offset)


META = {"name": "model", "layers": [{"i": i, "w": "x" * (i % 50), "ok": i % 2 == 0,
                                     "f": i / 3, "shape": [i, 2, 3], "none": None}
                                    for i in range(120)],
        "big": "y" * 5000, "raw": b"\x00\x01" * 700, "e": {}, "l": []}


def test_values_cross_many_windows_and_runs(api, tmp_path, small_windows):
    blob = kiln.encode(_meta.to_nodes(META), _meta.META_TYPE, frame=True)
    assert len(blob) > 40 * _meta.WINDOW
    p, at = _file(tmp_path, blob)
    got = _lazy(p)
    assert got == _one_shot(blob, at) and got[0] == "ok"
    assert _meta.same(got[1], META)


def _nodes():
    return _meta.to_nodes(META)


def _mutations():
    """(name, blob): faults of every kind, early, late, inside a long string."""
    good = kiln.encode(_nodes(), _meta.META_TYPE, frame=True)
    out = [("truncated-late", good[:-3]), ("truncated-early", good[:30]),
           ("trailing", good + b"\x00"), ("count-claims-more", _with_count(good, 10 ** 6)),
           ("count-claims-less", _with_count(good, 5)), ("frame", b"\x00" * 16 + good[16:])]
    i = good.index(b"y" * 5000)
    bad = bytearray(good)
    bad[i + 4000] = 0xFF   # not UTF-8, inside the long string
    out.append(("utf8-in-long-string", bytes(bad)))
    nodes = _nodes()
    nodes[-5]["kind"] = 99
    out.append(("unknown-kind-late", kiln.encode(nodes, _meta.META_TYPE, frame=True)))
    nodes = _nodes()
    nodes[300]["parent"] = 400
    out.append(("parent-after", kiln.encode(nodes, _meta.META_TYPE, frame=True)))
    nodes = _nodes()
    nodes[200]["float"] = -0.0
    out.append(("unused-field", kiln.encode(nodes, _meta.META_TYPE, frame=True)))
    nodes = _nodes()
    nodes[2]["key"] = nodes[1]["key"]
    out.append(("repeated-key", kiln.encode(nodes, _meta.META_TYPE, frame=True)))
    long_len = bytearray(good)   # the long string claims more bytes than the payload holds
    long_len[i - 4:i] = (len(good)).to_bytes(4, "little")
    out.append(("string-past-the-end", bytes(long_len)))
    # two faults: a tree fault early, a wire fault or trailing bytes later (the one-shot
    # decode finds the wire's first)
    nodes = _nodes()
    nodes[0]["kind"] = _meta.LIST
    out.append(("root-not-dict-and-trailing",
                kiln.encode(nodes, _meta.META_TYPE, frame=True) + b"\x00"))
    nodes = _nodes()
    nodes[2]["key"] = nodes[1]["key"]
    two = bytearray(kiln.encode(nodes, _meta.META_TYPE, frame=True))
    two[two.index(b"y" * 5000) + 100] = 0xFF
    out.append(("repeated-key-then-utf8", bytes(two)))
    nodes = _nodes()
    nodes[5]["parent"] = 50
    out.append(("parent-after-then-truncated",
                kiln.encode(nodes, _meta.META_TYPE, frame=True)[:-40]))
    return out


def _with_count(blob, n):
    b = bytearray(blob)
    b[W.FRAME_SIZE:W.FRAME_SIZE + 4] = n.to_bytes(4, "little")
    return bytes(b)


@pytest.mark.parametrize("name, blob", _mutations(), ids=[m[0] for m in _mutations()])
def test_each_fault_is_the_one_shot_decodes(api, tmp_path, small_windows, name, blob):
    p, at = _file(tmp_path, blob)
    want = _one_shot(blob, at)
    assert want[0] == "fault", want
    assert _lazy(p) == want
    with pytest.raises(kiln.KilnError) as e:   # load_metadata reads it the same way
        kiln.load_metadata(p)
    assert ("fault", e.value.code, e.value.offset) == want
    with pytest.raises(kiln.KilnError) as e:   # and a copying load_tensors, from memory
        kiln.load_tensors(p, copy=True)
    assert ("fault", e.value.code, e.value.offset) == want


def test_open_reads_no_metadata_until_it_is_used(api, tmp_path):
    nodes = _nodes()
    nodes[-1]["kind"] = 99   # broken at its last node
    blob = kiln.encode(nodes, _meta.META_TYPE, frame=True)
    p, at = _file(tmp_path, blob)
    with kiln.open(p) as f:   # the table alone
        assert f.keys() == ["w"]
        with pytest.raises(kiln.KilnError) as e:
            f.metadata
        assert ("fault", e.value.code, e.value.offset) == _one_shot(blob, at)
        with pytest.raises(kiln.KilnError):   # reading a tensor needs the checksums in it
            f["w"]


def test_metadata_a_writer_stores_is_read_back_whatever_its_size(api, tmp_path):
    # a string longer than the default max_bytes: the caps follow the payload
    meta = {"config": "z" * (W.DEFAULT_MAX_BYTES + 10), "n": 1}
    p = tmp_path / "big.kiln"
    kiln.save_tensors(p, {"w": np.ones(2, np.float32)}, metadata=meta)
    with kiln.open(p) as f:
        assert f.metadata == meta
    assert kiln.load_metadata(p) == meta


def test_the_kernels_list_head_and_items_against_decode(impl):
    t = kiln.parse_type("list<struct{a:u32,s:str,}>")
    item = kiln.parse_type("struct{a:u32,s:str,}")
    value = [{"a": i, "s": "v" * i} for i in range(40)]
    buf = kiln.encode(value, t, frame=True)
    k = impl.kernels
    head = k.compile_decoder(t.plan(), t.schema_hash, False, 1000, 1000, False)
    prog = k.compile_decoder(item.plan(), None, False, 1000, 1000, False)
    count, p = head.list_head(buf)
    assert (count, p) == (40, W.FRAME_SIZE + 4)
    assert head.list_head(buf[:p + 10], len(buf)) == (40, p)   # a window and the length
    out = []
    p = prog.decode_items(buf, p, 25, out)
    p = prog.decode_items(buf, p, 15, out)
    assert out == value and p == len(buf)
    with pytest.raises(kiln.KilnError) as e:   # the count checked against the length
        head.list_head(buf[:60], W.FRAME_SIZE + 4 + 100)   # 40 items need 320 bytes
    assert (e.value.code, e.value.offset) == ("EOF", W.FRAME_SIZE)
    with pytest.raises(ValueError):
        head.list_head(buf[:10], len(buf))   # the window must hold the count word
    with pytest.raises(ValueError):
        prog.list_head(buf)                  # not a list program
    with pytest.raises(kiln.KilnError) as e:   # faults at their offsets in buf
        prog.decode_items(buf[:100], W.FRAME_SIZE + 4, 40, [])
    assert e.value.code == "EOF" and e.value.offset < 100


def test_verify_false_reads_no_metadata(api, tmp_path):
    nodes = _nodes()
    nodes[-1]["kind"] = 99   # broken: any read of the metadata raises
    p, _ = _file(tmp_path, kiln.encode(nodes, _meta.META_TYPE, frame=True))
    with kiln.open(p, verify=False) as f:
        assert f["w"].numpy().tolist() == [0.0, 1.0, 2.0]
        assert f.rows("w", 0, 2).tolist() == [0.0, 1.0]
        with pytest.raises(kiln.KilnError):
            f.metadata
    with kiln.open(p) as f:   # verify on: the read needs the checksums the metadata may hold
        with pytest.raises(kiln.KilnError):
            f["w"]


def test_metadata_as_one_blob_reads_what_a_file_reads(api):
    # kiln._access.metadata_of_blob (kiln.torch.load of bytes, the safetensors converter):
    # the caps follow the blob, and a fault is a plain KilnError at its offset in the blob
    from kiln import _access
    meta = {"config": "z" * (W.DEFAULT_MAX_BYTES + 10)}
    assert _access.metadata_of_blob(_access.metadata_blob(meta)) == meta
    blob = kiln.encode(_nodes(), _meta.META_TYPE, frame=True)[:-3]
    with pytest.raises(kiln.KilnError) as e:
        _access.metadata_of_blob(blob)
    assert type(e.value) is kiln.KilnError
    assert ("fault", e.value.code, e.value.offset) == _one_shot(blob, 0)

