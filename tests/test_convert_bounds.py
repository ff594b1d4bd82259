"""The converters are bounded by their input and refuse what their format's own
library refuses (issue 26 point 3, issue 27 point 12).

Oracles: the safetensors package itself (safe_open) for what a safetensors
file may be, numpy's np.load for npz contents, hand-written expected values
for GGUF, and each conversion's peak RSS measured in a child process."""

import io
import json
import os
import resource
import struct
import subprocess
import sys
import zipfile

import numpy as np
import pytest

import kiln
from kiln.convert import ConvertError, convert

import hostile_convert as H
from _util import ROOT


def _refused(tmp_path, src, dst_name="o.kiln"):
    dst = tmp_path / dst_name
    with pytest.raises(kiln.KilnError) as e:
        convert(str(src), str(dst))
    assert isinstance(e.value, ConvertError) and e.value.code in kiln._errors.CODES
    assert str(src) in str(e.value)
    assert not dst.exists()
    return e.value


# --- safetensors: what the safetensors library refuses, kiln refuses --------------

@pytest.mark.parametrize("what", sorted(H.SAFETENSORS_REFUSED))
def test_safetensors_refuses_what_the_library_refuses(tmp_path, what):
    safetensors = pytest.importorskip("safetensors")
    src = tmp_path / "h.safetensors"
    src.write_bytes(H.SAFETENSORS_REFUSED[what])
    with pytest.raises(Exception) as lib:
        with safetensors.safe_open(str(src), framework="np") as f:
            list(f.keys())
    assert not isinstance(lib.value, AssertionError)
    _refused(tmp_path, src)


def test_safetensors_never_drops_a_tensor(tmp_path):
    # two entries named "a" on the same two bytes: a JSON reader keeping the
    # last would see one valid tensor; kiln refuses the repeated key
    src = tmp_path / "d.safetensors"
    src.write_bytes(H.st(b'{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},'
                         b'"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}', b"ab",
                         raw=True))
    e = _refused(tmp_path, src)
    assert e.code == "FRAME" and "repeats" in e.reason


@pytest.mark.parametrize("raw,code,offset", [
    (H.SAFETENSORS_REFUSED["bytes after the data"], "TRAILING", None),
    (H.SAFETENSORS_REFUSED["header too large"], "LIMIT", 0),
    (H.SAFETENSORS_REFUSED["not UTF-8"], "UTF8", 8 + 3),
    (H.SAFETENSORS_REFUSED["UTF-8 BOM"], "FRAME", 8),
])
def test_safetensors_errors_say_where(tmp_path, raw, code, offset):
    src = tmp_path / "h.safetensors"
    src.write_bytes(raw)
    e = _refused(tmp_path, src)
    assert e.code == code
    if offset is None:   # the first byte after the last tensor's data
        offset = len(raw) - 1
    assert e.offset == offset


def test_safetensors_accepts_what_the_library_accepts(tmp_path):
    safetensors = pytest.importorskip("safetensors")
    # leading and trailing JSON whitespace, a null __metadata__, unknown fields
    # and zero-byte tensors at any point: the library reads them, so does kiln
    body = (b' {"__metadata__":null,"z":{"dtype":"U8","shape":[0],"data_offsets":[2,2]},'
            b'"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2],"x":[1]}}  ')
    src = tmp_path / "ok.safetensors"
    src.write_bytes(H.st(body, b"\x07\x09", raw=True))
    with safetensors.safe_open(str(src), framework="np") as f:
        want = {k: f.get_tensor(k) for k in f.keys()}
    assert convert(str(src), str(tmp_path / "ok.kiln")) == 2
    got = kiln.load_tensors(tmp_path / "ok.kiln")
    assert sorted(got.keys()) == sorted(want)
    for k, a in want.items():
        assert bytes(got[k].data) == a.tobytes() and got[k].shape == a.shape


def test_safetensors_header_values_are_capped(tmp_path):
    from kiln.convert.safetensors import MAX_VALUES
    src = H.safetensors_values(tmp_path / "v.safetensors", n=MAX_VALUES)
    e = _refused(tmp_path, src)
    assert e.code == "LIMIT" and e.offset == 8


# --- GGUF ------------------------------------------------------------------------

def test_gguf_overlapping_ranges_are_refused(tmp_path):
    e = _refused(tmp_path, H.gguf_overlapping(tmp_path / "o.gguf", n=4, size=256))
    assert e.code == "TYPE" and "overlap" in e.reason
    # the second tensor's info starts after the 24-byte header and the first info
    assert e.offset == 24 + (8 + 2) + 4 + 8 + 4 + 8


def test_gguf_ranges_stay_inside_the_data_section(tmp_path):
    e = _refused(tmp_path, H.gguf_outside(tmp_path / "x.gguf"))
    assert e.code == "TYPE" and e.offset == 24 and "data section" in e.reason


def test_gguf_nested_overlap_is_found(tmp_path):
    # a long range, then two short ones inside it that do not touch each other
    infos = [("a", (64,), 0, 0), ("b", (8,), 0, 32), ("c", (8,), 0, 128)]
    p = tmp_path / "n.gguf"
    p.write_bytes(H.gguf(infos=infos, data=bytes(256)))
    assert "overlap" in _refused(tmp_path, p).reason


