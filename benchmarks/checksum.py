"""What verifying checksums by default costs ``load_tensors`` (issue 39, item 5).

    python -m benchmarks.checksum [--arrays 16] [--mib 256] [--repeat 7]

One file written with ``checksum=True``, page cache warm, in one process,
for each kernel (``KILN_PUREPYTHON`` picks it at import, so the pure rows
run in a child process):

* ``copy, verify=False`` / ``copy, verified``: ``load_tensors(path,
  copy=True)``: the file read into memory the directory owns, then (the
  default) every payload's CRC-32 compared;
* ``views, verify=False`` / ``views, verified``: ``load_tensors(path)``:
  views of the mapping; unverified, nothing past the table is read, so the
  verified row is the first read of every page, not an overhead on one;
* ``views + one read, verify=False``: the same views and every payload
  read once (``np.bitwise_xor.reduce`` over its bytes), what a consumer of
  the views pays anyway, to compare the verified views with.

Target (issue 39): ``copy, verified`` at most 1.15x ``copy, verify=False``.
Each row: median seconds over ``--repeat`` calls (min..max), GB/s of payload,
and the ratio to its unverified row.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

from benchmarks.harness import median_time  # noqa: E402




def _measure(path, repeat):
    """{row: (median, min, max)} for the kernel this process imported."""
    import kiln

    def touch(d):
        for t in d.values():
            np.bitwise_xor.reduce(np.frombuffer(t.data, np.uint64))

    rows = {
        "copy, verify=False": lambda: kiln.load_tensors(path, copy=True, verify=False),
        "copy, verified": lambda: kiln.load_tensors(path, copy=True),
        "views, verify=False": lambda: kiln.load_tensors(path, verify=False),
        "views, verified": lambda: kiln.load_tensors(path),
        "views + one read, verify=False": lambda: touch(kiln.load_tensors(path, verify=False)),
    }
    return kiln.IMPLEMENTATION, {k: median_time(fn, repeat) for k, fn in rows.items()}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arrays", type=int, default=16)
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(_measure(args.child, args.repeat)))
        return
    import kiln
    per = (args.mib << 20) // args.arrays // 4
    arrays = {"layer%03d" % i: np.full(per, i, np.float32) for i in range(args.arrays)}
    total = sum(a.nbytes for a in arrays.values())
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "m.kiln")
        kiln.save_tensors(path, arrays, checksum=True)
        del arrays
        results = [_measure(path, args.repeat)]
        env = dict(os.environ, KILN_PUREPYTHON="1")
        out = subprocess.run([sys.executable, "-m", "benchmarks.checksum", "--child", path,
                              "--repeat", str(args.repeat)], env=env, capture_output=True,
                             text=True, check=True, timeout=600,
                             cwd=str(Path(__file__).resolve().parent.parent))
        results.append(json.loads(out.stdout))
    print("%d f32 tensors, %.0f MiB, written with checksum=True" % (args.arrays, total / 2**20))
    print("%-8s %-32s %10s %18s %8s %7s" % ("kernel", "op", "median s", "min..max", "GB/s",
                                            "ratio"))
    for impl, rows in results:
        for label, (med, lo, hi) in rows.items():
            base = rows[label.replace("verified", "verify=False")][0] if "verified" in label \
                else None
            ratio = "%6.2fx" % (med / base) if base else ""
            print("%-8s %-32s %10.4f %8.4f..%-8.4f %8.2f %7s" % (
                impl, label, med, lo, hi, total / med / 1e9, ratio))
        v, r = rows["views, verified"][0], rows["views + one read, verify=False"][0]
        print("%-8s %-32s %10s %27s %7s" % (impl, "views verified / views + one read", "", "",
                                            "%6.2fx" % (v / r)))


if __name__ == "__main__":
    main()
