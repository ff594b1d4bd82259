"""Peak memory of `kiln convert` on hostile sources, each in its own process.

    python tools/convert_memory.py [--tree DIR] [--impl cython|python]

For each file of tests/hostile_convert.py: the growth of the converting
process's peak RSS (ru_maxrss after the conversion minus before it, with
kiln and numpy already imported), the output's size, and the outcome.
``--tree`` runs another checkout's kiln (to measure before a change).
"""

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
CHILD = r"""
import resource, sys, os
import numpy, kiln, kiln.convert, kiln.files
assert kiln.IMPLEMENTATION == sys.argv[3], kiln.IMPLEMENTATION
from kiln.convert import convert
import kiln.convert.gguf, kiln.convert.npz, kiln.convert.safetensors
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    n = convert(sys.argv[1], sys.argv[2])
    out = "converted %d tensors" % n
except Exception as e:
    out = "%s: %s" % (type(e).__name__, str(e)[:90])
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
size = os.path.getsize(sys.argv[2]) if os.path.exists(sys.argv[2]) else 0
print("%d %d %s" % ((after - before) // 1024, size, out))
"""


def cases(folder):
    sys.path.insert(0, str(HERE / "tests"))
    import hostile_convert as H
    yield "gguf: 2,048 tensors on one 32 KiB range", H.gguf_overlapping(folder / "o.gguf")
    yield "gguf: a metadata array of 2**20 bools", H.gguf_bool_array(folder / "b.gguf")
    yield "npz: 512 MiB of zeros, deflated", H.npz_zeros(folder / "z.npz")
    yield "npz: 64 MiB of zeros in 2 rows, deflated", H.npz_zeros_2d(folder / "r.npz")
    yield "safetensors: 2**21 dicts in the header", H.safetensors_values(
        folder / "v.safetensors")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tree", default=str(HERE))
    ap.add_argument("--impl", default="cython")
    a = ap.parse_args()
    env = dict(os.environ, PYTHONPATH=a.tree, KILN_PUREPYTHON="1" if a.impl == "python" else "0")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for what, src in cases(folder):
            dst = folder / "out.kiln"
            r = subprocess.run([sys.executable, "-c", CHILD, str(src), str(dst), a.impl],
                               env=env, cwd=a.tree, capture_output=True, text=True, timeout=600)
            grew, size, out = (r.stdout.split(" ", 2) + ["?", "?", r.stderr[-200:]])[:3]
            print("%-44s %7s KB in, +%s MiB peak RSS, %s bytes out; %s"
                  % (what, os.path.getsize(src) // 1000, grew, size, out.strip()))
            if dst.exists():
                dst.unlink()


if __name__ == "__main__":
    main()