def test_gguf_numeric_arrays_are_read_from_their_bytes(tmp_path):
    kv = (H._gguf_string("flags") + struct.pack("<IIQ", 9, 7, 4) + bytes([1, 0, 0, 1])
          + H._gguf_string("f") + struct.pack("<IIQ", 9, 6, 2) + struct.pack("<2f", 0.5, -2)
          + H._gguf_string("q") + struct.pack("<IIQ", 9, 11, 2) + struct.pack("<2q", -7, 1 << 40))
    p = tmp_path / "m.gguf"
    p.write_bytes(H.gguf(kv=kv, n_kv=3, infos=[("w", (2,), 0, 0)], data=struct.pack("<2f", 1, 2)))
    assert convert(str(p), str(tmp_path / "m.kiln")) == 1
    meta = kiln.load_metadata(tmp_path / "m.kiln")["gguf"]
    assert meta == {"flags": [1, 0, 0, 1], "f": [0.5, -2.0], "q": [-7, 1 << 40]}


@pytest.mark.parametrize("kv,at", [
    (H._gguf_string("b") + struct.pack("<IIQ", 9, 7, 3) + bytes([0, 1, 5]), 24 + 9 + 16 + 2),
    (H._gguf_string("b") + struct.pack("<I", 7) + bytes([2]), 24 + 9 + 4),
])
def test_gguf_bools_are_0_or_1(tmp_path, kv, at):
    p = tmp_path / "b.gguf"
    p.write_bytes(H.gguf(kv=kv, n_kv=1))
    e = _refused(tmp_path, p)
    assert e.code == "TYPE" and e.offset == at


# --- npz -------------------------------------------------------------------------

def _npz(path, members, method=zipfile.ZIP_STORED):
    with zipfile.ZipFile(path, "w", method) as zf:
        for name, raw in members:
            zf.writestr(name, raw)
    return path


def _npy(header, payload=b"", version=(1, 0)):
    text = (header if isinstance(header, str) else repr(header)).encode("latin1")
    text += b" " * (-(len(text) + 11) % 64) + b"\n"
    if version == (1, 0):
        return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text + payload
    return b"\x93NUMPY\x02\x00" + struct.pack("<I", len(text)) + text + payload


F8 = {"descr": "<f8", "fortran_order": False, "shape": (2,)}


@pytest.mark.parametrize("members,code,words", [
    ([("a.npy", b"\x93NUMPY\x02\x00" + struct.pack("<I", 0xFFFFFFFF))], "LIMIT", "header of"),
    ([("a.npy", _npy("{'descr': '<f8', 'shape': (2,)", bytes(16)))], "FRAME", "literal"),
    ([("a.npy", _npy({"descr": "<f8", "fortran_order": False, "shape": (2,), "x": 1},
                     bytes(16)))], "TYPE", "dict of"),
    ([("a.npy", _npy(dict(F8, shape=(True, 2)), bytes(16)))], "TYPE", "shape"),
    ([("a.npy", _npy(dict(F8, shape=(1,) * 9), bytes(8)))], "TYPE", "shape"),
    ([("a.npy", _npy(dict(F8, descr=[("x", "<f8")]), bytes(16)))], "TYPE", "descr"),
    ([("a.npy", _npy(dict(F8, descr="|O"), bytes(16)))], "TYPE", "no twin"),
    ([("a.npy", _npy(F8, bytes(8)))], "EOF", "holds 8"),
    ([("a.npy", _npy(F8, bytes(24)))], "TRAILING", "holds 24"),
    ([("a.npy", _npy(F8, bytes(16))), ("a.npy", _npy(F8, bytes(16)))], "TYPE", "repeats"),
    ([("a.txt", b"hello")], "TYPE", "not a .npy"),
    ([("a.npy", _npy(dict(F8, descr="|b1", shape=(3,)), bytes([1, 5, 0])))], "TYPE",
     "bool byte"),
    ([("a.npy", b"\x93NUMPY\x04\x00" + bytes(8))], "FRAME", "version"),
])
def test_hostile_npz_members(tmp_path, members, code, words):
    e = _refused(tmp_path, _npz(tmp_path / "h.npz", members))
    assert e.code == code and words in e.reason, e


def test_npz_other_compression_methods_are_refused(tmp_path):
    p = _npz(tmp_path / "b.npz", [("a.npy", _npy(F8, bytes(16)))], zipfile.ZIP_BZIP2)
    e = _refused(tmp_path, p)
    assert e.code == "TYPE" and "method 12" in e.reason


