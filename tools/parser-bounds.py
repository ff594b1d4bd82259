"""Peak memory and outcome of the hostile parser inputs of issue 27 (points
7 to 11), each in its own subprocess (peak RSS from ``ru_maxrss``).

    PYTHONPATH=$PWD python tools/parser-bounds.py            # every case
    PYTHONPATH=$PWD python tools/parser-bounds.py defs meta  # some of them

Prints one line per case: its name, what it raised (or ``ok``), the peak of
memory allocated by the call under test (tracemalloc, started after the
input is made), the child's peak RSS above a bare ``import kiln`` (input
included), and the CPU seconds of the call.  Not a test: the suite asserts the
errors and tracemalloc bounds (tests/test_parsers.py).
"""

import subprocess
import sys

PRELUDE = r"""
import resource, sys, json, os, tempfile, time, tracemalloc
import kiln
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t0 = [0.0]
def start():
    if TRACE:
        tracemalloc.start()
    t0[0] = time.process_time()
def done(what):
    cpu = time.process_time() - t0[0]
    peak = tracemalloc.get_traced_memory()[1] if tracemalloc.is_tracing() else 0
    r = resource.getrusage(resource.RUSAGE_SELF)
    print("%s|%.1f|%.1f|%.2f" % (what, peak / 2.0 ** 20, (r.ru_maxrss - base) / 1024.0, cpu))
try:
"""

EPILOGUE = r"""
    done("ok")
except BaseException as e:
    done("%s %s" % (type(e).__name__, str(e)[:70].replace("|", "/")))
"""

CASES = {
    # 20 definitions, each with two properties referring to the one before
    "defs": """
    defs = {"d0": {"type": "boolean"}}
    for i in range(1, 21):
        defs["d%d" % i] = {"type": "object", "properties": {
            "a" * 40: {"$ref": "#/$defs/d%d" % (i - 1)},
            "b" * 40: {"$ref": "#/$defs/d%d" % (i - 1)}}}
    doc = json.dumps({"$defs": defs, "$ref": "#/$defs/d20"})
    sys.stderr.write("document: %d bytes\\n" % len(doc))
    start()
    kiln.schema_from_json(doc)
""",
    # 16 definitions with two long property names each: few tokens, many characters
    "defs-long": """
    defs = {"d0": {"type": "boolean"}}
    for i in range(1, 17):
        defs["d%d" % i] = {"type": "object", "properties": {
            "a" * 2000: {"$ref": "#/$defs/d%d" % (i - 1)},
            "b" * 2000: {"$ref": "#/$defs/d%d" % (i - 1)}}}
    doc = json.dumps({"$defs": defs, "$ref": "#/$defs/d16"})
    sys.stderr.write("document: %d bytes\\n" % len(doc))
    start()
    kiln.schema_from_json(doc)
""",
    # 63 lists around a struct of 249,000 fields: under 1,000,000 tokens, but
    # each list holds its own copy of the text
    "nested": """
    text = "list<" * 63 + "struct{" + "".join("f%d:i8," % i for i in range(249000)) + "}" + ">" * 63
    start()
    kiln.parse_type(text)
""",
    # 15 MB of type text
    "typetext": """
    text = "struct{" + "".join("f%d:i8," % i for i in range(1_700_000)) + "}"
    sys.stderr.write("type text: %d bytes\\n" % len(text))
    start()
    kiln.parse_type(text)
""",
    # 40,000 required properties
    "required": """
    n = 40000
    doc = {"type": "object", "properties": {"p%d" % i: {"type": "integer"} for i in range(n)},
           "required": ["p%d" % i for i in range(n)]}
    start()
    kiln.schema_from_json(doc)
""",
    "brackets": """
    text = "[" * 100000
    start()
    kiln.schema_from_json(text)
""",
    # a file whose metadata nests 2,000 lists (written without the save-side check)
    "meta-load": """
    from kiln import _meta
    import kiln.files as F
    nodes = [{"parent": 0xFFFFFFFF, "key": None, "kind": _meta.DICT, "int": 0, "float": 0.0,
              "text": "", "raw": b""},
             {"parent": 0, "key": "k", "kind": _meta.LIST, "int": 0, "float": 0.0,
              "text": "", "raw": b""}]
    for i in range(2, 2000):
        nodes.append({"parent": i - 1, "key": None, "kind": _meta.LIST, "int": 0,
                      "float": 0.0, "text": "", "raw": b""})
    blob = kiln.encode(nodes, _meta.META_TYPE, frame=True)
    rec = (kiln._wire.DTYPE_CODES["u8"], (len(blob),), b"__metadata__", None, 0, 0)
    path = os.path.join(tempfile.mkdtemp(), "deep.kiln")
    real = _meta.to_nodes
    _meta.to_nodes = lambda m: nodes
    try:
        kiln.save_tensors(path, {"x": kiln.Tensor.from_numpy(__import__("numpy").zeros(2))},
                          metadata={})
    finally:
        _meta.to_nodes = real
    start()
    m = kiln.load_metadata(path)
    import copy, pickle
    repr(m); pickle.dumps(m); copy.deepcopy(m)
""",
    # saving 80,000 nested lists
    "meta-save": """
    import numpy as np
    v = []
    for _ in range(80000):
        v = [v]
    path = os.path.join(tempfile.mkdtemp(), "deep.kiln")
    x = {"x": kiln.Tensor.from_numpy(np.zeros(2))}
    start()
    kiln.save_tensors(path, x, metadata={"v": v})
""",
}


def child(name, trace):
    body = "TRACE = %r\n" % trace + PRELUDE + CASES[name] + EPILOGUE
    r = subprocess.run([sys.executable, "-c", body], capture_output=True, text=True,
                       timeout=600)
    line = (r.stdout.strip().splitlines() or ["no output: " + r.stderr[-200:]])[-1]
    return line.split("|"), r.stderr.strip().splitlines()[:1]


def run(name):
    traced, note = child(name, True)      # the traced peak (tracemalloc slows the call)
    plain, _ = child(name, False)         # RSS and CPU seconds without tracing
    if len(traced) == 4 and len(plain) == 4:
        print("%-10s %-72s traced %7s MB  rss %7s MB %7s s"
              % (name, plain[0], traced[1], plain[2], plain[3]))
    else:
        print("%-10s %s / %s" % (name, "|".join(traced), "|".join(plain)))
    for extra in note:
        print("           (%s)" % extra)


if __name__ == "__main__":
    for name in sys.argv[1:] or list(CASES):
        run(name)
