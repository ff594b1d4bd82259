"""Values in the Python ecosystem: numpy's array protocol, DLPack, Mapping,
pickle (out of band with protocol 5), copies; both implementations."""

import collections.abc
import copy
import gc
import pickle

import numpy as np
import pytest

import kiln
from kiln._tensors import dlpack as _dlpack

try:
    import ml_dtypes   # numpy's bfloat16 (the [ml] and [test] extras)
except ImportError:  # pragma: no cover - depends on the environment
    ml_dtypes = None

ARRAYS = {
    "f32": np.arange(12, dtype=np.float32).reshape(3, 4),
    "f16": np.linspace(-2, 2, 5).astype(np.float16),
    "i8": np.array([-128, 0, 127], dtype=np.int8),
    "bool": np.array([True, False, True]),
    "u64": np.array([2 ** 64 - 1, 0], dtype=np.uint64),
}


if ml_dtypes is not None:
    ARRAYS["bf16"] = np.array([1.5, -2.0, 3.25], dtype=ml_dtypes.bfloat16)
# every array's case, the bf16 one skipped (and counted) without ml_dtypes
NAMES = sorted(ARRAYS) if ml_dtypes is not None else sorted(ARRAYS) + [pytest.param(
    "bf16", marks=pytest.mark.skip(reason="a bf16 array needs ml_dtypes, not installed"))]


@pytest.fixture
def directory(impl):
    buf = bytearray(impl.encode_tensors(ARRAYS))
    return buf, impl.decode_tensors(buf)


def test_a_directory_is_a_mapping(directory):
    buf, d = directory
    assert isinstance(d, collections.abc.Mapping)
    assert list(d) == sorted(ARRAYS) == d.keys()
    assert dict(d).keys() == set(ARRAYS)
    assert [k for k, _ in d.items()] == sorted(ARRAYS)
    assert d[0] is d[sorted(ARRAYS)[0]] and d[-1] is d[sorted(ARRAYS)[-1]]
    assert "f32" in d and "nope" not in d and 0 not in d    # the keys are the names
    assert d.get("nope") is None and d.get(99) is None and d.get(1.5) is None
    with pytest.raises(IndexError):
        d[99]
    with pytest.raises(KeyError):
        d["nope"]


def test_an_unnamed_directory_is_keyed_by_position(impl):
    d = impl.decode_tensors(impl.encode_tensors([np.ones(2, np.float32), np.zeros(1, np.int8)]))
    assert list(d) == [0, 1]
    assert d[1].dtype == "i8" and 1 in d and 2 not in d and "0" not in d


@pytest.mark.parametrize("name", NAMES)
def test_numpy_asarray_gives_the_view(directory, name):
    buf, d = directory
    a = np.asarray(d[name])
    assert a.dtype == ARRAYS[name].dtype
    assert np.array_equal(a.view(np.uint8), ARRAYS[name].view(np.uint8))
    assert np.shares_memory(a, np.frombuffer(buf, np.uint8))
    c = np.array(d[name], copy=True)
    assert not np.shares_memory(c, np.frombuffer(buf, np.uint8))
    if name == "f32":
        with pytest.raises(ValueError, match="needs a copy"):
            np.asarray(d[name], dtype=np.float64, copy=False)
        assert np.asarray(d[name], dtype=np.float64).dtype == np.float64


@pytest.mark.parametrize("name", ["f32", "f16", "i8", "bool", "u64"])
def test_numpy_from_dlpack_shares_memory_read_only(impl, name):
    buf = bytearray(impl.encode_tensors(ARRAYS))   # not the fixture's: it holds its own views
    d = impl.decode_tensors(buf)
    a = np.from_dlpack(d[name])
    assert np.array_equal(a, ARRAYS[name]) and a.dtype == ARRAYS[name].dtype
    assert np.shares_memory(a, np.frombuffer(buf, np.uint8))
    assert not a.flags.writeable
    with pytest.raises(BufferError):
        buf.clear()   # the consumer's array holds the caller's buffer
    del a, d
    gc.collect()
    assert _dlpack.live_exports() == 0
    buf.clear()


def test_dlpack_copy_is_writable_and_independent(directory):
    buf, d = directory
    a = np.from_dlpack(d["f32"], copy=True)
    assert a.flags.writeable and not np.shares_memory(a, np.frombuffer(buf, np.uint8))


