"""One rounding rule for floats (issue 40 item 2): a value an f32 or f64
field or element cannot hold exactly is refused unless round_floats=True,
whatever the source (a Python float or int, a numpy scalar, a list or tuple,
an array, a struct field, JSON Lines), in both kernels.  Expected bytes are
struct.pack's (which rounds to nearest, as round_floats does); overflow to
infinity is refused either way; NaN and the infinities pass."""

import json
import math
import struct

import numpy as np
import pytest

import kiln

F32_01 = struct.pack("<f", 0.1)        # 0.1 rounded to f32: 0.10000000149011612
assert struct.unpack("<f", F32_01)[0] == float(np.float32(0.1)) != 0.1


def enc(impl, value, t, rf):
    return kiln.Encoder(t, round_floats=rf, kernels=impl.kernels).encode(value)


def refused(impl, value, t):
    with pytest.raises(kiln.EncodeError) as ei:
        enc(impl, value, t, False)
    assert ei.value.code == "TYPE" and "pass round_floats=True" in ei.value.reason, ei.value
    return ei.value


N = struct.Struct("<I")
LONG = 70    # past the pure kernel's short-list path (64)

# (source, value, type, bytes with round_floats=True); each is refused without it
INEXACT = [
    ("float scalar", 0.1, "f32", F32_01),
    ("numpy float64 scalar", np.float64(0.1), "f32", F32_01),
    ("numpy longdouble scalar", np.longdouble(1) / 3, "f64", struct.pack("<d", 1 / 3)),
    ("int past 2**24", 2 ** 24 + 1, "f32", struct.pack("<f", 2.0 ** 24)),
    ("int past 2**53", 2 ** 53 + 1, "f64", struct.pack("<d", 2.0 ** 53)),
    ("numpy int64 past 2**53", np.int64(2 ** 53 + 1), "f64", struct.pack("<d", 2.0 ** 53)),
    ("list", [0.5, 0.1], "list<f32>", N.pack(2) + struct.pack("<2f", 0.5, 0.1)),
    ("tuple", (0.5, 0.1), "list<f32>", N.pack(2) + struct.pack("<2f", 0.5, 0.1)),
    ("long list", [0.5] * LONG + [0.1], "list<f32>",
     N.pack(LONG + 1) + struct.pack("<%df" % (LONG + 1), *([0.5] * LONG + [0.1]))),
    ("list of ints", [1, 2 ** 53 + 1], "list<f64>",
     N.pack(2) + struct.pack("<2d", 1.0, 2.0 ** 53)),
    ("list of numpy float64", [np.float64(0.1)], "list<f32>", N.pack(1) + F32_01),
    ("list numpy makes float64", [1, 2 ** 64 - 1], "list<f64>",
     N.pack(2) + struct.pack("<2d", 1.0, 2.0 ** 64)),
    ("float64 array", np.array([0.5, 0.1]), "list<f32>",
     N.pack(2) + struct.pack("<2f", 0.5, 0.1)),
    ("int64 array", np.array([1, 2 ** 53 + 1], np.int64), "list<f64>",
     N.pack(2) + struct.pack("<2d", 1.0, 2.0 ** 53)),
    ("int32 array", np.array([2 ** 24 + 1], np.int32), "list<f32>",
     N.pack(1) + struct.pack("<f", 2.0 ** 24)),
    ("uint64 array at the top", np.array([2 ** 64 - 1], np.uint64), "list<f64>",
     N.pack(1) + struct.pack("<d", 2.0 ** 64)),
    ("struct field", {"x": 0.1}, "struct{x:f32,}", F32_01),
    ("struct run of scalars", {"a": 1, "x": 0.1, "b": 2}, "struct{a:i32,x:f32,b:i32,}",
     struct.pack("<ifi", 1, 0.1, 2)),
    ("struct f64 run, an int", {"a": 1, "x": 2 ** 53 + 1}, "struct{a:i32,x:f64,}",
     struct.pack("<id", 1, 2.0 ** 53)),
    ("struct field's list", {"xs": [0.1]}, "struct{xs:list<f32>,}", N.pack(1) + F32_01),
    ("opt", 0.1, "opt<f32>", b"\x01" + F32_01),
    ("list of structs", [{"x": 0.1}], "list<struct{x:f32,}>", N.pack(1) + F32_01),
    ("dict value", {"k": 0.1}, "dict<str,f32>", N.pack(1) + N.pack(1) + b"k" + F32_01),
]


@pytest.mark.parametrize("source, value, t, rounded", INEXACT, ids=[c[0] for c in INEXACT])
def test_a_value_that_would_change_is_refused_unless_round_floats(impl, source, value, t,
                                                                  rounded):
    refused(impl, value, t)
    assert enc(impl, value, t, True) == rounded


@pytest.mark.parametrize("t", ["f32", "f64"])
@pytest.mark.parametrize("x", [0.5, -0.0, 2.0 ** -149, 3.4028234663852886e38,
                               math.inf, -math.inf, 16777216, np.float32(0.1),
                               np.float16(0.1), True])
def test_exact_values_pass_from_every_source(impl, t, x):
    want = struct.pack("<f" if t == "f32" else "<d", float(x))
    for value, tt, expect in [
            (x, t, want),
            ([x], "list<%s>" % t, N.pack(1) + want),
            ((x,), "list<%s>" % t, N.pack(1) + want),
            ([x] * LONG, "list<%s>" % t, N.pack(LONG) + want * LONG),
            ({"a": 1, "x": x}, "struct{a:i32,x:%s,}" % t, struct.pack("<i", 1) + want)]:
        assert enc(impl, value, tt, False) == expect, (value, tt)
    if not isinstance(x, bool):
        arr = np.array([x], np.float64)
        assert enc(impl, arr, "list<%s>" % t, False) == N.pack(1) + want


