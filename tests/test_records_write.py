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
