"""Parsers bounded before they build (issue 27, points 7 to 11): JSON Schema
documents, type text and metadata blocks.  Bounds are asserted through the
error raised, its offset (computed here by hand), and tracemalloc peaks (a
resource, not a time); both implementations where a kernel takes part."""

import copy
import json
import pickle
import subprocess
import sys
import tracemalloc

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import kiln
from kiln import _meta
from kiln.schema import generate


def _peak(fn, *args):
    """(outcome, traced peak in bytes) of one call; a KilnError is the outcome."""
    tracemalloc.start()
    try:
        try:
            got = fn(*args)
        except kiln.KilnError as e:
            got = e
        return got, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


# --- point 7: $defs reuse is counted before it is built ------------------------------

def _doubling(levels, name_len):
    defs = {"d0": {"type": "boolean"}}
    for i in range(1, levels + 1):
        defs["d%d" % i] = {"type": "object", "properties": {
            "a" * name_len: {"$ref": "#/$defs/d%d" % (i - 1)},
            "b" * name_len: {"$ref": "#/$defs/d%d" % (i - 1)}}}
    return {"$defs": defs, "$ref": "#/$defs/d%d" % levels}


def _first_level_over(name_len):
    """By hand: d0 is bool (1 token, 4 characters); d(k) is struct{ a:d(k-1), b:d(k-1), }
    with 2 + 2 * (3 + T) tokens and 8 + 2 * (len(name) + 2 + C) characters."""
    tokens, chars, k = 1, 4, 0
    while tokens <= 1_000_000 and chars <= 16_000_000:
        tokens, chars, k = 2 + 2 * (3 + tokens), 8 + 2 * (name_len + 2 + chars), k + 1
    return k


@pytest.mark.parametrize("name_len", [1, 40, 5000])
def test_reused_definitions_are_refused_before_they_are_built(name_len):
    k = _first_level_over(name_len)
    doc = json.dumps(_doubling(k + 3, name_len))
    e, peak = _peak(kiln.schema_from_json, doc)
    assert isinstance(e, kiln.SchemaError) and e.code == "LIMIT", e
    assert e.pointer == "#/$defs/d%d" % k
    # what it read (the document, a few KB) and no type: not the type's megabytes
    assert peak < 20 * len(doc) + 512 * 1024, peak


def test_kiln_gen_sizes_definitions_the_root_does_not_use():
    doc = _doubling(24, 40)
    doc["$defs"]["bad"] = {"type": "null"}
    doc["$defs"]["used"] = {"type": "object", "properties": {"x": {"type": "integer"}}}
    doc.update({"$ref": "#/$defs/used"})
    assert kiln.schema_from_json(doc).text == "struct{x:i64,}"   # the rest is never read
    src, peak = _peak(generate, json.dumps(doc))
    assert isinstance(src, str), src
    # the largest definition under the limits is built for its class, the ones
    # after it are refused before they are built (d24 would be 256 times d16)
    assert peak < 40 * 1024 * 1024, peak
    ns = {}
    exec(src, ns)
    assert kiln.struct(ns["ROOT"]).text == "struct{x:i64,}" and ns["ROOT"].__name__ == "Used"
    k = _first_level_over(40)
    assert "D%d" % (k - 1) in ns["TYPES"] and "D%d" % k not in ns["TYPES"]
    assert "Bad" not in ns["TYPES"]


def test_a_type_of_exactly_the_token_limit_is_read():
    # by hand: d has 249 bool fields (2 + 4 * 249 = 998 tokens); the root has 998
    # fields of d (3 + 998 each) and 250 bools (4 each): 2 + 998,998 + 1,000 tokens
    d = {"type": "object", "properties": {"b%d" % i: {"type": "boolean"} for i in range(249)}}
    props = {"r%d" % i: {"$ref": "#/$defs/d"} for i in range(998)}
    props.update(("s%d" % i, {"type": "boolean"}) for i in range(250))
    doc = {"$defs": {"d": d}, "type": "object", "properties": props}
    assert len(kiln.schema_from_json(doc).tokens) == 1_000_000
    props["t"] = {"type": "boolean"}
    with pytest.raises(kiln.SchemaError) as ei:
        kiln.schema_from_json(doc)
    assert ei.value.code == "LIMIT" and ei.value.pointer == "#"


