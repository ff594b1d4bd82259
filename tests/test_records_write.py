"""The writer's record loop (issue 40 item 3): ``encode_record`` and
``encode_records`` in both kernels, called directly, and
``RecordWriter.write_many``.

Expected bytes come from tests/_records_util.py (an independent writer from
spec/records.md, struct and zlib only) around the public ``kiln.encode`` of
each value; offsets are counted by hand.
"""

import io
import struct
import zlib
from array import array

import pytest

import kiln
import _records_util as U

T = "struct{id:i64,name:str,}"
H = kiln.parse_type(T).schema_hash


def values(n):
    return [{"id": i, "name": "n" * (i % 7)} for i in range(n)]


def framed(v, t=T):
    return kiln.encode(v, t, frame=True)


def enc_program(impl, t=T, frame=True):
    return kiln.Encoder(t, frame, kernels=impl.kernels)._prog


def test_encode_record_is_the_spec_record(impl):
    p = enc_program(impl)
    for v in values(8):
        rec = impl.kernels.encode_record(p, v)
        assert rec == U.record(framed(v))
        # by hand: the head (length, kind 0, pad 0, reserved 0, head CRC), value, record CRC
        n = len(framed(v))
        first = struct.pack("<QBBH", n, 0, 0, 0)
        assert rec[:16] == first + struct.pack("<I", zlib.crc32(first))
        assert rec[-4:] == struct.pack("<I", zlib.crc32(rec[:-4]))


def test_encode_records_blocks_offsets_room_and_errors(impl):
    p = enc_program(impl)
    vs = values(50)
    recs = [U.record(framed(v)) for v in vs]
    it = iter(vs)
    offs = array("Q")
    # a block stops after the record that reaches the limit
    data, more, err = impl.kernels.encode_records(p, it, 1000, 100, offs)
    want = b""
    n = 0
    while len(want) < 100:
        want += recs[n]
        n += 1
    assert (data, more, err) == (want, True, None)
    assert list(offs) == [sum(len(r) for r in recs[:k]) for k in range(n)]
    # the iterator goes on where the block stopped; room caps the count
    offs = array("Q")
    data, more, err = impl.kernels.encode_records(p, it, 3, 1 << 20, offs)
    assert (data, more, err) == (b"".join(recs[n:n + 3]), True, None)
    assert list(offs) == [0, len(recs[n]), len(recs[n]) + len(recs[n + 1])]
    offs = array("Q")
    data, more, err = impl.kernels.encode_records(p, it, 0, 1 << 20, offs)
    assert (data, more, err, len(offs)) == (b"", True, None, 0)    # nothing taken
    # the rest, to the iterator's end
    data, more, err = impl.kernels.encode_records(p, it, 1000, 1 << 20, offs)
    assert (data, more, err) == (b"".join(recs[n + 3:]), False, None)
    # a bad value: the records before it, its EncodeError (offset as kiln.encode's)
    bad = [vs[0], vs[1], {"id": "x", "name": ""}, vs[3]]
    with pytest.raises(kiln.EncodeError) as ei:
        kiln.encode(bad[2], T, frame=True)
    it = iter(bad)
    offs = array("Q")
    data, more, err = impl.kernels.encode_records(p, it, 1000, 1 << 20, offs)
    assert data == recs[0] + recs[1] and not more and list(offs) == [0, len(recs[0])]
    assert isinstance(err, kiln.EncodeError)
    assert (err.code, err.offset) == (ei.value.code, ei.value.offset)
    assert next(it) == vs[3]              # the value after the bad one was not taken


def test_encode_records_needs_a_framing_program(impl):
    import kiln._kernels_py as py
    for k in (py, impl.kernels):
        p = kiln.Encoder(T, False, kernels=k)._prog
        with pytest.raises(ValueError):
            impl.kernels.encode_records(p, iter(values(2)), 10, 1 << 20, array("Q"))
        with pytest.raises(ValueError):
            impl.kernels.encode_record(p, {"id": 1, "name": "long enough to pass for a frame"})


