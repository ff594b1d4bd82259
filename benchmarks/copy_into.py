"""Filling arrays the caller owns from a tensor file (issue 32, point 7).

    python -m benchmarks.copy_into [--arrays 16] [--mib 256] [--repeat 7]

A model's weights already exist (``targets``, allocated once); each row fills
them from one file, page cache warm, in one process:

* ``kiln into``: ``kiln.load_tensors(path, into=targets)``, one copy from
  the mapping into each target, nothing of the payloads' size allocated;
* ``kiln view + ndarray.copy``: ``t.numpy().copy()`` for every tensor, a new
  array each (what a user writes without ``into``), then dropped;
* ``safetensors load_file``: ``safetensors.numpy.load_file`` (new arrays);
* ``safetensors load_file + copyto``: the same, then ``np.copyto`` into the
  targets (the load_state_dict pattern: a second copy).

Each row: median seconds over ``--repeat`` calls (min..max), GB/s of payload,
and the peak traced allocation (``tracemalloc``) of one call.
"""

import argparse
import os
import statistics
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

import kiln  # noqa: E402


def _rows(kp, sp, targets):
    import safetensors.numpy as stnp

    def into():
        kiln.load_tensors(kp, into=targets)

    def view_copy():
        d = kiln.load_tensors(kp)
        return [t.numpy().copy() for t in d.values()]

    def st_load():
        return stnp.load_file(sp)

    def st_copyto():
        loaded = stnp.load_file(sp)
        for k, a in loaded.items():
            np.copyto(targets[k], a)

    return [("kiln into", into), ("kiln view + ndarray.copy", view_copy),
            ("safetensors load_file", st_load), ("safetensors load_file + copyto", st_copyto)]


def _peak(fn):
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arrays", type=int, default=16)
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args(argv)
    import safetensors.numpy as stnp
    per = (args.mib << 20) // args.arrays // 4
    arrays = {"layer%03d" % i: np.full(per, i, np.float32) for i in range(args.arrays)}
    total = sum(a.nbytes for a in arrays.values())
    with tempfile.TemporaryDirectory() as folder:
        kp, sp = os.path.join(folder, "m.kiln"), os.path.join(folder, "m.safetensors")
        kiln.save_tensors(kp, arrays)
        stnp.save_file(arrays, sp)
        targets = {k: np.empty_like(a) for k, a in arrays.items()}
        del arrays
        print("%d f32 tensors, %.0f MiB, kiln %s" % (args.arrays, total / 2**20,
                                                      kiln.IMPLEMENTATION))
        print("%-32s %10s %18s %8s %12s" % ("op", "median s", "min..max", "GB/s", "peak MiB"))
        for label, fn in _rows(kp, sp, targets):
            fn()   # warm: page cache, imports
            times = []
            for _ in range(args.repeat):
                t = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t)
            med = statistics.median(times)
            print("%-32s %10.4f %8.4f..%-8.4f %8.2f %12.1f" % (
                label, med, min(times), max(times), total / med / 1e9, _peak(fn) / 2**20))
        assert all(float(targets["layer%03d" % i][0]) == i for i in range(len(targets)))


if __name__ == "__main__":
    main()