def test_npz_size_claims_past_deflate_are_refused(tmp_path):
    p = _npz(tmp_path / "c.npz", [("a.npy", _npy(dict(F8, shape=(1 << 20,)), bytes(8 << 20)))],
             zipfile.ZIP_DEFLATED)
    raw = bytearray(p.read_bytes())
    # claim 2**40 bytes in the central directory entry (zip64 is not used for small sizes)
    cd = raw.rindex(b"PK\x01\x02")
    raw[cd + 24:cd + 28] = struct.pack("<I", 0xFFFFFFF0)
    p.write_bytes(bytes(raw))
    e = _refused(tmp_path, p)
    assert e.code == "LIMIT" and "compressed bytes" in e.reason


@pytest.mark.parametrize("chunk", [8, 24, 1 << 20])
@pytest.mark.parametrize("array", [
    np.arange(60, dtype=">i4").reshape(5, 3, 4),                 # big-endian, rows of 48 bytes
    np.asfortranarray(np.arange(12, dtype=np.float64).reshape(3, 4)),
    np.array([[True, False, True]] * 7),
    np.zeros((0, 3), np.int16), np.float32(2.5), np.arange(7, dtype=np.uint8),
])
def test_npz_streams_every_layout(tmp_path, monkeypatch, chunk, array):
    import kiln.convert.npz as N
    monkeypatch.setattr(N, "CHUNK", chunk)   # rows split across chunks, rows above a chunk
    np.savez_compressed(tmp_path / "a.npz", x=array)
    assert convert(str(tmp_path / "a.npz"), str(tmp_path / "a.kiln")) == 1
    with np.load(tmp_path / "a.npz") as z:
        want = z["x"]
    t = kiln.load_tensors(tmp_path / "a.kiln")["x"]
    assert t.shape == want.shape
    assert bytes(t.data) == np.ascontiguousarray(want.astype(want.dtype.newbyteorder("<"))
                                                 ).tobytes()


# --- peak memory: a published constant plus one chunk, whatever the ratio ---------

CHILD = r"""
import resource, sys
import kiln, kiln.convert.npz, kiln.convert.gguf, kiln.convert.safetensors
from kiln.convert import convert
assert kiln.IMPLEMENTATION == sys.argv[3], kiln.IMPLEMENTATION
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    convert(sys.argv[1], sys.argv[2])
    out = "ok"
except kiln.KilnError as e:
    out = e.code
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024, out)
"""
# docs/security.md, "Converters": what a conversion may hold above its start
from kiln.convert import PEAK  # noqa: E402


def _peak(impl, src, dst):
    env = dict(os.environ, PYTHONPATH=ROOT, KILN_PUREPYTHON="1" if impl.name == "python" else "0")
    r = subprocess.run([sys.executable, "-c", CHILD, str(src), str(dst), impl.name], env=env, cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    grew, out = r.stdout.split()
    return int(grew), out


@pytest.mark.parametrize("make,nbytes", [(H.npz_zeros, 192 << 20), (H.npz_zeros_2d, 96 << 20)])
def test_npz_peak_memory_does_not_follow_the_ratio(tmp_path, impl, make, nbytes):
    src = make(tmp_path / "z.npz", nbytes=nbytes)
    assert os.path.getsize(src) < nbytes // 500          # a ratio above 500
    grew, out = _peak(impl, src, tmp_path / "z.kiln")
    assert out == "ok" and grew < PEAK < nbytes, grew
    t = kiln.open(tmp_path / "z.kiln")
    x = t["z"]
    assert x.nbytes == nbytes and x.shape[0] in (2, nbytes)
    assert not np.frombuffer(x.data, np.uint8)[::4093].any()
    t.close()


def test_gguf_bool_array_peak_memory(tmp_path, impl):
    n = 1 << 20
    grew, out = _peak(impl, H.gguf_bool_array(tmp_path / "b.gguf", n=n), tmp_path / "b.kiln")
    # 8 bytes an item in the list and in the stored i64 array, plus the constant
    assert out == "ok" and grew < PEAK + 24 * n, grew


def test_gguf_overlap_output_is_bounded(tmp_path, impl):
    src = H.gguf_overlapping(tmp_path / "o.gguf", n=2048)
    grew, out = _peak(impl, src, tmp_path / "o.kiln")
    assert out == "TYPE" and not (tmp_path / "o.kiln").exists()


def test_a_bool_payload_kiln_cannot_hold_is_refused_at_its_byte(tmp_path):
    # the safetensors library reads any byte as a bool; a Kiln bool is 0 or 1
    raw = H.st({"f": {"dtype": "BOOL", "shape": [4], "data_offsets": [0, 4]}}, b"\1\0\7\1")
    src = tmp_path / "b.safetensors"
    src.write_bytes(raw)
    e = _refused(tmp_path, src)
    assert (e.code, e.offset) == ("TYPE", len(raw) - 2)


def test_convert_errors_pickle_with_their_fields():
    import pickle
    e = ConvertError("m.gguf", 24, "tensor 'a' repeats", "TYPE")
    back = pickle.loads(pickle.dumps(e))
    assert (back.path, back.offset, back.code, back.reason) == ("m.gguf", 24, "TYPE",
                                                               "tensor 'a' repeats")
    assert str(back) == "m.gguf: TYPE at byte 24: tensor 'a' repeats"
    assert isinstance(back, kiln.KilnError) and isinstance(back, ValueError)
