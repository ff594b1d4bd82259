"""Readers of every kind against files that other processes change under them
(issue 51 item 8; every value checked, issue 56 item 15).

    python tools/stress_readers.py [--seconds 600] [--readers 2] [--folder DIR]
                                   [--kinds open,records,copies,torch,gens] [--json PATH]

Two kinds of file are made in ``--folder`` (a new temporary folder by default).

*Damaged in place.*  A tensor file (with checksums) and a record file (with
tensors), which one mutator process changes for the whole run, at random:
truncates in place (to a random size), extends, rewrites in place (its own
bytes, one flipped), replaces atomically (a new file renamed over it), and
puts back.  A file changed in place has no generation a reader could be held
to, so these calls are held to this: no reader dies by a signal, and every
refusal is a ``KilnError`` (or ``ValueError`` of a closed file) that says the
file is not what it was (the report lists any other exception by message).

*Generations.*  A tensor file, a record file and a sharded set that a writer
process saves again and again, each save a new generation ``g`` replacing the
old one the way kiln's writers do (a new file renamed over the path; a set's
new shards, then its index).  Every value of generation ``g`` says ``g``
(``a = g * 10**6 + arange``, ``b = g + 0.5``, ``flag`` the bits of ``g``,
the tied pair ``tie.w``/``tie.v`` ``g + arange``, record ``i``'s id
``g * 1000 + i``, ``40 + g % 5`` records), so each reader call is checked
against an oracle that needs no decoder: everything one call returns, and
everything one open file returns across its calls, must be exactly one
generation, never a mix, never bytes of no generation.  The files are always
whole, so any refusal is wrong too, except a set's shard already removed
(``FileNotFoundError``) and a ``RecordFile`` closed by another thread
(``ValueError``).  The calls: ``kiln.open`` (a tensor, ``tensors``,
``values``, ``rows``, ``copy_into``, ``verify``), ``load_tensors`` (views,
``copy=True``, ``copy=True, max_copy_bytes=``), ``RecordFile`` (a record, a
slice, every record, and ``rf[i]`` racing ``close()`` in another thread),
the set (``kiln.open`` of its folder), and, where torch is installed,
``kiln.torch.load_file`` and ``load_model`` on the CPU (a module whose two
names share one tied parameter, ``assign=True`` too) of the file and of the
set, and the staged device path (``kiln.torch._pipeline.load(stage=True)``,
the host standing in for the device: random chunk sizes, slots, threads,
O_DIRECT or not) of the file and of the set.

Readers run ``--readers`` at a time, each call kind chosen at random (and
each kind at least once with an answer, past the deadline if need be (the
mutator puts the files back whole when it stops): a reader slow to start on
a busy machine still covers them).  A
reader touches no view kiln handed out once the call returned (those are the
documented exception: they read the mapping when used).  A reader that dies
by a signal (SIGBUS, SIGSEGV) is a crash: counted, named, and replaced by a
new reader.

Prints the calls made by kind, the mutations, the generations written, the
crashes and the wrong values; exits 1 when a reader crashed or any call gave
a wrong value, 0 otherwise.
"""

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
T = "struct{id:i64,x:tensors,}"
KINDS = "open,records,copies,torch,gens"

# --- generations: what generation g holds, and which g a value is -------------------

_A, _B, _FLAG, _TIE = 50000, 20000, 4096, 1000


def gen_tensors(g):
    """The tensors of generation ``g`` (numpy)."""
    import numpy as np
    tie = np.arange(_TIE, dtype=np.float32) + g
    return {"a": g * 10 ** 6 + np.arange(_A, dtype=np.int64),
            "b": np.full(_B, g + 0.5, np.float64),
            "flag": np.array([(g >> (i % 20)) & 1 for i in range(_FLAG)], np.bool_),
            "tie.v": tie, "tie.w": tie.copy()}   # a tied pair stored under both names


def gen_records(g):
    import numpy as np
    return [{"id": g * 1000 + i, "x": {"w": np.full(64, g * 1000 + i, np.float32)}}
            for i in range(40 + g % 5)]


