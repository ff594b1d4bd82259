"""Tensor directories: API, views, copies, lifetime, dtypes, embedding."""

import gc
import mmap
import pickle
import struct
import sys

import numpy as np
import pytest

import kiln
from _util import CASE_BY_NAME

try:
    import ml_dtypes
except ImportError:  # pragma: no cover
    ml_dtypes = None


def case_bytes(name):
    return bytes.fromhex(CASE_BY_NAME[name]["hex"])


def test_spec_f32_block(impl):
    buf = impl.encode_tensors([kiln.Tensor(np.array([1.0, -2.0], "<f4").tobytes(), dtype="f32",
                                           shape=[2])])
    assert buf == case_bytes("kiln-v2-f32")
    d = impl.decode_tensors(buf)
    assert len(d) == 1 and d.names == [None]
    t = d[0]
    assert (t.dtype, t.code, t.shape, t.nbytes) == ("f32", 2, (2,), 8)
    assert t.numpy().dtype == np.dtype("<f4")
    assert t.numpy().tolist() == [1.0, -2.0]
    assert bytes(t.data) == bytes.fromhex("0000803f000000c0")
    assert t.data.readonly


def test_empty_directory(impl):
    assert impl.encode_tensors([]) == case_bytes("kiln-v2-empty")
    assert len(impl.decode_tensors(case_bytes("kiln-v2-empty"))) == 0


def test_views_borrow_the_buffer(impl):
    src = {"a": np.arange(16, dtype=np.float32), "b": np.arange(5, dtype=np.int64)}
    buf = bytearray(impl.encode_tensors(src))
    d = impl.decode_tensors(buf)
    arr = d["a"].numpy()
    assert not arr.flags.owndata
    assert np.shares_memory(arr, np.frombuffer(buf, np.uint8))
    # a view sees a change to the caller's buffer
    off = buf.index(np.arange(16, dtype="<f4").tobytes())
    buf[off:off + 4] = struct.pack("<f", 42.0)
    assert d["a"].numpy()[0] == 42.0


def test_copies_own_their_payload(impl):
    src = {"a": np.arange(16, dtype=np.float32)}
    buf = bytearray(impl.encode_tensors(src))
    d = impl.decode_tensors(buf, copy=True)
    arr = d["a"].numpy()
    assert not np.shares_memory(arr, np.frombuffer(buf, np.uint8))
    buf[:] = bytes(len(buf))
    np.testing.assert_array_equal(d["a"].numpy(), src["a"])


def test_copies_are_not_capped_unless_asked(impl):
    buf = impl.encode_tensors({"a": np.zeros(100, np.uint8)})
    # max_bytes bounds strings and byte runs, not payloads: they lie inside buf already
    assert impl.decode_tensors(buf, copy=True, max_bytes=99)["a"].nbytes == 100
    assert impl.decode_tensors(buf, max_bytes=99)["a"].nbytes == 100
    with pytest.raises(kiln.KilnError) as ei:
        impl.decode_tensors(buf, copy=True, max_copy_bytes=99)
    assert ei.value.code == "LIMIT" and "max_copy_bytes=99" in str(ei.value)
    assert ei.value.offset == 64 + 40
    # the cap is for copies only: a view is not capped
    assert impl.decode_tensors(buf, max_copy_bytes=99)["a"].nbytes == 100
    # a broken block is reported as such, not as LIMIT
    with pytest.raises(kiln.KilnError) as ei:
        impl.decode_tensors(buf + b"\0", copy=True, max_copy_bytes=99)
    assert ei.value.code == "TRAILING"


def test_lifetime_source_outlives_views(impl):
    buf = impl.encode_tensors({"w": np.arange(1000, dtype=np.float64)})
    d = impl.decode_tensors(bytearray(buf))
    arr = d["w"].numpy()
    del d
    gc.collect()
    assert arr.sum() == sum(range(1000))


def test_mmap_input(impl, tmp_path):
    buf = impl.encode_tensors({"w": np.arange(64, dtype=np.int32)})
    p = tmp_path / "t.kiln"
    p.write_bytes(buf)
    with open(p, "rb") as f:
        m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        d = impl.decode_tensors(m)
        arr = d["w"].numpy()
        assert arr.tolist() == list(range(64))
        with pytest.raises(BufferError):
            m.close()  # the view keeps the mapping exported
        del arr, d
        gc.collect()
        m.close()


def test_big_endian_input_arrays(impl):
    be = np.arange(6, dtype=">i4").reshape(2, 3)
    le = np.arange(6, dtype="<i4").reshape(2, 3)
    assert impl.encode_tensors([be]) == impl.encode_tensors([le])
    t = impl.decode_tensors(impl.encode_tensors([be]))[0]
    assert t.numpy().dtype == np.dtype("<i4") and t.numpy().tolist() == le.tolist()


