"""``kiln.save`` puts every payload of a value's first directory with payload
bytes on a 64-byte boundary of the file (issue 52; spec/kiln-v2.md section
13): a pad head (``KLNP``, version 1, P, reserved 0) and P zero bytes before
the framed value when it needs one, nothing otherwise.

The oracle is independent of the writer: the framed value is the public
``kiln.encode(..., frame=True)``; where a payload sits is found by searching
the file for its bytes (each tensor's bytes are unique random data); the
head is packed by hand with ``struct``; the pad is what puts the found
payload on a multiple of 64, counted by hand.
"""

import io
import json
import os
import struct

import numpy as np
import pytest

import kiln
from test_cli import run

T = "struct{id:i64,label:str,x:tensors,}"
RNG = np.random.default_rng(52)


def rand(n, dtype=np.float32):
    """``n`` elements of random bytes (distinct from every other call's)."""
    return np.frombuffer(RNG.bytes(n * np.dtype(dtype).itemsize), dtype).copy()


def at(data, arr):
    """The file offset of ``arr``'s bytes in ``data``: found once, and only once."""
    b = np.ascontiguousarray(arr).tobytes()
    i = data.find(b)
    assert i >= 0 and data.find(b, i + 1) == -1, "payload bytes not found exactly once"
    return i


def padded(framed, pad):
    """A pad head and its pad before ``framed``, by hand."""
    return struct.pack("<4sBBH", b"KLNP", 1, pad, 0) + bytes(pad) + framed


def expected_file(framed, first):
    """The file kiln.save must write for the framed value ``framed`` whose first
    payload of the first directory with payload bytes is ``framed[first:]``."""
    if first % 64 == 0:
        return framed
    return padded(framed, -(8 + first) % 64)


def address(a):
    return a.__array_interface__["data"][0]


def issue_value():
    """The issue's record: ten random floats after an id and a 3-byte label."""
    w = rand(10)
    return w, {"id": 1, "label": "abc", "x": {"w": w}}


def test_the_issue_example_by_hand(api, tmp_path):
    w, v = issue_value()
    p = tmp_path / "rec.kiln"
    kiln.save(p, v, T, store_type=False)
    data = p.read_bytes()
    # without a head, the payload is at 16 (frame) + 8 (id) + 4 + 3 (label)
    # + 256 (directory table: 64 + 128 + the name "w", rounded up) = 287, 31 mod 64
    framed = kiln.encode(v, T, frame=True)
    assert at(framed, w) == 287
    assert data == padded(framed, 25)        # 8 + 25 + 287 = 320 = 5 * 64
    with pytest.raises(kiln.KilnError) as e:  # what kiln.load did before the head: refused
        kiln.decode(data, T, frame=True)
    assert (e.value.code, e.value.offset) == ("FRAME", 0)
    assert at(data, w) == 320
    got = kiln.load(p, T)
    a = got["x"]["w"].numpy()
    assert address(a) % 64 == 0 and a.tobytes() == w.tobytes()
    assert (got["id"], got["label"]) == (1, "abc")
    assert not a.flags.writeable             # a view of the mapping, as before
    # a label of 36 bytes puts the payload at 16 + 8 + 4 + 36 + 256 = 320 with
    # no head: the file is the framed value alone, as earlier versions wrote it
    v = {"id": 1, "label": "a" * 36, "x": {"w": w}}
    kiln.save(p, v, T, store_type=False)
    assert p.read_bytes() == kiln.encode(v, T, frame=True)
    assert at(p.read_bytes(), w) == 320
    assert address(kiln.load(p, T)["x"]["w"].numpy()) % 64 == 0


# (type, value builder taking the prefix length k, the arrays whose payloads
# must be aligned whatever k is)
def _nested(k):
    ws = [rand(3), rand(17, np.float64), rand(64, np.int8)]
    v = {"id": k, "s": "x" * k, "inner": {"b": bytes(range(k)),
                                           "t": {"a": ws[0], "b": ws[1], "c": ws[2]}}}
    return "struct{id:i64,s:str,inner:struct{b:list<u8>,t:tensors,},}", v, ws


