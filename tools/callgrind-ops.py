"""Count the instructions of one kiln operation with callgrind.

    tools/callgrind-ops.py [--reps N] OP [OP ...]

For each OP the script runs under ``valgrind --tool=callgrind`` twice, once
doing the setup only and once doing the setup and N repetitions of OP, and
prints the difference divided by N: the instructions of one OP, repeatable
whatever else the machine is doing (the garbage collector is off during the
repetitions and hash randomisation is pinned, so runs agree to the
instruction).  Ops: records-decode, records-encode (with
the suffix -list: tags declared list[kiln.i32], decoded to Python lists;
then -slots: the record class a slots dataclass; records-decode-shared: the
records in a bytearray, whose strings are copied before they are decoded;
records-decode-text: a bytearray of records whose names are 300-byte ASCII
and short non-ASCII strings, in turn),
tensors-decode, tensors-numpy, tensors-encode, tensors-floor (one
``np.frombuffer`` per tensor, the many-tensors decode floor), sample-decode,
sample-encode (500 samples of the benchmarks' sample workload).  The kernels are whatever
``import kiln`` picks (KILN_PUREPYTHON=1 for the pure ones).
"""

import argparse
import dataclasses
import os
import re
import subprocess
import sys
import tempfile


def build(op):
    import numpy as np
    import kiln

    @dataclasses.dataclass
    class Rec:
        id: int
        name: str
        score: float
        tags: kiln.list_(kiln.i32)

    @dataclasses.dataclass
    class RecL:
        id: int
        name: str
        score: float
        tags: list[kiln.i32]

    if op in ("records-decode-shared", "records-decode-text"):
        long = op == "records-decode-text"
        t = kiln.list_(kiln.struct(Rec))
        recs = [Rec(i, ("n%03d" % (i % 1000)) * 75 if long and i % 2 else
                    "n\u00e9me-%d" % i if long else "name-%d" % i,
                    i * 0.5, np.arange(i % 8, dtype=np.int32)) for i in range(20000)]
        buf = bytearray(kiln.encode(recs, t))
        d = kiln.Decoder(t).decode
        return lambda: d(buf)
    if op.startswith("records"):
        slots = op.endswith("-slots")  # the class is a slots dataclass
        op = op[:-6] if slots else op
        lists = op.endswith("-list")   # tags declared list[kiln.i32]: Python lists
        op = op[:-5] if lists else op
        cls = RecL if lists else Rec
        if slots:
            cls = dataclasses.dataclass(slots=True)(
                type(cls.__name__ + "S", (), {"__annotations__": dict(cls.__annotations__)}))
        t = kiln.list_(kiln.struct(cls))
        recs = [cls(i, "name-%d" % i, i * 0.5, list(range(i % 8)) if lists
                    else np.arange(i % 8, dtype=np.int32))
                for i in range(20000)]
        buf = kiln.encode(recs, t)
        if op == "records-decode":
            d = kiln.Decoder(t).decode
            return lambda: d(buf)
        e = kiln.Encoder(t).encode
        return lambda: e(recs)
    if op.startswith("sample"):   # 500 samples of the benchmarks' sample workload
        @dataclasses.dataclass
        class Sample:
            id: int
            text: str
            batch: kiln.tensors

        batch = {"tokens": np.arange(512, dtype=np.int32), "mask": np.ones(512, np.uint8),
                 "emb": np.ones((512, 64), np.float16), "label": np.array([7], np.int64)}
        samples = [Sample(i, "sample text number %d" % i, batch) for i in range(500)]
        enc = kiln.Encoder(Sample).encode
        bufs = [enc(s) for s in samples]
        if op == "sample-decode":
            dec = kiln.Decoder(Sample).decode
            return lambda: [(s.id, s.text, s.batch.to_dict()) for s in map(dec, bufs)]
        return lambda: [enc(s) for s in samples]
    ws = {"t%05d" % i: np.full(16, i, np.float32) for i in range(10000)}
    buf = kiln.encode_tensors(ws)
    if op == "tensors-decode":
        return lambda: kiln.decode_tensors(buf)
    if op == "tensors-numpy":
        return lambda: [t.numpy() for t in kiln.decode_tensors(buf).values()]
    if op == "tensors-floor":   # the many-tensors decode floor: np.frombuffer per tensor
        offs = [t.numpy().ctypes.data - np.frombuffer(buf, np.uint8).ctypes.data
                for t in kiln.decode_tensors(buf).values()]
        return lambda: [np.frombuffer(buf, np.float32, 16, o) for o in offs]
    return lambda: kiln.encode_tensors(ws)


def count(op, reps):
    code = ("import sys; sys.path.insert(0, %r); import importlib.util as u; "
            "s = u.spec_from_file_location('cg', %r); m = u.module_from_spec(s); "
            "s.loader.exec_module(m); f = m.build(%r); f(); import gc; gc.collect(); "
            "gc.disable(); [f() for _ in range(%d)]"
            % (os.path.dirname(__file__), __file__, op, reps))
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "cg.out")
        # the same dict layouts every run; no OpenBLAS worker threads, whose
        # spin-waiting after numpy's import callgrind would count (up to about
        # 10 million instructions an op, differing from run to run)
        env = dict(os.environ, PYTHONHASHSEED="0", OPENBLAS_NUM_THREADS="1")
        subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=" + out,
                        sys.executable, "-c", code], check=True, capture_output=True, env=env)
        with open(out) as fh:
            text = fh.read()
    return int(re.search(r"^summary: (\d+)", text, re.M).group(1))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("ops", nargs="+")
    a = ap.parse_args(argv)
    for op in a.ops:
        base = count(op, 0)
        full = count(op, a.reps)
        print("%-16s %14.0f instructions per op" % (op, (full - base) / a.reps), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
