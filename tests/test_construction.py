"""Tensors and directories built without the wire (kiln.Tensor(...), unpickling,
kiln's Dask deserializer) are checked when built, against the wire's rules
(issue 27 point 13).

Oracle: the reference decoder (spec/reference/kiln_ref.py) refuses the same
tensors written as a directory block by the reference builder
(gen_v2_cases.directory), with the same error code."""

import os
import pickle
import sys

import numpy as np
import pytest

import kiln

from _util import ROOT, kiln_ref

sys.path.insert(0, os.path.join(ROOT, "spec", "reference"))
import gen_v2_cases as G  # noqa: E402

BOOL, U4, E2M1, E8M0, F32 = 7, 17, 18, 19, 2


def _ref_refuses(tensors, code):
    buf = G.directory(tensors)
    with pytest.raises(kiln_ref.RefError) as e:
        kiln_ref.read_directory(buf, 0)
    assert e.value.code == code
    return e.value


# --- one tensor --------------------------------------------------------------------

@pytest.mark.parametrize("payload,dtype,shape,at", [
    (b"\x01\x00\x05", "bool", (3,), 2),
    (b"\x02", "bool", (1,), 0),
    (b"\x21\x13", "u4", (3,), 1),            # odd 4-bit tail, high nibble set
    (b"\x21\xf3", "i4", (3,), 1),
    (b"\x21\x13", "e2m1", (3,), 1),
])
def test_bad_payload_bytes_are_refused_at_construction(payload, dtype, shape, at):
    code = kiln._wire.DTYPE_CODES[dtype]
    _ref_refuses([G.T(code, list(shape), payload)], "TYPE")
    with pytest.raises(kiln.KilnError) as e:
        kiln.Tensor(payload, dtype=dtype, shape=shape)
    assert e.value.code == "TYPE" and e.value.offset == at


def test_a_big_bool_payload_is_scanned_to_its_last_byte():
    raw = np.ones(3 << 20, np.uint8)
    raw[-1] = 9
    with pytest.raises(kiln.KilnError) as e:
        kiln.Tensor(raw, dtype="bool", shape=raw.shape)
    assert e.value.offset == len(raw) - 1
    ok = kiln.Tensor(raw[:-1], dtype="bool", shape=(len(raw) - 1,))
    assert ok.nbytes == len(raw) - 1


@pytest.mark.parametrize("fields,ref", [
    (dict(dtype=4096, layout=None, block_size=2), dict(block_size=2)),          # no layout
    (dict(dtype=4096, layout="Q", block_size=0), dict(layout=b"Q")),            # no block size
    (dict(dtype=4096, layout="Q", block_size=3), dict(layout=b"Q", block_size=3)),  # 4 % 3
    (dict(dtype="u8", block_size=2), dict(block_size=2)),
    (dict(dtype="u8", layout="Q"), dict(layout=b"Q")),
    (dict(dtype="u8", quant_scheme=3), dict(scheme=3)),
    (dict(dtype="u8", group_size=2), dict(group=2)),                             # no scheme
])
def test_bad_descriptor_fields_are_refused_at_construction(fields, ref):
    code = kiln._wire.DTYPE_CODES.get(fields["dtype"], fields["dtype"])
    _ref_refuses([G.T(code, [4], bytes(4), **ref)], "TYPE")
    with pytest.raises(kiln.KilnError) as e:
        kiln.Tensor(bytes(4), shape=(4,), **fields)
    assert e.value.code == "TYPE"


# --- directories -------------------------------------------------------------------

def _pair(name_b="a"):
    a = kiln.Tensor(b"\x01\x02", dtype="u8", shape=(2,), name="a")
    b = kiln.Tensor(b"\x03", dtype="u8", shape=(1,), name=name_b)
    return a, b


def test_repeated_names_are_refused():
    _ref_refuses([G.T(9, [2], b"\1\2", name=b"a"), G.T(9, [1], b"\3", name=b"a")], "TYPE")
    with pytest.raises(kiln.KilnError) as e:
        kiln.TensorDirectory(_pair("a"))
    assert e.value.code == "TYPE" and "repeats" in e.value.reason
    d = kiln.TensorDirectory(_pair("b"))
    assert d.keys() == ["a", "b"] and sorted(d.to_dict()) == ["a", "b"]


def test_names_all_or_none():
    a, _ = _pair()
    with pytest.raises(kiln.KilnError):
        kiln.TensorDirectory([a, kiln.Tensor(b"\x03", dtype="u8", shape=(1,))])
    with pytest.raises(kiln.KilnError):
        kiln.TensorDirectory([a, kiln.Tensor(b"\x03", dtype="u8", shape=(1,), name="")])
    with pytest.raises(TypeError):
        kiln.TensorDirectory([a, np.zeros(2)])


