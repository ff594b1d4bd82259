"""JSON Schema in and out, and the dataclass generator; both implementations."""

import importlib.util
import json
import keyword
import os
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import kiln

from _util import mypy_path
from kiln.schema import generate

jsonschema = pytest.importorskip("jsonschema")   # a test dependency (the [test] extra)

DOC = {
    "title": "reading", "type": "object",
    "$defs": {"Point": {"type": "object", "description": "ignored",
                        "properties": {"x": {"type": "number", "format": "float"},
                                       "y": {"type": "number"}}}},
    "properties": {
        "id": {"type": "integer", "format": "int32"}, "name": {"type": "string"},
        "blob": {"type": "string", "format": "binary"},
        "tags": {"type": "array", "items": {"type": "integer", "format": "uint8"}},
        "where": {"$ref": "#/$defs/Point"}, "path": {"type": "array",
                                                     "items": {"$ref": "#/$defs/Point"}},
        "attrs": {"type": "object", "additionalProperties": {"type": "boolean"}},
        "note": {"type": "string"}, "big": {"type": "integer"},
    },
    "required": ["id", "name", "blob", "tags", "where", "path", "attrs", "big"],
}
TEXT = ("struct{id:i32,name:str,blob:list<u8>,tags:list<u8>,where:struct{x:f32,y:f64,},"
        "path:list<struct{x:f32,y:f64,}>,attrs:dict<str,bool>,note:opt<str>,big:i64,}")
VALUE = {"id": 1, "name": "a", "blob": b"\x00\x01", "tags": [1, 2, 255],
         "where": {"x": 0.5, "y": 1.0}, "path": [{"x": 1.5, "y": -2.0}],
         "attrs": {"k": True}, "note": None, "big": -(2 ** 63)}


def _jsonable(v):
    """A decoded value as JSON holds it: an absent optional is a missing key, and
    binary strings (which JSON has no form for) become hex text."""
    if isinstance(v, dict):
        return {k: _jsonable(x) for k, x in v.items() if x is not None}
    if isinstance(v, list):
        return [_jsonable(x) for x in v]
    if isinstance(v, bytes):
        return v.hex()
    return v


def test_the_subset_maps_as_documented(api):
    t = kiln.schema_from_json(DOC)
    assert t.text == TEXT
    assert kiln.schema_from_json(json.dumps(DOC)).schema_hash == t.schema_hash
    v = kiln.decode(kiln.encode(VALUE, t), t)
    # the type text's values: an array of uint8 is bytes, as list<u8> is
    assert v == dict(VALUE, tags=bytes(VALUE["tags"])) and isinstance(v["tags"], bytes)
    lists = kiln.schema_from_json(DOC, arrays="list")   # or JSON's: plain dicts and lists
    v = kiln.decode(kiln.encode(VALUE, lists), lists)
    assert v == VALUE and isinstance(v["tags"], list)
    doc = dict(DOC)
    doc["properties"] = dict(DOC["properties"], blob={"type": "string"})
    jsonschema.validate(_jsonable(v), doc)


def test_no_required_means_all_present():
    t = kiln.schema_from_json({"type": "object", "properties": {"a": {"type": "boolean"}}})
    assert t.text == "struct{a:bool,}"


def test_to_json_schema_round_trips_and_validates(api):
    t = kiln.schema_from_json(DOC)
    assert kiln.schema_from_json(kiln.to_json_schema(t)) == t
    t = kiln.schema_from_json(DOC, arrays="list")     # tags: an array of uint8, not binary
    out = kiln.to_json_schema(t)
    assert kiln.schema_from_json(out).text == t.text
    assert kiln.schema_from_json(out, arrays="list") == t
    v = kiln.decode(kiln.encode(VALUE, t), t)
    out["properties"]["blob"] = {"type": "string"}   # binary aside
    jsonschema.validate(_jsonable(v), out)
    for text in ("list<opt<i32>>", "tensors", "struct{a:opt<opt<i8>>,}", "opt<str>"):
        with pytest.raises(kiln.SchemaError):
            kiln.to_json_schema(text)


