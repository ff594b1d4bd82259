"""Samples through a Dask cluster: kiln's serializers against Dask's default (issue 18).

    python -m benchmarks.dask_samples [--samples 1000] [--repeat 3]

Each sample is a Kiln record (an id, a text, four tensors of about 68 KB) as
kiln decodes it: a dict whose ``t`` is a ``TensorDirectory``.  Two workloads:
the records themselves, and their directories alone.  Dask picks a dict's
serializer by its first value (here the id), so records travel by pickle in
both modes; kiln's serializers act on the directories.  A child process starts a ``LocalCluster`` with one worker
process over TCP on 127.0.0.1, scatters the samples to the worker and
gathers them back (each crosses the wire twice), and times that round trip.

- ``kiln``: ``import kiln.dask`` on the client and the worker, so tensors
  travel with kiln's serializers (a small header and one frame a payload);
- ``pickle``: without it, as Dask sends any object by default (pickle
  protocol 5, whose out-of-band buffers are the payloads).

Bytes on the wire are the frames ``distributed.protocol`` writes for the
samples, headers included.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

CHILD = r"""
import json, sys, time
import numpy as np
mode, n, what = sys.argv[1], int(sys.argv[2]), sys.argv[3]
import kiln
if mode == "kiln":
    import kiln.dask
from distributed import Client, LocalCluster
from distributed.protocol import serialize_bytelist

SAMPLE = kiln.parse_type("struct{id:i64,text:str,t:tensors,}")
rng = np.random.default_rng(0)
def sample(i):
    v = {"id": i, "text": "sample %d: a short caption" % i,
         "t": {"image": rng.integers(0, 255, 68 * 1024, dtype=np.uint8),
               "embedding": rng.standard_normal(17 * 1024).astype(np.float32),
               "mask": rng.integers(0, 2, 68 * 1024).astype(np.bool_),
               "logits": rng.standard_normal(17 * 1024).astype(np.float32)}}
    return kiln.decode(kiln.encode(v, SAMPLE), SAMPLE)
samples = [sample(i) for i in range(n)]
if what == "directories":
    samples = [s["t"] for s in samples]
serializers = ["dask", "pickle"] if mode == "kiln" else ["pickle"]
wire = sum(sum(len(memoryview(f).cast("B")) for f in serialize_bytelist(s, serializers=serializers))
           for s in samples)

def load_kiln_dask():
    import kiln.dask   # noqa: F401
    return True

with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, host="127.0.0.1",
                  dashboard_address=None, serializers=serializers,
                  deserializers=["dask", "pickle"]) as cluster, \
        Client(cluster, serializers=serializers, deserializers=["dask", "pickle"]) as client:
    if mode == "kiln":
        client.run(load_kiln_dask)
    client.scatter(samples[:10])         # warm the connections
    t = time.perf_counter()
    futures = client.scatter(samples)
    back = client.gather(futures)
    dt = time.perf_counter() - t
    if what == "directories":
        assert back[5] == samples[5]
    else:
        assert back[5]["t"] == samples[5]["t"] and back[5]["text"] == samples[5]["text"]
    del futures
print(json.dumps({"seconds": dt, "wire_bytes": wire}))
"""


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args(argv)
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    print("| sent | serializers | round trip s (median of %d) | bytes on the wire |" % a.repeat)
    print("| --- | --- | --- | --- |")
    ratios = []
    for what in ("records", "directories"):
        rows = {}
        for mode in ("pickle", "kiln"):
            runs = []
            for _ in range(a.repeat):
                r = subprocess.run([sys.executable, "-c", CHILD, mode, str(a.samples), what],
                                   capture_output=True, text=True, env=env, timeout=600)
                if r.returncode:
                    sys.stderr.write(r.stderr)
                    raise SystemExit("the %s run failed" % mode)
                runs.append(json.loads(r.stdout.strip().splitlines()[-1]))
            rows[mode] = (statistics.median(x["seconds"] for x in runs), runs[0]["wire_bytes"])
        for mode, (sec, w) in rows.items():
            label = "kiln (kiln.dask)" if mode == "kiln" else "Dask default (pickle 5)"
            print("| %d %s | %s | %.3f | %d |" % (a.samples, what, label, sec, w))
        ratios.append("%s %.2f" % (what, rows["kiln"][0] / rows["pickle"][0]))
    print("ratio kiln / default: " + ", ".join(ratios))


if __name__ == "__main__":
    main()