@pytest.mark.parametrize("dt", ["<f8", "<f4", "<f2", "|b1", "|i1", "|u1", "<i2", "<u2", "<i4",
                                "<u4", "<i8", "<u8"])
def test_numpy_mapping_round_trip(impl, dt):
    a = (np.arange(12) % 2).astype(dt).reshape(3, 4) if dt == "|b1" else np.arange(12).astype(dt).reshape(3, 4)
    d = impl.decode_tensors(impl.encode_tensors({"x": a}))
    out = d["x"].numpy()
    assert out.dtype == np.dtype(dt) and out.shape == (3, 4)
    np.testing.assert_array_equal(out, a)
    assert kiln.Tensor.from_numpy(a).dtype == d["x"].dtype


def test_rank0_and_zero_dims(impl):
    d = impl.decode_tensors(impl.encode_tensors({"s": np.float32(3.5).reshape(()),
                                                 "z": np.zeros((0, 4), np.int16)}))
    assert d["s"].shape == () and d["s"].numpy().shape == () and d["s"].numpy() == 3.5
    assert d["z"].shape == (0, 4) and d["z"].numpy().shape == (0, 4)


@pytest.mark.parametrize("name,code,fallback", [("bf16", 4, "<u2"), ("f8e4m3", 5, "|u1"),
                                                 ("f8e5m2", 6, "|u1"), ("e8m0", 19, "|u1")])
def test_ml_dtypes_mapping(impl, name, code, fallback):
    width = np.dtype(fallback).itemsize
    t = kiln.Tensor(bytes(range(1, 1 + 4 * width)), dtype=name, shape=[4])
    d = impl.decode_tensors(impl.encode_tensors([t]))
    if ml_dtypes is not None:
        arr = d[0].numpy()
        assert arr.dtype == kiln.numpy_dtype(code)
        assert arr.dtype.name in ("bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu")
        assert arr.view(np.uint8).tobytes() == bytes(range(1, 1 + 4 * width))
    else:   # no numpy form without ml_dtypes: .numpy() says so and names .bits()
        with pytest.raises(ImportError, match=r"ml_dtypes is not installed.*bits\(\)"):
            d[0].numpy()
    bits = d[0].bits()
    assert bits.dtype == np.dtype(fallback)
    assert bits.view(np.uint8).tobytes() == bytes(range(1, 1 + 4 * width))


def test_bf16_one(impl):
    if ml_dtypes is None:  # pragma: no cover
        pytest.skip("ml_dtypes not installed")
    a = np.array([1.0], dtype=ml_dtypes.bfloat16)
    t = kiln.Tensor.from_numpy(a)
    assert t.dtype == "bf16" and bytes(t.data) == b"\x80\x3f"
    assert impl.decode_tensors(impl.encode_tensors([t]))[0].numpy()[0] == 1.0


def test_packed_nibbles(impl):
    t = kiln.Tensor(kiln.pack_nibbles([1, 2, 3]), dtype="u4", shape=[3])
    assert bytes(t.data) == bytes.fromhex("2103")
    d = impl.decode_tensors(impl.encode_tensors([t]))
    assert d[0].bits().tolist() == [0x21, 0x03]   # the packed bytes, asked for by name
    assert kiln.unpack_nibbles(d[0].data, 3).tolist() == [1, 2, 3]
    s = kiln.Tensor(kiln.pack_nibbles([-1, 7, -8]), dtype="i4", shape=[3])
    assert kiln.unpack_nibbles(s.data, 3, signed=True).tolist() == [-1, 7, -8]


def test_opaque(impl):
    t = kiln.Tensor(bytes(36), dtype=4096, shape=[2], layout="Q4_K", block_size=18)
    d = impl.decode_tensors(impl.encode_tensors([t]))
    assert d[0].dtype == 4096 and d[0].layout == "Q4_K" and d[0].block_size == 18
    with pytest.raises(kiln.EncodeError):
        impl.encode_tensors([kiln.Tensor(bytes(35), dtype=4096, shape=[2], layout="Q4_K",
                                         block_size=18)])


def test_quantized_links_by_name(impl):
    data = kiln.Tensor(bytes(16), dtype="e2m1", shape=[32], name="w", quant_scheme=1,
                       quant_axis=0, group_size=32, scale_index="w.scale")
    scale = kiln.Tensor(b"\x7f", dtype="e8m0", shape=[1], name="w.scale")
    buf = impl.encode_tensors([data, scale])
    d = impl.decode_tensors(buf)
    assert d["w"].scale_index == 1 and d["w"].quant_scheme == 1 and d["w"].group_size == 32
    assert d["w.scale"].scale_index is None
    bad = kiln.Tensor(bytes(16), dtype="e2m1", shape=[32], name="w", quant_scheme=1,
                      quant_axis=0, group_size=16, scale_index="w.scale")
    with pytest.raises(kiln.EncodeError) as ei:
        impl.encode_tensors([bad, scale])
    assert ei.value.code == "TYPE"


