"""Readers of every kind against files that other processes change under them
(issue 51, item 8).

    python tools/stress_readers.py [--seconds 600] [--readers 2] [--folder DIR]
                                   [--json PATH]

A tensor file (with checksums) and a record file (with tensors) are made in
``--folder`` (a new temporary folder by default).  One mutator process
changes them for the whole run, at random: truncates a file in place (to a
random size), extends it, rewrites it in place (its own bytes, one flipped),
replaces it atomically (a new file renamed over it), and puts it back.  The
``--readers`` reader processes read them meanwhile, each call of every kind:
``kiln.open`` and its calls (a tensor's first read, ``verify``, ``rows``,
``tensors``, ``values``, ``copy_into``), ``load_tensors`` (views and
``copy=True``), ``RecordFile`` (a record, a slice, every record),
``iter_records`` and ``StreamDecoder`` over the file's bytes, and, where
torch is installed, ``kiln.torch.load_model``.  A reader touches no view kiln
handed out once the call returned (those are the documented exception: they
read the mapping when used).  A call may fail with any exception that
says the file is not what it was; a reader that dies by a signal (SIGBUS,
SIGSEGV) is a crash: counted, named, and replaced by a new reader.

Prints the calls made by kind, the mutations, and the crashes; exits 1 when a
reader crashed, 0 otherwise.
"""

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
T = "struct{id:i64,x:tensors,}"

_READER = r"""
import faulthandler; faulthandler.enable()   # a crash names the call it died in
import json, os, random, sys, time
import numpy as np
import kiln, kiln.records
folder, deadline, seed = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
wanted = sys.argv[4].split(",")
rnd = random.Random(seed)
tp, rp = os.path.join(folder, "t.kiln"), os.path.join(folder, "r.kilnr")
T = "struct{id:i64,x:tensors,}"
try:
    import torch, kiln.torch
except ImportError:
    torch = None
counts = {}

def tensor_calls():
    f = kiln.open(tp)
    try:
        name = rnd.choice(["a", "b", "flag"])
        k = rnd.randrange(7)
        if k == 0: f[name]
        elif k == 1: f.verify()
        elif k == 2: f.rows(name, 0, 8)
        elif k == 3: f.tensors()
        elif k == 4: f.values()
        elif k == 5: f["a"].copy_into(np.empty(200000, np.float32))
        else: kiln.load_tensors(tp, copy=rnd.random() < 0.5)
        return "open.%d" % k
    finally:
        f.close()

def record_calls():
    k = rnd.randrange(5)
    if k < 3:
        with kiln.RecordFile(rp, T) as rf:
            if k == 0: rf[rnd.randrange(max(1, len(rf)))]
            elif k == 1: rf[10:50]
            else: sum(1 for _ in rf)
    elif k == 3:
        iterate()
    else:
        stream()
    return "records.%d" % k

def iterate():   # kiln.iter_records over the open file
    with open(rp, "rb") as f:
        sum(1 for _ in kiln.iter_records(f, T))

def stream():   # the record file's bytes fed to a StreamDecoder
    d = kiln.StreamDecoder(T)
    with open(rp, "rb") as f:
        while True:
            b = f.read(65536)
            if not b:
                break
            for _ in d.feed(b):
                pass
    d.eof()

def copy_calls():   # whole reads through pread: load_tensors(copy=True), the streams
    k = rnd.randrange(3)
    (lambda: kiln.load_tensors(tp, copy=True), iterate, stream)[k]()
    return "copies.%d" % k

def torch_calls():
    m = torch.nn.ParameterDict({"a": torch.nn.Parameter(torch.zeros(200000)),
                                "b": torch.nn.Parameter(torch.zeros(200000))})
    kiln.torch.load_model(m, tp, strict=False)
    return "torch.load_model"

every = {"open": tensor_calls, "records": record_calls, "copies": copy_calls}
if torch is not None:
    every["torch"] = torch_calls
kinds = [every[k] for k in wanted if k in every]
while time.time() < deadline:
    call = rnd.choice(kinds)
    try:
        what = call()
        counts[what] = counts.get(what, 0) + 1
    except Exception as e:   # any refusal: the file changed under the reader
        key = "refused." + type(e).__name__
        counts[key] = counts.get(key, 0) + 1
        if not isinstance(e, kiln.KilnError):   # what else readers were told, once each
            counts.setdefault("other: %s: %s" % (type(e).__name__, str(e)[:120]), 0)
print(json.dumps(counts))
"""


