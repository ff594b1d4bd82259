"""The compiled kernels' byte-swapping path, forced on a little-endian host.

``set_force_byteswap(True)`` makes kiln._kernels_c behave as on a big-endian
host: numeric lists decode into explicitly big-endian arrays filled by the
swapping loop, and encode swaps host-order values into little-endian wire
bytes.  The wire bytes and the values must not change."""

import struct

import numpy as np
import pytest

import kiln
from conftest import compiled_kernels

POD = ["i16", "u16", "i32", "u32", "i64", "u64", "int", "uint", "f32", "f64"]


@pytest.fixture
def swapped(pytestconfig):
    K = compiled_kernels(pytestconfig)
    K.set_force_byteswap(True)
    try:
        yield K
    finally:
        K.set_force_byteswap(False)


@pytest.mark.parametrize("name", POD)
def test_swap_path_same_bytes_and_values(swapped, name):
    K = swapped
    t = kiln.parse_type("list<%s>" % name)
    le = {"i16": "<i2", "u16": "<u2", "i32": "<i4", "u32": "<u4", "i64": "<i8", "u64": "<u8",
          "int": "<i8", "uint": "<u8", "f32": "<f4", "f64": "<f8"}[name]
    vals = np.arange(1, 200, 3).astype(le)
    wire = struct.pack("<I", len(vals)) + vals.tobytes()
    out = kiln.Decoder(t, kernels=K).decode(wire)
    assert out.dtype.byteorder == ">"      # the swap loop, not a memcpy, filled it
    np.testing.assert_array_equal(out, vals)
    assert kiln.Encoder(t, kernels=K).encode(out) == wire
    assert kiln.Encoder(t, kernels=K).encode(vals) == wire
    assert kiln.Encoder(t, kernels=K).encode(vals.tolist()) == wire


def test_swap_path_keeps_float_bits(swapped):
    K = swapped
    raw = np.array([0x7FF8000000000001, 0x8000000000000000], "<u8")
    wire = struct.pack("<I", 2) + raw.tobytes()
    t = kiln.parse_type("list<f64>")
    out = kiln.Decoder(t, kernels=K).decode(wire)
    assert kiln.Encoder(t, kernels=K).encode(out) == wire


def test_swap_path_in_records(swapped):
    K = swapped
    t = kiln.parse_type("struct{id:i64,v:list<f32>,w:list<u16>,}")
    v = {"id": 3, "v": np.array([1.0, -2.0], "<f4"), "w": [1, 2, 65535]}
    normal = kiln.Encoder(t, kernels=kiln._kernels_py).encode(v)
    assert kiln.Encoder(t, kernels=K).encode(v) == normal
    out = kiln.Decoder(t, kernels=K).decode(normal)
    assert out["v"].tolist() == [1.0, -2.0] and out["w"].tolist() == [1, 2, 65535]
