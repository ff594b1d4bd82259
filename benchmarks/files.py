"""Tensor files against safetensors: save, load, open one tensor (issue 14).

    python -m benchmarks.files [--arrays 200] [--mib 200] [--repeat 5]

The same arrays (f32, f16, int8 and bf16 in turn; about 200 MiB) are saved and
loaded by kiln and by ``safetensors.numpy`` in one run, page cache warm.  Each
row is the median of ``--repeat`` runs in a fresh child process, so the peak
resident memory (``VmHWM``, minus the child's resident size before the
operation) belongs to that operation alone.  Ratios are kiln / safetensors.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

CHILD = r"""
import json, os, resource, sys, time
import numpy as np, ml_dtypes
import kiln
import safetensors.numpy as stnp
from safetensors import safe_open

op, folder, n, mib = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
kinds = [np.float32, np.float16, np.int8, ml_dtypes.bfloat16]
per = (mib << 20) // n
arrays = {}
if op.endswith("save"):   # loads start from an empty process: their peak is theirs
    for i in range(n):
        dt = np.dtype(kinds[i % 4])
        arrays["layer%03d" % i] = np.ones(per // dt.itemsize, dtype=dt)
kp, sp = os.path.join(folder, "m.kiln"), os.path.join(folder, "m.safetensors")
name = "layer%03d" % (n // 2)

def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

def run():
    if op == "kiln-save":
        kiln.save_tensors(kp, arrays)
    elif op == "st-save":
        stnp.save_file(arrays, sp)
    elif op == "kiln-load-copy":
        d = kiln.load_tensors(kp, copy=True)
        return [t.numpy() for t in d.values()]
    elif op == "st-load":
        return stnp.load_file(sp)
    elif op == "kiln-open-one":
        with kiln.open(kp) as f:
            return f[name].numpy().copy()
    elif op == "st-open-one":
        with safe_open(sp, framework="np") as f:
            return f.get_tensor(name)
    elif op == "kiln-load-views":
        d = kiln.load_tensors(kp)
        return [t.numpy() for t in d.values()]

base = rss()
t = time.perf_counter()
out = run()
dt = time.perf_counter() - t
# VmHWM, not ru_maxrss: ru_maxrss keeps the parent's size across fork and exec
peak = [int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM")][0] * 1024
if base > peak:
    peak = base
print(json.dumps({"seconds": dt, "extra_peak": max(peak - base, 0)}))
"""

PAIRS = [("save", "kiln-save", "st-save"), ("load with copies", "kiln-load-copy", "st-load"),
         ("open + one tensor", "kiln-open-one", "st-open-one"),
         ("load every tensor as a view", "kiln-load-views", "st-load")]


def measure(op, folder, n, mib, repeat):
    runs = []
    for _ in range(repeat):
        os.sync()   # no write-back of an earlier run charged to this run's fsync
        r = subprocess.run([sys.executable, "-c", CHILD, op, folder, str(n), str(mib)],
                           capture_output=True, text=True, check=True)
        runs.append(json.loads(r.stdout))
    return (statistics.median(x["seconds"] for x in runs),
            max(x["extra_peak"] for x in runs))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arrays", type=int, default=200)
    ap.add_argument("--mib", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        measure("kiln-save", folder, a.arrays, a.mib, 1)   # the files, and a warm page cache
        measure("st-save", folder, a.arrays, a.mib, 1)
        print("| op | kiln s | safetensors s | ratio | kiln extra peak MiB | "
              "safetensors extra peak MiB |")
        print("| --- | --- | --- | --- | --- | --- |")
        for label, k, s in PAIRS:
            kt, kp = measure(k, folder, a.arrays, a.mib, a.repeat)
            st, sp = measure(s, folder, a.arrays, a.mib, a.repeat)
            print("| %s | %.4f | %.4f | %.3f | %.1f | %.1f |"
                  % (label, kt, st, kt / st, kp / 2 ** 20, sp / 2 ** 20), flush=True)


if __name__ == "__main__":
    main()
