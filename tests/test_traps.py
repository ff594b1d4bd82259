"""Issue 32, point 2: no silent traps (caps that agree between save and load,
list<u8> bounded by max_bytes alone, metadata's unused fields, numpy scalars
as metadata values).  Expected values are written out by hand."""
import struct

import numpy as np
import pytest

import kiln
from kiln import _compat


@pytest.fixture
def kernels(impl, monkeypatch):
    monkeypatch.setattr(_compat, "kernels", impl.kernels)
    monkeypatch.setattr(_compat, "IMPLEMENTATION", impl.name)
    return impl


# --- list<u8>: max_bytes alone --------------------------------------------

def test_list_u8_is_bounded_by_max_bytes_not_max_count(impl):
    buf = struct.pack("<I", 100) + bytes(range(100))
    assert impl.decode(buf, "list<u8>", max_count=10, max_bytes=100) == bytes(range(100))
    assert impl.decode(buf, "struct{b:list<u8>,}", max_count=10,
                       max_bytes=1000) == {"b": bytes(range(100))}
    with pytest.raises(kiln.KilnError) as e:
        impl.decode(buf, "list<u8>", max_count=1000, max_bytes=99)
    assert (e.value.code, e.value.offset) == ("LIMIT", 0)
    assert "max_bytes=99" in e.value.reason


@pytest.mark.parametrize("t, buf, cap, name", [
    ("list<i32>", struct.pack("<I", 3) + bytes(12), {"max_count": 2}, "max_count=2"),
    ("list<str>", struct.pack("<II", 1, 0), {"max_count": 0}, "max_count=0"),
    ("str", struct.pack("<I", 3) + b"abc", {"max_bytes": 2}, "max_bytes=2"),
    ("dict<str,i8>", struct.pack("<I", 1) + struct.pack("<I", 3) + b"abc\x01",
     {"max_bytes": 2}, "max_bytes=2"),
    ("dict<str,i8>", struct.pack("<I", 1) + struct.pack("<I", 1) + b"a\x01",
     {"max_count": 0}, "max_count=0"),
    ("list<u8>", struct.pack("<I", 3) + b"abc", {"max_bytes": 2}, "max_bytes=2"),
])
def test_every_limit_names_the_cap_that_fired(impl, t, buf, cap, name):
    with pytest.raises(kiln.KilnError) as e:
        impl.decode(buf, t, **cap)
    assert e.value.code == "LIMIT" and name in e.value.reason


# --- what save writes, load reads ----------------------------------------

def test_load_reads_back_what_save_wrote_above_the_default_caps(kernels, tmp_path):
    n = 16_777_217      # one above the default max_count and max_bytes
    t = "struct{x:list<i8>,b:list<u8>,s:str,}"
    x = np.arange(n, dtype=np.int64).astype(np.int8)
    value = {"x": x, "b": b"\x07" * n, "s": "a" * n}
    p = tmp_path / "big.kiln"
    kiln.save(p, value, t)
    got = kiln.load(p, t)
    assert got["x"].shape == (n,) and got["x"][-3:].tolist() == [-2, -1, 0]   # 2**24 % 256 == 0
    assert got["b"] == b"\x07" * n and got["s"] == "a" * n
    # a cap the caller sets is the cap, and the message names it
    with pytest.raises(kiln.KilnError) as e:
        kiln.load(p, t, max_count=1000)
    # (at the file's offset: the value starts after kiln.save's 12-byte type head and text)
    assert e.value.code == "LIMIT" and e.value.offset == 12 + len(t) + 16 and \
        "max_count=1000" in e.value.reason


# --- metadata: the fields a kind does not use hold zero ---------------------

def _file_with_node_field(tmp_path, meta, node, field, value):
    """A file saved with ``meta`` whose metadata node ``node`` then has
    ``field`` set to ``value`` (the same length, so every offset stays)."""
    from kiln import _meta
    p = tmp_path / "m.kiln"
    kiln.save_tensors(p, {"a": np.zeros(2, np.float32)}, metadata=meta)
    nodes = _meta.to_nodes(meta)
    good = kiln.encode(nodes, _meta.META_TYPE, frame=True)
    nodes[node][field] = value
    bad = kiln.encode(nodes, _meta.META_TYPE, frame=True)
    data = p.read_bytes()
    assert len(good) == len(bad) and data.count(good) == 1
    p.write_bytes(data.replace(good, bad))
    return p


@pytest.mark.parametrize("node, field, value", [
    (1, "float", float("nan")),      # an int node: float unused
    (1, "float", -0.0),
    (2, "int", 1),                   # a float node: int unused
    (0, "int", 7),                   # the root dict uses nothing
    (3, "float", 1.0),               # a null node
])
def test_metadata_fields_a_kind_does_not_use_must_be_zero(kernels, tmp_path, node, field, value):
    meta = {"i": 3, "f": 0.5, "n": None}
    p = _file_with_node_field(tmp_path, meta, node, field, value)
    with pytest.raises(kiln.KilnError) as e:
        kiln.load_metadata(p)
    assert e.value.code == "TYPE" and ("node %d" % node) in e.value.reason
    assert repr(field) in e.value.reason
    with kiln.open(p) as f:   # the metadata is decoded when first read
        with pytest.raises(kiln.KilnError) as e2:
            f.metadata
    assert (e2.value.code, e2.value.offset) == (e.value.code, e.value.offset)