def test_mapping_sorted_sequence_kept(impl):
    a = np.zeros(1, np.int8)
    m = impl.decode_tensors(impl.encode_tensors({"b": a, "a": a, "é": a, "Z": a}))
    assert m.names == ["Z", "a", "b", "é"]
    s = impl.decode_tensors(impl.encode_tensors([kiln.Tensor.from_numpy(a, "b"),
                                                 kiln.Tensor.from_numpy(a, "a")]))
    assert s.names == ["b", "a"]


def test_canonical_two_encoders_same_bytes(impl):
    ts = [kiln.Tensor.from_numpy(np.arange(n, dtype=np.float32), "t%d" % n) for n in (1, 17, 0, 3)]
    a = impl.encode_tensors(ts)
    assert a == impl.encode_tensors(impl.decode_tensors(a))
    assert a == kiln.encode_tensors(ts)


def test_encoder_refuses_what_decoder_rejects(impl):
    a = np.zeros(1, np.int8)
    with pytest.raises(kiln.EncodeError):
        impl.encode_tensors([kiln.Tensor.from_numpy(a, "x"), kiln.Tensor.from_numpy(a, "x")])
    with pytest.raises(kiln.EncodeError):
        impl.encode_tensors([kiln.Tensor.from_numpy(a, "x"), kiln.Tensor.from_numpy(a)])
    with pytest.raises(kiln.EncodeError):
        impl.encode_tensors([kiln.Tensor(b"\x02", dtype="bool", shape=[1])])
    with pytest.raises(kiln.EncodeError):
        impl.encode_tensors([kiln.Tensor(b"\x12", dtype="u4", shape=[1])])


def test_struct_embedding(impl):
    t = kiln.parse_type("struct{id:i64,batch:tensors,text:str,}")
    v = {"id": 7, "batch": {"x": np.arange(3, dtype=np.float32)}, "text": "after"}
    buf = impl.encode(v, t)
    out = impl.decode(buf, t)
    assert out["id"] == 7 and out["text"] == "after"
    assert out["batch"]["x"].numpy().tolist() == [0.0, 1.0, 2.0]
    assert np.shares_memory(out["batch"]["x"].numpy(), np.frombuffer(buf, np.uint8))
    assert impl.encode(out, t) == buf
    case = case_bytes("kiln-v2-in-struct")
    s = impl.decode(case, "struct{id:i64,batch:tensors,}")
    assert s["id"] == 7 and s["batch"][0].numpy().tolist() == [1.0, -2.0]


def test_tensors_in_list_and_opt(impl):
    t = kiln.parse_type("list<opt<tensors>>")
    v = [None, [np.arange(2, dtype=np.int8)], []]
    buf = impl.encode(v, t)
    out = impl.decode(buf, t)
    assert out[0] is None and out[1][0].numpy().tolist() == [0, 1] and len(out[2]) == 0
    assert impl.encode(out, t) == buf
    f = impl.encode(v, t, frame=True)
    assert impl.encode(impl.decode(f, t, frame=True), t, frame=True) == f


def test_decode_tensors_equals_decode(impl):
    buf = case_bytes("kiln-v2-f16-named")
    assert impl.decode_tensors(buf) == impl.decode(buf, kiln.parse_type("tensors"))
    assert kiln.decode_tensors(buf) == kiln.decode(buf, "tensors")


def test_from_dlpack_and_buffer(impl):
    a = np.arange(4, dtype=np.int16)
    assert kiln.Tensor.from_numpy(memoryview(a)).numpy().tolist() == [0, 1, 2, 3]
    # and through each kernel's encoder and decoder
    t = impl.decode_tensors(impl.encode_tensors([kiln.Tensor.from_numpy(memoryview(a))]))[0]
    assert (t.dtype, t.shape, bytes(t.data)) == ("i16", (4,), a.astype("<i2").tobytes())

    class DL:
        def __init__(self, x):
            self.x = x

        def __dlpack__(self, **kw):
            return self.x.__dlpack__(**kw)

        def __dlpack_device__(self):
            return self.x.__dlpack_device__()
    assert kiln.Tensor.from_numpy(DL(a)).numpy().tolist() == [0, 1, 2, 3]


def test_directory_indexing(impl):
    d = impl.decode_tensors(impl.encode_tensors({"a": np.zeros(1), "b": np.ones(1)}))
    assert d[1] is d["b"] and "a" in d and "q" not in d and d.get("q") is None
    with pytest.raises(KeyError):
        d["q"]
    assert sorted(d.to_dict()) == ["a", "b"]


