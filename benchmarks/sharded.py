"""Opening a sharded set against one file (issue 39, item 4).

    python -m benchmarks.sharded [--arrays 48] [--mib 192] [--repeat 15]

The same tensors written as one file (``save_tensors``) and as a 3-shard set
(``save_sharded`` with ``max_shard_size`` a third of the payload), page
cache warm, in one process.  Each row times a fresh open and a first read:

* ``open + first tensor``: ``kiln.open(path)``, then ``f[first].numpy()``
  and a sum over it (its pages read), then close;
* ``open + last tensor``: the same for the last tensor (in the last shard:
  the set opens one shard, its index having been read);
* ``open + every tensor``: every tensor read (the set opens all shards);
* ``... index parsed``: ``open + first tensor`` with kiln's memory of the
  indexes it parsed cleared before each open, as the first open of a set in
  a process is (a reopened index whose bytes did not change skips the JSON
  parse; its bytes are still read and compared);
* ``safetensors safe_open + get_tensor``: the first tensor of the one-file
  safetensors twin, for reference.

Target (issue 39): the set's ``open + first tensor`` at most 1.2x the one
file's.  Each row: median seconds over ``--repeat`` runs (min..max) and the
set's ratio to the one file.
"""

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

from benchmarks.harness import median_time  # noqa: E402

import kiln  # noqa: E402
from kiln._files.sharded import _MEMO  # noqa: E402


def _pair(fa, fb, repeat):
    """``median_time`` of two functions run in turns (drift on a shared machine hits both)."""
    fa(), fb()
    ta, tb = [], []
    for _ in range(repeat):
        for fn, out in ((fa, ta), (fb, tb)):
            t = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t)
    return [(statistics.median(x), min(x), max(x)) for x in (ta, tb)]


def _read(path, names, forget=False):
    def run():
        if forget:
            _MEMO.clear()
        with kiln.open(path) as f:
            for n in names:
                float(f[n].numpy().sum())
    return run


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arrays", type=int, default=48)
    ap.add_argument("--mib", type=int, default=192)
    ap.add_argument("--repeat", type=int, default=15)
    args = ap.parse_args(argv)
    per = (args.mib << 20) // args.arrays // 4
    arrays = {"layer%03d.w" % i: np.full(per, i, np.float32) for i in range(args.arrays)}
    total = sum(a.nbytes for a in arrays.values())
    names = sorted(arrays)
    with tempfile.TemporaryDirectory() as folder:
        one = os.path.join(folder, "one.kiln")
        kiln.save_tensors(one, arrays)
        index = kiln.save_sharded(arrays, os.path.join(folder, "set"),
                                  max_shard_size=-(-total // 3))
        with kiln.open(index) as f:
            shards = len(f.shards)
        rows = []
        for label, sel in (("open + first tensor", names[:1]), ("open + last tensor", names[-1:]),
                           ("open + every tensor", names)):
            a, b = _pair(_read(one, sel), _read(index, sel), args.repeat)
            rows.append((label, a, b))
        a, b = _pair(_read(one, names[:1]), _read(index, names[:1], True), args.repeat)
        rows.append(("... index parsed", a, b))
        st = None
        try:
            import safetensors
            import safetensors.numpy as stnp
            sp = os.path.join(folder, "one.safetensors")
            stnp.save_file(arrays, sp)

            def st_first():
                with safetensors.safe_open(sp, "np") as f:
                    float(f.get_tensor(names[0]).sum())
            st = median_time(st_first, args.repeat)
        except ImportError:
            pass
    print("%d f32 tensors, %.0f MiB; the set: %d shards; kiln %s" % (
        args.arrays, total / 2**20, shards, kiln.IMPLEMENTATION))
    print("%-24s %12s %18s %12s %18s %7s" % ("op", "one file s", "min..max", "set s", "min..max",
                                             "ratio"))
    for label, a, b in rows:
        print("%-24s %12.5f %8.5f..%-8.5f %12.5f %8.5f..%-8.5f %6.2fx" % (
            label, a[0], a[1], a[2], b[0], b[1], b[2], b[0] / a[0]))
    if st is not None:
        print("%-24s %12.5f %8.5f..%-8.5f   (safetensors safe_open + get_tensor, first)"
              % ("safetensors", st[0], st[1], st[2]))


if __name__ == "__main__":
    main()
