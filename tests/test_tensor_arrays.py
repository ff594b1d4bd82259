"""Tensor.numpy() and TensorDirectory.values() of decoded directories: the
compiled kernels build the arrays and Tensor objects themselves; they must be
what the Python code makes (kiln._tensors.arrays.numpy_py), read-only, and keep the
caller's buffer exported while they live."""

import gc

import numpy as np
import pytest

import kiln
from kiln._tensors.arrays import numpy_py
from _util import root_base

ARRAYS = {
    "a": np.arange(6, dtype=np.float32).reshape(2, 3),
    "b": np.arange(4, dtype=np.int64),
    "c": np.zeros((0, 3), np.float32),
    "d": np.array(5, np.int16),
    "e": np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4),
    "f": np.array([True, False]),
    "g": np.arange(3, dtype=np.float16),
}


def same_array(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape and a.strides == b.strides
    assert a.tobytes() == b.tobytes()
    for flag in ("C_CONTIGUOUS", "F_CONTIGUOUS", "WRITEABLE", "ALIGNED", "OWNDATA"):
        assert a.flags[flag] == b.flags[flag], flag


@pytest.mark.parametrize("copy", [False, True])
def test_arrays_match_the_python_path(impl, copy):
    buf = impl.encode_tensors(ARRAYS)
    d = impl.decode_tensors(buf, copy=copy, max_copy_bytes=1 << 20) if copy \
        else impl.decode_tensors(buf)
    ts = d.values()
    assert [t.name for t in ts] == sorted(ARRAYS)
    for t in ts:
        a = t.numpy()
        same_array(a, numpy_py(t))
        # and what the array must be, whichever path made both
        want = ARRAYS[t.name]
        assert a.dtype == want.dtype.newbyteorder("<") and a.shape == want.shape
        assert a.tobytes() == want.tobytes() and a.flags.c_contiguous
        assert not a.flags.writeable or a.size == 0
        assert t.shape == want.shape
    # values() and indexing give the same objects
    assert all(d[t.name] is t for t in ts)
    assert d.values() == ts


def test_one_tensor_then_all(impl):
    d = impl.decode_tensors(impl.encode_tensors(ARRAYS))
    first = d["b"]
    ts = d.values()
    assert ts[1] is first and first.numpy().tolist() == [0, 1, 2, 3]


def test_arrays_keep_the_buffer_exported_and_stay_read_only(impl):
    b = bytearray(impl.encode_tensors(ARRAYS))
    d = impl.decode_tensors(b)
    a = d["a"].numpy()
    with pytest.raises(ValueError):
        a.flags.writeable = True
    if impl.compiled_tensors:
        # the compiled kernels' directory: a view of the caller's buffer, which
        # the array's base (a HeldBuffer) holds an export of
        with pytest.raises(BufferError):
            d._buf.release()
    else:
        # the pure kernels' directory (or any directory on a free-threaded build):
        # one read-only owner array holding the one export of the caller's object
        assert type(d._buf) is np.ndarray and not d._buf.flags.writeable
    # the array's memory: the compiled tensor part's HeldBuffer where it serves
    # (declared in kiln._compat), else the owner's export of the bytearray
    if impl.compiled_tensors:
        assert type(root_base(a)).__name__ == "HeldBuffer"
    else:
        assert type(root_base(a)) is memoryview and root_base(a).obj is b
    del d
    gc.collect()
    with pytest.raises(BufferError):
        b.append(0)
    assert a.tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    del a
    gc.collect()
    b.append(0)


def test_tensors_made_by_hand_take_the_python_path():
    t = kiln.Tensor.from_numpy(np.arange(6, dtype=np.int32).reshape(2, 3))
    same_array(t.numpy(), numpy_py(t))
    a = t.numpy()
    assert a.tolist() == [[0, 1, 2], [3, 4, 5]] and a.dtype == np.dtype("<i4")
    assert type(root_base(a)) is memoryview and not a.flags.writeable


def test_to_dict_matches_the_python_comprehension(impl):
    buf = impl.encode_tensors(ARRAYS)
    for copy in (False, True):
        d = impl.decode_tensors(buf, copy=copy, max_copy_bytes=1 << 20)
        got = d.to_dict()
        want = {t.name: numpy_py(t) for t in d.values()}
        assert list(got) == list(want)
        for k in want:
            same_array(got[k], want[k])
    d = impl.decode_tensors(buf)
    d["b"].name = "renamed"          # a tensor made before keeps its (changed) name
    assert list(d.to_dict()) == ["a", "renamed", "c", "d", "e", "f", "g"]


def test_unnamed_and_trusted_directories(impl):
    buf = impl.encode_tensors([np.arange(3, dtype=np.int32), np.ones((2, 2), np.float64)])
    d = impl.decode_tensors(buf)
    assert list(d.to_dict()) == [None]
    assert [t.numpy().shape for t in d.values()] == [(3,), (2, 2)]
    t = kiln.struct({"x": kiln.tensors})
    out = impl.decode(impl.encode({"x": ARRAYS}, t), t, trusted=True)
    assert out["x"]._errors == "surrogateescape"
    assert sorted(out["x"].to_dict()) == sorted(ARRAYS)


def test_names_that_are_not_utf8_in_a_trusted_decode(impl):
    buf = bytearray(impl.encode_tensors({"qq": np.zeros(2, np.float32),
                                         "zz": np.ones(1, np.int8)}))
    at = bytes(buf).index(b"qqzz")
    buf[at:at + 2] = b"\xffq"       # still ascending, no longer UTF-8
    for _ in range(2):              # twice: what the compiled kernels remember
        d = impl.decode_tensors(bytes(buf), trusted=True)
        assert d.names == ["\udcffq", "zz"]
        assert list(d.to_dict()) == ["\udcffq", "zz"]
        assert [t.name for t in d.values()] == ["\udcffq", "zz"]
    with pytest.raises(kiln.KilnError) as e:
        impl.decode_tensors(bytes(buf))
    assert e.value.code == "UTF8"
    d = impl.decode_tensors(impl.encode_tensors({"qq": np.zeros(2, np.float32)}))
    assert d.to_dict()["qq"].tolist() == [0.0, 0.0] and d.values()[0].name == "qq"


def test_every_array_and_view_stays_read_only(impl):
    b = bytearray(impl.encode_tensors(ARRAYS))
    made = kiln.Tensor(bytearray(b"\x01\x02\x03\x04"), dtype="u8", shape=(2, 2))
    for t in (impl.decode_tensors(b, copy=True)["a"], impl.decode_tensors(b)["a"], made):
        a = t.numpy()
        with pytest.raises(ValueError):
            a.flags.writeable = True
        assert t.data.readonly
        with pytest.raises(TypeError):
            t.data[0] = 1
    assert made.numpy().tolist() == [[1, 2], [3, 4]]