def gen_of(name, arr, lo=None):
    """The generation whose tensor ``name`` is ``arr`` (the whole tensor; with
    ``lo``, rows from ``lo`` on), or None."""
    import numpy as np
    arr = np.asarray(arr)
    whole = lo is None
    lo = lo or 0
    if name == "a" and arr.dtype == np.int64 and arr.ndim == 1 and arr.size:
        d = arr - np.arange(lo, lo + arr.size, dtype=np.int64)
        g, r = divmod(int(d[0]), 10 ** 6)
        ok = r == 0 and (d == d[0]).all() and (arr.size == _A or not whole)
    elif name == "b" and arr.dtype == np.float64 and arr.size and (arr.size == _B or not whole):
        g = int(arr[0] - 0.5)
        ok = (arr == g + 0.5).all()
    elif name == "flag" and arr.dtype == np.bool_ and arr.size == _FLAG and whole:
        g = sum(int(arr[i]) << i for i in range(20))
        ok = (arr == np.resize(arr[:20], _FLAG)).all()
    elif name in ("tie.w", "tie.v") and arr.dtype == np.float32 and arr.size == _TIE:
        g = int(arr[0])
        ok = (arr == np.arange(_TIE, dtype=np.float32) + g).all()
    else:
        return None
    return g if ok and g > 0 else None


def _write_generations(folder, deadline):
    """The writer (run in a child): a new generation of every file until ``deadline``."""
    import kiln
    tp, rp, sp = (os.path.join(folder, n) for n in ("gt.kiln", "gr.kilnr", "gset"))
    g = 1
    while time.time() < deadline:
        g += 1
        kiln.save_tensors(tp, gen_tensors(g), checksum=g % 2 == 0)
        with kiln.RecordWriter(rp, T) as w:
            w.write_many(gen_records(g))
        if g % 2 == 0:
            kiln.save_sharded(gen_tensors(g), sp, max_shard_size=100000)
        time.sleep(0.002)
    print(json.dumps({"generations": g}))


def _first_generation(folder):
    import kiln
    kiln.save_tensors(os.path.join(folder, "gt.kiln"), gen_tensors(1), checksum=True)
    with kiln.RecordWriter(os.path.join(folder, "gr.kilnr"), T) as w:
        w.write_many(gen_records(1))
    kiln.save_sharded(gen_tensors(1), os.path.join(folder, "gset"), max_shard_size=100000)


# --- the reader (run in a child) ------------------------------------------------------

class Wrong(Exception):
    """A call returned a value of no generation, or of two, or refused a whole file."""