def _optional(k):
    w = rand(5, np.int16)
    return "struct{s:str,o:opt<tensors>,}", {"s": "y" * k, "o": {"q": w}}, [w]


def _list_of_directories(k):
    # the first directory holds no payload bytes: the second is the one aligned;
    # the third follows a 64-byte payload region with no names heap change, so
    # the bytes between the second's and third's payloads are a multiple of 64
    a, b = rand(16), rand(32, np.uint16)
    v = {"pre": [k] * k, "d": [{"e": np.zeros(0, np.float32)}, {"a": a}, {"b": b}]}
    return "struct{pre:list<i32>,d:list<tensors>,}", v, [a, b]


def _dict_of_directories(k):
    w = rand(9, np.uint8)
    return "struct{n:u8,m:dict<str,tensors>,}", {"n": k % 256, "m": {"k" * (k + 1): {"w": w}}}, [w]


def _bare_directory(k):
    ws = [rand(k + 1), rand(2 * k + 3, np.int64)]
    return "tensors", {"n" * (k + 1): ws[0], "z": ws[1]}, ws


SHAPES = [_nested, _optional, _list_of_directories, _dict_of_directories, _bare_directory]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda f: f.__name__.strip("_"))
def test_every_payload_of_the_first_directory_is_aligned(api, tmp_path, shape):
    p = tmp_path / "v.kiln"
    heads = set()
    for k in range(0, 70, 3):   # prefixes of many lengths: every pad, and none
        t, v, arrays = shape(k)
        kiln.save(p, v, t, store_type=False)
        data = p.read_bytes()
        framed = kiln.encode(v, t, frame=True)
        assert data == expected_file(framed, at(framed, arrays[0])), k
        heads.add(data[:4])
        for a in arrays:
            assert at(data, a) % 64 == 0, (k, a.dtype)
        back = kiln.load(p, t)
        assert kiln.encode(back, t, frame=True) == framed   # the whole value round trips
        views = [x for x in _tensors(back) if x.nbytes]
        assert [x.numpy().tobytes() for x in views] == [a.tobytes() for a in arrays]
        for x in views:
            assert address(x.numpy()) % 64 == 0
        copied = kiln.load(p, t, copy=True)
        assert kiln.encode(copied, t, frame=True) == framed
    assert b"KLNP" in heads


def _tensors(v):
    if isinstance(v, kiln.TensorDirectory):
        return list(v.values())
    if isinstance(v, dict):
        return [t for x in v.values() for t in _tensors(x)]
    if isinstance(v, (list, tuple)):
        return [t for x in v for t in _tensors(x)]
    if isinstance(v, kiln.Some):
        return _tensors(v.value)
    return []


def test_later_directories_are_aligned_only_when_the_bytes_between_allow(api, tmp_path):
    # a second directory after 40 payload bytes: the first is aligned, the second
    # is not (Frozen has no padding to give it); the documented limit
    a, b = rand(10), rand(4)
    t = "struct{x:tensors,y:tensors,}"
    p = tmp_path / "two.kiln"
    kiln.save(p, {"x": {"a": a}, "y": {"b": b}}, t, store_type=False)
    data = p.read_bytes()
    assert at(data, a) % 64 == 0
    # a's 40 bytes end x's block; y's table is 64 + 128 + the name "b", rounded to 256
    assert at(data, b) == at(data, a) + 40 + 256
    assert kiln.load(p, t)["y"]["b"].numpy().tobytes() == b.tobytes()


@pytest.mark.parametrize("t,v", [
    ("i64", 7),
    ("struct{id:i64,label:str,}", {"id": 3, "label": "abc"}),
    ("list<f32>", [1.5, 2.5]),
    ("struct{tensors:i64,}", {"tensors": 9}),            # the word, not the type
    ("struct{s:str,x:tensors,}", {"s": "ab", "x": {}}),  # an empty directory
    ("struct{s:str,x:tensors,}", {"s": "ab", "x": {"z": np.zeros(0, np.float32)}}),
    ("struct{s:str,x:list<tensors>,}", {"s": "a", "x": [{}, {}]}),
])
def test_values_without_payload_bytes_are_written_as_before(api, tmp_path, t, v):
    p = tmp_path / "plain.kiln"
    kiln.save(p, v, t, store_type=False)
    assert p.read_bytes() == kiln.encode(v, t, frame=True)
    assert kiln.encode(kiln.load(p, t), t, frame=True) == p.read_bytes()


