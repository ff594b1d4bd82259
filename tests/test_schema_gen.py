"""``kiln gen`` output constructs as a user expects (issue 32, point 5): optional
fields default to None, a field past an optional one is keyword-only where a
required one follows (``dataclasses.KW_ONLY``), wire order is the schema's,
and the module passes pyflakes and ``mypy --strict`` (no unused imports).
Expected texts and values are written here by hand; hashes and bytes are
checked with the reference (spec/reference/kiln_ref.py); both implementations.

pyflakes and mypy are in the [test] extra (pyproject.toml), which the
README's test command (.ci/run) installs, so they run there; the wheel jobs
install neither (pyproject.toml's test-requires) and count the two checks as
skipped, naming the package (.github/workflows/wheels.yml lists them)."""

import dataclasses
import importlib.util
import inspect
import json
import os
import subprocess
import sys

import pytest

import kiln
from kiln import _compat
from kiln.schema import generate
from _util import kiln_ref, mypy_path


@pytest.fixture
def api(impl, monkeypatch):
    monkeypatch.setattr(_compat, "kernels", impl.kernels)
    monkeypatch.setattr(_compat, "IMPLEMENTATION", impl.name)
    return impl


_I = {"type": "integer"}
_S = {"type": "string"}
_F = {"type": "number", "format": "float"}

# name: (schema, canonical text, the required wire names of the root, the root's
#        attribute for each wire name, the positional prefix of the root's __init__)
SCHEMAS = {
    # optional between required ones: the required one after it is keyword-only
    "optional": ({"title": "rec", "type": "object", "required": ["id", "score"],
                  "properties": {"id": _I, "note": _S, "score": _F, "tail": _I}},
                 "struct{id:i64,note:opt<str>,score:f32,tail:opt<i64>,}",
                 {"id": "id", "note": "note", "score": "score", "tail": "tail"},
                 ["id"]),
    # optional ones last only: no marker, every field positional
    "trailing": ({"title": "rec", "type": "object", "required": ["a"],
                  "properties": {"a": _I, "b": _S, "c": _F}},
                 "struct{a:i64,b:opt<str>,c:opt<f32>,}",
                 {"a": "a", "b": "b", "c": "c"}, ["a", "b", "c"]),
    # nested objects and arrays of them, arrays of numbers, maps
    "nested": ({"title": "track", "type": "object", "required": ["points", "ids", "meta"],
                "$defs": {"point": {"type": "object", "required": ["x"],
                                    "properties": {"x": _F, "label": _S, "y": _F}}},
                "properties": {"first": {"$ref": "#/$defs/point"},
                               "points": {"type": "array", "items": {"$ref": "#/$defs/point"}},
                               "ids": {"type": "array", "items": _I},
                               "blob": {"type": "string", "format": "binary"},
                               "meta": {"type": "object", "additionalProperties":
                                        {"type": "array", "items": _F}}}},
               "struct{first:opt<struct{x:f32,label:opt<str>,y:opt<f32>,}>,"
               "points:list<struct{x:f32,label:opt<str>,y:opt<f32>,}>,ids:list<i64>,"
               "blob:opt<list<u8>>,meta:dict<str,list<f32>>,}",
               {"first": "first", "points": "points", "ids": "ids", "blob": "blob",
                "meta": "meta"}, []),
    # keywords and names the module uses, optional and required, out of order
    "keywords": ({"title": "class", "type": "object", "required": ["if", "None", "int"],
                  "properties": {"class": _S, "if": {"type": "boolean"}, "lambda": _I,
                                 "None": {"type": "array", "items": _S}, "int": _I,
                                 "Optional": _S, "_": _I}},
                 "struct{class:opt<str>,if:bool,lambda:opt<i64>,None:list<str>,int:i64,"
                 "Optional:opt<str>,_:opt<i64>,}",
                 {"class": "class_", "if": "if_", "lambda": "lambda_", "None": "None_",
                  "int": "int_", "Optional": "Optional_", "_": "_"}, []),
    # every property optional (required absent would make them all required)
    "all-optional": ({"title": "o", "type": "object", "required": [],
                      "properties": {"a": _I, "b": {"type": "array", "items": _I}}},
                     "struct{a:opt<i64>,b:opt<list<i64>>,}", {"a": "a", "b": "b"},
                     ["a", "b"]),
    # nothing optional: no Optional to import (pyflakes would call it unused)
    "plain": ({"title": "plain", "type": "object",
               "properties": {"x": _I, "tags": {"type": "array", "items": _S}}},
              "struct{x:i64,tags:list<str>,}", {"x": "x", "tags": "tags"}, ["x", "tags"]),
}

# a value of each root with only the required fields given, as the reference
# decodes it (wire names; absent optional fields None), written by hand
REQUIRED_ONLY = {
    "optional": ({"id": 7, "score": 0.5},
                 {"id": 7, "note": None, "score": 0.5, "tail": None}),
    "trailing": ({"a": -1}, {"a": -1, "b": None, "c": None}),
    "nested": ({"points": [], "ids": [1, 2], "meta": {"m": [0.25]}},
               {"first": None, "points": [], "ids": [1, 2], "blob": None,
                "meta": {"m": [0.25]}}),
    "keywords": ({"if": True, "None": ["n"], "int": 3},
                 {"class": None, "if": True, "lambda": None, "None": ["n"], "int": 3,
                  "Optional": None, "_": None}),
    "all-optional": ({}, {"a": None, "b": None}),
    "plain": ({"x": 1, "tags": ["t"]}, {"x": 1, "tags": ["t"]}),
}