class _Reader:
    def __init__(self, folder, seed):
        import numpy as np
        import kiln
        import kiln.records   # noqa: F401 (loaded before the clock runs)
        self.np, self.kiln = np, kiln
        self.rnd = random.Random(seed)
        self.tp, self.rp = os.path.join(folder, "t.kiln"), os.path.join(folder, "r.kilnr")
        self.gt, self.gr, self.gs = (os.path.join(folder, n)
                                     for n in ("gt.kiln", "gr.kilnr", "gset"))
        try:
            import torch
            import kiln.torch
            self.torch = torch
        except ImportError:
            self.torch = None

    # the files damaged in place: no crash, a KilnError or ValueError when refused
    def tensor_calls(self):
        np, kiln, rnd = self.np, self.kiln, self.rnd
        f = kiln.open(self.tp)
        try:
            name = rnd.choice(["a", "b", "flag"])
            k = rnd.randrange(7)
            if k == 0: f[name]
            elif k == 1: f.verify()
            elif k == 2: f.rows(name, 0, 8)
            elif k == 3: f.tensors()
            elif k == 4: f.values()
            elif k == 5: f["a"].copy_into(np.empty(200000, np.float32))
            else: kiln.load_tensors(self.tp, copy=rnd.random() < 0.5)
            return "open.%d" % k
        finally:
            f.close()

    def record_calls(self):
        k = self.rnd.randrange(5)
        if k < 3:
            with self.kiln.RecordFile(self.rp, T) as rf:
                if k == 0: rf[self.rnd.randrange(max(1, len(rf)))]
                elif k == 1: rf[10:50]
                else: sum(1 for _ in rf)
        elif k == 3:
            self.iterate()
        else:
            self.stream()
        return "records.%d" % k

    def iterate(self):   # kiln.iter_records over the open file
        with open(self.rp, "rb") as f:
            sum(1 for _ in self.kiln.iter_records(f, T))

    def stream(self):   # the record file's bytes fed to a StreamDecoder
        d = self.kiln.StreamDecoder(T)
        with open(self.rp, "rb") as f:
            while True:
                b = f.read(65536)
                if not b:
                    break
                for _ in d.feed(b):
                    pass
        d.eof()

    def copy_calls(self):   # whole reads through pread: load_tensors(copy=True), the streams
        k = self.rnd.randrange(3)
        (lambda: self.kiln.load_tensors(self.tp, copy=True), self.iterate, self.stream)[k]()
        return "copies.%d" % k

    def torch_calls(self):
        torch = self.torch
        m = torch.nn.ParameterDict({"a": torch.nn.Parameter(torch.zeros(200000)),
                                    "b": torch.nn.Parameter(torch.zeros(200000))})
        self.kiln.torch.load_model(m, self.tp, strict=False)
        return "torch.load_model"

    # the generations: every value checked
    def one_gen(self, got, what):
        """The one generation of ``got`` ({name: array}, or a list of (name, lo, array))."""
        items = got.items() if isinstance(got, dict) else got
        gens = set()
        for item in items:
            name, lo, arr = item if len(item) == 3 else (item[0], None, item[1])
            gens.add(gen_of(name, arr, lo))
        if len(gens) != 1 or None in gens:
            raise Wrong("%s: generations %s (None: a value of no generation)"
                        % (what, sorted(gens, key=str)))
        return gens.pop()

    def gen_open(self):
        np, kiln, rnd = self.np, self.kiln, self.rnd
        k = rnd.randrange(9)
        if k == 7:
            d = kiln.load_tensors(self.gt, copy=rnd.random() < 0.5)
            self.one_gen({n: t.numpy() for n, t in d.items()}, "load_tensors")
            return "gens.open.%d" % k
        if k == 8:
            d = kiln.load_tensors(self.gt, copy=True, max_copy_bytes=1 << 24)
            self.one_gen({n: t.numpy() for n, t in d.items()}, "load_tensors(max_copy_bytes)")
            return "gens.open.%d" % k
        with kiln.open(self.gt) as f:   # one open file: one generation across its calls
            seen = []
            for _ in range(2):
                name = rnd.choice(["a", "b", "flag", "tie.w", "tie.v"])
                if k == 0:
                    got = {name: f[name].numpy()}
                elif k == 1:
                    got = {n: t.numpy() for n, t in f.tensors().items()}
                elif k == 2:
                    got = dict(zip(f.keys(), (t.numpy() for t in f.values())))
                elif k == 3:
                    lo = rnd.randrange(0, 1000)
                    got = [("a", lo, f.rows("a", lo, lo + 500))]
                elif k == 4:
                    out = np.empty(_A, np.int64)
                    f["a"].copy_into(out)
                    got = {"a": out}
                elif k == 5:
                    if f.checksums is not None:
                        f.verify()   # one generation's bytes against its own CRC-32s
                    got = {"b": f["b"].numpy()}
                else:
                    got = {"a": f["a"].numpy(), "tie.v": f["tie.v"].numpy()}
                seen.append(self.one_gen(got, "kiln.open call %d" % k))
            if len(set(seen)) != 1:
                raise Wrong("one open file gave generations %s" % seen)
        return "gens.open.%d" % k

    def check_records(self, rf, got, what):
        """``got``: (index, record) pairs of one RecordFile: one generation, in place."""
        gens = set()
        for i, r in got:
            g, j = divmod(int(r["id"]), 1000)
            w = self.np.asarray(r["x"]["w"].numpy() if hasattr(r["x"]["w"], "numpy")
                                else r["x"]["w"])
            if j != i or not (w == r["id"]).all() or w.size != 64:
                raise Wrong("%s: record %d is id %d" % (what, i, r["id"]))
            gens.add(g)
        if len(gens) > 1:
            raise Wrong("%s: generations %s" % (what, sorted(gens)))
        if rf is not None and gens and len(rf) != 40 + next(iter(gens)) % 5:
            raise Wrong("%s: %d records in generation %s" % (what, len(rf), gens))

    def gen_records(self):
        k = self.rnd.randrange(4)
        if k == 3:
            return self.gen_close()
        with self.kiln.RecordFile(self.gr, T) as rf:
            n = len(rf)
            if k == 0:
                i = self.rnd.randrange(n)
                got = [(i, rf[i]), (0, rf[0])]
            elif k == 1:
                a = self.rnd.randrange(n)
                got = list(zip(range(a, n), rf[a:n]))
            else:
                got = list(enumerate(rf))
            self.check_records(rf, got, "RecordFile call %d" % k)
        return "gens.records.%d" % k

    def gen_close(self):
        """rf[i] in a thread while this one closes the file: every record it
        returns is its own, then ValueError (closed)."""
        rf = self.kiln.RecordFile(self.gr, T)
        n, got, errors = len(rf), [], []
        rnd = random.Random(self.rnd.random())

        def read():
            try:
                while True:
                    i = rnd.randrange(n)
                    got.append((i, rf[i]))
            except ValueError as e:
                if "closed" not in str(e):
                    errors.append(e)
            except Exception as e:   # anything else is wrong
                errors.append(e)

        t = threading.Thread(target=read)
        t.start()
        time.sleep(self.rnd.random() * 0.003)
        rf.close()
        t.join()
        if errors:
            raise Wrong("rf[i] racing close: %s: %s" % (type(errors[0]).__name__, errors[0]))
        self.check_records(None, got, "rf[i] racing close")
        return "gens.close"

    def gen_set(self):
        k = self.rnd.randrange(2)
        try:
            with self.kiln.open(self.gs) as f:
                if k == 0:   # a reader that holds the set a while: shards opened later
                    got, hold = {}, self.rnd.choice((0, 0.01, 0.2))
                    for n in f.keys():   # (a set is saved every 2nd generation)
                        got[n] = f[n].numpy()
                        time.sleep(self.rnd.random() * hold)
                else:
                    got = {n: t.numpy() for n, t in f.tensors().items()}
                self.one_gen(got, "set call %d" % k)
        except FileNotFoundError:   # a shard removed after a later set replaced it
            return "gens.set.gone"
        return "gens.set.%d" % k

    def gen_torch(self):
        torch, kt = self.torch, self.kiln.torch
        k = self.rnd.randrange(7)
        where = self.gs if k in (3, 4, 6) else self.gt
        try:
            if k >= 5:
                return self.gen_staged(k, where)
            if k in (0, 3):
                sd = kt.load_file(where)
                self.one_gen({n: t.numpy() for n, t in sd.items()}, "load_file %d" % k)
                return "gens.torch.%d" % k
            m = torch.nn.Module()
            m.register_buffer("a", torch.zeros(_A, dtype=torch.int64))
            m.register_buffer("b", torch.zeros(_B, dtype=torch.float64))
            m.register_buffer("flag", torch.zeros(_FLAG, dtype=torch.bool))
            m.tie = torch.nn.Module()
            m.tie.w = torch.nn.Parameter(torch.zeros(_TIE))
            m.tie.v = m.tie.w   # one parameter under two names: the file holds both
            kt.load_model(m, where, assign=k == 2)
            sd = m.state_dict()
            if sd["tie.w"] is not sd["tie.v"] and sd["tie.w"].data_ptr() != sd["tie.v"].data_ptr():
                raise Wrong("load_model %d untied tie.w and tie.v" % k)
            self.one_gen({n: t.detach().numpy() for n, t in sd.items()}, "load_model %d" % k)
        except FileNotFoundError:
            if where != self.gs:
                raise
            return "gens.torch.gone"
        return "gens.torch.%d" % k

    def gen_staged(self, k, where):
        """The staged device path (``load_file(device=...)``, ``load_model``
        onto a GPU) with host memory standing in for the device: reached
        from the public calls only with CUDA, so called as the tests call it."""
        from kiln.torch import _load as L, _pipeline as P
        torch, rnd = self.torch, self.rnd
        with self.kiln.open(where) as f, L._Files() as files:
            entries = files.entries(f)
            items = [L._item(torch, n, e, L._torch_dtype(torch, e.t, e.src.name), None)
                     for n, e in entries.items()]
            outs = P.load(items, "cpu", stage=True, chunk_bytes=rnd.choice([4096, 65536, 1 << 20]),
                          threads=rnd.randint(1, 3), slots=rnd.randint(1, 3),
                          direct_io=rnd.random() < 0.25)
        self.one_gen({n: t.numpy() for n, t in zip(entries, outs)}, "staged load %d" % k)
        return "gens.torch.%d" % k

    def gen_calls(self):
        calls = [self.gen_open, self.gen_open, self.gen_records, self.gen_set]
        if self.torch is not None:
            calls.append(self.gen_torch)
        call = self.rnd.choice(calls)
        try:
            return call()
        except Wrong:
            raise
        except Exception as e:   # the files are always whole: a refusal is wrong
            raise Wrong("%s refused a whole file: %s: %s"
                        % (call.__name__, type(e).__name__, str(e)[:200])) from None


