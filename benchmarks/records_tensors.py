"""Records that carry a small tensor each (issue 52), against length-prefixed
msgpack and msgspec with the arrays as bytes.

    python -m benchmarks.records_tensors [--quick] [--json PATH]

The record: ``id: int, caption: str, emb: F32Array (256 floats), image:
TensorDirectory {"img": uint8 16x16x3}`` as a dataclass.  The peers write
and read the same fields with ``emb`` and ``img`` as ``bytes`` (msgspec with
a typed ``Struct`` decoder), each record prefixed by its 4-byte length.  All
in one process, interleaved (``benchmarks/harness.py``), GC on:

* **write**: every record to a file object in a temporary folder (page
  cache; no fsync for anyone): kiln ``RecordWriter.write`` in a loop,
  ``write_many``, and ``align=False``; the peers ``encode`` and two writes.
* **read**: every record of the file into a list: kiln ``list(RecordFile)``
  (record CRCs checked; ``emb`` an ndarray, ``image`` a lazy directory of
  the file's bytes); the peers read the file and decode each record.
* **random**: N reads at random positions, ``rf[i]``, against a record of
  iteration, on this shape and on ``struct{id:i64,label:str,x:tensors,}``
  with two small tensors.

Also printed: bytes per record of each file.  Targets (issue 52): write <=
1.2x msgspec, read <= 1.0x msgspec, file <= 1.05x msgspec's, rf[i] <= 3x a
record of iteration on both shapes.
"""

import argparse
import dataclasses
import json
import os
import random
import struct
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np

import kiln
from benchmarks.harness import PEER, VARIANT, Config, Contender, measure
from benchmarks.records_container import _kiln_write as _write_all, _per as _us

_LEN = struct.Struct("<I")
SMALL = "struct{id:i64,label:str,x:tensors,}"


@dataclasses.dataclass
class Rec:
    id: int
    caption: str
    emb: kiln.F32Array
    image: kiln.TensorDirectory


def make(n):
    rng = np.random.default_rng(52)
    embs = rng.standard_normal((n, 256), dtype=np.float32)
    imgs = rng.integers(0, 255, (n, 16, 16, 3), dtype=np.uint8)
    recs = [Rec(i, "caption number %d" % i, embs[i].copy(), {"img": imgs[i].copy()})
            for i in range(n)]
    plain = [{"id": r.id, "caption": r.caption, "emb": r.emb.tobytes(),
              "image": r.image["img"].tobytes()} for r in recs]
    return recs, plain


def _lp_write(path, plain, encode):
    def run():
        with open(path, "wb") as f:
            for p in plain:
                b = encode(p)
                f.write(_LEN.pack(len(b)))
                f.write(b)
    return run


def _lp_read(path, decode):
    def run():
        with open(path, "rb") as f:
            data = f.read()
        mv, pos, n, out = memoryview(data), 0, len(data), []
        while pos < n:
            (k,) = _LEN.unpack_from(mv, pos)
            out.append(decode(mv[pos + 4:pos + 4 + k]))
            pos += 4 + k
        return out
    return run


def _kiln_write(path, recs, many=False, **kw):
    return _write_all(Rec, recs, None, many, lambda: open(path, "wb"), **kw)


def build(n, folder):
    import msgpack
    import msgspec

    class M(msgspec.Struct):
        id: int
        caption: str
        emb: bytes
        image: bytes

    recs, plain = make(n)
    p = {k: os.path.join(folder, k) for k in ("kiln", "noalign", "msgspec", "msgpack", "tmp")}
    enc = msgspec.msgpack.Encoder().encode
    write = [Contender("msgspec length-prefixed", PEER, _lp_write(p["tmp"], plain, enc)),
             Contender("msgpack length-prefixed", PEER, _lp_write(p["tmp"], plain, msgpack.packb)),
             Contender("kiln-cython write", "kiln", _kiln_write(p["tmp"], recs)),
             Contender("kiln-cython write_many", VARIANT, _kiln_write(p["tmp"], recs, True)),
             Contender("kiln-cython write_many align=False", VARIANT,
                       _kiln_write(p["tmp"], recs, True, align=False))]
    _kiln_write(p["kiln"], recs, True)()
    _kiln_write(p["noalign"], recs, True, align=False)()
    _lp_write(p["msgspec"], plain, enc)()
    _lp_write(p["msgpack"], plain, msgpack.packb)()
    sizes = {k: os.path.getsize(p[k]) / n for k in ("kiln", "noalign", "msgspec", "msgpack")}
    dec = msgspec.msgpack.Decoder(M).decode
    read = [Contender("msgspec length-prefixed", PEER, _lp_read(p["msgspec"], dec)),
            Contender("msgpack length-prefixed", PEER, _lp_read(p["msgpack"], msgpack.unpackb)),
            Contender("kiln-cython RecordFile", "kiln",
                      lambda: list(kiln.RecordFile(p["kiln"], Rec))),
            Contender("kiln-cython verify=False", VARIANT,
                      lambda: list(kiln.RecordFile(p["kiln"], Rec, verify=False)))]
    return write, read, sizes, p["kiln"]


