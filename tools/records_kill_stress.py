"""Kill record writers at random moments and check that every complete record
is recovered (a long run of what tests/test_records.py does twice).

    python tools/records_kill_stress.py [--rounds 200] [--folder /tmp]

Each round starts a writer process (records of random sizes, a flush every
few records, tensors in some), kills it with SIGKILL after a random delay,
then opens the file with ``recover=True`` and checks that the records are
exactly the first ``len(rf)`` the writer was asked to write, and that
``iter_records`` over the same bytes stops with EOF or FRAME at the same
place.  Exits 1 at the first mismatch.
"""

import argparse
import io
import os
import random
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import kiln  # noqa: E402

T = "struct{id:i64,blob:list<u8>,img:tensors,}"
WRITER = """
import random, sys, numpy as np, kiln
rng = random.Random(int(sys.argv[2]))
with kiln.RecordWriter(sys.argv[1], %r) as w:
    i = 0
    while True:
        n = rng.choice((0, 10, 1000, 70000))
        img = {"x": np.full(rng.choice((0, 3, 5000)), i %% 256, np.uint8)}
        w.write({"id": i, "blob": bytes([i %% 256]) * n, "img": img})
        if rng.random() < 0.2:
            w.flush()
        i += 1
""" % T


def expected(seed, count):
    rng = random.Random(seed)
    out = []
    for i in range(count):
        n = rng.choice((0, 10, 1000, 70000))
        m = rng.choice((0, 3, 5000))
        out.append((i, bytes([i % 256]) * n, bytes([i % 256]) * m))
        rng.random()
    return out


def one_round(folder, seed):
    path = os.path.join(folder, "stress-%d.kilnr" % seed)
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.Popen([sys.executable, "-c", WRITER, path, str(seed)], env=env)
    try:
        deadline = time.monotonic() + 60
        while not os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(random.Random(seed).uniform(0.0, 1.0))
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    try:
        with kiln.RecordFile(path, T, recover=True) as rf:
            got = [(r["id"], r["blob"], bytes(r["img"]["x"].data)) for r in rf]
            stop = rf.recovery
    except kiln.KilnError as e:            # killed before the header reached the file
        if os.path.getsize(path) >= 16:
            raise
        return 0, str(e)
    if got != expected(seed, len(got)):
        raise SystemExit("round %d: the recovered records differ from those written" % seed)
    with open(path, "rb") as f:
        data = f.read()
    streamed = 0
    try:
        for _ in kiln.iter_records(io.BytesIO(data), T):
            streamed += 1
    except kiln.KilnError:
        pass
    if streamed != len(got):
        raise SystemExit("round %d: the stream read %d records, recovery %d"
                         % (seed, streamed, len(got)))
    os.remove(path)
    return len(got), stop.error.code if stop else "closed"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--folder", default=tempfile.gettempdir())
    args = ap.parse_args(argv)
    total = 0
    for seed in range(args.rounds):
        n, why = one_round(args.folder, seed)
        total += n
        print("round %d: %d records recovered (%s)" % (seed, n, why), flush=True)
    print("ok: %d rounds, %d records recovered" % (args.rounds, total))
    return 0


if __name__ == "__main__":
    sys.exit(main())
