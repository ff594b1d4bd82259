"""The annotations users write (issue 40 item 1): enums, Literal, tuples,
datetime/date/timedelta, UUID, Decimal and Annotated map onto existing wire
types (same bytes and hash as the wire type), in both kernels; what has no
wire form is a TypeError naming the field when the type is built.

Expected bytes are written out by hand (struct.pack of the documented wire
value); the hash is the executable spec's (kiln_ref)."""

import dataclasses
import datetime as dt
import decimal
import enum
import struct
import typing
import uuid
from typing import Annotated, Literal, NamedTuple, Optional

import pytest

import kiln
from _util import kiln_ref

UTC = dt.timezone.utc


class Color(enum.IntEnum):
    RED = 1
    GREEN = 2


class Mood(enum.Enum):
    HAPPY = "h"
    SAD = "s"


class Mixed(enum.Enum):
    A = 1
    B = "b"


def i64(n):
    return struct.pack("<q", n)


def i32(n):
    return struct.pack("<i", n)


def s(text):
    b = text.encode()
    return struct.pack("<I", len(b)) + b


@pytest.mark.parametrize("ann, text", [
    (Color, "i64"), (Mood, "str"), (Annotated[Color, kiln.u8], "u8"),
    (Literal[1, 2], "i64"), (Literal["a", "b"], "str"), (Literal[True], "bool"),
    (Annotated[Literal[3, 4], kiln.i8], "i8"),
    (tuple[int, str], "struct{_0:i64,_1:str,}"), (tuple[float, ...], "list<f64>"),
    (tuple[Color, ...], "list<i64>"),
    (dt.datetime, "i64"), (dt.date, "i32"), (dt.timedelta, "i64"),
    (uuid.UUID, "list<u8>"), (decimal.Decimal, "str"),
    (int | None, "opt<i64>"), (Optional[Color], "opt<i64>"), (list[dt.date], "list<i32>"),
])
def test_each_annotation_is_its_wire_type_with_that_hash(ann, text):
    t = kiln.as_type(ann)
    assert t.text == text
    assert t.schema_hash == kiln_ref.schema_hash(text)
    if text not in ("opt<i64>",) or ann is Optional[Color]:
        # another Python value than the text's: another type, one hash
        assert t != kiln.parse_type(text)


def test_types_of_one_text_differ_by_their_python_side():
    assert kiln.as_type(Color) == kiln.as_type(Color)
    assert kiln.as_type(Color) != kiln.as_type(dt.datetime)       # both i64
    assert kiln.as_type(Literal[1]) != kiln.as_type(Literal[2])
    assert repr(kiln.as_type(Color)) == "kiln.Type('i64', python='Color')"


def test_enums(impl):
    assert impl.encode(Color.GREEN, Color) == i64(2)
    assert impl.decode(i64(2), Color) is Color.GREEN
    assert impl.encode(2, Color) == i64(2)                 # a value of the enum
    assert impl.decode(s("s"), Mood) is Mood.SAD
    assert impl.encode(Mood.HAPPY, Mood) == s("h")
    with pytest.raises(kiln.KilnError) as ei:
        impl.decode(i64(3), Color)
    assert (ei.value.code, ei.value.offset) == ("TYPE", 0)
    assert "3 is not a value of Color" in str(ei.value)
    with pytest.raises(kiln.KilnError) as ei:
        impl.decode(s("x"), Mood)
    assert (ei.value.code, ei.value.offset) == ("TYPE", 0)
    for bad in (3, True, "1", Mood.SAD):
        with pytest.raises(kiln.EncodeError) as ei:
            impl.encode(bad, Color)
        assert ei.value.code == "TYPE"
    small = Annotated[Color, kiln.u8]
    assert impl.encode(Color.RED, small) == b"\x01"
    assert impl.decode(b"\x02", small) is Color.GREEN
    with pytest.raises(kiln.KilnError) as ei:
        impl.decode(b"\x09", small)
    assert (ei.value.code, ei.value.offset) == ("TYPE", 0)


