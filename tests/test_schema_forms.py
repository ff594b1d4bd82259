"""One rule for a type's equality and its Python values (issue 32, point 5):
two types are equal exactly when they have the same canonical text (so the
same bytes and schema hash) and decode to the same Python values.  A type
read from a JSON Schema is the one its text parses to, unless ``arrays=``
asks for another Python form.  Expected values are written here by hand
and the bytes decoded by the reference (spec/reference/kiln_ref.py); both
implementations."""

import itertools

import numpy as np
import pytest

import kiln
from kiln import _compat
from _util import kiln_ref


@pytest.fixture
def api(impl, monkeypatch):
    monkeypatch.setattr(_compat, "kernels", impl.kernels)
    monkeypatch.setattr(_compat, "IMPLEMENTATION", impl.name)
    return impl


_I64S = {"type": "array", "items": {"type": "integer"}}
_U8S = {"type": "array", "items": {"type": "integer", "format": "uint8"}}
_F32S = {"type": "array", "items": {"type": "number", "format": "float"}}

# (schema, its canonical text, a value, what the type text decodes it to: the
#  Python class of each leaf container, written by hand)
CASES = [
    (_I64S, "list<i64>", [1, -2], np.ndarray),
    (_U8S, "list<u8>", [1, 255], bytes),
    (_F32S, "list<f32>", [0.5], np.ndarray),
    ({"type": "array", "items": _I64S}, "list<list<i64>>", [[1], []], [np.ndarray]),
    ({"type": "object", "required": ["a"], "properties": {"a": _I64S, "b": _U8S}},
     "struct{a:list<i64>,b:opt<list<u8>>,}", {"a": [3], "b": [4]},
     {"a": np.ndarray, "b": bytes}),
    ({"type": "object", "additionalProperties": _F32S}, "dict<str,list<f32>>",
     {"k": [1.5]}, {"k": np.ndarray}),
    ({"type": "string", "format": "binary"}, "list<u8>", b"\x01", bytes),
]


def _classes(v):
    """The Python class of each container in a decoded value, as CASES writes them."""
    if isinstance(v, dict):
        return {k: _classes(x) for k, x in v.items()}
    if isinstance(v, list) and v and isinstance(v[0], (list, np.ndarray, bytes)):
        return [_classes(v[0])]
    return type(v)


def _plain(v):
    """A decoded value with ndarrays and bytes as lists (the reference's values)."""
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, bytes):
        return list(v)
    return v


@pytest.mark.parametrize("doc,text,value,classes", CASES, ids=[c[1] for c in CASES])
def test_a_schema_type_is_its_text(api, doc, text, value, classes):
    from_schema = kiln.schema_from_json(doc)
    from_text = kiln.parse_type(text)
    assert from_schema == from_text and hash(from_schema) == hash(from_text)
    assert from_schema.schema_hash == from_text.schema_hash == kiln_ref.schema_hash(text)
    buf = kiln.encode(value, from_text)
    assert kiln.encode(value, from_schema) == buf
    want = kiln_ref.decode(buf, text, False)
    a, b = kiln.decode(buf, from_schema), kiln.decode(buf, from_text)
    assert _classes(a) == _classes(b) == classes
    assert _plain(a) == _plain(b) == _plain(want)


@pytest.mark.parametrize("doc,text,value,classes", CASES[:6], ids=[c[1] for c in CASES[:6]])
def test_arrays_list_asks_for_python_lists_and_is_another_type(api, doc, text, value,
                                                              classes):
    lists = kiln.schema_from_json(doc, arrays="list")
    from_text = kiln.parse_type(text)
    # another Python value: not equal, though the bytes and the hash are the same
    assert lists != from_text and lists.text == text
    assert lists.schema_hash == from_text.schema_hash
    buf = kiln.encode(value, from_text)
    assert kiln.encode(value, lists) == buf
    got = kiln.decode(buf, lists)
    assert got == _plain(kiln_ref.decode(buf, text, False))   # lists all the way down
    assert "ndarray" not in repr(_classes(got)) and "bytes" not in repr(_classes(got))


