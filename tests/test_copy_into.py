"""Owned copies into memory the caller owns (issue 32, point 7):
Tensor.copy_into, TensorDirectory.copy_into and load_tensors(path, into=...)
check every target before writing any, then write each payload once; no
allocation of the payload's size.  Both kernels.  Oracle: the arrays saved."""

import tracemalloc

import numpy as np
import pytest

import kiln


def _src():
    return {"w": np.arange(12, dtype=np.float32).reshape(3, 4),
            "b": np.array([True, False]), "i": np.arange(5, dtype=np.int16),
            "s": np.array(7, np.int64)}


@pytest.fixture
def model(api, tmp_path):
    p = tmp_path / "m.kiln"
    kiln.save_tensors(p, _src())
    return p


def _targets():
    return {"w": np.full((3, 4), -1, np.float32), "b": np.zeros(2, bool),
            "i": memoryview(bytearray(10)).cast("h"), "s": np.zeros((), np.int64)}


def _check_filled(t):
    src = _src()
    assert np.array_equal(t["w"], src["w"]) and np.array_equal(t["b"], src["b"])
    assert list(t["i"]) == [0, 1, 2, 3, 4] and int(t["s"]) == 7


def test_load_tensors_into_fills_numpy_and_buffer_targets(model):
    t = _targets()
    d = kiln.load_tensors(model, into=t)
    _check_filled(t)
    assert d.keys() == ["b", "i", "s", "w"]


def test_directory_and_tensor_copy_into(model):
    d = kiln.load_tensors(model)
    t = _targets()
    d.copy_into(t)
    _check_filled(t)
    out = np.zeros(5, np.int16)
    d["i"].copy_into(out)
    assert out.tolist() == [0, 1, 2, 3, 4]
    strided = np.zeros((3, 8), np.float32)[:, ::2]     # a view into a larger array
    d["w"].copy_into(strided)
    assert np.array_equal(strided, _src()["w"])
    part = {"i": np.zeros(5, np.int16)}
    d.copy_into(part, strict=False)
    assert part["i"].tolist() == [0, 1, 2, 3, 4]


def test_dlpack_target(model):
    class Exporter:   # an object that offers DLPack only (no buffer protocol)
        def __init__(self, a):
            self.a = a

        def __dlpack__(self, **kw):
            return self.a.__dlpack__(**kw)

        def __dlpack_device__(self):
            return self.a.__dlpack_device__()

    back = np.zeros(5, np.int16)
    kiln.load_tensors(model)["i"].copy_into(Exporter(back))
    assert back.tolist() == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("bad, exc, words", [
    ("readonly", ValueError, "read-only"), ("bytes", ValueError, "read-only"),
    ("dtype", TypeError, "has dtype uint16; tensor 'i' (i16) needs int16"),
    ("shape", ValueError, "has shape (6,); tensor 'i' needs (5,)"),
    ("unknown", KeyError, "no tensor named 'nope'"), ("missing", KeyError, "no target for"),
    ("overlap", ValueError, "overlaps"), ("kind", TypeError, "copy_into takes"),
])
def test_a_bad_target_writes_nothing(model, bad, exc, words):
    t = _targets()
    if bad == "readonly":
        ro = np.zeros(5, np.int16)
        ro.flags.writeable = False
        t["i"] = ro
    elif bad == "bytes":
        t["i"] = bytes(10)                                # a read-only buffer
    elif bad == "dtype":
        t["i"] = np.zeros(5, np.uint16)                   # same size, another dtype
    elif bad == "shape":
        t["i"] = np.zeros(6, np.int16)
    elif bad == "unknown":
        t["nope"] = np.zeros(1)
    elif bad == "missing":
        del t["s"]
    elif bad == "overlap":
        big = np.zeros(8, np.int16)
        t["i"] = big[:5]
        t["s"] = big[4:8].view(np.int64).reshape(())     # shares big[4] with "i"
    else:
        t["i"] = [0, 0, 0, 0, 0]
    with pytest.raises(exc) as e:   # "w" and "b" come before the bad "i" in the targets
        kiln.load_tensors(model, into=t)
    assert words in str(e.value)
    assert (t["w"] == -1).all() and not t["b"].any() and int(t.get("s", 0)) == 0


def test_no_allocation_of_the_payload_size(api, tmp_path):
    n = 64 << 20                                           # 64 MiB of f32
    p = tmp_path / "big.kiln"
    kiln.save_tensors(p, {"x": np.ones(n // 4, np.float32)})
    target = np.zeros(n // 4, np.float32)
    tracemalloc.start()
    try:
        kiln.load_tensors(p, into={"x": target})
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert target[0] == 1.0 and target[-1] == 1.0
    assert peak < n // 16, peak                            # far below the payload


def test_packed_and_opaque_tensors_take_raw_bytes(api):
    d = kiln.decode_tensors(kiln.encode_tensors([kiln.Tensor(b"\x21\x43\x05", dtype="u4",
                                                              shape=(5,), name="q")]))
    raw = np.zeros(3, np.uint8)
    d["q"].copy_into(raw)
    assert raw.tolist() == [0x21, 0x43, 0x05]
    with pytest.raises(ValueError):
        d["q"].copy_into(np.zeros(5, np.uint8))           # the element count: not the bytes