def _load(path, name):
    spec = importlib.util.spec_from_file_location(name, str(path))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    """Each schema through ``kiln gen`` (the command), written and imported."""
    d = tmp_path_factory.mktemp("gen")
    mods = {}
    for case, (doc, *_rest) in SCHEMAS.items():
        name = "gen_" + case.replace("-", "_")
        schema = d / (name + ".json")
        schema.write_text(json.dumps(doc))
        r = subprocess.run([sys.executable, "-m", "kiln", "gen", str(schema), "-o",
                            str(d / (name + ".py"))], capture_output=True, text=True,
                           timeout=120)
        assert r.returncode == 0, r.stderr
        mods[case] = _load(d / (name + ".py"), name)
    return d, mods


@pytest.mark.parametrize("case", sorted(SCHEMAS))
def test_generated_classes_construct_from_the_required_fields(api, generated, case):
    doc, text, attrs, positional = SCHEMAS[case]
    mod = generated[1][case]
    root = mod.ROOT
    given, want = REQUIRED_ONLY[case]
    rec = root(**{attrs[w]: v for w, v in given.items()})
    # optional fields default to None
    for w in want:
        if w not in given:
            assert getattr(rec, attrs[w]) is None
    # the positional prefix is the wire order's; the rest is keyword-only
    params = list(inspect.signature(root).parameters.values())
    assert [p.name for p in params if p.kind is p.POSITIONAL_OR_KEYWORD] == positional
    assert [f.name for f in dataclasses.fields(root)] == [attrs[w] for w in want]
    # the class binds the schema's type: the same text and hash as the reference's
    assert kiln.struct(root).text == text == kiln.schema_from_json(doc).text
    assert kiln.struct(root).schema_hash == kiln_ref.schema_hash(text)
    assert kiln.schema_from_json(doc).schema_hash == kiln_ref.schema_hash(text)
    buf = kiln.encode(rec, root, frame=True)
    assert kiln_ref.decode(buf, text, True) == want
    back = kiln.decode(buf, root, frame=True)
    assert back == rec


def test_nested_optional_classes_and_positional_calls(api, generated):
    mod = generated[1]["nested"]
    point = mod.TYPES["Point"].cls
    p = point(0.5, y=2.0)                      # optional fields last: all positional
    assert (p.x, p.label, p.y) == (0.5, None, 2.0)
    assert point(0.5, "a", 1.0).label == "a"
    with pytest.raises(TypeError):             # score follows an optional field: by name
        generated[1]["optional"].ROOT(7, None, 0.5)
    rec = mod.ROOT(points=[p], ids=[], meta={}, first=point(1.0), blob=b"\x01")
    buf = kiln.encode(rec, mod.ROOT)
    assert kiln_ref.decode(buf, SCHEMAS["nested"][1], False) == {
        "first": {"x": 1.0, "label": None, "y": None},
        "points": [{"x": 0.5, "label": None, "y": 2.0}], "ids": [], "blob": b"\x01",
        "meta": {}}
    back = kiln.decode(buf, mod.ROOT)
    assert back == rec and back.ids == [] and isinstance(back.points[0], point)


def _source_files(d):
    return sorted(str(p) for p in d.glob("gen_*.py"))


def test_generated_modules_pass_pyflakes(generated):
    pytest.importorskip("pyflakes")   # the [test] extra
    d, _ = generated
    r = subprocess.run([sys.executable, "-m", "pyflakes"] + _source_files(d),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout == "", r.stdout + r.stderr


def test_generated_modules_and_their_use_pass_mypy_strict(generated, mypy_cache):
    pytest.importorskip("mypy")   # the [test] extra
    d, _ = generated
    use = d / "use_generated.py"
    use.write_text(
        "import gen_optional, gen_nested, gen_keywords, gen_all_optional\n\n"
        "a = gen_optional.Rec(7, score=0.5)\n"
        "b = gen_nested.Track(points=[gen_nested.Point(0.5)], ids=[1], meta={})\n"
        "c = gen_keywords.Class(if_=True, None_=['n'], int_=3)\n"
        "e = gen_all_optional.O()\n"
        "n: int = a.id\n"
        "s: list[int] = b.ids\n")
    bad = d / "misuse_generated.py"
    bad.write_text("import gen_optional\n\n"
                   "a = gen_optional.Rec(7, None, 0.5)\n")   # score is keyword-only
    env = dict(os.environ, MYPYPATH=mypy_path(d))
    cmd = [sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent",
           "--cache-dir", str(mypy_cache)]
    r = subprocess.run(cmd + _source_files(d) + [str(use)], capture_output=True, text=True,
                       env=env, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    r = subprocess.run(cmd + [str(bad)], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 1 and "misuse_generated.py:3: error" in r.stdout, r.stdout


def test_only_used_names_are_imported():
    src = generate({"title": "p", "type": "object", "properties": {"x": _I}})
    assert "Optional" not in src
    src = generate({"title": "p", "type": "object", "required": [],
                    "properties": {"x": _I}})
    assert "from typing import Optional\n" in src
