"""Tensor files whose names pass one directory's 16-bit offsets (issue 57
item 1, spec/kiln-v2.md section 12.3): the wide name fields.

Each file is read by kiln (both kernels) and by the reference decoder
(spec/reference/kiln_ref.py, ``read_tensor_file``), and the values are
compared; the hostile cases give the code and offset the spec names, in both
kernels and the reference alike.  The big tables have one-element payloads,
so every test here takes seconds."""

import struct

import numpy as np
import pytest

import kiln
from kiln import _wire as W
from kiln._dirhead import block_head
from _util import kiln_ref

D0 = W.HEADER_SIZE   # descriptor 0


def _names60(n):
    """``n`` distinct names of exactly 60 bytes, MoE-shaped."""
    out = []
    for i in range(n):
        stem = "model.layers.%d.mlp.experts.%d.down_proj.weight" % (i // 128, i % 128)
        out.append(stem + "." * (60 - len(stem)))
    assert all(len(s) == 60 for s in out)
    return out


def _save(api, path, tensors):
    kiln.save_tensors(str(path), tensors)
    with open(path, "rb") as f:
        return f.read()


def _ref_tensors(buf):
    """name -> (dtype code, shape, payload) by the reference decoder."""
    return {t["name"]: (t["dtype"], list(t["shape"]), t["payload"])
            for t in kiln_ref.read_tensor_file(buf)}


def _kiln_tensors(path):
    """The same, by kiln.open and by kiln.load_tensors (they must agree)."""
    with kiln.open(str(path)) as f:
        opened = {k: (f[k].code, list(f[k].shape), bytes(f[k].data)) for k in f.keys()}
    for copy in (False, True):   # (the copying load decodes the bytes it read)
        loaded = {k: (t.code, list(t.shape), bytes(t.data))
                  for k, t in kiln.load_tensors(str(path), copy=copy).items()}
        assert opened == loaded
    return opened


def _wide(buf):
    return bool(buf[W.H_FLAGS] & W.FLAG_WIDE)


def test_20000_tensors_of_60_byte_names(api, tmp_path):
    names = _names60(20000)
    tensors = {n: np.array([i], np.float32) for i, n in enumerate(names)}
    buf = _save(api, tmp_path / "moe.kiln", tensors)
    assert _wide(buf)   # 1.2 MB of names: past one narrow heap
    got = _kiln_tensors(tmp_path / "moe.kiln")
    assert got == _ref_tensors(buf)
    assert len(got) == 20000
    for i, n in enumerate(names):
        assert got[n] == (W.DTYPE_CODES["f32"], [1], struct.pack("<f", i))


def test_200000_one_element_tensors(api, tmp_path):
    tensors = {"t%06d" % i: np.array([i], np.int32) for i in range(200000)}
    buf = _save(api, tmp_path / "many.kiln", tensors)
    assert _wide(buf)   # 1.4 MB of names
    with kiln.open(str(tmp_path / "many.kiln")) as f:
        assert len(f) == 200000
        assert f["t199999"].numpy().tolist() == [199999]
        assert f[123456].name == "t123456"
    got = kiln.load_tensors(str(tmp_path / "many.kiln"))
    assert list(got.keys()) == sorted(tensors)
    flat = np.frombuffer(b"".join(bytes(t.data) for t in got.values()), "<i4")
    assert flat.tolist() == list(range(200000))


def test_a_name_of_100000_bytes(api, tmp_path):
    long = "x" * 99990 + ".weight.."
    tensors = {long: np.arange(3, dtype=np.float64), "b": np.ones(2, np.int8)}
    buf = _save(api, tmp_path / "long.kiln", tensors)
    assert _wide(buf)
    got = _kiln_tensors(tmp_path / "long.kiln")
    assert got == _ref_tensors(buf)
    assert got[long] == (W.DTYPE_CODES["f64"], [3], np.arange(3, dtype="<f8").tobytes())
    # the field places of section 12.3: d+4..d+11 zero, u32 fields at d+112
    assert buf[D0 + 4:D0 + 12] == bytes(8)
    # (sorted by name: "b" first)
    assert struct.unpack_from("<IIII", buf, D0 + 112) == (0, 1, W.U32_MAX, 0)
    assert struct.unpack_from("<IIII", buf, D0 + 128 + 112) == (1, 99999, W.U32_MAX, 0)


def test_the_tensor_writer_takes_a_long_name(api, tmp_path):
    long = "w" * 100000
    with kiln.TensorWriter(str(tmp_path / "w.kiln")) as w:
        w.add(long, "u8", (4,))
        w.write(long, np.arange(4, dtype=np.uint8))
    with open(tmp_path / "w.kiln", "rb") as f:
        buf = f.read()
    assert _wide(buf)
    assert _kiln_tensors(tmp_path / "w.kiln") == _ref_tensors(buf) == {
        long: (W.DTYPE_CODES["u8"], [4], bytes([0, 1, 2, 3]))}


def test_files_within_the_old_limit_are_what_they_were(api, tmp_path):
    # the last name starts at offset 65535 and is 1 byte long: every field
    # fits u16, so the file is narrow, byte for byte the directory that
    # kiln.encode(..., "tensors") writes (its writer never takes the wide form)
    tensors = {"a" * 65535: np.ones(1, np.float32), "b": np.zeros(2, np.uint8)}
    buf = _save(api, tmp_path / "edge.kiln", tensors)
    assert buf[W.H_FLAGS] == W.FLAG_NAMED | W.FLAG_LITTLE
    assert buf == kiln.encode(tensors, "tensors")
    assert struct.unpack_from("<HHHH", buf, D0 + 128 + 4) == (65535, 1, W.NO_NAME, 0)
    assert buf[D0 + 112:D0 + 128] == bytes(16)
    # one byte more of name: the Frozen encoder refuses, the file takes the wide form
    tensors = {"a" * 65536: np.ones(1, np.float32), "b": np.zeros(2, np.uint8)}
    with pytest.raises(kiln.EncodeError) as e:
        kiln.encode(tensors, "tensors")
    assert e.value.code == "LIMIT"
    buf = _save(api, tmp_path / "wide.kiln", tensors)
    assert _wide(buf) and _kiln_tensors(tmp_path / "wide.kiln") == _ref_tensors(buf)


# --- hostile files ---------------------------------------------------------------

def _file_bytes(tmp_path, tensors):
    p = tmp_path / "h.kiln"
    kiln.save_tensors(str(p), tensors)
    with open(p, "rb") as f:
        return bytearray(f.read())


def _narrow_as_wide(buf):
    """A narrow file rewritten in the wide form: the flag, the fields moved."""
    out = bytearray(buf)
    out[W.H_FLAGS] |= W.FLAG_WIDE
    count = struct.unpack_from("<I", buf, W.H_COUNT)[0]
    for i in range(count):
        d = D0 + W.DESC_SIZE * i
        no, nl, lo, ll = struct.unpack_from("<HHHH", buf, d + 4)
        struct.pack_into("<HHHH", out, d + 4, 0, 0, 0, 0)
        struct.pack_into("<IIII", out, d + 112, W.U32_MAX if no == W.NO_NAME else no, nl,
                         W.U32_MAX if lo == W.NO_NAME else lo, ll)
    return out


def _write(tmp_path, buf):
    p = tmp_path / "bad.kiln"
    with open(p, "wb") as f:
        f.write(bytes(buf))
    return str(p)


def _outcomes(api, tmp_path, buf):
    """(code, offset) of kiln.open, kiln.load_tensors and the reference."""
    p = _write(tmp_path, buf)
    got = []
    for read in (lambda: kiln.open(str(p)).close(), lambda: kiln.load_tensors(str(p))):
        with pytest.raises(kiln.KilnError) as e:
            read()
        got.append((e.value.code, e.value.offset))
    with pytest.raises(kiln_ref.RefError) as e:
        kiln_ref.read_tensor_file(bytes(buf))
    got.append((e.value.code, e.value.offset))
    return got


def _two(tmp_path):
    return _file_bytes(tmp_path, {"a" * 65536: np.ones(1, np.float32),
                                  "b": np.ones(1, np.float32)})


def test_the_wide_flag_on_names_that_fit_is_refused(api, tmp_path):
    buf = _file_bytes(tmp_path, {"a": np.ones(1, np.float32), "b": np.ones(2, np.int8)})
    wide = _narrow_as_wide(buf)
    assert _outcomes(api, tmp_path, wide) == [("TYPE", W.H_FLAGS)] * 3


def test_nonzero_narrow_fields_under_the_wide_flag_are_refused(api, tmp_path):
    for k in range(4, 12):
        buf = _two(tmp_path)
        buf[D0 + W.DESC_SIZE + k] = 7
        assert _outcomes(api, tmp_path, buf) == [("FRAME", D0 + W.DESC_SIZE + k)] * 3


@pytest.mark.parametrize("off", [65537, 1 << 20, W.U32_MAX - 1])
def test_a_u32_name_offset_past_the_heap_is_refused(api, tmp_path, off):
    buf = _two(tmp_path)
    struct.pack_into("<I", buf, D0 + W.DESC_SIZE + W.D_WNAME_OFF, off)
    assert _outcomes(api, tmp_path, buf) == [("TYPE", D0 + W.DESC_SIZE + W.D_WNAME_OFF)] * 3
    buf = _two(tmp_path)   # a length past the heap
    struct.pack_into("<I", buf, D0 + W.DESC_SIZE + W.D_WNAME_LEN, off)
    assert _outcomes(api, tmp_path, buf) == [("TYPE", D0 + W.DESC_SIZE + W.D_WNAME_OFF)] * 3


def test_no_name_in_a_wide_descriptor_is_0xffffffff(api, tmp_path):
    buf = _two(tmp_path)   # "no layout" written as the narrow 0xFFFF
    struct.pack_into("<I", buf, D0 + W.D_WLAYOUT_OFF, W.NO_NAME)
    assert _outcomes(api, tmp_path, buf) == [("TYPE", D0 + W.D_WLAYOUT_OFF)] * 3
    # an unnamed wide file: an opaque dtype's layout name of 70,000 bytes
    meta = (4096, (32,), None, b"q" * 70000, 32, 0, W.NO_AXIS, 0, W.NO_INDEX, W.NO_INDEX, 32)
    head, _, total = block_head([meta], 0, True)
    buf = bytearray(head) + bytearray(total)
    assert _wide(buf) and struct.unpack_from("<IIII", buf, D0 + 112) == (W.U32_MAX, 0, 0, 70000)
    assert [(t["name"], t["layout"]) for t in kiln_ref.read_tensor_file(bytes(buf))] == \
        [(None, "q" * 70000)]
    with kiln.open(_write(tmp_path, buf)) as f:
        assert f[0].name is None and f[0].layout == "q" * 70000 and bytes(f[0].data) == bytes(32)
    struct.pack_into("<I", buf, D0 + W.D_WNAME_OFF, W.NO_NAME)
    assert _outcomes(api, tmp_path, buf) == [("TYPE", D0 + W.D_WNAME_OFF)] * 3


def test_a_wide_directory_is_refused_outside_a_tensor_file(api, tmp_path):
    buf = bytes(_two(tmp_path))
    for decode in (lambda: kiln.decode(buf, "tensors"),
                   lambda: api.kernels.validate_directory(buf, 0, True, False, W.U32_MAX,
                                                          W.U32_MAX)):
        with pytest.raises(kiln.KilnError) as e:
            decode()
        assert (e.value.code, e.value.offset) == ("FRAME", W.H_FLAGS)
        assert "unknown directory flag bits 0x4" in e.value.reason
    with pytest.raises(kiln_ref.RefError) as e:
        kiln_ref.decode(buf, "tensors", False)
    assert (e.value.code, e.value.offset) == ("FRAME", W.H_FLAGS)


def test_the_wide_fields_without_the_flag_are_reserved_bytes(api, tmp_path):
    buf = _two(tmp_path)
    buf[W.H_FLAGS] &= ~W.FLAG_WIDE
    # descriptor 0: name_off 0, name_len 65536 = 00 00 01 00 at d+116
    assert _outcomes(api, tmp_path, buf) == [("FRAME", D0 + W.D_WNAME_LEN + 2)] * 3


def test_a_repeated_long_name_is_found_at_the_wide_field(api, tmp_path):
    a, b = "a" * 65536, "b" * 65536
    buf = _file_bytes(tmp_path, {a: np.ones(1, np.float32), b: np.ones(1, np.float32)})
    assert _wide(buf)
    heap = D0 + 2 * W.DESC_SIZE
    buf[heap + 65536:heap + 2 * 65536] = a.encode()
    assert _outcomes(api, tmp_path, buf) == [("TYPE", D0 + W.DESC_SIZE + W.D_WNAME_OFF)] * 3


def test_the_name_flag_pass_runs_before_the_heap_walk(api, tmp_path):
    # spec section 7 step 8(b) and 12.5: every descriptor's flag check, then the
    # walk.  Descriptor 0's slice is bad, descriptor 1's name is empty: the
    # empty name is the fault (the kernels once walked in the same loop and
    # named descriptor 0; found by tools/fuzz_wide.py against the reference)
    narrow = bytearray(kiln.encode({"a": np.ones(1, np.float32), "b": np.ones(1, np.float32)},
                                   "tensors"))
    struct.pack_into("<H", narrow, D0 + W.D_NAME_LEN, 0xFFFE)
    struct.pack_into("<H", narrow, D0 + W.DESC_SIZE + W.D_NAME_LEN, 0)
    with pytest.raises(kiln.KilnError) as e:
        kiln.decode(bytes(narrow), "tensors")
    with pytest.raises(kiln_ref.RefError) as r:
        kiln_ref.decode(bytes(narrow), "tensors", False)
    assert (e.value.code, e.value.offset) == (r.value.code, r.value.offset) == \
        ("TYPE", D0 + W.DESC_SIZE + W.D_NAME_OFF)
    assert _outcomes(api, tmp_path, narrow) == [("TYPE", D0 + W.DESC_SIZE + W.D_NAME_OFF)] * 3
    wide = _two(tmp_path)
    struct.pack_into("<I", wide, D0 + W.D_WNAME_LEN, 0xFFFFFFFE)
    struct.pack_into("<I", wide, D0 + W.DESC_SIZE + W.D_WNAME_LEN, 0)
    assert _outcomes(api, tmp_path, wide) == [("TYPE", D0 + W.DESC_SIZE + W.D_WNAME_OFF)] * 3


def test_the_bytes_of_a_wide_file_decode_as_a_file(api, tmp_path):
    # kiln.decode_tensors (kiln.torch.load's reader) and load_tensors of a file
    # object read a tensor file's bytes: wide ones too; inside a value: FRAME
    import io
    tensors = {"l" * 70000: np.arange(4, dtype=np.uint16), "s": np.ones(3, np.float32)}
    buf = bytes(_file_bytes(tmp_path, tensors))
    want = _ref_tensors(buf)
    for copy in (False, True):
        d = kiln.decode_tensors(buf, copy=copy)
        assert {t.name: (t.code, list(t.shape), bytes(t.data)) for t in d.values()} == want
    got = kiln.load_tensors(io.BytesIO(buf))
    assert {k: (t.code, list(t.shape), bytes(t.data)) for k, t in got.items()} == want
    with pytest.raises(kiln.KilnError) as e:   # the checks still run: a bad byte d+4
        bad = bytearray(buf)
        bad[D0 + 4] = 1
        kiln.decode_tensors(bytes(bad))
    assert (e.value.code, e.value.offset) == ("FRAME", D0 + 4)
    with pytest.raises(kiln.KilnError) as e:
        kiln.decode(buf, "struct{t:tensors,}")
    assert (e.value.code, e.value.offset) == ("FRAME", W.H_FLAGS)


def test_a_wide_file_over_http(api, tmp_path):
    # a remote reader runs steps 1 to 6 on the first bytes, then asks for the
    # table: the wide flag is a tensor file's there too (kiln.open of a URL)
    from _servers import RangeServer
    names = _names60(3000)   # 180 KB of names: a table past the first request
    kiln.save_tensors(str(tmp_path / "r.kiln"),
                      {n: np.array([i], np.int64) for i, n in enumerate(names)})
    with open(tmp_path / "r.kiln", "rb") as f:
        buf = f.read()
    assert _wide(buf)
    with RangeServer(tmp_path) as server:
        with kiln.open(server.url + "r.kiln") as f:
            assert len(f) == 3000
            assert {k: bytes(f[k].data) for k in (names[0], names[2999])} == {
                k: v[2] for k, v in _ref_tensors(buf).items() if k in (names[0], names[2999])}


def test_a_name_heap_past_16_mib_reads_back(api, tmp_path):
    # the max_bytes cap on a tensor file's name heap follows the file's size
    # when it is left unset (a set caller's cap is kept)
    from _servers import RangeServer
    long = "n" * (17 << 20)
    path = tmp_path / "h.kiln"
    kiln.save_tensors(str(path), {long: np.ones(2, np.int8), "b": np.zeros(1, np.int8)})
    with kiln.open(str(path)) as f:
        assert bytes(f[long].data) == b"\x01\x01"
    for copy in (False, True):
        assert sorted(kiln.load_tensors(str(path), copy=copy).keys()) == ["b", long]
    with RangeServer(tmp_path) as server:
        with kiln.open(server.url + "h.kiln") as f:
            assert bytes(f["b"].data) == b"\x00"
    for read in (lambda: kiln.open(str(path), max_bytes=kiln.DEFAULT_MAX_BYTES),
                 lambda: kiln.load_tensors(str(path), copy=True,
                                           max_bytes=kiln.DEFAULT_MAX_BYTES)):
        with pytest.raises(kiln.KilnError) as e:
            read()
        assert (e.value.code, e.value.offset) == ("LIMIT", W.H_NAME_BYTES)
