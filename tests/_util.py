import json
import os
import struct
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# a run from an installed wheel: tests/ copied out of the sdist, no kiln/ source
IS_SOURCE_TREE = os.path.isfile(os.path.join(ROOT, "kiln", "__init__.py"))


def mypy_path(*extra):
    """MYPYPATH for a type check of user code: the folder holding the kiln
    package when it is a checkout (an editable install hides it behind an
    import hook that type checkers do not run); nothing for an installed wheel,
    which mypy finds in site-packages itself (and refuses on MYPYPATH)."""
    import kiln
    parent = os.path.dirname(os.path.dirname(os.path.abspath(kiln.__file__)))
    parts = [parent] if os.path.isfile(os.path.join(parent, "pyproject.toml")) else []
    return os.pathsep.join(parts + [str(e) for e in extra])
CASES_PATH = os.path.join(ROOT, "spec", "kiln-v2-cases.json")
sys.path.insert(0, os.path.join(ROOT, "spec", "reference"))
import kiln_ref  # noqa: E402  (the executable spec; standard library only)

with open(CASES_PATH) as _f:
    CASES = json.load(_f)["cases"]
CASE_BY_NAME = {c["name"]: c for c in CASES}


def f32_bits(x):
    return struct.pack("<f", x)


def f64_bits(x):
    return struct.pack("<d", x)


def run_in_threads(work, n=4):
    """Run ``work()`` in ``n`` threads started together; re-raise the first failure."""
    import threading
    errors = []
    start = threading.Barrier(n)

    def run():
        try:
            start.wait()
            work()
        except BaseException as e:  # reported below, in the test's thread
            errors.append(e)
    threads = [threading.Thread(target=run) for _ in range(n)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if errors:
        raise errors[0]


def root_base(a):
    """What a numpy array's memory belongs to (a reshape's base is the flat array)."""
    import numpy as np
    b = a.base
    while isinstance(b, np.ndarray):
        b = b.base
    return b


def st_i32_file(path, tensors):
    """A safetensors file written by hand from the format's rules (an 8-byte
    length, the JSON header, the payloads), not by kiln: ``tensors`` (name ->
    array, stored as little-endian i32) in name order; returns its header dict."""
    header, blobs, at = {}, [], 0
    for name in sorted(tensors):
        b = tensors[name].astype("<i4").tobytes()
        header[name] = {"dtype": "I32", "shape": list(tensors[name].shape),
                        "data_offsets": [at, at + len(b)]}
        blobs.append(b)
        at += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
    return header