@pytest.mark.parametrize("doc,pointer,words", [
    ({"type": "object", "properties": {"a": {"type": "string", "enum": ["x"]}}},
     "#/properties/a", "keyword 'enum'"),
    ({"type": ["string", "null"]}, "#", "outside the subset"),
    ({"$defs": {"A": {"type": "array", "items": {"$ref": "#/$defs/A"}}}, "$ref": "#/$defs/A"},
     "#/$defs/A/items/$ref", "recursive"),
    ({"type": "integer", "format": "int128"}, "#/format", "int128"),
    ({"type": "object", "properties": {"a-b": {"type": "string"}}}, "#/properties/a-b",
     "not an identifier"),
    ({"$ref": "http://example.com/x"}, "#/$ref", "not #/$defs"),
    ({"type": "array"}, "#", "needs items"),
    ({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["b"]},
     "#/required", "required must list"),
])
def test_outside_the_subset_is_a_schema_error_naming_the_node(doc, pointer, words):
    with pytest.raises(kiln.SchemaError) as ei:
        kiln.schema_from_json(doc)
    assert ei.value.pointer == pointer and words in str(ei.value)
    assert isinstance(ei.value, ValueError)


def test_deep_and_huge_documents():
    deep = {"type": "boolean"}
    for _ in range(70):
        deep = {"type": "array", "items": deep}
    with pytest.raises(kiln.KilnError) as ei:
        kiln.schema_from_json(deep)
    assert ei.value.code == "DEPTH"
    wide = {"type": "object", "properties": {"f%d" % i: {"type": "integer"}
                                             for i in range(20000)}}
    assert kiln.schema_from_json(wide).text.count("i64") == 20000


