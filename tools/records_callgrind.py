"""Count the instructions a record costs in the record container, with callgrind.

    tools/records_callgrind.py [--reps N] OP [OP ...]

OPs: ``small-list``, ``small-iter``, ``small-get``, ``small-stream`` and the
same with ``sample-`` (the two shapes of ``benchmarks/records_container.py``:
5,000 small records, 2,000 samples with a 28x28 u8 tensor).  ``list``
decodes the records as one ``list<...>`` value (the baseline), ``iter`` is
``list(RecordFile)``, ``get`` is ``rf[i]`` for every i, ``stream`` is
``list(iter_records(...))`` over an in-memory stream; the writes (issue 40)
go to a ``BytesIO``: ``write`` is ``RecordWriter.write`` of every record,
``many`` is ``write_many``, ``encode`` the framed encode of each value alone,
``msgpack`` a length-prefixed msgpack stream (``packb`` and a 4-byte
length); the ``user`` shape is issue 40's (5,000 records of an id, a string,
two floats and three ints).  Each OP runs under
``valgrind --tool=callgrind`` twice, with no repetition and with N, and the
difference divided by N and by the records is printed: the same on a busy
machine as on a quiet one (GC off, hash seed pinned, one BLAS thread).  The kernels are those
``import kiln`` picks (KILN_PUREPYTHON=1 for the pure ones).
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile

# the checkout whose kiln is counted (another one: KILN_CG_ROOT=path)
ROOT = os.environ.get("KILN_CG_ROOT") or \
    os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIZES = {"small": 5000, "sample": 2000, "user": 5000}
# issue 40's shape, for a checkout whose benchmarks do not have it
USER = ("struct{id:i64,name:str,x:f64,y:f64,tags:list<i64>,}",
        lambda i: {"id": i, "name": "sample-%06d" % i, "x": i * 0.5, "y": -1.25,
                   "tags": [i, i + 1, i + 2]})


def child(op, reps, folder):
    import gc
    import io
    sys.path.insert(0, ROOT)
    import kiln
    from benchmarks.records_container import SHAPES
    shape, what = op.split("-", 1)
    text, make = SHAPES[shape] if shape in SHAPES else USER
    n = SIZES[shape]
    values = [make(i) for i in range(n)]
    path = os.path.join(folder, shape + ".kilnr")
    if not os.path.exists(path):
        with kiln.RecordWriter(path, text) as w:
            for v in values:
                w.write(v)
    rf = kiln.RecordFile(path, text)
    listbuf = kiln.encode(values, "list<%s>" % text)
    dec = kiln.Decoder("list<%s>" % text)
    with open(path, "rb") as f:
        raw = f.read()
    def write():
        with kiln.RecordWriter(io.BytesIO(), text) as w:
            for v in values:
                w.write(v)

    def many():
        with kiln.RecordWriter(io.BytesIO(), text) as w:
            w.write_many(values)

    def lp_msgpack():
        import struct
        import msgpack
        out, packb, pack = io.BytesIO(), msgpack.packb, struct.Struct("<I").pack
        for v in plain:
            b = packb(v)
            out.write(pack(len(b)) + b)
    plain = [{k: (x["x"].tobytes() if k == "img" else x) for k, x in v.items()}
             for v in values]
    enc = kiln.Encoder(text, True).encode
    f = {"list": lambda: dec.decode(listbuf), "iter": lambda: list(rf),
         "get": lambda: [rf[i] for i in range(n)],
         "stream": lambda: list(kiln.iter_records(io.BytesIO(raw), text)),
         "write": write, "many": many, "encode": lambda: [enc(v) for v in values],
         "msgpack": lp_msgpack}[what]
    f()
    gc.disable()
    for _ in range(reps):
        f()


def count(op, reps, folder):
    out = os.path.join(folder, "cg.out")
    # one BLAS thread: an idle thread pool's spinning would be counted too
    env = dict(os.environ, PYTHONHASHSEED="0", OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    r = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=" + out,
                        sys.executable, __file__, "--child", op, str(reps), folder],
                       capture_output=True, text=True, env=env)
    m = re.search(r"Collected : (\d+)", r.stderr)
    if r.returncode or not m:
        raise SystemExit("callgrind failed for %s:\n%s" % (op, r.stderr[-2000:]))
    os.unlink(out)
    return int(m.group(1))


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--child":
        return child(argv[1], int(argv[2]), argv[3])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("ops", nargs="+")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        for op in args.ops:
            count(op, 0, folder)             # writes the file once, outside the counts
            base = count(op, 0, folder)
            more = count(op, args.reps, folder)
            n = SIZES[op.split("-", 1)[0]]
            print("%-14s %10.0f instructions per record" % (op, (more - base) / args.reps / n))
    return 0


if __name__ == "__main__":
    sys.exit(main())