# --- point 8: parse_type's limit applies while parsing ---------------------------------

_LONG_TEXT = r"""
import io, json, resource, sys
import kiln
out = io.StringIO()               # no list of parts: the text alone
out.write("struct{")
for i in range(300_000):
    out.write("f%d:i8," % i)
out.write("}")
text = out.getvalue()
del out
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    kiln.parse_type(text)
    got = None
except kiln.KilnError as e:
    got = [e.code, e.offset]
grew = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
print(json.dumps([got, grew]))
"""


def test_long_type_text_is_refused_at_the_token_past_the_limit():
    # token 1 is "struct{", field i holds tokens 2 + 4i .. 5 + 4i; token 1,000,001 is
    # the comma closing field 249,999
    want = len("struct{") + sum(len("f%d:i8," % i) for i in range(249_999)) + len("f249999:i8")
    r = subprocess.run([sys.executable, "-c", _LONG_TEXT], capture_output=True, text=True,
                       timeout=300)
    got, grew_kib = json.loads(r.stdout)
    assert got == ["LIMIT", want], (got, r.stderr)
    # refused before anything is built: the peak RSS grows by less than the 3.3 MB
    # text itself (it grew by 180 MB when every token was built first)
    assert grew_kib < 3 * 1024, grew_kib


def test_nested_copies_of_a_large_type_are_within_one_budget():
    # each list holds its own copy of the text: 63 copies of 130,004 tokens or more
    inner = "struct{" + "".join("f%d:i8," % i for i in range(32_500)) + "}"
    assert len(kiln.parse_type("list<" + inner + ">").tokens) == 130_004
    text = "list<" * 63 + inner + ">" * 63
    with pytest.raises(kiln.KilnError) as ei:
        kiln.parse_type(text)
    e = ei.value
    assert e.code == "LIMIT", e
    # by hand: the struct (130,002 tokens) and then lists of 130,004, 130,006 ...;
    # the budget of 8,000,000 runs out at list j (from the inside) when the sum passes it
    spent, j = 130_002, 0
    while spent <= 8_000_000:
        j += 1
        spent += 130_002 + 2 * j
    assert e.offset == 5 * (63 - j)       # the opener of that list


@pytest.mark.parametrize("text,at", [
    ("struct{a:i32,b:i8,a:i8}", 18),
    ("list<struct { x : i8 , y : i8 , x : i8 }>", 32),
    ("struct{a:struct{b:i8,b:i8,},}", 21),
])
def test_a_repeated_field_name_is_reported_at_its_offset(text, at):
    with pytest.raises(kiln.KilnError) as ei:
        kiln.parse_type(text)
    assert ei.value.code == "TYPE" and ei.value.offset == at and text[at] in "abxy"


# --- point 9: required is linear -------------------------------------------------------

class _CountingList(list):
    """A required list that counts the element visits a reader makes of it."""
    visits = 0

    def __iter__(self):
        for x in list.__iter__(self):
            type(self).visits += 1
            yield x

    def __contains__(self, x):
        type(self).visits += len(self)    # what a list's membership test costs
        return list.__contains__(self, x)


def test_required_is_read_in_one_pass():
    n = 2000
    req = _CountingList("p%d" % i for i in range(n))
    _CountingList.visits = 0
    doc = {"type": "object", "properties": {"p%d" % i: {"type": "integer"} for i in range(n)},
           "required": req}
    assert kiln.schema_from_json(doc).text.count("opt<") == 0
    assert _CountingList.visits <= 4 * n, _CountingList.visits   # was n * n / 2


# --- point 11: bad schema input is a SchemaError with a location ----------------------

