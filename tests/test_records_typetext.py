"""The type text in a record container's head (issue 40 item 4): files that
say what they hold, read with no type given; the head checked as hostile
input; files without it (the layout before it) still read.

Heads and containers are built by tests/_records_util.py (an independent
writer from spec/records.md, struct and zlib only) or by hand below; offsets
are counted by hand.
"""

import io
import pickle
import struct
import zlib

import pytest

import kiln
import _records_util as U

T = "struct{id:i64,name:str,}"
H = kiln.parse_type(T).schema_hash


def values(n):
    return [{"id": i, "name": "n" * (i % 7)} for i in range(n)]


def framed(v, t=T):
    return kiln.encode(v, t, frame=True)


def expect(code, offset, fn, *args, **kw):
    with pytest.raises(kiln.KilnError) as ei:
        fn(*args, **kw)
    assert (ei.value.code, ei.value.offset) == (code, offset), str(ei.value)
    return ei.value


def read_file(impl, data, t=None, **kw):
    with kiln.RecordFile(io.BytesIO(data), t, kernels=impl.kernels, **kw) as rf:
        return list(rf)


def read_stream(impl, data, t=None, step=None):
    d = kiln.StreamDecoder(t, kernels=impl.kernels)
    out = []
    step = step or len(data) or 1
    for a in range(0, len(data), step):
        out += d.feed(data[a:a + step])
    d.eof()
    return out


def head(text, schema_hash=H, flags=1, length=None, crc=None):
    """A head by hand: header, u32 length, text, CRC of all before it."""
    raw = text.encode() if isinstance(text, str) else text
    first = struct.pack("<4sBBHQI", b"KLNR", 1, flags, 0, schema_hash,
                        len(raw) if length is None else length) + raw
    return first + struct.pack("<I", zlib.crc32(first) if crc is None else crc)


def test_a_file_read_with_no_type_given(impl, tmp_path):
    vs = values(20)
    p = tmp_path / "a.kilnr"
    with kiln.RecordWriter(p, T, kernels=impl.kernels) as w:
        w.write_many(vs)
    assert p.read_bytes()[:48] == head(T)
    with kiln.RecordFile(p, kernels=impl.kernels) as rf:
        assert rf.type.text == T and rf.type_text == T
        assert list(rf) == vs and rf[7] == vs[7]      # structs as dicts
        again = pickle.loads(pickle.dumps(rf))
        assert again[3] == vs[3]
        again.close()
    with kiln.RecordFile(p, T, kernels=impl.kernels) as rf:        # the type given: checked
        assert list(rf) == vs
    expect("SCHEMA", 8, kiln.RecordFile, p, "struct{id:i64,}", kernels=impl.kernels)
    data = p.read_bytes()
    assert read_stream(impl, data) == vs
    for step in (1, 5, 19, 20, 21, 47, 48, 49):
        assert read_stream(impl, data, step=step) == vs
    assert list(kiln.iter_records(io.BytesIO(data), kernels=impl.kernels)) == vs
    d = kiln.StreamDecoder(kernels=impl.kernels)
    assert d.type is None and d.feed(data[:48]) == [] and d.type.text == T


def test_a_file_written_before_the_type_text_still_reads(impl):
    """The layout written before this change (flags 0, records at byte 16),
    from hand-written bytes: read with its type; with none it says what to do."""
    vs = values(5)
    old, offs = U.container(H, [framed(v) for v in vs])
    assert old[5] == 0 and offs[0] == 16
    assert read_file(impl, old, T) == vs
    assert read_stream(impl, old, T) == vs
    with kiln.RecordFile(io.BytesIO(old), T, kernels=impl.kernels) as rf:
        assert rf.type_text is None
    with pytest.raises(TypeError, match="pass the type"):
        read_file(impl, old)
    with pytest.raises(TypeError, match="pass the type"):
        read_stream(impl, old)
    # and a writer asked for that layout writes it
    out = io.BytesIO()
    with kiln.RecordWriter(out, T, kernels=impl.kernels, store_type=False) as w:
        w.write_many(vs)
    assert out.getvalue() == old


def test_recovery_and_an_empty_file_start_after_the_type_text(impl):
    vs = values(6)
    full, offs = U.container(H, [framed(v) for v in vs], text=T)
    assert offs[0] == 48
    torn = full[:offs[4] + 7]
    with kiln.RecordFile(io.BytesIO(torn), recover=True, kernels=impl.kernels) as rf:
        assert list(rf) == vs[:4] and rf.recovery.offset == offs[4]
    empty = U.container(H, [], text=T)[0]
    assert read_file(impl, empty) == [] and read_stream(impl, empty) == []
    # an index that puts the first record at 16 is refused: the records start at 48
    bad = U.container(H, [framed(v) for v in vs], text=T, offsets=[16] + offs[1:])[0]
    with pytest.raises(kiln.KilnError) as ei:
        read_file(impl, bad)
    assert ei.value.code == "FRAME"


def _hostile_heads():
    other = "struct{id:i64,}"
    rest = U.container(H, [framed(v) for v in values(2)], text=T)[0][48:]
    return [
        # (name, bytes, code, offset)
        ("text of another type", head(other) + rest, "FRAME", 20),
        ("head CRC", head(T, crc=0) + rest, "FRAME", 20 + len(T)),
        ("text length 0", head(b"") + rest, "FRAME", 16),
        ("text length over the cap", head(b"", length=(1 << 20) + 1) + rest, "LIMIT", 16),
        ("not type text", head("struct{id:i64,,}") + rest, "TYPE", 20 + 14),
        ("not ASCII", head(b"struct{\xc3\xa9:i64,}") + rest, "TYPE", 20 + 7),
        ("unknown flag", head(T, flags=3) + rest, "FRAME", 5),
    ]


@pytest.mark.parametrize("case", _hostile_heads(), ids=lambda c: c[0])
def test_a_hostile_head_is_refused_at_its_byte(impl, case):
    name, data, code, offset = case
    expect(code, offset, read_file, impl, data)
    expect(code, offset, read_file, impl, data, T)        # a type given: checked all the same
    for step in (None, 1, 7):
        expect(code, offset, read_stream, impl, data, None, step)


def test_a_head_cut_short_and_a_length_past_the_end(impl):
    full = U.container(H, [framed(v) for v in values(2)], text=T)[0]
    for cut in (16, 18, 20, 30, 47):
        with pytest.raises(kiln.KilnError) as ei:
            read_file(impl, full[:cut])
        assert ei.value.code == "EOF", (cut, str(ei.value))
        with pytest.raises(kiln.KilnError) as ei:
            read_stream(impl, full[:cut])
        assert ei.value.code == "EOF"
    # a length of 1 MiB in a 60-byte file: refused before anything is allocated for it
    small = head(b"x" * 8, length=1 << 20)
    with pytest.raises(kiln.KilnError) as ei:
        read_file(impl, small)
    assert ei.value.code == "EOF"


def test_the_writer_refuses_a_type_text_over_the_cap():
    from kiln.records import _format as F
    with pytest.raises(ValueError, match="store_type=False"):
        F.make_header(1, "x" * ((1 << 20) + 1))
