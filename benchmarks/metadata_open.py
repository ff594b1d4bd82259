"""A tensor file with a large metadata payload (issue 51, item 7).

    python -m benchmarks.metadata_open [--mib 28] [--quick] [--json PATH]

For each shape of metadata (many short string entries, a list of small
dicts as a layer table, many integer entries, one long JSON string), a file
of one small tensor and about ``--mib`` MiB of metadata is written once; then,
each in a fresh process (the kernels the checkout picks, ``--pure`` for
``KILN_PUREPYTHON=1``):

* ``kiln.open`` alone (the table; the metadata is not read),
* the first ``f.metadata`` (read with pread a window at a time and decoded a
  run of nodes at a time),
* the same dict by the one-shot path the open used before: the whole payload
  decoded as one value, then the tree built from the list of every node,

with the tracemalloc peak of each over the metadata payload's size (a second
run, since tracing slows the calls down) and the process's peak RSS over
the payload's size.  Target: the peak at most 4x the payload.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if __package__ in (None, ""):
    sys.path.insert(0, str(ROOT))

TARGET_PEAK = 4.0

CHILD = r"""
import json, os, resource, sys, time, tracemalloc
import kiln
from kiln import _meta
path, how, traced = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
with kiln.open(path) as f:   # the payload's place and size, untimed
    at, size = f._meta_place
if traced:
    tracemalloc.start()
rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t0 = time.perf_counter()
if how == "open":
    f = kiln.open(path)
elif how == "lazy":
    f = kiln.open(path)
    m = f.metadata
else:
    with open(path, "rb") as fh:
        fh.seek(at)
        blob = fh.read(size)
    cap = max(kiln.DEFAULT_MAX_BYTES, 1 << (size - 1).bit_length())
    m = _meta.from_nodes(kiln.decode(blob, _meta.META_TYPE, frame=True, max_count=cap,
                                     max_bytes=cap), at)
t = time.perf_counter() - t0
peak = tracemalloc.get_traced_memory()[1] if traced else None
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0
print(json.dumps(dict(seconds=t, peak=peak, rss=rss * 1024, size=size)))
"""


WRITE = r"""
import sys
import numpy as np
import kiln
from benchmarks.metadata_open import shapes
path, name, mib = sys.argv[1], sys.argv[2], float(sys.argv[3])
kiln.save_tensors(path, {"w": np.ones(4, np.float32)}, metadata=shapes(mib)[name]())
"""


def shapes(mib):
    n = int(mib * (1 << 20))
    return {
        "strings": lambda: {"key_%07d" % i: "value number %d of the metadata" % i
                            for i in range(n // 76)},
        "layers": lambda: {"layers": [{"name": "layer.%d" % i, "shape": [i, 4, 5], "ok": True,
                                       "s": 1.5} for i in range(n // 210)]},
        "ints": lambda: {"k%d" % i: i * 7 for i in range(n // 41)},
        "json": lambda: {"format": "pt", "config": "x" * min(n, (1 << 24) - 64)},
    }


def child(path, how, traced, env):
    r = subprocess.run([sys.executable, "-c", CHILD, str(path), how, "1" if traced else "0"],
                       capture_output=True, text=True, env=env, timeout=600)
    if r.returncode:
        raise SystemExit(r.stderr)
    return json.loads(r.stdout.strip().splitlines()[-1])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=float, default=28.0)
    ap.add_argument("--quick", action="store_true", help="4 MiB of metadata")
    ap.add_argument("--pure", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    mib = 4.0 if args.quick else args.mib
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    if args.pure:
        env["KILN_PUREPYTHON"] = "1"
    report = {}
    with tempfile.TemporaryDirectory(prefix="kiln-meta-bench-") as tmp:
        for name in shapes(mib):
            p = Path(tmp) / (name + ".kiln")
            # written by a child: a process started from one that built the metadata
            # would inherit its peak RSS (ru_maxrss survives exec)
            subprocess.run([sys.executable, "-c", WRITE, str(p), name, str(mib)], env=env,
                           check=True, timeout=600)
            row = {}
            for how in ("open", "lazy", "one-shot"):
                plain = min((child(p, how, False, env) for _ in range(3)),
                            key=lambda r: r["seconds"])
                traced = child(p, how, True, env)
                size = plain["size"]
                row[how] = dict(seconds=plain["seconds"], peak_x=traced["peak"] / size,
                                rss_x=plain["rss"] / size)
            report[name] = dict(mib=size / (1 << 20), **row)
            print("%-8s %6.1f MiB  open %7.4f s | first metadata %6.3f s, peak %.2fx, "
                  "RSS +%.2fx | one-shot %6.3f s, peak %.2fx, RSS +%.2fx"
                  % (name, size / (1 << 20), row["open"]["seconds"], row["lazy"]["seconds"],
                     row["lazy"]["peak_x"], row["lazy"]["rss_x"], row["one-shot"]["seconds"],
                     row["one-shot"]["peak_x"], row["one-shot"]["rss_x"]))
    worst = max(r["lazy"]["peak_x"] for r in report.values())
    print("target: peak at most %.1fx the payload: worst %.2fx (%s)"
          % (TARGET_PEAK, worst, "met" if worst <= TARGET_PEAK else "not met"))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
