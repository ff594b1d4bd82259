"""Peak memory and outcome of the hostile parser inputs of issue 27 (points
7 to 11), each in its own subprocess (peak RSS from ``ru_maxrss``).

    PYTHONPATH=$PWD python tools/parser-bounds.py            # every case
    PYTHONPATH=$PWD python tools/parser-bounds.py defs meta  # some of them

Prints one line per case: its name, what it raised (or ``ok``), the peak RSS
of the child in MB above a bare ``import kiln``, and its CPU seconds.  Not a
test: the suite asserts the errors and tracemalloc bounds (tests/test_parsers.py).
"""

import subprocess
import sys

PRELUDE = r"""
import resource, sys, json, os, tempfile
import kiln
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t0 = resource.getrusage(resource.RUSAGE_SELF)
def done(what):
    r = resource.getrusage(resource.RUSAGE_SELF)
    print("%s|%.1f|%.2f" % (what, (r.ru_maxrss - base) / 1024.0,
                            r.ru_utime + r.ru_stime - t0.ru_utime - t0.ru_stime))
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
    kiln.schema_from_json(doc)
""",
    # 15 MB of type text
    "typetext": """
    text = "struct{" + "".join("f%d:i8," % i for i in range(1_700_000)) + "}"
    sys.stderr.write("type text: %d bytes\\n" % len(text))
    kiln.parse_type(text)
""",
    # 40,000 required properties
    "required": """
    n = 40000
    doc = {"type": "object", "properties": {"p%d" % i: {"type": "integer"} for i in range(n)},
           "required": ["p%d" % i for i in range(n)]}
    kiln.schema_from_json(doc)
""",
    "brackets": """
    kiln.schema_from_json("[" * 100000)
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
    kiln.save_tensors(path, {"x": kiln.Tensor.from_numpy(np.zeros(2))}, metadata={"v": v})
""",
}


def run(name):
    body = PRELUDE + CASES[name] + EPILOGUE
    r = subprocess.run([sys.executable, "-c", body], capture_output=True, text=True,
                       timeout=600)
    line = (r.stdout.strip().splitlines() or ["no output: " + r.stderr[-200:]])[-1]
    parts = line.split("|")
    if len(parts) == 3:
        print("%-10s %-80s %8s MB %7s s" % (name, parts[0], parts[1], parts[2]))
    else:
        print("%-10s %s" % (name, line))
    for extra in r.stderr.strip().splitlines()[:1]:
        print("           (%s)" % extra)


if __name__ == "__main__":
    for name in sys.argv[1:] or list(CASES):
        run(name)