def _go(folder, seed):
    """Say this reader is ready (its imports done), then wait for the run's
    deadline: the clock starts when every reader can call, however slowly a
    busy machine starts them."""
    open(os.path.join(folder, "ready.%d" % seed), "w").close()
    go = os.path.join(folder, "go")
    while not os.path.exists(go):
        time.sleep(0.01)
    with open(go) as f:
        return float(f.read())


def _read(folder, seed, wanted):
    import faulthandler
    faulthandler.enable()   # a crash names the call it died in
    r = _Reader(folder, seed)
    deadline = _go(folder, seed)
    every = {"open": r.tensor_calls, "records": r.record_calls, "copies": r.copy_calls,
             "gens": r.gen_calls}
    if r.torch is not None:
        every["torch"] = r.torch_calls
    kinds = [every[k] for k in wanted if k in every]
    counts, wrong = {}, []
    left = list(kinds)   # a reader slow to start still makes one call of each kind
    while time.time() < deadline or (left and time.time() < deadline + 60):
        call = r.rnd.choice(kinds) if time.time() < deadline else left[0]
        try:
            what = call()
            counts[what] = counts.get(what, 0) + 1
            if call in left:
                left.remove(call)
        except Wrong as e:
            counts["wrong"] = counts.get("wrong", 0) + 1
            if len(wrong) < 20:
                wrong.append(str(e))
        except Exception as e:   # any refusal: the file changed under the reader
            key = "refused." + type(e).__name__
            counts[key] = counts.get(key, 0) + 1
            if not isinstance(e, r.kiln.KilnError):   # what else readers were told, once each
                counts.setdefault("other: %s: %s" % (type(e).__name__, str(e)[:120]), 0)
    print(json.dumps({"counts": counts, "wrong": wrong}))