def test_dlpack_refuses_what_it_cannot_say(directory):
    buf, d = directory
    with pytest.raises(BufferError, match="cannot say read-only"):
        d["f32"].__dlpack__()            # an old consumer, a read-only view
    with pytest.raises(BufferError, match="stream"):
        d["f32"].__dlpack__(stream=1)
    with pytest.raises(BufferError, match="device"):
        d["f32"].__dlpack__(dl_device=(2, 0))
    packed = kiln.Tensor(kiln.pack_nibbles([1, 2, 3]), dtype="u4", shape=(3,))
    with pytest.raises(BufferError, match="no type for kiln dtype u4"):
        packed.__dlpack__(max_version=(1, 0))
    assert d["f32"].__dlpack_device__() == (1, 0)
    # numpy's own capsule (numpy 2.1+), or the compiled module's destructor
    if _dlpack.numpy_exports() or _dlpack._DESTROY[b"dltensor_versioned"] is not None:
        cap = d["f32"].__dlpack__(max_version=(1, 0))   # taken by nobody: released with it
        del cap
        gc.collect()
        assert _dlpack.live_exports() == 0

        def unused_capsule_then_error():
            return d["f32"].__dlpack__(max_version=(1, 0)), 1 / 0
        with pytest.raises(ZeroDivisionError):   # the pending error survives the release
            unused_capsule_then_error()
        gc.collect()
        assert _dlpack.live_exports() == 0


def test_a_0d_tensor_keeps_its_shape_through_dlpack():
    t = kiln.Tensor(np.float32(2.5).tobytes(), dtype="f32", shape=())
    a = np.from_dlpack(kiln.decode_tensors(kiln.encode_tensors([t]))[0])
    assert a.shape == () and float(a) == 2.5


def test_a_writable_tensor_exports_an_unversioned_capsule():
    t = kiln.Tensor(bytearray(8), dtype="f32", shape=(2,))
    assert t.numpy().flags.writeable is False   # tensors are read-only views
    a = np.from_dlpack(t, copy=True)
    assert a.tolist() == [0.0, 0.0]


@pytest.mark.parametrize("name", ["f32", "f16", "bf16", "i8"])
def test_torch_from_dlpack(directory, name):
    torch = pytest.importorskip("torch", reason="torch is not installed: this test runs "
                                "under --require-torch (README, The two commands)")
    if name not in ARRAYS:
        pytest.skip("a bf16 array needs the optional ml_dtypes package")
    buf, d = directory
    t = torch.from_dlpack(d[name])
    want = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16,
            "i8": torch.int8}[name]
    assert t.dtype == want
    assert t.float().reshape(-1).tolist() == \
        np.asarray(ARRAYS[name]).astype(np.float32).ravel().tolist()
    assert t.data_ptr() == np.frombuffer(d[name].data, np.uint8).ctypes.data


def test_pickle_protocol_5_sends_payloads_out_of_band(directory):
    buf, d = directory
    bufs = []
    data = pickle.dumps(d, protocol=5, buffer_callback=bufs.append)
    assert len(data) < 1024   # the payloads are not in the pickle
    assert len(bufs) == len(ARRAYS)
    src = np.frombuffer(buf, np.uint8)
    for b in bufs:
        assert np.shares_memory(np.frombuffer(b.raw(), np.uint8), src)
    back = pickle.loads(data, buffers=bufs)
    assert back == d and back.names == d.names
    assert back["u64"].numpy().tolist() == ARRAYS["u64"].tolist()


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_everything_pickles_and_copies(directory, protocol):
    buf, d = directory
    for obj in (d, d["f16"], kiln.Some(None), kiln.Some(kiln.Some(3)),
                kiln.KilnError("EOF", 7, "short"), kiln.EncodeError("TYPE", 3, "x", ".a[2]")):
        back = pickle.loads(pickle.dumps(obj, protocol=protocol))
        assert type(back) is type(obj)
        if isinstance(obj, kiln.KilnError):
            assert (back.code, back.offset, back.reason) == (obj.code, obj.offset, obj.reason)
            assert str(back) == str(obj)
        else:
            assert back == obj
        assert copy.deepcopy(obj) == obj or isinstance(obj, kiln.KilnError)
        assert copy.copy(obj) == obj or isinstance(obj, kiln.KilnError)
    deep = copy.deepcopy(d)
    assert not np.shares_memory(deep["f32"].numpy(), np.frombuffer(buf, np.uint8))