def test_a_program_of_the_other_kernel(impl):
    """Each kernel takes any encode program (the other kernel's too)."""
    import kiln._kernels_py as py
    for k in (py, impl.kernels):
        p = kiln.Encoder(T, True, kernels=k)._prog
        offs = array("Q")
        data, more, err = impl.kernels.encode_records(p, iter(values(5)), 10, 1 << 20, offs)
        assert data == b"".join(U.record(framed(v)) for v in values(5)) and err is None
        assert impl.kernels.encode_record(p, values(1)[0]) == U.record(framed(values(1)[0]))


@pytest.mark.parametrize("store_type", [False, True])
def test_write_many_writes_what_write_writes(impl, store_type):
    vs = values(3000)                     # several 64 KiB blocks
    out = io.BytesIO()
    with kiln.RecordWriter(out, T, kernels=impl.kernels, store_type=store_type) as w:
        assert w.write(vs[0]) == 0
        assert w.write_many(v for v in vs[1:2000]) == 1999
        assert w.write_many([]) == 0
        assert w.write(vs[2000]) == 2000
        assert w.write_many(vs[2001:]) == 999
        assert len(w) == 3000
    want, offs = U.container(H, [framed(v) for v in vs], text=T if store_type else None)
    assert out.getvalue() == want
    with kiln.RecordFile(io.BytesIO(want), T, kernels=impl.kernels) as rf:
        assert list(rf) == vs


def test_write_many_with_a_bad_value_keeps_the_records_before_it(impl, tmp_path):
    vs = values(10)
    bad = vs[:4] + [{"id": 1.5, "name": ""}] + vs[5:]
    p = tmp_path / "b.kilnr"
    with kiln.RecordWriter(p, T, kernels=impl.kernels, store_type=False) as w:
        with pytest.raises(kiln.EncodeError):
            w.write_many(bad)
        assert len(w) == 4
        w.write_many(vs[4:])              # the writer stays usable
    assert p.read_bytes() == U.container(H, [framed(v) for v in vs])[0]


def test_write_many_with_tensors_aligns_each_record(impl):
    import numpy as np
    t = "struct{id:i64,img:tensors,}"
    vs = [{"id": i, "img": {"x": np.full((3, 5), i, np.uint8)}} for i in range(20)]
    a, b = io.BytesIO(), io.BytesIO()
    with kiln.RecordWriter(a, t, kernels=impl.kernels) as w:
        for v in vs:
            w.write(v)
    with kiln.RecordWriter(b, t, kernels=impl.kernels) as w:
        assert w.write_many(vs) == 20
    assert a.getvalue() == b.getvalue()
    with kiln.RecordFile(io.BytesIO(b.getvalue()), t, kernels=impl.kernels) as rf:
        assert [int(r["img"]["x"].numpy()[0, 0]) for r in rf] == list(range(20))


def test_write_many_after_close_and_a_write_from_inside_the_iterator(impl):
    out = io.BytesIO()
    w = kiln.RecordWriter(out, T, kernels=impl.kernels, store_type=False)
    vs = values(6)

    def gen():
        yield vs[0]
        w.write(vs[1])                    # reentrant: lands before the block being built
        yield vs[2]
    assert w.write_many(gen()) == 2
    w.close()
    with pytest.raises(ValueError):
        w.write_many(vs)
    assert out.getvalue() == U.container(H, [framed(v) for v in (vs[1], vs[0], vs[2])])[0]


def test_an_iterable_that_fails_keeps_the_records_before_it(impl):
    vs = values(5)

    def gen():
        yield from vs[:3]
        raise RuntimeError("the source broke")
    p = enc_program(impl)
    offs = array("Q")
    data, more, err = impl.kernels.encode_records(p, gen(), 100, 1 << 20, offs)
    assert data == b"".join(U.record(framed(v)) for v in vs[:3]) and not more
    assert isinstance(err, RuntimeError) and len(offs) == 3
    out = io.BytesIO()
    with kiln.RecordWriter(out, T, kernels=impl.kernels, store_type=False) as w:
        with pytest.raises(RuntimeError, match="the source broke"):
            w.write_many(gen())
        assert len(w) == 3
        w.write_many(vs[3:])
    assert out.getvalue() == U.container(H, [framed(v) for v in vs])[0]


TD = "struct{id:i64,name:str,a:tensors,b:tensors,}"


