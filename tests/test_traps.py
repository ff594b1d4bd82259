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
    assert e.value.code == "LIMIT" and e.value.offset == 16 and "max_count=1000" in e.value.reason