def test_a_bare_value_has_no_head(api, tmp_path):
    w, v = issue_value()
    p = tmp_path / "bare.kiln"
    kiln.save(p, v, T, frame=False)
    assert p.read_bytes() == kiln.encode(v, T)
    assert kiln.load(p, T, frame=False)["x"]["w"].numpy().tobytes() == w.tobytes()


def test_file_objects_are_aligned_from_where_they_write(api, tmp_path):
    w, v = issue_value()
    framed = kiln.encode(v, T, frame=True)
    for start in (0, 5, 33, 64):
        buf = io.BytesIO()
        buf.write(b"\xee" * start)
        kiln.save(buf, v, T, store_type=False)
        data = buf.getvalue()
        assert at(data, w) % 64 == 0, start
        body = data[start:]
        if (start + 287) % 64 == 0:          # 287: the payload's offset in the framed value
            assert body == framed
        else:
            assert body == padded(framed, -(start + 8 + 287) % 64), start
        assert kiln.load(io.BytesIO(body), T)["x"]["w"].numpy().tobytes() == w.tobytes()
    # a real file, 7 bytes in: aligned in the file, loaded through kiln.load's mapping
    p = tmp_path / "f.bin"
    with open(p, "wb") as f:
        f.write(b"1234567")
        kiln.save(f, v, T, store_type=False)
    data = p.read_bytes()
    assert at(data, w) % 64 == 0
    with open(p, "rb") as f:
        f.seek(7)
        assert kiln.load(io.BytesIO(f.read()), T)["id"] == 1

    class Pipe:   # no tell: aligned from the first byte it is given
        def __init__(self):
            self.parts = []

        def write(self, b):
            self.parts.append(bytes(b))
            return len(b)

    out = Pipe()
    kiln.save(out, v, T, store_type=False)
    assert b"".join(out.parts) == padded(framed, 25)


def test_an_old_file_without_a_head_still_loads(api, tmp_path):
    w, v = issue_value()
    p = tmp_path / "old.kiln"
    p.write_bytes(kiln.encode(v, T, frame=True))   # what kiln.save wrote before
    got = kiln.load(p, T)
    assert got["x"]["w"].numpy().tobytes() == w.tobytes() and got["label"] == "abc"
    code, out, err = run("inspect", "old.kiln", "--type", T, "--json", env_impl=api.name,
                         cwd=tmp_path)
    assert code == 0, err
    assert json.loads(out)["value"]["x"]["tensors"][0]["offset"] == 287


def test_kiln_open_says_it_is_a_saved_value(api, tmp_path):
    p = tmp_path / "rec.kiln"
    kiln.save(p, {"id": 1, "label": "abc", "x": {"w": rand(10)}}, T, store_type=False)
    with pytest.raises(kiln.KilnError) as e:
        kiln.open(p)
    assert (e.value.code, e.value.offset) == ("FRAME", 0)
    assert "kiln.load" in str(e.value)


def test_the_command_line_reads_a_padded_file(api, tmp_path):
    w, v = issue_value()
    kiln.save(tmp_path / "rec.kiln", v, T, store_type=False)
    data = (tmp_path / "rec.kiln").read_bytes()
    code, out, err = run("inspect", "rec.kiln", "--json", env_impl=api.name, cwd=tmp_path)
    assert code == 0, err
    rep = json.loads(out)
    assert rep["schema_hash"] == "0x%016x" % kiln.parse_type(T).schema_hash
    assert rep["value_offset"] == 8 + 25
    code, out, err = run("inspect", "rec.kiln", "--type", T, "--json", env_impl=api.name,
                         cwd=tmp_path)
    assert code == 0, err
    row = json.loads(out)["value"]["x"]["tensors"][0]
    assert row["offset"] == at(data, w) == 320            # the file's offset
    code, out, err = run("check", "rec.kiln", "--type", T, env_impl=api.name, cwd=tmp_path)
    assert code == 0 and "valid" in out, err
    bad = bytearray(data)
    bad[8 + 3] = 1                                         # a pad byte
    (tmp_path / "bad.kiln").write_bytes(bytes(bad))
    code, out, err = run("check", "bad.kiln", "--type", T, env_impl=api.name, cwd=tmp_path)
    assert code == 1 and out.startswith("bad.kiln: FRAME at byte 11:"), (out, err)