def dir_value(i, a):
    import numpy as np
    return {"id": i, "name": "n" * (i % 5), "a": a,
            "b": {"w": np.arange(i % 3 + 1, dtype=np.float32)}}


def test_encode_record_pads_the_first_directory_with_payload_bytes(impl):
    """Issue 52: ``base`` is where the record's head lands; the pad puts the
    first directory whose payload_bytes is not 0 on a 64-byte boundary (its
    payloads are 64-aligned to its start).  Offsets counted by hand: the
    frame (16), id (8), name (4 + its bytes), then directory a (64 bytes when
    empty; header, one descriptor and a one-byte name rounded to 256 when it
    holds one empty tensor: no payload bytes, so b is the one aligned)."""
    import numpy as np
    p = kiln.Encoder(TD, True, kernels=impl.kernels)._prog
    for a, a_len in (({}, 64), ({"z": np.zeros(0, np.int8)}, 256)):
        for i in range(5):
            v = dir_value(i, a)
            at_b = 16 + 8 + 4 + i % 5 + a_len
            for base in (0, 1, 17, 63, 64, 1000):
                pad = -(base + 16 + at_b) % 64
                assert impl.kernels.encode_record(p, v, base) == U.record(framed(v, TD), pad=pad)
            assert impl.kernels.encode_record(p, v) == U.record(framed(v, TD))   # no base: no pad
    # a directory with payload first: it is the one aligned
    v = dir_value(3, {"q": np.ones(2, np.uint8)})
    assert impl.kernels.encode_record(p, v, 5) == \
        U.record(framed(v, TD), pad=-(5 + 16 + 16 + 8 + 4 + 3) % 64)
    # no payload bytes anywhere: no pad wherever the record lands
    v = {"id": 1, "name": "x", "a": {}, "b": {"w": np.zeros(0, np.float32)}}
    for base in (0, 9, 50):
        assert impl.kernels.encode_record(p, v, base) == U.record(framed(v, TD))


def test_encode_records_pads_each_record_where_it_lands(impl):
    p = kiln.Encoder(TD, True, kernels=impl.kernels)._prog
    vs = [dir_value(i, {}) for i in range(40)]
    for base in (0, 24, 61):
        offs = array("Q")
        data, more, err = impl.kernels.encode_records(p, iter(vs), 1000, 1 << 20, offs, base)
        want, at = b"", []
        for i, v in enumerate(vs):
            at.append(len(want))
            pad = -(base + len(want) + 16 + 16 + 8 + 4 + i % 5 + 64) % 64
            want += U.record(framed(v, TD), pad=pad)
        assert (data, more, err) == (want, False, None) and list(offs) == at
    # a bad value after two: the two records, padded, and its error
    bad = vs[:2] + [{"id": "x", "name": "", "a": {}, "b": {}}]
    offs = array("Q")
    data, more, err = impl.kernels.encode_records(p, iter(bad), 10, 1 << 20, offs, 3)
    assert isinstance(err, kiln.EncodeError) and len(offs) == 2
    first = impl.kernels.encode_record(p, vs[0], 3)
    assert data == first + impl.kernels.encode_record(p, vs[1], 3 + len(first))


def test_padded_records_need_a_program_of_the_same_kernel(impl):
    import kiln._kernels_py as py
    try:
        import kiln._kernels_c as c
    except ImportError:
        c = None
    other = c if impl.kernels is py else py
    if other is None:
        pytest.skip("the compiled kernels are not built")
    p = kiln.Encoder(TD, True, kernels=other)._prog
    v = dir_value(1, {})
    with pytest.raises(ValueError, match="padded records"):
        impl.kernels.encode_record(p, v, 0)
    with pytest.raises(ValueError, match="padded records"):
        impl.kernels.encode_records(p, iter([v]), 10, 1 << 20, array("Q"), 0)
    assert impl.kernels.encode_record(p, v) == U.record(framed(v, TD))   # unpadded: any program