def test_lazy_rows_are_the_table_rows(impl):
    """kiln.open builds rows on demand from the kernel's checked copy: every row,
    slice and name must be what validate_directory's table holds."""
    from _mutation import directory_tensors
    from kiln import _kernels_py
    from kiln._rows import LazyRows
    M = 1 << 20
    named = directory_tensors()
    unnamed = [kiln.Tensor(t.data, dtype=t.dtype, shape=t.shape) for t in named[:6]]
    for ts in (named, unnamed, []):
        buf = kiln.encode_tensors(ts)
        end, base, table = impl.kernels.validate_directory(buf, 0, True, False, M, M)
        got = impl.kernels.validate_directory_copy(buf, 0, True, False, M, M)
        assert got[:2] == (end, base) and got[2] == len(table)
        assert got == _kernels_py.validate_directory_copy(buf, 0, True, False, M, M)
        rows = LazyRows(got[4], got[2], got[3], got[5])
        assert list(rows) == table and len(rows) == len(table)
        assert [rows[i] for i in range(-len(table), len(table))] == table + table
        assert list(rows[1:-1]) == table[1:-1] and rows[::2] == table[::2]
        assert rows.raw_names() == [r[2] for r in table]
        assert rows[1:4].raw_names() == [r[2] for r in table[1:4]]
        with pytest.raises(IndexError):
            rows[len(table)]
    with pytest.raises(kiln.KilnError) as e:
        impl.kernels.validate_directory_copy(buf[:-1], 0, True, False, M, M)
    assert e.value.code == "EOF"


# pickles made by kiln before the tensor layer became the package kiln._tensors
# (their reconstructors are kiln._tensor._rebuild_tensor / _rebuild_directory):
# protocol 2 and 5, a named f32 tensor [1.5, -2.0] and a directory of a bool and
# a u4 tensor
OLD_PICKLES = {
    (2, "t"): "8002636b696c6e2e5f74656e736f720a5f72656275696c645f74656e736f720a710028635f636f64"
              "6563730a656e636f64650a7101580a0000000000c3803f000000c380710258060000006c617469"
              "6e3171038671045271054b024b0285710658010000007771074e4b004b004e4b004e4e74710852"
              "71092e",
    (2, "d"): "8002636b696c6e2e5f74656e736f720a5f72656275696c645f6469726563746f72790a71005d71"
              "0128636b696c6e2e5f74656e736f720a5f72656275696c645f74656e736f720a710228635f636f"
              "646563730a656e636f64650a71035803000000010001710458060000006c6174696e3171058671"
              "065271074b074b0385710858010000006271094e4b004b004e4b004e4e74710a52710b68022868"
              "0358020000002103710c680586710d52710e4b114b0385710f58010000007171104e4b004b004e"
              "4b004e4e747111527112658571135271142e",
    (5, "t"): "80059548000000000000008c0c6b696c6e2e5f74656e736f72948c0f5f72656275696c645f7465"
              "6e736f729493942843080000c03f000000c0944b024b0285948c0177944e4b004b004e4b004e4e"
              "749452942e",
    (5, "d"): "80059584000000000000008c0c6b696c6e2e5f74656e736f72948c125f72656275696c645f6469"
              "726563746f72799493945d942868008c0f5f72656275696c645f74656e736f7294939428430301"
              "0001944b074b0385948c0162944e4b004b004e4b004e4e7494529468052843022103944b114b03"
              "85948c0171944e4b004b004e4b004e4e7494529465859452942e",
}


@pytest.mark.parametrize("protocol", [2, 5])
def test_pickles_made_before_the_package_split_still_load(impl, protocol):
    t = pickle.loads(bytes.fromhex(OLD_PICKLES[protocol, "t"]))
    assert type(t) is kiln.Tensor and (t.name, t.dtype, t.shape) == ("w", "f32", (2,))
    assert bytes(t.data) == struct.pack("<2f", 1.5, -2.0)
    d = pickle.loads(bytes.fromhex(OLD_PICKLES[protocol, "d"]))
    assert type(d) is kiln.TensorDirectory and d.keys() == ["b", "q"]
    assert (d["b"].dtype, bytes(d["b"].data)) == ("bool", b"\x01\x00\x01")
    assert (d["q"].dtype, d["q"].shape, bytes(d["q"].data)) == ("u4", (3,), b"\x21\x03")
    # and they round-trip through the tested kernel like any other directory
    back = impl.decode_tensors(impl.encode_tensors(d))
    assert back == d and pickle.loads(pickle.dumps(back, protocol=protocol)) == d