def build_random(n, folder, path=None):
    """(iterate, random) contenders: ``path`` (the Rec file) or the small shape."""
    if path is None:
        path = os.path.join(folder, "small.kilnr")
        with kiln.RecordWriter(path, SMALL) as w:
            for i in range(n):
                w.write({"id": i, "label": "l%d" % i,
                         "x": {"a": np.arange(4, dtype=np.float32),
                               "b": np.full((2, 3), i, np.int16)}})
        rf = kiln.RecordFile(path, SMALL)
    else:
        rf = kiln.RecordFile(path, Rec)
    idx = [random.Random(52).randrange(len(rf)) for _ in range(len(rf))]
    return [Contender("kiln-cython iterate", "kiln", lambda: list(rf)),
            Contender("kiln-cython rf[i]", "kiln", lambda: [rf[i] for i in idx])]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="10,000 records, 3 repeats")
    ap.add_argument("--json", help="write the numbers as JSON here")
    args = ap.parse_args(argv)
    # (records, records for rf[i]) and (repeats, warm-up samples, seconds a sample)
    (n, nr), cfg = ((10000, 5000), Config(3, 0, 0.05)) if args.quick else \
        ((100000, 20000), Config(7, 1, 0.2))
    report = {"records": n, "us_per_record": {}, "bytes_per_record": {}, "ratios": {}}
    with tempfile.TemporaryDirectory() as folder:
        write, read, sizes, kpath = build(n, folder)
        measure(write, cfg, "write")
        measure(read, cfg, "read")
        shapes = {"Rec": build_random(nr, folder, kpath) if nr == n else None}
        if shapes["Rec"] is None:
            sub = os.path.join(folder, "sub.kilnr")
            recs, _ = make(nr)
            _kiln_write(sub, recs, True)()
            shapes["Rec"] = build_random(nr, folder, sub)
        shapes[SMALL] = build_random(nr, folder)
        for name, rows in shapes.items():
            measure(rows, cfg, "random " + name)
    table = {"write": {c.name: _us(c, n) for c in write},
             "read": {c.name: _us(c, n) for c in read}}
    for name, rows in shapes.items():
        table["random " + name] = {c.name: _us(c, nr) for c in rows}
    spec_w = table["write"]["msgspec length-prefixed"]
    spec_r = table["read"]["msgspec length-prefixed"]
    ratios = {
        "write / msgspec": (table["write"]["kiln-cython write"] / spec_w, 1.2),
        "write_many / msgspec": (table["write"]["kiln-cython write_many"] / spec_w, 1.2),
        "read / msgspec": (table["read"]["kiln-cython RecordFile"] / spec_r, 1.0),
        "file bytes / msgspec's": (sizes["kiln"] / sizes["msgspec"], 1.05),
    }
    for name, rows in shapes.items():
        t = table["random " + name]
        ratios["rf[i] / iterate, %s" % name] = (t["kiln-cython rf[i]"] /
                                                 t["kiln-cython iterate"], 3.0)
    print("\n%d records (rf[i] on %d), microseconds per record (median of %d), GC on"
          % (n, nr, cfg.repeats))
    for op, rows in table.items():
        for name, us in rows.items():
            print("  %-26s %-36s %s" % (op, name, "n/a" if us is None else "%.2f" % us))
    for name, b in sizes.items():
        print("  bytes a record: %-10s %.1f" % (name, b))
    for name, (r, limit) in ratios.items():
        print("  target %-44s %.2fx (<= %.2fx: %s)" % (name, r, limit,
                                                       "met" if r <= limit else "not met"))
    report.update(us_per_record=table, bytes_per_record=sizes,
                  ratios={k: v[0] for k, v in ratios.items()})
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