def test_metadata_text_and_raw_unused_must_be_empty():
    from kiln import _meta
    for node, field, value in ((1, "text", "x"), (1, "raw", b"\x00"), (0, "text", "r")):
        nodes = _meta.to_nodes({"i": 3})
        nodes[node][field] = value
        with pytest.raises(kiln.KilnError) as e:
            _meta.from_nodes(nodes, 40)
        # the fault is at its node: the 16-byte frame and the 4-byte count at 40,
        # then node 0 (parent 4, key flag 1, kind 1, int 8, float 8, text 4+0,
        # raw 4+0: 30 bytes), then node 1
        want = {0: 40 + 16 + 4, 1: 40 + 16 + 4 + 30}[node]
        assert (e.value.code, e.value.offset) == ("TYPE", want) and repr(field) in e.value.reason


def test_kiln_check_refuses_a_nan_in_an_unused_metadata_field(tmp_path):
    import subprocess
    import sys
    from _util import ROOT
    p = _file_with_node_field(tmp_path, {"i": 3}, 1, "float", float("nan"))
    r = subprocess.run([sys.executable, "-m", "kiln", "check", str(p)], capture_output=True,
                       text=True, cwd=str(ROOT), timeout=60)
    assert r.returncode != 0 and "TYPE" in r.stdout + r.stderr


def test_numpy_scalars_are_metadata_values_read_back_as_python_values(kernels, tmp_path):
    p = tmp_path / "s.kiln"
    meta = {"i": np.int64(3), "f": np.float32(0.5), "b": np.bool_(True), "u": np.uint8(200),
            "h": np.float16(1.5), "ints": [np.int32(1), np.int64(-2)],
            "floats": [np.float32(0.25), 2.0], "nested": {"k": [np.bool_(False)]}}
    kiln.save_tensors(p, {"a": np.zeros(1, np.float32)}, metadata=meta)
    got = kiln.load_metadata(p)
    assert got == {"i": 3, "f": 0.5, "b": True, "u": 200, "h": 1.5, "ints": [1, -2],
                   "floats": [0.25, 2.0], "nested": {"k": [False]}}
    kinds = {k: type(v) for k, v in got.items()}
    assert kinds == {"i": int, "f": float, "b": bool, "u": int, "h": float, "ints": list,
                     "floats": list, "nested": dict}
    assert [type(v) for v in got["ints"] + got["floats"]] == [int, int, float, float]
    assert type(got["nested"]["k"][0]) is bool
    with pytest.raises(kiln.EncodeError):
        kiln.save_tensors(tmp_path / "x.kiln", {"a": np.zeros(1)},
                          metadata={"c": np.complex64(1j)})


# --- point 6: a dtype is kiln's name, a numpy dtype or numpy's name --------

@pytest.mark.parametrize("spelling, code", [
    ("f32", 2), (2, 2), ("float32", 2), (np.float32, 2), (np.dtype("<f4"), 2),
    ("float64", 1), (np.float16, 3), ("bool", 7), (np.bool_, 7), ("int8", 8), ("i8", 8),
    ("uint8", 9), (np.int16, 10), ("uint16", 11), ("int32", 12), (np.uint32, 13),
    ("int64", 14), (np.uint64, 15), ("bfloat16", 4), ("float8_e4m3fn", 5),
    ("float8_e5m2", 6), ("float8_e8m0fnu", 19), ("i4", 16),   # kiln's i4 (4-bit), not numpy's
])
def test_every_dtype_spelling_is_taken(tmp_path, spelling, code):
    width = {2: 4, 1: 8, 3: 2, 7: 1, 8: 1, 9: 1, 10: 2, 11: 2, 12: 4, 13: 4, 14: 8, 15: 8,
             4: 2, 5: 1, 6: 1, 19: 1, 16: 1}[code]
    shape = (2,) if code == 16 else (1,)
    t = kiln.Tensor(bytes(width), dtype=spelling, shape=shape)
    assert t.code == code
    p = tmp_path / "w.kiln"
    with kiln.TensorWriter(p) as w:
        w.add("a", spelling, shape)
        w.write("a", t)
    assert kiln.load_tensors(p)["a"].code == code


@pytest.mark.parametrize("spelling", ["f8", "<f4", "float", "double", ">f4",
                                      np.dtype(">f4"), np.complex64, object])
def test_a_dtype_kiln_cannot_take_is_refused_clearly(tmp_path, spelling):
    with pytest.raises(ValueError):
        kiln.Tensor(bytes(8), dtype=spelling, shape=(1,))
    with kiln.TensorWriter(tmp_path / "w.kiln") as w:
        with pytest.raises(kiln.EncodeError) as e:
            w.add("a", spelling, (1,))
        assert e.value.code == "TYPE"
        w.add("b", "f32", (1,))
        w.write("b", np.zeros(1, np.float32))


def test_file_caps_keep_the_zero_size_budget():
    # the rule kiln.load applies (white-box: a file big enough to show it
    # would need ~1 GB of empty dicts to write)
    from kiln import _api
    size = (1 << 25) + 1
    assert _api._file_caps(size, "struct{x:list<i8>,}", {}) == {
        "max_count": 1 << 26, "max_bytes": 1 << 26}
    assert _api._file_caps(size, "struct{z:list<struct{}>,b:list<u8>,}", {}) == {
        "max_bytes": 1 << 26}                                   # max_count: its default
    assert _api._file_caps(size, "list<opt<list<struct{}>>>", {}) == {"max_bytes": 1 << 26}
    assert _api._file_caps(size, "list<i8>", {"max_count": 5}) == {"max_count": 5,
                                                                 "max_bytes": 1 << 26}
    assert _api._file_caps(1000, "list<i8>", {}) == {}         # small files: the defaults