# --- the files damaged in place ---------------------------------------------------------

def _make(folder):
    import numpy as np
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
    for path, data in originals.items():   # whole again for the readers' last calls
        tmp = path + ".new"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    names = ["truncate", "extend", "rewrite", "replace", "restore"]
    print(json.dumps({names[k]: v for k, v in sorted(counts.items())}))


def _where(err):
    """The kiln frames of a crashed reader's traceback (faulthandler's), innermost first."""
    lines = [ln.strip() for ln in err.splitlines() if "File " in ln]
    return [ln.split("/kiln/", 1)[-1] if "/kiln/" in ln else ln for ln in lines[:6]]


def _wait_ready(folder, readers, n):
    """Until ``n`` readers said they are ready (or one ended: it is reported)."""
    limit = time.time() + 600
    while time.time() < limit:
        if sum(1 for x in os.listdir(folder) if x.startswith("ready.")) >= n or \
                any(p.poll() is not None for p in readers.values()):
            return
        time.sleep(0.05)


def _children(args, folder, deadline, env):
    """The mutator and, when readers read generations, the generation writer."""
    me = [sys.executable, os.path.abspath(__file__)]
    kids = {"mutator": subprocess.Popen(me + ["--mutator", folder, str(deadline), "1"],
                                        stdout=subprocess.PIPE, text=True, env=env)}
    if "gens" in args.kinds.split(","):
        kids["writer"] = subprocess.Popen(me + ["--generations", folder, str(deadline)],
                                          stdout=subprocess.PIPE, text=True, env=env)
    return kids


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=600)
    ap.add_argument("--readers", type=int, default=2)
    ap.add_argument("--folder")
    ap.add_argument("--kinds", default=KINDS,
                    help="the readers: open (kiln.open and its calls, load_tensors views), "
                         "records (RecordFile), copies (load_tensors(copy=True), "
                         "iter_records and StreamDecoder over a file object), torch "
                         "(kiln.torch.load_model, where torch is installed), gens (every "
                         "value checked against the generation it must be)")
    ap.add_argument("--json")
    ap.add_argument("--mutator", nargs=3, help=argparse.SUPPRESS)
    ap.add_argument("--generations", nargs=2, help=argparse.SUPPRESS)
    ap.add_argument("--reader", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.mutator:   # the child that changes the files
        folder, deadline, seed = args.mutator
        names = [os.path.join(folder, n) for n in ("t.kiln", "r.kilnr")]
        originals = {n: open(n + ".orig", "rb").read() for n in names}
        _mutate(originals, float(deadline), int(seed))
        return 0
    if args.generations:   # the child that saves generation after generation
        _write_generations(args.generations[0], float(args.generations[1]))
        return 0
    if args.reader:
        folder, seed, kinds = args.reader
        _read(folder, int(seed), kinds.split(","))
        return 0
    folder = args.folder or tempfile.mkdtemp(prefix="kiln-stress-")
    for x in os.listdir(folder):   # an earlier run's start signals
        if x == "go" or x.startswith("ready."):
            os.remove(os.path.join(folder, x))
    sys.path.insert(0, str(ROOT))
    originals = _make(folder)
    _first_generation(folder)
    for path, data in originals.items():
        with open(path + ".orig", "wb") as f:
            f.write(data)
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    readers, kids = {}, {}
    seed = 100
    crashes, wrong, calls = [], [], {}

    def start():
        nonlocal seed
        seed += 1
        p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--reader", folder,
                              str(seed), args.kinds],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        readers[p.pid] = p

    try:
        for _ in range(args.readers):
            start()
        _wait_ready(folder, readers, args.readers)
        deadline = time.time() + args.seconds   # the clock starts with every reader ready
        with open(os.path.join(folder, "go.new"), "w") as f:
            f.write(repr(deadline))
        os.replace(os.path.join(folder, "go.new"), os.path.join(folder, "go"))
        kids = _children(args, folder, deadline, env)
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
                done = json.loads(out.strip().splitlines()[-1])
                wrong.extend(done["wrong"])
                for k, v in done["counts"].items():
                    calls[k] = calls.get(k, 0) + v
        mutations = json.loads(kids["mutator"].communicate(timeout=120)[0].strip() or "{}")
        gens = {}
        if "writer" in kids:
            gens = json.loads(kids["writer"].communicate(timeout=60)[0].strip() or "{}")
    finally:
        for p in list(readers.values()) + list(kids.values()):
            if p.poll() is None:
                p.kill()
                p.wait()
    report = {"seconds": args.seconds, "readers": args.readers, "calls": calls,
              "mutations": mutations, "generations": gens.get("generations", 0),
              "crashes": crashes, "wrong": wrong}
    print(json.dumps(report, indent=1, sort_keys=True))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 1 if crashes or wrong or calls.get("wrong") else 0


if __name__ == "__main__":
    sys.exit(main())