def test_nan_passes(impl):
    for t in ("f32", "f64"):
        for value, tt in [(math.nan, t), ([math.nan], "list<%s>" % t),
                          (np.array([math.nan]), "list<%s>" % t)]:
            back = kiln.decode(enc(impl, value, tt, False), tt)
            assert math.isnan(float(back if tt == t else back[0]))


@pytest.mark.parametrize("value, t", [(1e39, "f32"), ([1e39], "list<f32>"),
                                      (np.array([1e39]), "list<f32>"), ({"x": 1e39},
                                                                         "struct{x:f32,}"),
                                      (2 ** 1100, "f64")])
def test_overflow_is_refused_even_with_round_floats(impl, value, t):
    for rf in (False, True):
        with pytest.raises(kiln.EncodeError) as ei:
            enc(impl, value, t, rf)
        assert ei.value.code == "TYPE" and "round_floats" not in ei.value.reason


def test_the_messages_say_what_and_where(impl):
    e = refused(impl, 0.1, "f32")
    assert (e.offset, e.reason) == (0, "0.1 would change as f32 (0.10000000149011612); "
                                       "pass round_floats=True to round")
    e = refused(impl, [0.5, 0.1], "list<f32>")
    assert (e.offset, e.path) == (0, "[1]")
    assert e.reason == "0.1 would change as f32 (0.10000000149011612); pass round_floats=True " \
                       "to round"
    e = refused(impl, np.array([0.5, 0.1]), "list<f32>")
    assert (e.offset, e.path) == (0, "[1]") and "in a float64 array" in e.reason
    e = refused(impl, {"a": 1, "x": 0.1}, "struct{a:i32,x:f32,}")
    assert (e.offset, e.path) == (4, ".x")
    e = refused(impl, {"rows": [{"x": 0.5}, {"x": 0.1}]}, "struct{rows:list<struct{x:f32,}>,}")
    assert (e.offset, e.path) == (8, ".rows[1].x")


def test_decoded_rounding_is_numpys(impl):
    buf = enc(impl, [0.1, 1 / 3], "list<f32>", True)
    assert kiln.decode(buf, "list<f32>").tolist() == [float(np.float32(0.1)),
                                                      float(np.float32(1 / 3))]
    assert kiln.decode(enc(impl, 0.1, "f32", True), "f32") == float(np.float32(0.1))


def test_json_lines_follow_the_rule(api, tmp_path):
    from kiln.records.tools import jsonl_to_records
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"x": 0.5, "xs": [0.25]}) + "\n"
                   + json.dumps({"x": 0.1, "xs": [0.5]}) + "\n")
    t = "struct{x:f32,xs:list<f32>,}"
    with pytest.raises(ValueError) as ei:
        jsonl_to_records(str(src), str(tmp_path / "out.kilnr"), t)
    assert "line 2" in str(ei.value) and "round_floats" in str(ei.value)
    assert not (tmp_path / "out.kilnr").exists()
    assert jsonl_to_records(str(src), str(tmp_path / "out.kilnr"), t, round_floats=True) == 2
    with kiln.records.RecordFile(str(tmp_path / "out.kilnr"), t) as rf:
        rows = list(rf)
    assert rows[1]["x"] == float(np.float32(0.1)) and rows[0]["xs"].tolist() == [0.25]


def test_the_cli_converter_takes_round_floats(api, tmp_path, capsys):
    from kiln.cli import main
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"x": 0.1}) + "\n")
    dst = str(tmp_path / "out.kilnr")
    assert main(["convert", str(src), dst, "--type", "struct{x:f32,}"]) == 1
    said = capsys.readouterr()
    assert "line 1" in said.err and "pass --round-floats to round" in said.err
    assert main(["convert", str(src), dst, "--type", "struct{x:f32,}", "--round-floats"]) == 0
    with kiln.records.RecordFile(dst, "struct{x:f32,}") as rf:
        assert [r["x"] for r in rf] == [float(np.float32(0.1))]


def test_bound_classes_fields_follow_the_rule(impl):
    import dataclasses
    from typing import NamedTuple

    @dataclasses.dataclass(slots=True)
    class Slots:
        a: kiln.I32
        x: kiln.F32

    class Tup(NamedTuple):
        a: kiln.I32
        x: kiln.F32

    class Rec(kiln.Record):
        a: kiln.I32
        x: kiln.F32

    @dataclasses.dataclass
    class Plain:
        a: kiln.I32
        x: kiln.F32
    for cls in (Slots, Tup, Rec, Plain):
        e = refused(impl, cls(1, 0.1), cls)
        assert (e.offset, e.path) == (4, ".x"), cls
        assert enc(impl, cls(1, 0.1), cls, True) == struct.pack("<if", 1, 0.1)
        assert enc(impl, cls(1, 0.5), cls, False) == struct.pack("<if", 1, 0.5)
        assert enc(impl, [cls(1, 0.5)] * 3, list[cls], False) == \
            N.pack(3) + struct.pack("<if", 1, 0.5) * 3
        e = refused(impl, [cls(1, 0.5), cls(2, 0.1)], list[cls])
        assert (e.offset, e.path) == (16, "[1].x"), cls   # count, a record, its a
