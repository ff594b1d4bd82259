"""The fuzzing oracle of the text parsers: JSON Schema documents, type text and
metadata blocks (issue 27, points 7 to 11), shared by ``fuzz_parsers.py`` and
the corpus replay (tests/test_fuzz_parsers.py).

For one input, byte 0 picks the target and the rest is its input:

* ``0``: JSON Schema text for ``kiln.schema_from_json``.  Only ``SchemaError``
  may escape; an accepted document's type parses back from its own text to
  the same hash, and, when its root is an object, the module ``kiln gen``
  writes for it executes and its ``ROOT`` class has that hash too.
* ``1``: type text (UTF-8, bad bytes replaced) for ``kiln.parse_type``.  Only
  ``KilnError`` may escape; an accepted text's canonical text parses to the
  same type.
* ``2``: a framed metadata block (``kiln._meta.META_TYPE``).  The compiled and
  pure kernels decode it, and ``kiln._meta.from_nodes`` reads the nodes, to
  the same metadata or the same error code and offset; accepted metadata
  saves and reads back equal (``_meta.same``).

Every call's traced peak is at most :data:`PEAK_BOUND` bytes (the parsers'
build budgets, far below the fuzzer's ``-malloc_limit_mb``).
"""


import kiln
from kiln import _kernels_py, _meta
from kiln.schema import generate

from oracle import traced_call

try:
    from kiln import _kernels_c
except ImportError:  # pragma: no cover - the replay test requires it under CI
    _kernels_c = None

TARGETS = ("schema", "type", "metadata")
# 8,000,000 tokens of tuples and 64,000,000 characters of text, with room
PEAK_BOUND = 256 * 1024 * 1024
_DECODERS = {}


def _traced(fn, *args):
    """``fn(*args)`` under tracemalloc (oracle.traced_call): its value, or its
    KilnError raised, after checking the traced peak against PEAK_BOUND."""
    v, err, peak = traced_call(fn, *args)
    if peak > PEAK_BOUND:
        raise AssertionError("%s allocated %d bytes" % (fn.__name__, peak))
    if err is not None:
        raise err
    return v


def check_schema(body):
    try:
        t = _traced(kiln.schema_from_json, body)
    except kiln.SchemaError:
        return ("err",)
    back = kiln.parse_type(t.text)
    assert back.text == t.text and back.schema_hash == t.schema_hash, t.text
    if isinstance(t, kiln.Type) and t.text.startswith("struct{"):
        ns = {}
        exec(compile(generate(body), "<kiln gen>", "exec"), ns)
        got = kiln.struct(ns["ROOT"])
        assert got.text == t.text and got.schema_hash == t.schema_hash, (got.text, t.text)
        for cls_name, st in ns["TYPES"].items():
            assert st.cls is ns[cls_name]
    return ("ok", t.text)


def check_type(body):
    text = body.decode("utf-8", "replace")
    try:
        t = _traced(kiln.parse_type, text)
    except kiln.KilnError as e:
        assert 0 <= e.offset <= len(text), (e, len(text))
        return ("err", e.code, e.offset)
    again = kiln.parse_type(t.text)
    assert again.text == t.text and again.schema_hash == t.schema_hash
    return ("ok", t.text)


def _metadata(kernels, blob):
    dec = _DECODERS.get(kernels.__name__)
    if dec is None:
        dec = _DECODERS[kernels.__name__] = kiln.Decoder(_meta.META_TYPE, kernels=kernels,
                                                         frame=True)
    try:
        nodes = _traced(dec.decode, blob)
        return ("ok", _traced(_meta.from_nodes, nodes, 0))
    except kiln.KilnError as e:
        return ("err", e.code, e.offset)


def check_metadata(body):
    a = _metadata(_kernels_py, body)
    if _kernels_c is not None:
        b = _metadata(_kernels_c, body)
        same = a[0] == b[0] and (a[1:] == b[1:] if a[0] == "err" else _meta.same(a[1], b[1]))
        assert same, ("the kernels disagree on metadata", a, b)
    if a[0] == "ok":
        blob = kiln.encode(_meta.to_nodes(a[1]), _meta.META_TYPE, frame=True)
        back = _meta.from_nodes(kiln.decode(blob, _meta.META_TYPE, frame=True), 0)
        assert _meta.same(back, a[1])
    return a


def check_parsers_input(data):
    """Harness entry for raw fuzz bytes: byte 0 picks the target."""
    if not data:
        return None
    target = TARGETS[data[0] % len(TARGETS)]
    body = bytes(data[1:])
    return {"schema": check_schema, "type": check_type, "metadata": check_metadata}[target](body)