def test_errors_are_shown_as_kiln_errors():
    assert repr(kiln.KilnError("EOF", 1)).startswith("KilnError(")
    assert kiln.KilnError.__module__ == "kiln" and kiln.EncodeError.__module__ == "kiln"


def test_a_framed_buffer_decoded_bare_says_so(impl):
    buf = impl.encode({"id": 1}, "struct{id:i64,}", frame=True)
    with pytest.raises(kiln.KilnError, match="starts with a Kiln frame: decode it with frame=True"):
        kiln.decode(buf, "struct{id:i64,}")


@pytest.mark.parametrize("text,canonical", [
    ("struct{id:i64}", "struct{id:i64,}"),
    (" struct { id : i64 , tags : list < str > } ", "struct{id:i64,tags:list<str>,}"),
    ("dict<str, opt<f32>>", "dict<str,opt<f32>>"),
    ("struct{ }", "struct{}"),
    ("struct{a:struct{b:i8},}", "struct{a:struct{b:i8,},}"),
])
def test_lenient_type_text_canonical_out(text, canonical):
    t = kiln.parse_type(text)
    assert t.text == canonical
    assert t.schema_hash == kiln.parse_type(canonical).schema_hash


@pytest.mark.parametrize("text,at", [("struct{a:i8 b:i8}", 12), ("list<i32> x", 10),
                                     ("struct{a:i8,,}", 12), ("list<i32", 8)])
def test_broken_type_text_still_fails_where_it_breaks(text, at):
    with pytest.raises(kiln.KilnError) as ei:
        kiln.parse_type(text)
    assert ei.value.offset == at


def test_narrowing_that_changes_a_value_is_refused(impl):
    wide = np.array([0.5, 0.1, 2.0])
    with pytest.raises(kiln.EncodeError, match="pass round_floats=True") as ei:
        impl.encode(wide, "list<f32>")
    assert ei.value.path == "[1]"
    exact = np.array([0.5, 0.25, np.nan, np.inf])
    out = impl.decode(impl.encode(exact, "list<f32>"), "list<f32>")
    assert np.array_equal(out, exact.astype(np.float32), equal_nan=True)
    rounded = impl.decoder("list<f32>").decode(
        kiln.Encoder("list<f32>", round_floats=True, kernels=impl.kernels).encode(wide))
    assert rounded.tolist() == wide.astype(np.float32).tolist()
    # Python floats follow the same rule as arrays and scalar fields (issue 40 item 2)
    with pytest.raises(kiln.EncodeError, match="pass round_floats=True"):
        impl.encode([0.1] * 100, "list<f32>")
    with pytest.raises(kiln.EncodeError, match="pass round_floats=True"):
        impl.encode(0.1, "f32")
    assert impl.decode(kiln.Encoder("list<f32>", round_floats=True, kernels=impl.kernels)
                       .encode([0.1] * 100), "list<f32>")[0] == np.float32(0.1)
    with pytest.raises(kiln.EncodeError, match="does not fit i32"):
        impl.encode(np.array([2 ** 40]), "list<i32>")


@pytest.mark.parametrize("value,text,path,words", [
    ([1, 2, 3], "tensors", "[0]", "expected a numpy array, a kiln.Tensor, or an object with "
     "__dlpack__ or the buffer protocol, got int"),
    ({"a": "x"}, "tensors", "['a']", "got str"),
    ({"a": [1.0]}, "tensors", "['a']", "got list"),
    (np.array(["a"]), "list<f32>", "", "list<f32> takes a numeric array, got an array of str"),
    (np.array([1.5]), "list<i32>", "", "list<i32> takes an integer array, got a float64 array"),
    ("1.0", "f64", "", "expected a float for f64, got str"),
    ([1.0, "x"], "list<f32>", "[1]", "expected a float for f32, got str"),
    ((x for x in [1.0]), "list<f32>", "", "expected a sequence of numbers for list<f32>, "
     "got generator"),
    ({1, 2}, "list<i32>", "", "got set"),
])
def test_errors_name_the_python_types_and_the_path(impl, value, text, path, words):
    with pytest.raises(kiln.EncodeError) as ei:
        impl.encode(value, text)
    assert ei.value.code == "TYPE" and ei.value.path == path
    assert words in str(ei.value)
    assert "<U" not in str(ei.value) and "memoryview" not in str(ei.value)