def test_literals_are_checked_both_ways(impl):
    t = Literal["a", "b"]
    assert impl.encode("b", t) == s("b")
    assert impl.decode(s("a"), t) == "a"
    with pytest.raises(kiln.EncodeError) as ei:
        impl.encode("c", t)
    assert ei.value.code == "TYPE" and "'c' is not one of Literal['a', 'b']" in str(ei.value)
    with pytest.raises(kiln.KilnError) as ei:
        impl.decode(s("c"), t)
    assert (ei.value.code, ei.value.offset) == ("TYPE", 0)
    with pytest.raises(kiln.EncodeError):
        impl.encode(True, Literal[1])                       # a bool is no int literal
    assert impl.decode(i64(1), Literal[1, 2]) == 1


def test_tuples(impl):
    pair = tuple[int, str]
    assert impl.encode((7, "x"), pair) == i64(7) + s("x")
    back = impl.decode(i64(7) + s("x"), pair)
    assert back == (7, "x") and type(back) is tuple
    with pytest.raises(kiln.EncodeError) as ei:
        impl.encode((1, "x", 2), pair)
    assert ei.value.code == "TYPE"
    many = tuple[float, ...]
    buf = struct.pack("<I2d", 2, 0.5, 1.5)
    assert impl.encode((0.5, 1.5), many) == buf
    assert impl.decode(buf, many) == (0.5, 1.5) and type(impl.decode(buf, many)) is tuple
    colors = tuple[Color, ...]
    assert impl.decode(struct.pack("<Iqq", 2, 1, 2), colors) == (Color.RED, Color.GREEN)
    with pytest.raises(kiln.KilnError) as ei:
        impl.decode(struct.pack("<Iqq", 2, 1, 5), colors)
    assert (ei.value.code, ei.value.offset) == ("TYPE", 12)   # the second element