def _hostile(data):
    """(bytes, code, offset) of damaged pad heads of the file ``data`` (P = 25)."""
    n_pad = data[5]
    assert n_pad == 25
    cases = []

    def put(i, b, code, off):
        d = bytearray(data)
        d[i] = b
        cases.append((bytes(d), code, off))

    put(4, 3, "FRAME", 4)              # version (2 is the typed head: tests/test_saved_type.py)
    put(4, 0, "FRAME", 4)
    put(5, 64, "FRAME", 5)             # a pad above 63
    put(5, 255, "FRAME", 5)
    put(6, 1, "FRAME", 6)              # reserved
    put(7, 1, "FRAME", 7)
    put(8, 1, "FRAME", 8)              # the first pad byte
    put(8 + 24, 0x80, "FRAME", 32)     # the last
    cases.append((data[:5], "EOF", 0))                 # shorter than the head
    cases.append((data[:8], "EOF", 8))                 # the pad claimed, the file ends
    cases.append((data[:20], "EOF", 20))
    short = bytearray(data[:8 + 3])
    short[5] = 63
    cases.append((bytes(short), "EOF", 11))            # a pad longer than the file
    return cases


def test_hostile_pad_heads_are_kiln_errors_at_their_byte(api, tmp_path):
    p = tmp_path / "h.kiln"
    kiln.save(p, issue_value()[1], T, store_type=False)
    data = p.read_bytes()
    for bad, code, off in _hostile(data):
        p.write_bytes(bad)
        with pytest.raises(kiln.KilnError) as e:
            kiln.load(p, T)
        assert (e.value.code, e.value.offset) == (code, off), bad[:12]
        with pytest.raises(kiln.KilnError) as e:
            kiln.load(io.BytesIO(bad), T)                  # bytes read, not mapped
        assert (e.value.code, e.value.offset) == (code, off)


def test_errors_in_the_value_count_from_the_file_start(api, tmp_path):
    w, v = issue_value()
    framed = kiln.encode(v, T, frame=True)
    p = tmp_path / "e.kiln"
    start = 8 + 25
    damaged = [
        (framed[:-3], None),                         # cut short
        (framed[:20], None),
        (framed[:2], None),                          # not even a frame magic
        (framed + b"\0", None),                      # a trailing byte
        (framed[:16 + 8] + b"\xff\xff\xff\xff" + framed[16 + 12:], None),   # label length
    ]
    for bad, _ in damaged:
        with pytest.raises(kiln.KilnError) as want:
            kiln.decode(bad, T, frame=True)          # the oracle: offsets in the value
        p.write_bytes(padded(bad, 25))
        with pytest.raises(kiln.KilnError) as got:
            kiln.load(p, T)
        assert (got.value.code, got.value.offset) == (want.value.code,
                                                      want.value.offset + start)
    # another type: SCHEMA at the frame's hash, in the file
    p.write_bytes(padded(framed, 25))
    with pytest.raises(kiln.KilnError) as e:
        kiln.load(p, "struct{id:i64,}")
    assert (e.value.code, e.value.offset) == ("SCHEMA", start + 8)


def test_a_value_that_does_not_encode_writes_nothing(api, tmp_path):
    p = tmp_path / "n.kiln"
    bad = {"id": "one", "label": "abc", "x": {"w": rand(3)}}
    with pytest.raises(kiln.EncodeError) as want:
        kiln.encode(bad, T, frame=True)
    with pytest.raises(kiln.EncodeError) as got:
        kiln.save(p, bad, T, store_type=False)
    assert (got.value.code, got.value.offset, got.value.path) == \
        (want.value.code, want.value.offset, want.value.path)
    assert not p.exists() and os.listdir(tmp_path) == []