def test_binary_strings_stay_bytes_and_bad_forms_are_refused(api):
    binary = {"type": "string", "format": "binary"}
    for arrays in (None, "list", "ndarray"):
        t = kiln.schema_from_json(binary, arrays=arrays)
        assert t == kiln.bytes_ and kiln.decode(b"\x01\x00\x00\x00\x07", t) == b"\x07"
    t = kiln.schema_from_json(_U8S, arrays="ndarray")
    assert t == kiln.list_(kiln.u8) and t != kiln.bytes_
    assert isinstance(kiln.decode(b"\x01\x00\x00\x00\x07", t), np.ndarray)
    with pytest.raises(ValueError, match="arrays"):
        kiln.schema_from_json(_I64S, arrays="tuple")


def test_equality_is_the_text_and_the_python_values_for_every_route(api):
    """Types of list<i64> and list<u8> built every way kiln builds them: equal
    exactly when the text and the decoded Python values are the same."""
    routes = {
        "text i64": kiln.parse_type("list<i64>"),
        "schema i64": kiln.schema_from_json(_I64S),
        "schema i64 lists": kiln.schema_from_json(_I64S, arrays="list"),
        "schema i64 ndarray": kiln.schema_from_json(_I64S, arrays="ndarray"),
        "list_ i64": kiln.list_(kiln.i64),
        "list[int]": kiln.as_type(list[int]),
        "I64Array": kiln.as_type(kiln.I64Array),
        "text u8": kiln.parse_type("list<u8>"),
        "schema u8": kiln.schema_from_json(_U8S),
        "schema binary": kiln.schema_from_json({"type": "string", "format": "binary"}),
        "schema u8 lists": kiln.schema_from_json(_U8S, arrays="list"),
        "list_ u8": kiln.list_(kiln.u8),
        "bytes": kiln.as_type(bytes),
        "list[U8]": kiln.as_type(list[kiln.U8]),
    }
    values = {}
    for name, t in routes.items():
        buf = kiln.encode([1, 2], t)
        assert _plain(kiln_ref.decode(buf, t.text, False)) == [1, 2]
        got = kiln.decode(buf, t)
        values[name] = (t.text, type(got))
    for (n1, t1), (n2, t2) in itertools.combinations(routes.items(), 2):
        same = values[n1] == values[n2]
        assert (t1 == t2) is same, (n1, n2, values[n1], values[n2])
        assert (repr(t1) == repr(t2)) is same, (n1, n2)   # unequal types look unequal
        if same:
            assert hash(t1) == hash(t2)


def test_kiln_convert_with_a_schema_keeps_json_arrays(tmp_path):
    """``kiln convert --schema``: a JSON Schema's arrays stay JSON arrays both
    ways (a uint8 array is not turned into base64 text)."""
    import json
    import subprocess
    import sys
    schema = {"type": "object", "properties": {"b": _U8S, "n": _I64S}}
    (tmp_path / "s.json").write_text(json.dumps(schema))
    (tmp_path / "d.jsonl").write_text('{"b": [1, 255], "n": [3]}\n')
    for src, dst in (("d.jsonl", "d.kilnr"), ("d.kilnr", "back.jsonl")):
        r = subprocess.run([sys.executable, "-m", "kiln", "convert", src, dst, "--schema",
                            "s.json"], cwd=str(tmp_path), capture_output=True, text=True,
                           timeout=120)
        assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "back.jsonl").read_text()) == {"b": [1, 255], "n": [3]}


def test_to_json_schema_reads_back_as_the_text(api):
    """to_json_schema writes the wire type: reading it back gives the type its
    text parses to, whatever Python form the written type had."""
    import dataclasses
    from typing import Optional

    @dataclasses.dataclass
    class Rec:
        a: list[int]
        b: bytes
        c: list[kiln.U8]
        d: kiln.U8Array
        e: Optional[dict[str, list[float]]] = None

    for t in (kiln.as_type(Rec), kiln.list_(kiln.u8), kiln.as_type(list[kiln.U8]),
              kiln.parse_type("struct{a:list<u8>,b:opt<list<f32>>,}")):
        back = kiln.schema_from_json(kiln.to_json_schema(t))
        assert back == kiln.parse_type(t.text)
        assert back.schema_hash == kiln_ref.schema_hash(t.text)