@pytest.mark.parametrize("doc,code,pointer,offset", [
    ("[" * 100_000, "DEPTH", "#", 144),
    ('{"type": "object", "properties": {"a": {"type": "integer"}', "TYPE", "#", 58),
    ('{"type": 1', "TYPE", "#", 10),
    ('"' + '\\"' * 100_000, "TYPE", "#", 0),   # unterminated: each quote scanned once
    ({"type": json.loads("[" * 900 + "]" * 900)}, "TYPE", "#", 0),   # a message, no repr
    (b'{"type": "boolean"\xff}', "TYPE", "#", 18),
    (json.dumps(json.dumps({"type": "boolean"})), "TYPE", "#", 0),
    ('{"type": "object", "type": "boolean"}', "TYPE", "#", 0),
    ({"type": "object", "properties": {1: {"type": "boolean"}}}, "TYPE", "#/properties/1", 0),
    ({"type": "boolean", 1: 2, "x": 3}, "TYPE", "#", 0),
    ({"$defs": {2: {"type": "boolean"}}, "$ref": "#/$defs/2"}, "TYPE", "#/$defs", 0),
    ({"type": "object", "properties": {"a": {"type": "integer"}},
      "additionalProperties": 0}, "TYPE", "#/additionalProperties", 0),
    ({"type": "object", "properties": {"a": {"type": "integer"}}, "required": [["a"]]},
     "TYPE", "#/required", 0),
])
def test_bad_schema_input_is_a_schema_error(doc, code, pointer, offset):
    with pytest.raises(kiln.SchemaError) as ei:
        kiln.schema_from_json(doc)
    e = ei.value
    assert isinstance(e, kiln.KilnError) and isinstance(e, ValueError)
    assert (e.code, e.pointer, e.offset) == (code, pointer, offset), (e.code, e.pointer, e)
    assert pickle.loads(pickle.dumps(e)).pointer == pointer
    with pytest.raises(kiln.SchemaError):
        generate(doc)


def test_optional_fields_deep_in_a_schema_are_depth_errors():
    doc = {"type": "boolean"}
    for _ in range(40):   # 40 objects, each with an optional property: 80 containers
        doc = {"type": "object", "properties": {"a": doc}, "required": []}
    with pytest.raises(kiln.SchemaError) as ei:
        kiln.schema_from_json(doc)
    assert ei.value.code == "DEPTH"


def _nest(n):
    deep = {"type": "boolean"}
    for _ in range(n):
        deep = {"type": "array", "items": deep}
    return deep


