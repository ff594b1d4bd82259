"""Converting a generated safetensors file to Kiln, against copying the file (issue 15).

    python -m benchmarks.convert [--gib 1.0] [--repeat 3]

Writes a safetensors file of ``--gib`` GiB (f32/f16/bf16/i8 arrays of 4 MiB),
then times ``kiln convert`` (in process, the converter tensor by tensor through
the streaming writer) against ``shutil.copyfile`` of the same file, page cache
warm, each in a fresh child so that its peak resident memory (``VmHWM``) is
its own.  The kiln row includes the fsyncs of the atomic replace.  Every run
starts after ``os.sync()``, so write-back left over from the previous run
does not land in the next one's fsync.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

CHILD = r"""
import json, resource, shutil, sys, time
op, src, dst = sys.argv[1:4]
if op == "kiln":
    from kiln.convert import convert
    t = time.perf_counter(); convert(src, dst)
else:
    t = time.perf_counter(); shutil.copyfile(src, dst)
dt = time.perf_counter() - t
# VmHWM, not ru_maxrss: ru_maxrss keeps the parent's size across fork and exec
hwm = [int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM")][0]
print(json.dumps({"seconds": dt, "peak_mib": hwm / 1024}))
"""


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args(argv)
    import numpy as np
    import ml_dtypes
    import safetensors.numpy as stnp
    with tempfile.TemporaryDirectory() as folder:
        src = os.path.join(folder, "m.safetensors")
        kinds = [np.float32, np.float16, ml_dtypes.bfloat16, np.int8]
        n = int(a.gib * 256)
        arrays = {"t%04d" % i: np.ones((4 << 20) // np.dtype(kinds[i % 4]).itemsize,
                                       kinds[i % 4]) for i in range(n)}
        stnp.save_file(arrays, src)
        del arrays
        rows = {}
        for op, dst in (("copy", "c.bin"), ("kiln", "m.kiln")):
            runs = []
            for _ in range(a.repeat):
                os.sync()   # start each run with no dirty pages queued for the disk, so one
                #             op's write-back is not charged to the next op's fsync
                r = subprocess.run([sys.executable, "-c", CHILD, op, src,
                                    os.path.join(folder, dst)], capture_output=True, text=True,
                                   check=True)
                runs.append(json.loads(r.stdout))
            rows[op] = (statistics.median(x["seconds"] for x in runs),
                        max(x["peak_mib"] for x in runs))
        print("| op | seconds | peak RSS MiB |")
        print("| --- | --- | --- |")
        for op, (s, m) in rows.items():
            print("| %s | %.3f | %.1f |" % ("kiln convert" if op == "kiln" else "shutil.copyfile",
                                            s, m))
        print("ratio kiln / copy: %.2f" % (rows["kiln"][0] / rows["copy"][0]))


if __name__ == "__main__":
    main()
