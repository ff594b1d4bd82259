"""Type model: canonical text, schema hash, minimum sizes, depth, class binding."""

import dataclasses
import typing
from typing import Annotated, NamedTuple, Optional

import numpy as np
import numpy.typing as npt
import pytest

import kiln
from _util import kiln_ref


TEXTS = [
    "bool", "i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64", "int", "uint", "f32", "f64",
    "str", "tensors", "list<u8>", "list<f32>", "opt<str>", "dict<str,i32>", "struct{}",
    "struct{id:i64,batch:tensors,}", "list<struct{a:opt<list<str>>,b:dict<str,f64>,}>",
]


@pytest.mark.parametrize("text", TEXTS)
def test_text_round_trip_and_hash_matches_reference(text):
    t = kiln.parse_type(text)
    assert t.text == text
    assert "".join(t.tokens) == text
    assert t.schema_hash == kiln_ref.schema_hash(text)
    assert kiln.parse_type(t.text) == t


def test_known_hash():
    assert kiln.parse_type("struct{id:i64,batch:tensors,}").schema_hash == 0xE58AADC7552F0D82
    # int and i64 are distinct tokens with the same width
    assert kiln.int_.min_size == kiln.i64.min_size == 8
    assert kiln.int_.schema_hash != kiln.i64.schema_hash


@pytest.mark.parametrize("text,size", [
    ("bool", 1), ("i8", 1), ("u8", 1), ("i16", 2), ("u16", 2), ("i32", 4), ("u32", 4),
    ("f32", 4), ("i64", 8), ("u64", 8), ("int", 8), ("uint", 8), ("f64", 8), ("str", 4),
    ("list<u8>", 4), ("opt<f64>", 1), ("list<f64>", 4), ("dict<str,f64>", 4), ("tensors", 64),
    ("struct{}", 0), ("struct{a:i64,b:str,c:opt<i8>,d:tensors,}", 8 + 4 + 1 + 64),
])
def test_min_sizes(text, size):
    assert kiln.parse_type(text).min_size == size


def test_constructors_build_the_same_types():
    t = kiln.struct([("id", kiln.i64), ("tags", kiln.list_(kiln.i32)),
                     ("m", kiln.dict_(kiln.opt(kiln.str_))), ("b", kiln.bytes_),
                     ("t", kiln.tensors)])
    assert t.text == "struct{id:i64,tags:list<i32>,m:dict<str,opt<str>>,b:list<u8>,t:tensors,}"
    assert t == kiln.parse_type(t.text)


@pytest.mark.parametrize("bad", [
    "", "i33", "list<i32", "list<i32>>", "struct{a:i32 b:i8}", "struct{1a:i32,}",
    "dict<i32,i8>", "struct{a:i32,a:i8,}", "li st<i32>", "list<i 32>", "opt<>", "struct{a:,}",
    "struct{a:i32,,}",
])
def test_bad_text_is_type_error(bad):
    with pytest.raises(kiln.KilnError) as ei:
        kiln.parse_type(bad)
    assert ei.value.code == "TYPE"
    assert isinstance(ei.value, ValueError)


@pytest.mark.parametrize("wrap", [("list<", ">"), ("opt<", ">"), ("dict<str,", ">"),
                                  ("struct{f:", ",}")])
def test_depth_64_ok_65_rejected_on_every_container(wrap):
    def nest(n):
        return wrap[0] * n + "i32" + wrap[1] * n
    assert kiln.parse_type(nest(64)).depth == 64
    with pytest.raises(kiln.KilnError) as ei:
        kiln.parse_type(nest(65))
    assert ei.value.code == "DEPTH"
    with pytest.raises(kiln.KilnError) as ei:
        kiln.parse_type(nest(100_000))
    assert ei.value.code == "DEPTH"


def test_depth_by_constructors():
    t = kiln.i32
    for _ in range(64):
        t = kiln.list_(t)
    with pytest.raises(kiln.KilnError) as ei:
        kiln.opt(t)
    assert ei.value.code == "DEPTH"


@dataclasses.dataclass
class Inner:
    x: kiln.f32
    y: Annotated[int, kiln.i16]


@dataclasses.dataclass
class Record:
    id: int
    score: float
    name: str
    raw: bytes
    ok: bool
    tags: list[int]
    maybe: Optional[str]
    attrs: dict[str, float]
    inner: Inner
    arr: npt.NDArray[np.float32]
    arr2: Annotated[np.ndarray, kiln.u16]
    batch: kiln.TensorDirectory
    also: "int | None" = None


class Point(NamedTuple):
    x: int
    y: kiln.i8


def test_dataclass_mapping():
    t = kiln.struct(Record)
    assert t.text == (
        "struct{id:i64,score:f64,name:str,raw:list<u8>,ok:bool,tags:list<i64>,maybe:opt<str>,"
        "attrs:dict<str,f64>,inner:struct{x:f32,y:i16,},arr:list<f32>,arr2:list<u16>,"
        "batch:tensors,also:opt<i64>,}")
    assert kiln.as_type(Record) is t
    assert kiln.struct(Point).text == "struct{x:i64,y:i8,}"


@dataclasses.dataclass
class Node:
    value: int
    next: Optional["Node"]


def test_self_reference_is_a_type_error_naming_the_field():
    # (issue 40 item 1: no wire form is a TypeError at struct time, not DEPTH at byte 0)
    with pytest.raises(TypeError, match=r"^field Node\.next: class Node contains itself") as ei:
        kiln.struct(Node)
    assert not isinstance(ei.value, kiln.KilnError)


def test_unmappable_annotation():
    @dataclasses.dataclass
    class Bad:
        x: complex
    with pytest.raises(TypeError, match=r"^field .*Bad\.x: complex has no Kiln wire form: use "
                                        r"tuple\[float, float\]") as ei:
        kiln.struct(Bad)
    assert not isinstance(ei.value, kiln.KilnError)
    with pytest.raises(TypeError, match="only T | None") as ei:
        kiln.as_type(typing.Union[int, str])
    assert not isinstance(ei.value, kiln.KilnError)