@pytest.mark.parametrize("text", [
    "[" * 100_000,
    json.dumps(_nest(200)),
    json.dumps(_nest(70)),
    json.dumps({"type": "array", "items": json.loads("[" * 50 + "]" * 50)}),
    json.dumps(json.dumps({"type": "object", "properties": {}})),
    '{"type": ',
])
def test_kiln_gen_on_bad_input_prints_one_line(tmp_path, text):
    path = tmp_path / "bad.json"
    path.write_text(text)
    r = subprocess.run([sys.executable, "-m", "kiln", "gen", str(path)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 1 and r.stdout == ""
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.startswith("kiln gen: %s: " % path)


# --- point 10: metadata depth ----------------------------------------------------------

def _chain(n):
    v = []
    for _ in range(n - 1):
        v = [v]
    return v


def test_metadata_at_the_depth_limit_round_trips(api, tmp_path):
    meta = {"k": _chain(63)}          # the root dict and 63 lists: 64 levels
    path = str(tmp_path / "m.kiln")
    kiln.save_tensors(path, {"x": kiln.Tensor.from_numpy(np.zeros(2))}, metadata=meta)
    got = kiln.load_metadata(path)
    assert got == meta
    assert copy.deepcopy(got) == meta and pickle.loads(pickle.dumps(got)) == meta
    assert repr(got).count("[") == 63


@pytest.mark.parametrize("levels", [65, 80_000])
def test_metadata_past_the_depth_limit_is_refused_at_save(api, tmp_path, levels):
    path = tmp_path / "m.kiln"
    with pytest.raises(kiln.EncodeError) as ei:
        kiln.save_tensors(str(path), {"x": kiln.Tensor.from_numpy(np.zeros(2))},
                          metadata={"k": _chain(levels - 1)})
    assert ei.value.code == "DEPTH" and ei.value.path == "['k']" + "[0]" * 63
    assert not path.exists()
    with pytest.raises(kiln.EncodeError) as ei:   # numbers' lists count as lists
        _meta.to_nodes({"k": _numbers_at(64)})
    assert ei.value.code == "DEPTH"


def _numbers_at(level):
    v = [1, 2]
    for _ in range(level - 1):
        v = [v]
    return v


def _deep_file(tmp_path):
    """A file whose metadata nests 65 levels: saved at 64 levels plus a sibling list,
    then the sibling's parent rewritten to the innermost list.  By hand, each node is
    parent u32, key opt<str>, kind u8, int i64, float f64, text str, raw list<u8>: 30
    bytes with no key and empty text and raw, 35 with the key "k"."""
    meta = {"k": [_chain(62), []]}    # root, k, 62 chained lists, then the sibling
    path = tmp_path / "deep.kiln"
    kiln.save_tensors(str(path), {"x": kiln.Tensor.from_numpy(np.zeros(2))}, metadata=meta)
    data = bytearray(path.read_bytes())
    at = data.rfind(b"KLN0")          # the metadata's frame (the last tensor's payload)
    sibling = at + 16 + 4 + 30 + 35 + 62 * 30
    assert int.from_bytes(data[sibling:sibling + 4], "little") == 1   # its parent: "k"
    data[sibling:sibling + 4] = (63).to_bytes(4, "little")            # the innermost list
    path.write_bytes(bytes(data))
    return path, sibling


def test_metadata_past_the_depth_limit_is_refused_at_load(api, tmp_path):
    path, sibling = _deep_file(tmp_path)
    with pytest.raises(kiln.KilnError) as ei:
        kiln.load_metadata(str(path))
    assert ei.value.code == "DEPTH" and ei.value.offset == sibling, ei.value


def test_inspect_of_deep_metadata_prints_one_line(tmp_path):
    path, sibling = _deep_file(tmp_path)
    r = subprocess.run([sys.executable, "-m", "kiln", "inspect", str(path)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "DEPTH at byte %d" % sibling in r.stderr


# --- every hostile document and text raises only kiln's errors -------------------------

_KEYS = st.sampled_from(["type", "items", "properties", "required", "additionalProperties",
                         "$ref", "$defs", "format", "title", "default", "a", "__id", "if", ""])
_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.floats(allow_nan=False),
                     st.sampled_from(["object", "array", "integer", "string", "number",
                                      "boolean", "binary", "int8", "uint64", "float",
                                      "#/$defs/a", "#/$defs/", "a", "__id"]))
_JSON = st.recursive(_SCALARS, lambda c: st.one_of(
    st.lists(c, max_size=4), st.dictionaries(_KEYS, c, max_size=5),
    st.dictionaries(_KEYS | st.integers(0, 2), c, max_size=3)), max_leaves=25)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=_JSON, as_text=st.booleans(), cut=st.integers(0, 400))
def test_hostile_schema_documents_raise_only_schema_errors(doc, as_text, cut):
    arg = json.dumps(doc) if as_text else doc
    if as_text and cut < len(arg) and cut % 3 == 0:
        arg = arg[:cut]           # truncated text too
    try:
        t = kiln.schema_from_json(arg)
    except kiln.SchemaError:
        return
    assert kiln.parse_type(t.text).schema_hash == t.schema_hash
    if t.text.startswith("struct{"):
        ns = {}
        exec(generate(arg), ns)
        assert kiln.struct(ns["ROOT"]).schema_hash == t.schema_hash


_TOKENS = st.sampled_from(["struct{", "struct {", "list<", "opt<", "dict<", "str", ",", ":",
                           "}", ">", "i8", "f64", "tensors", "a", "b", "a", " ", "\t", "<",
                           "{", "1", "\u00e9", "\x00", "bool"])


@settings(max_examples=300, deadline=None)
@given(parts=st.lists(_TOKENS, max_size=30) | st.text(max_size=40))
def test_hostile_type_text_raises_only_kiln_errors(parts):
    text = "".join(parts)
    try:
        t = kiln.parse_type(text)
    except kiln.KilnError as e:
        assert e.code in ("TYPE", "DEPTH", "LIMIT") and 0 <= e.offset <= len(text)
        return
    assert kiln.parse_type(t.text) == t
