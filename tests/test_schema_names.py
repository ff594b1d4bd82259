"""``kiln gen`` names (issue 26, point 5): generated classes and attributes are
unique, unmangled Python names, the wire names stay the schema's, and the
generated module's types hash as ``kiln.schema_from_json`` of the same
document; both implementations.  The expected canonical texts are written
here by hand and hashed by the reference (spec/reference/kiln_ref.py)."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

import kiln
from kiln.schema import generate
from _util import kiln_ref, mypy_path


def _obj(**props):
    return {"type": "object", "properties": props}


_I = {"type": "integer"}
_S = {"type": "string"}
_B = {"type": "boolean"}

# (document, canonical text of the root, written by hand)
DOCS = {
    # a, A and A2 all sanitize towards "A" / "A2": three distinct classes
    "collisions": ({"type": "object", "title": "rec",
                    "$defs": {"a": _obj(x=_I), "A": _obj(y={"type": "number"}),
                              "A2": _obj(z=_S)},
                    "properties": {"p": {"$ref": "#/$defs/a"}, "q": {"$ref": "#/$defs/A"},
                                   "r": {"$ref": "#/$defs/A2"}}},
                   "struct{p:struct{x:i64,},q:struct{y:f64,},r:struct{z:str,},}"),
    # names Python would mangle inside a class body, and dunders a class relies on
    "dunders": ({"type": "object", "title": "Rec",
                 "properties": {"__id": _I, "__init__": _S, "__class__": _B, "__dict__": _I,
                                "_x": _I, "id_": _S, "__": _B}},
                "struct{__id:i64,__init__:str,__class__:bool,__dict__:i64,_x:i64,id_:str,"
                "__:bool,}"),
    "keywords": ({"type": "object", "title": "class",
                  "$defs": {"None": _obj(v=_I), "if": _obj(w=_I)},
                  "properties": {"class": _S, "if": _B, "None": {"$ref": "#/$defs/None"},
                                 "lambda": {"$ref": "#/$defs/if"}, "class_": _I,
                                 "match": _I, "type": _S}},
                 "struct{class:str,if:bool,None:struct{v:i64,},lambda:struct{w:i64,},"
                 "class_:i64,match:i64,type:str,}"),
    "non-identifiers": ({"type": "object", "title": "my record!",
                         "$defs": {"my-def": _obj(a=_I), "1st": _obj(b=_I), "\u00fc": _obj(c=_I),
                                   "a b": _obj(d=_I), "": _obj(e=_I)},
                         "properties": {"m": {"$ref": "#/$defs/my-def"},
                                        "f": {"$ref": "#/$defs/1st"},
                                        "u": {"$ref": "#/$defs/\u00fc"},
                                        "s": {"$ref": "#/$defs/a b"},
                                        "e": {"$ref": "#/$defs/"}}},
                        "struct{m:struct{a:i64,},f:struct{b:i64,},u:struct{c:i64,},"
                        "s:struct{d:i64,},e:struct{e:i64,},}"),
    "case": ({"type": "object", "title": "root",
              "$defs": {"point": _obj(x=_I), "Point": _obj(y=_I), "POINT": _obj(z=_I)},
              "properties": {"a": _I, "A": _S, "point": {"$ref": "#/$defs/point"},
                             "Point": {"$ref": "#/$defs/Point"},
                             "POINT": {"$ref": "#/$defs/POINT"}}},
             "struct{a:i64,A:str,point:struct{x:i64,},Point:struct{y:i64,},"
             "POINT:struct{z:i64,},}"),
    # names the module binds or its annotations name (imports, builtins, ROOT/TYPES)
    "module-names": ({"type": "object", "title": "Optional",
                      "$defs": {"kiln": _obj(int=_I), "dataclasses": _obj(str=_S),
                                "ROOT": _obj(bool=_B), "TYPES": _obj(float={"type": "number"})},
                      "properties": {"int": _I, "str": _S, "float": {"type": "number"},
                                     "bool": _B, "bytes": {"type": "string", "format": "binary"},
                                     "list": {"type": "array", "items": _I},
                                     "dict": {"type": "object", "additionalProperties": _I},
                                     "Optional": {"$ref": "#/$defs/kiln"},
                                     "kiln": {"$ref": "#/$defs/dataclasses"},
                                     "dataclasses": {"$ref": "#/$defs/ROOT"},
                                     "ROOT": {"$ref": "#/$defs/TYPES"},
                                     "TYPES": _I, "Kiln": _I},
                      "required": ["int", "str", "float", "bool", "bytes", "list", "dict",
                                   "Optional", "kiln", "dataclasses", "ROOT", "TYPES"]},
                     "struct{int:i64,str:str,float:f64,bool:bool,bytes:list<u8>,list:list<i64>,"
                     "dict:dict<str,i64>,Optional:struct{int:i64,},kiln:struct{str:str,},"
                     "dataclasses:struct{bool:bool,},ROOT:struct{float:f64,},TYPES:i64,"
                     "Kiln:opt<i64>,}"),
}


def _load(tmp_path, src, name):
    path = tmp_path / ("%s.py" % name.replace("-", "_"))
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("generated_" + path.stem, str(path))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod, path


def _value(t):
    """A value of a schema type (dicts keyed by the wire names)."""
    from kiln import _types as T
    if isinstance(t, T.Struct):
        return {n: _value(ft) for n, ft in t.fields}
    if isinstance(t, T.Opt):
        return 5 if t.elem.text == "i64" else None
    if isinstance(t, T.List):
        return b"\x01\x02" if t.form is None and t.elem.text == "u8" else [3, 4]
    if isinstance(t, T.Dict):
        return {"k": 6}
    return {"i64": 7, "f64": 0.5, "str": "s", "bool": True}[t.text]


def _instance(cls, v):
    """``v`` (wire names) as an instance of the generated ``cls``, built by name
    (a field after an optional one may be keyword-only)."""
    import dataclasses
    args = {}
    for f, (name, x) in zip(dataclasses.fields(cls), v.items()):
        assert f.metadata.get("kiln.name", f.name) == name
        sub = f.type
        args[f.name] = _instance(sub, x) if dataclasses.is_dataclass(sub) else x
    return cls(**args)


@pytest.mark.parametrize("case", sorted(DOCS))
def test_generated_types_hash_as_the_schema(api, tmp_path, case):
    doc, text = DOCS[case]
    mod, _ = _load(tmp_path, generate(json.dumps(doc)), case)
    t = kiln.schema_from_json(doc)
    assert t.text == text
    want = kiln_ref.schema_hash(text)
    assert t.schema_hash == want
    root = kiln.struct(mod.ROOT)
    assert root.text == text and root.schema_hash == want
    # every class name is bound once, to the class TYPES says
    assert len(set(mod.TYPES)) == len(mod.TYPES)
    for name, st in mod.TYPES.items():
        assert getattr(mod, name) is st.cls
    # attributes: unique, unmangled, no keyword; wire names as the schema's
    import dataclasses
    import keyword
    for cls in (st.cls for st in mod.TYPES.values()):
        attrs = [f.name for f in dataclasses.fields(cls)]
        assert len(set(attrs)) == len(attrs)
        assert not any(a.startswith("__") or keyword.iskeyword(a) for a in attrs), attrs
    # a value written through the classes is the schema's value on the wire
    v = _value(t)
    rec = _instance(mod.ROOT, v)
    buf = kiln.encode(rec, mod.ROOT, frame=True)
    assert buf == kiln.encode(v, t, frame=True)
    assert kiln_ref.decode(buf, text, True) == v
    assert kiln.decode(buf, mod.ROOT, frame=True) == rec


def test_kiln_gen_on_hostile_names_imports_and_type_checks(tmp_path, mypy_cache):
    doc = {"type": "object", "title": "rec", "$defs": dict(DOCS["collisions"][0]["$defs"]),
           "properties": {}}
    for case in ("collisions", "dunders", "keywords", "case", "module-names"):
        sub, _ = DOCS[case]
        for k, v in sub.get("$defs", {}).items():
            doc["$defs"].setdefault(k, v)
        doc["properties"]["p_" + case.replace("-", "_")] = {
            "type": "object", "properties": sub["properties"],
            **({"required": sub["required"]} if "required" in sub else {})}
    schema = tmp_path / "names.json"
    schema.write_text(json.dumps(doc))
    out = tmp_path / "names_mod.py"
    r = subprocess.run([sys.executable, "-m", "kiln", "gen", str(schema), "-o", str(out)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    mod, _ = _load(tmp_path, out.read_text(), "names_mod")
    t = kiln.schema_from_json(doc)
    assert kiln.struct(mod.ROOT).schema_hash == kiln_ref.schema_hash(t.text)
    pytest.importorskip("mypy")   # the [test] extra; the wheel jobs count it as skipped
    env = dict(os.environ, MYPYPATH=mypy_path())
    r = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent",
                        "--cache-dir", str(mypy_cache), str(out)],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stdout


def test_a_wire_name_in_field_metadata_binds_a_dataclass(api):
    import dataclasses

    @dataclasses.dataclass
    class Rec:
        id_: int = dataclasses.field(metadata={"kiln.name": "__id"})
        n: kiln.I8 = 0

    t = kiln.struct(Rec)
    assert t.text == "struct{__id:i64,n:i8,}"
    assert t.schema_hash == kiln_ref.schema_hash("struct{__id:i64,n:i8,}")
    buf = kiln.encode(Rec(-2, 3), Rec)
    assert kiln_ref.decode(buf, t.text, False) == {"__id": -2, "n": 3}
    assert kiln.decode(buf, Rec) == Rec(-2, 3)