def _load_module(path):
    spec = importlib.util.spec_from_file_location("generated_%d" % id(path), path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_kiln_gen_writes_dataclasses_with_the_same_types(api, tmp_path, mypy_cache):
    schema = tmp_path / "reading.json"
    schema.write_text(json.dumps(DOC))
    out = tmp_path / "records.py"
    r = subprocess.run([sys.executable, "-m", "kiln", "gen", str(schema), "-o", str(out)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    mod = _load_module(str(out))
    assert mod.ROOT.__name__ == "Reading"
    assert kiln.struct(mod.ROOT).text == TEXT
    assert kiln.struct(mod.ROOT).schema_hash == kiln.schema_from_json(DOC).schema_hash
    assert kiln.struct(mod.Point).text == "struct{x:f32,y:f64,}"
    # note is optional and big follows it: big is keyword-only, note defaults to None
    rec = mod.Reading(1, "a", b"\x00", [1, 2], mod.Point(0.5, 1.0), [], {"k": True}, big=7)
    assert rec.note is None
    assert kiln.decode(kiln.encode(rec, mod.Reading), mod.Reading) == rec
    env = dict(os.environ, MYPYPATH=mypy_path())
    r = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent",
                        "--cache-dir", str(mypy_cache), str(out)],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stdout


def test_keywords_become_other_attributes_with_the_wire_name_kept():
    doc = {"type": "object", "properties": {"if": {"type": "boolean"}}}
    assert kiln.schema_from_json(doc).text == "struct{if:bool,}"   # a Kiln field may be
    ns = {}
    exec(generate(doc), ns)
    assert kiln.struct(ns["ROOT"]).text == "struct{if:bool,}"
    assert ns["ROOT"](True).if_ is True


def test_kiln_gen_errors_are_one_line(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"type": "object", "properties": {"a": {"type": "null"}}}))
    r = subprocess.run([sys.executable, "-m", "kiln", "gen", str(bad)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1
    assert "#/properties/a" in r.stderr


# --- generated schemas ---------------------------------------------------------------

_leaf = st.sampled_from([{"type": "boolean"}, {"type": "integer"}, {"type": "string"},
                         {"type": "number"}, {"type": "number", "format": "float"},
                         {"type": "string", "format": "binary"}]
                        + [{"type": "integer", "format": f} for f in
                           ("int8", "int16", "int32", "uint8", "uint16", "uint32", "uint64")])
_names = st.from_regex(r"[a-z][a-z0-9_]{0,5}", fullmatch=True).filter(
    lambda n: not keyword.iskeyword(n))   # keywords: tests/test_schema_names.py


def _objects(children):
    return st.dictionaries(_names, children, min_size=1, max_size=4).flatmap(
        lambda props: st.lists(st.sampled_from(sorted(props)), unique=True).map(
            lambda req: {"type": "object", "properties": props, "required": req}))


_schemas = st.recursive(_leaf, lambda c: st.one_of(
    st.builds(lambda s: {"type": "array", "items": s}, c),
    st.builds(lambda s: {"type": "object", "additionalProperties": s}, c),
    _objects(c)), max_leaves=8)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(props=st.dictionaries(_names, _schemas, min_size=1, max_size=4))
def test_generated_schemas_agree_everywhere(tmp_path_factory, props):
    doc = {"title": "root", "type": "object", "properties": props}
    t = kiln.schema_from_json(doc)
    assert kiln.schema_from_json(kiln.to_json_schema(t)).text == t.text
    path = tmp_path_factory.mktemp("gen") / "m.py"
    path.write_text(generate(doc))
    mod = _load_module(str(path))
    assert kiln.struct(mod.ROOT).text == t.text
    assert kiln.struct(mod.ROOT).schema_hash == t.schema_hash
    lists = kiln.schema_from_json(doc, arrays="list")
    v = _sample(lists)
    assert kiln.decode(kiln.encode(v, lists), lists) == v


def _sample(t):
    """A value of a type read from the subset (every kind of node filled)."""
    from kiln import _types as T
    if isinstance(t, T.Scalar):
        return True if t.text == "bool" else (0.5 if t.text[0] == "f" else 1)
    if isinstance(t, T.Str):
        return "s"
    if isinstance(t, T.List):
        return b"x" if t.text == "list<u8>" and t.form is None else [_sample(t.elem)]
    if isinstance(t, T.Dict):
        return {"k": _sample(t.value)}
    if isinstance(t, T.Opt):
        return None
    return {name: _sample(ft) for name, ft in t.fields}


def test_reused_definitions_cannot_explode():
    defs = {"d%d" % i: {"type": "object", "properties": {
        "a": {"$ref": "#/$defs/d%d" % (i + 1)}, "b": {"$ref": "#/$defs/d%d" % (i + 1)}}}
        for i in range(28)}
    defs["d28"] = {"type": "boolean"}
    with pytest.raises(kiln.KilnError) as ei:   # 2**28 fields: refused, not built
        kiln.schema_from_json({"$defs": defs, "$ref": "#/$defs/d0"})
    assert ei.value.code == "LIMIT"


def test_long_ref_chains_and_odd_values():
    defs = {"d%d" % i: {"$ref": "#/$defs/d%d" % (i + 1)} for i in range(2000)}
    defs["d2000"] = {"type": "boolean"}
    with pytest.raises(kiln.KilnError) as ei:
        kiln.schema_from_json({"$defs": defs, "$ref": "#/$defs/d0"})
    assert ei.value.code == "DEPTH"
    with pytest.raises(kiln.SchemaError, match="format must be a string"):
        kiln.schema_from_json({"type": "integer", "format": []})
    src = generate({"title": 5, "type": "object", "$defs": {
        "Optional": {"type": "object", "properties": {"x": {"type": "integer"}}}},
        "properties": {"o": {"$ref": "#/$defs/Optional"}, "n": {"type": "string"}},
        "required": ["o"]})
    ns = {}
    exec(compile(src, "generated", "exec"), ns)
    assert kiln.struct(ns["ROOT"]).text == "struct{o:struct{x:i64,},n:opt<str>,}"