def _make(folder):
    import numpy as np
    sys.path.insert(0, str(ROOT))
    import kiln
    tp, rp = os.path.join(folder, "t.kiln"), os.path.join(folder, "r.kilnr")
    kiln.save_tensors(tp, {"a": np.arange(200000, dtype=np.float32),
                           "b": np.ones(200000, np.float32),
                           "flag": np.zeros(5000, np.bool_)}, checksum=True)
    with kiln.RecordWriter(rp, T) as w:
        for i in range(200):
            w.write({"id": i, "x": {"w": np.full(1000, i, np.float32)}})
    return {tp: open(tp, "rb").read(), rp: open(rp, "rb").read()}


def _mutate(originals, deadline, seed):
    """The mutator (run in a child): changes the files until ``deadline``."""
    rnd = random.Random(seed)
    counts = {}
    while time.time() < deadline:
        path = rnd.choice(sorted(originals))
        data = originals[path]
        k = rnd.randrange(5)
        try:
            if k == 0:   # truncate in place
                os.truncate(path, rnd.randrange(len(data)))
            elif k == 1:   # extend
                with open(path, "ab") as f:
                    f.write(bytes(rnd.randrange(1, 1 << 16)))
            elif k == 2:   # rewrite in place, one byte flipped
                b = bytearray(data)
                b[rnd.randrange(len(b))] ^= 1 << rnd.randrange(8)
                with open(path, "r+b") as f:
                    f.write(b)
            elif k == 3:   # replace atomically
                tmp = path + ".new"
                with open(tmp, "wb") as f:
                    f.write(data)
                os.replace(tmp, path)
            else:   # put back in place (truncate, then write)
                with open(path, "wb") as f:
                    f.write(data)
        except OSError:
            pass
        counts[k] = counts.get(k, 0) + 1
        time.sleep(rnd.random() * 0.002)
    names = ["truncate", "extend", "rewrite", "replace", "restore"]
    print(json.dumps({names[k]: v for k, v in sorted(counts.items())}))


def _where(err):
    """The kiln frames of a crashed reader's traceback (faulthandler's), innermost first."""
    lines = [ln.strip() for ln in err.splitlines() if "File " in ln]
    return [ln.split("/kiln/", 1)[-1] if "/kiln/" in ln else ln for ln in lines[:6]]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=600)
    ap.add_argument("--readers", type=int, default=2)
    ap.add_argument("--folder")
    ap.add_argument("--kinds", default="open,records,copies,torch",
                    help="the readers: open (kiln.open and its calls, load_tensors views), "
                         "records (RecordFile), copies (load_tensors(copy=True), "
                         "iter_records and StreamDecoder over a file object), torch "
                         "(kiln.torch.load_model, where torch is installed)")
    ap.add_argument("--json")
    ap.add_argument("--mutator", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.mutator:   # the child that changes the files
        folder, deadline, seed = args.mutator
        names = [os.path.join(folder, n) for n in ("t.kiln", "r.kilnr")]
        originals = {n: open(n + ".orig", "rb").read() for n in names}
        _mutate(originals, float(deadline), int(seed))
        return 0
    folder = args.folder or tempfile.mkdtemp(prefix="kiln-stress-")
    originals = _make(folder)
    for path, data in originals.items():
        with open(path + ".orig", "wb") as f:
            f.write(data)
    deadline = time.time() + args.seconds
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    mutator = subprocess.Popen([sys.executable, __file__, "--mutator", folder, str(deadline),
                                "1"], stdout=subprocess.PIPE, text=True, env=env)
    readers = {}
    seed = 100
    crashes = []
    calls = {}

    def start():
        nonlocal seed
        seed += 1
        p = subprocess.Popen([sys.executable, "-c", _READER, folder, str(deadline), str(seed),
                              args.kinds],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        readers[p.pid] = p

    try:
        for _ in range(args.readers):
            start()
        while readers:
            time.sleep(0.05)
            for pid, p in list(readers.items()):
                if p.poll() is None:
                    continue
                out, err = p.communicate()
                del readers[pid]
                if p.returncode < 0:   # died by a signal
                    crashes.append({"signal": signal.Signals(-p.returncode).name,
                                    "where": _where(err)})
                    if time.time() < deadline:
                        start()
                    continue
                if p.returncode != 0:
                    crashes.append({"exit": p.returncode, "stderr": err[-500:]})
                    continue
                for k, v in json.loads(out.strip().splitlines()[-1]).items():
                    calls[k] = calls.get(k, 0) + v
        mutations = json.loads(mutator.communicate(timeout=60)[0].strip() or "{}")
    finally:
        for p in list(readers.values()) + [mutator]:
            if p.poll() is None:
                p.kill()
                p.wait()
    report = {"seconds": args.seconds, "readers": args.readers, "calls": calls,
              "mutations": mutations, "crashes": crashes}
    print(json.dumps(report, indent=1, sort_keys=True))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 1 if crashes else 0


if __name__ == "__main__":
    sys.exit(main())