def test_aligned_write_many_reframes_a_block_when_a_write_lands_first(impl):
    """write_many frames a block for the position it reads before the block;
    a write from inside the iterator moves it, and the block is framed again
    for where it lands: the file is what three write calls make."""
    import numpy as np
    vs = [dir_value(i, {}) for i in range(3)]
    out = io.BytesIO()
    w = kiln.RecordWriter(out, TD, kernels=impl.kernels)

    def gen():
        yield vs[0]
        w.write(vs[1])
        yield vs[2]
    assert w.write_many(gen()) == 2
    w.close()
    want = io.BytesIO()
    with kiln.RecordWriter(want, TD, kernels=impl.kernels) as w2:
        for v in (vs[1], vs[0], vs[2]):
            w2.write(v)
    assert out.getvalue() == want.getvalue()
    data = out.getvalue()
    with kiln.RecordFile(io.BytesIO(data), TD, kernels=impl.kernels) as rf:
        for r, i in zip(rf, (1, 0, 2)):
            np.testing.assert_array_equal(r["b"]["w"].numpy(), np.arange(i % 3 + 1))
    # every b payload 64-aligned in the file: its value position by hand
    at, k = 16 + 4 + len(TD) + 4, 0
    while k < 3:
        n, kind, pad = struct.unpack_from("<QBB", data, at)
        i = (1, 0, 2)[k]
        assert (at + 16 + pad + 16 + 8 + 4 + i % 5 + 64) % 64 == 0
        at += 16 + pad + n + 4
        k += 1


def test_encode_record_without_its_crc(impl):
    """``crc=False`` (kiln.save keeps only the value): the same record with
    its 4 CRC bytes 0, padded or not, for a program of either kernel."""
    import kiln._kernels_py as py
    p = enc_program(impl)
    for v in values(4):
        want = U.record(framed(v))
        assert impl.kernels.encode_record(p, v, crc=False) == want[:-4] + bytes(4)
    pd = kiln.Encoder(TD, True, kernels=impl.kernels)._prog
    for i, base in ((0, 0), (1, 17), (4, 1000)):
        v = dir_value(i, {})
        pad = -(base + 16 + 16 + 8 + 4 + i % 5 + 64) % 64
        want = U.record(framed(v, TD), pad=pad)
        assert impl.kernels.encode_record(pd, v, base, False) == want[:-4] + bytes(4)
    other = kiln.Encoder(T, True, kernels=py)._prog   # the other kernel's program, unpadded
    v = values(3)[2]
    assert impl.kernels.encode_record(other, v, -1, False) == U.record(framed(v))[:-4] + bytes(4)


def test_records_of_plain_arrays_are_valid_directories(impl):
    """The compiled encoder writes a dict of plain arrays without checking
    the block again (src/kernels/dirwrite.pxi, plain_dtype): each such record
    is read back by the pure kernels, which check every directory rule; a
    bool array with a byte that is not 0 or 1 is still refused."""
    import numpy as np
    import kiln._kernels_py as py
    t = "struct{id:i64,x:tensors,}"
    p = kiln.Encoder(t, True, kernels=impl.kernels)._prog
    dec = kiln.Decoder(t, True, kernels=py)
    rng = np.random.default_rng(7)
    shapes = [(), (0,), (3,), (2, 3), (1,) * 8, (4, 0, 2)]
    dtypes = ["u1", "i2", "<u4", "<f4", "<f8", "<i8", "<f2", "i1"]
    for i in range(40):
        keys = rng.permutation(["b", "a", "\u00e9t\u00e9", "z" * 300, "m1", "\U0001f600"])
        x = {str(k): np.asarray(rng.integers(0, 100, shapes[(i + j) % len(shapes)]),
                                dtype=dtypes[(i * 3 + j) % len(dtypes)])
             for j, k in enumerate(keys[:1 + i % 6])}
        rec = impl.kernels.encode_record(p, {"id": i, "x": x}, 5 * i)
        got = dec.decode(rec[16 + rec[9]:-4])["x"]
        assert sorted(got) == sorted(x)
        for k, a in x.items():
            b = got[k].numpy()
            assert b.dtype == a.dtype.newbyteorder("<") and b.shape == a.shape
            assert b.tobytes() == a.tobytes()
    bad = np.frombuffer(b"\x00\x02", np.bool_)
    with pytest.raises(kiln.EncodeError) as e:
        impl.kernels.encode_record(p, {"id": 1, "x": {"a": np.ones(3, "<f4"), "b": bad}})
    assert e.value.code == "TYPE"