def _quantized(scale, outer=None, group=32, scheme=1):
    return kiln.Tensor(bytes(16), dtype="e2m1", shape=(32,), name="w", quant_scheme=scheme,
                       quant_axis=0, group_size=group, scale_index=scale, outer_index=outer)


SCALE = kiln.Tensor(b"\x7f", dtype="e8m0", shape=(1,), name="w.scale")


@pytest.mark.parametrize("ts,ref", [
    (lambda: [_quantized(5), SCALE], [G.T(E2M1, [32], bytes(16), scheme=1, axis=0, group=32,
                                          scale=5), G.T(E8M0, [1], b"\x7f")]),
    (lambda: [_quantized(0), SCALE], [G.T(E2M1, [32], bytes(16), scheme=1, axis=0, group=32,
                                          scale=0), G.T(E8M0, [1], b"\x7f")]),
    (lambda: [_quantized(1, group=16), SCALE],                   # 2 groups, 1 scale
     [G.T(E2M1, [32], bytes(16), scheme=1, axis=0, group=16, scale=1), G.T(E8M0, [1], b"\x7f")]),
    (lambda: [_quantized(1, outer=1, scheme=2), SCALE],
     [G.T(E2M1, [32], bytes(16), scheme=2, axis=0, group=32, scale=1, outer=1),
      G.T(E8M0, [1], b"\x7f")]),
])
def test_dangling_or_wrong_links_are_refused(ts, ref):
    _ref_refuses(ref, "TYPE")
    with pytest.raises(kiln.KilnError) as e:
        kiln.TensorDirectory(ts())
    assert e.value.code == "TYPE"


def test_unknown_link_name_is_refused():
    with pytest.raises(kiln.KilnError) as e:
        kiln.TensorDirectory([_quantized("nope"), SCALE])
    assert "unknown tensor" in e.value.reason


def test_good_links_by_name_and_position():
    for ref in ("w.scale", 1):
        d = kiln.TensorDirectory([_quantized(ref), SCALE])
        back = kiln.decode_tensors(kiln.encode_tensors(d))
        assert back["w"].scale_index == 1


# --- where hostile objects arrive: pickles and Dask frames -------------------------

MARK = bytes([1, 0, 1, 1, 0, 0, 1, 0, 1, 1, 1, 0, 0, 1, 0, 1])


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_a_hostile_pickle_is_refused_when_loaded(protocol):
    t = kiln.Tensor(MARK, dtype="bool", shape=(16,), name="flags")
    raw = pickle.dumps(t, protocol=protocol)
    assert raw.count(MARK) == 1
    bad = raw.replace(MARK, MARK[:5] + b"\x05" + MARK[6:])
    with pytest.raises(kiln.KilnError) as e:
        pickle.loads(bad)
    assert e.value.code == "TYPE" and e.value.offset == 5


def test_a_hostile_out_of_band_buffer_is_refused():
    t = kiln.Tensor(MARK, dtype="bool", shape=(16,))
    bufs = []
    raw = pickle.dumps(t, protocol=5, buffer_callback=bufs.append)
    assert len(bufs) == 1
    with pytest.raises(kiln.KilnError):
        pickle.loads(raw, buffers=[bytes(15) + b"\x07"])


def test_a_pickled_directory_with_repeated_names_is_refused():
    a = kiln.Tensor(b"\x01", dtype="u8", shape=(1,), name="name-one")
    b = kiln.Tensor(b"\x02", dtype="u8", shape=(1,), name="name-two")
    raw = pickle.dumps(kiln.TensorDirectory([a, b]), protocol=4)
    with pytest.raises(kiln.KilnError) as e:
        pickle.loads(raw.replace(b"name-two", b"name-one"))
    assert "repeats" in e.value.reason


def test_a_hostile_dask_frame_is_refused():
    pytest.importorskip("distributed")
    import kiln.dask  # noqa: F401  (registers the serializers)
    from distributed.protocol import deserialize, serialize
    d = kiln.decode_tensors(kiln.encode_tensors({"f": np.array([True, False]),
                                                 "g": np.ones(2, np.float32)}))
    header, frames = serialize(d, serializers=["dask"])
    frames = [bytes(f) for f in frames]
    rows = header["sub-header"]["kiln-tensors"]
    i = [h[2] for h in rows].index("f")
    bad = list(frames)
    bad[i] = b"\x01\x03"
    with pytest.raises(kiln.KilnError):
        deserialize(header, bad)
    twice = [list(h) for h in rows]
    twice[1 - i][2] = "f"
    dup = dict(header, **{"sub-header": {"kiln-tensors": twice}})
    with pytest.raises(kiln.KilnError):
        deserialize(dup, frames)
    assert deserialize(header, frames) == d