def test_datetimes_are_utc_microseconds(impl):
    when = dt.datetime(2020, 1, 2, 3, 4, 5, 6, tzinfo=UTC)
    us = 1577934245 * 1_000_000 + 6        # 2020-01-02T03:04:05Z is 1577934245 s
    assert impl.encode(when, dt.datetime) == i64(us)
    back = impl.decode(i64(us), dt.datetime)
    assert back == when and back.tzinfo is UTC
    # an aware time in another zone is the same instant
    plus2 = dt.datetime(2020, 1, 2, 5, 4, 5, 6, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    assert impl.encode(plus2, dt.datetime) == i64(us)
    assert impl.decode(i64(-1), dt.datetime) == dt.datetime(1969, 12, 31, 23, 59, 59, 999999,
                                                            tzinfo=UTC)
    with pytest.raises(kiln.EncodeError) as ei:
        impl.encode(dt.datetime(2020, 1, 2), dt.datetime)    # naive: refused
    assert ei.value.code == "TYPE" and "naive" in str(ei.value)
    with pytest.raises(kiln.KilnError) as ei:
        impl.decode(i64(2 ** 63 - 1), dt.datetime)            # past year 9999
    assert (ei.value.code, ei.value.offset) == ("TYPE", 0)


def test_dates_and_timedeltas(impl):
    assert impl.encode(dt.date(1970, 1, 2), dt.date) == i32(1)
    assert impl.encode(dt.date(1969, 12, 31), dt.date) == i32(-1)
    assert impl.decode(i32(18753), dt.date) == dt.date(2021, 5, 6)   # 51 years and 124 days
    with pytest.raises(kiln.EncodeError):
        impl.encode(dt.datetime(2020, 1, 2, tzinfo=UTC), dt.date)   # would lose its time
    with pytest.raises(kiln.KilnError) as ei:
        impl.decode(i32(2 ** 31 - 1), dt.date)
    assert (ei.value.code, ei.value.offset) == ("TYPE", 0)
    span = dt.timedelta(days=1, microseconds=3)
    assert impl.encode(span, dt.timedelta) == i64(86_400_000_003)
    assert impl.decode(i64(-5), dt.timedelta) == dt.timedelta(microseconds=-5)
    with pytest.raises(kiln.EncodeError) as ei:
        impl.encode(dt.timedelta.max, dt.timedelta)          # more microseconds than i64
    assert ei.value.code == "TYPE"


def test_uuid_and_decimal(impl):
    u = uuid.UUID("12345678-1234-5678-1234-567812345678")
    raw = bytes.fromhex("12345678123456781234567812345678")
    assert impl.encode(u, uuid.UUID) == b"\x10\x00\x00\x00" + raw
    assert impl.decode(b"\x10\x00\x00\x00" + raw, uuid.UUID) == u
    with pytest.raises(kiln.KilnError) as ei:
        impl.decode(b"\x0f\x00\x00\x00" + raw[:15], uuid.UUID)
    assert (ei.value.code, ei.value.offset) == ("TYPE", 0)
    with pytest.raises(kiln.EncodeError):
        impl.encode(str(u), uuid.UUID)
    d = decimal.Decimal("1.10")
    assert impl.encode(d, decimal.Decimal) == s("1.10")
    back = impl.decode(s("1.10"), decimal.Decimal)
    assert back == d and str(back) == "1.10"
    assert impl.decode(s("-1E+3"), decimal.Decimal) == decimal.Decimal("-1000")
    for bad in ("abc", " 1", "1_000", ""):
        with pytest.raises(kiln.KilnError) as ei:
            impl.decode(s(bad), decimal.Decimal)
        assert (ei.value.code, ei.value.offset) == ("TYPE", 0)
    with pytest.raises(kiln.EncodeError) as ei:
        impl.encode(0.1, decimal.Decimal)                     # a float is not exact
    assert "Decimal(str(x))" in str(ei.value)


@dataclasses.dataclass
class Event:
    color: Color
    kind: Literal["a", "b"]
    at: dt.datetime
    pair: tuple[int, str]
    id: uuid.UUID
    note: str | None = None


def test_a_dataclass_of_them_in_both_kernels(impl):
    at = dt.datetime(1970, 1, 1, 0, 0, 1, tzinfo=UTC)
    e = Event(Color.RED, "b", at, (3, "p"), uuid.UUID(int=1), "n")
    expected = (i64(1) + s("b") + i64(1_000_000) + i64(3) + s("p")
                + b"\x10\x00\x00\x00" + bytes(15) + b"\x01" + b"\x01" + s("n"))
    assert kiln.struct(Event).text == ("struct{color:i64,kind:str,at:i64,pair:struct{_0:i64,"
                                       "_1:str,},id:list<u8>,note:opt<str>,}")
    assert impl.encode(e, Event) == expected
    assert impl.decode(expected, Event) == e
    assert impl.decode(impl.encode([e, e], list[Event]), list[Event]) == [e, e]
    bad = bytearray(expected)
    bad[8 + 4] = ord("z")                                     # kind: "z"
    with pytest.raises(kiln.KilnError) as ei:
        impl.decode(bytes(bad), Event)
    assert (ei.value.code, ei.value.offset) == ("TYPE", 8)
    with pytest.raises(kiln.EncodeError) as ei:
        impl.encode(dataclasses.replace(e, at=dt.datetime(2000, 1, 1)), Event)
    assert (ei.value.code, ei.value.offset, ei.value.path) == ("TYPE", 13, ".at")


@dataclasses.dataclass
class Union1:
    id: int
    x: int | str


class Union2(NamedTuple):
    y: typing.Union[int, str, None]


def test_no_wire_form_is_a_type_error_naming_the_field(impl):
    for cls, field in ((Union1, "Union1.x"), (Union2, "Union2.y")):
        for build in (kiln.struct, lambda c: impl.encode({}, c), lambda c: impl.decode(b"", c)):
            with pytest.raises(TypeError) as ei:
                build(cls)
            assert not isinstance(ei.value, kiln.KilnError)
            assert str(ei.value).startswith("field %s: " % field)
            assert "union" in str(ei.value)

    @dataclasses.dataclass
    class Outer:
        inner: list[Union1]
    with pytest.raises(TypeError, match=r"^field .*Outer\.inner\.x: int \| str has no wire"):
        kiln.struct(Outer)

    @dataclasses.dataclass
    class BadEnum:
        m: Mixed
    with pytest.raises(TypeError, match=r"^field .*BadEnum\.m: enum Mixed has values that "):
        kiln.struct(BadEnum)

    @dataclasses.dataclass
    class Narrow:
        c: Annotated[Color, kiln.u8]
        big: Annotated[Literal[300], kiln.u8]
    with pytest.raises(TypeError, match=r"^field .*Narrow\.big: Literal value 300 does not "
                                        r"fit u8"):
        kiln.struct(Narrow)
    with pytest.raises(TypeError, match="Annotated cannot change it"):
        kiln.as_type(Annotated[dt.datetime, kiln.i32])
    for bare in (tuple, typing.Tuple):
        with pytest.raises(TypeError, match="bare tuple"):
            kiln.as_type(bare)


def test_classes_defined_in_a_function_with_forward_references(impl):
    @dataclasses.dataclass
    class Leaf:
        when: "dt.date"
        tags: "tuple[Color, ...]"

    @dataclasses.dataclass
    class Tree:
        leaves: "list[Leaf]"
        first: "Optional[Leaf]"

    t = kiln.struct(Tree)
    assert t.text == ("struct{leaves:list<struct{when:i32,tags:list<i64>,}>,"
                      "first:opt<struct{when:i32,tags:list<i64>,}>,}")
    v = Tree([Leaf(dt.date(1970, 1, 3), (Color.GREEN,))], None)
    buf = impl.encode(v, Tree)
    assert buf == struct.pack("<IiIqB", 1, 2, 1, 2, 0)
    assert impl.decode(buf, Tree) == v


def _build_elsewhere(cls):
    return kiln.struct(cls)


def test_an_unresolvable_forward_reference_names_the_field():
    def make():
        @dataclasses.dataclass
        class Hidden:
            x: int

        @dataclasses.dataclass
        class Holder:
            h: "Hidden"
            n: int
        return Holder
    Holder = make()
    with pytest.raises(TypeError, match=r"^field .*Holder\.h: the annotation names Hidden"):
        _build_elsewhere(Holder)


@dataclasses.dataclass
class Stamped:
    c: Color
    at: dt.datetime
    pair: tuple[int, dt.date]
    ids: tuple[uuid.UUID, ...]
    price: decimal.Decimal
    span: dt.timedelta


def test_json_lines_carry_them_as_json_values(api, tmp_path):
    from kiln.records.tools import jsonl_to_records, records_to_jsonl
    src = tmp_path / "a.jsonl"
    src.write_text('{"c": 1, "at": "2020-01-01T00:00:01+00:00", "pair": [2, "1970-01-03"], '
                   '"ids": ["00000000-0000-0000-0000-000000000005"], "price": "2.50", '
                   '"span": 7}\n')
    assert jsonl_to_records(str(src), str(tmp_path / "a.kilnr"), Stamped) == 1
    with kiln.records.RecordFile(str(tmp_path / "a.kilnr"), Stamped) as rf:
        (got,) = list(rf)
    assert got == Stamped(Color.RED, dt.datetime(2020, 1, 1, 0, 0, 1, tzinfo=UTC),
                          (2, dt.date(1970, 1, 3)), (uuid.UUID(int=5),),
                          decimal.Decimal("2.50"), dt.timedelta(microseconds=7))
    assert records_to_jsonl(str(tmp_path / "a.kilnr"), str(tmp_path / "b.jsonl"), Stamped) == 1
    assert (tmp_path / "b.jsonl").read_text() == src.read_text()


class AsRecord(kiln.Record):
    color: Color
    at: dt.date
    pair: tuple[int, int]


class AsTuple(NamedTuple):
    color: Color
    at: dt.date


@dataclasses.dataclass(slots=True)
class AsSlots:
    color: Color
    at: dt.date


@pytest.mark.parametrize("cls, args", [(AsRecord, (Color.GREEN, dt.date(1970, 1, 2), (1, 2))),
                                       (AsTuple, (Color.GREEN, dt.date(1970, 1, 2))),
                                       (AsSlots, (Color.GREEN, dt.date(1970, 1, 2)))])
def test_every_class_kind_builds_the_python_values(impl, cls, args):
    # (the compiled kernel builds these without calling them: the values are converted first)
    v = cls(*args)
    buf = impl.encode(v, cls)
    assert buf[:12] == i64(2) + i32(1)
    back = impl.decode(buf, cls)
    assert back == v and back.color is Color.GREEN and type(back.at) is dt.date
    assert impl.decode(impl.encode([v] * 3, list[cls]), list[cls]) == [v] * 3


def test_a_local_name_does_not_shadow_the_modules_own():
    @dataclasses.dataclass
    class Local:
        x: int

    @dataclasses.dataclass
    class Uses:
        c: "Color"          # the module's enum, though a local below has its name
        local: "Local"

    Color = 5               # noqa: F841  (a local of the building frame)
    assert kiln.struct(Uses).text == "struct{c:i64,local:struct{x:i64,},}"
    assert kiln.struct(Uses).fields[0][1] == kiln.as_type(globals()["Color"])
