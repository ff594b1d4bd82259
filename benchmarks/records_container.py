"""The record container (issue 33) against one list value and the containers
users pick today.

    python -m benchmarks.records_container [--quick] [--json PATH]

Two record shapes: ``small`` (an id, a label and a short name) and ``sample``
(an id, a label and a 28x28 u8 image as a tensor).  For each, N records are
written once to a file in a temporary folder, page cache warm, then timed in
one process with the harness's interleaved rounds (``benchmarks/harness.py``):

* **iterate**: every record of the file, in order.  The floor is kiln
  decoding the same records as one ``list<...>`` value from memory (the
  baseline of the target); kiln iterates a ``RecordFile`` (record CRCs
  checked, and with ``verify=False``) and ``iter_records`` over the file;
  the peers read a length-prefixed msgpack file (msgpack, and msgspec with a
  typed decoder) and, when pyarrow is installed, an Arrow IPC file.
* **random**: N reads at random positions; kiln ``rf[i]``; the peers seek
  through an in-memory offset table of the same length-prefixed file.
* **write**: the N records written to a ``BytesIO`` (open, every record,
  close).  The floor is kiln encoding each value alone (framed, into a list);
  kiln ``RecordWriter.write`` in a loop, ``write_many``, and ``write`` with
  ``store_type=False``; the peers write the length-prefixed msgpack stream
  (``packb`` and a 4-byte length) and, with pyarrow, an Arrow IPC file from
  ``Table.from_pylist``.

Also printed: the bytes a record takes in each file (the whole file over N)
and its overhead, the file's bytes beyond kiln's own encoding of the values
(unframed, which for these shapes is as tight as a positional encoding gets).

Each contender decodes to its format's own objects: kiln's tensors are lazy
views of the file (no array is built), msgpack's and msgspec's images are
``bytes`` copies.

Every number is per record.  Targets (issue 33): iterate <= 1.5x the list
decode; a random read <= 3x a record of iteration.  Issue 40: a ``write``
<= 1.2x a record of the length-prefixed msgpack stream.

The ``user`` shape is the one of issue 40 (an id, a string, two floats and a
short list of ints).
"""

import argparse
import io
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
from benchmarks.harness import (FLOOR, PEER, VARIANT, Config, Contender, kiln_impls, measure)

SHAPES = {
    "small": ("struct{id:i64,label:i32,name:str,}",
              lambda i: {"id": i, "label": i % 10, "name": "sample-%06d" % i}),
    "user": ("struct{id:i64,name:str,x:f64,y:f64,tags:list<i64>,}",
             lambda i: {"id": i, "name": "sample-%06d" % i, "x": i * 0.5, "y": -1.25,
                        "tags": [i, i + 1, i + 2]}),
    "sample": ("struct{id:i64,label:i32,img:tensors,}",
               lambda i: {"id": i, "label": i % 10,
                          "img": {"x": np.full((28, 28), i % 256, np.uint8)}}),
}
_LEN = struct.Struct("<I")
# msgspec's typed decoder: the fields of each shape
_SPEC_FIELDS = {"small": [("id", int), ("label", int), ("name", str)],
                "user": [("id", int), ("name", str), ("x", float), ("y", float),
                         ("tags", list)],
                "sample": [("id", int), ("label", int), ("img", bytes)]}


def _plain(v):
    """The value as msgpack takes it (the image as raw bytes)."""
    if "img" in v:
        return {"id": v["id"], "label": v["label"], "img": v["img"]["x"].tobytes()}
    return v


def _lp_file(path, values, packb):
    offsets = []
    with open(path, "wb") as f:
        for v in values:
            b = packb(_plain(v))
            offsets.append(f.tell())
            f.write(_LEN.pack(len(b)) + b)
    return offsets


def _lp_iter(data, unpack):
    pos, n, out = 0, len(data), []
    mv = memoryview(data)
    while pos < n:
        (k,) = _LEN.unpack_from(mv, pos)
        out.append(unpack(mv[pos + 4:pos + 4 + k]))
        pos += 4 + k
    return out


def _kiln_write(text, values, kernels, many=False, target=io.BytesIO, **kw):
    """Every value written by a RecordWriter to ``target()`` (a file object,
    returned: a file is closed when it is dropped)."""
    def run():
        out = target()
        with kiln.RecordWriter(out, text, kernels=kernels, **kw) as w:
            if many:
                w.write_many(values)
            else:
                for v in values:
                    w.write(v)
        return out
    return run


def _lp_write(values, packb):
    def run():
        out = io.BytesIO()
        for v in values:
            b = packb(v)
            out.write(_LEN.pack(len(b)) + b)
        return out
    return run


def build_write(shape, n):
    """The write op's contenders, and each format's bytes for the N records."""
    import msgpack
    text, make = SHAPES[shape]
    values = [make(i) for i in range(n)]
    plain = [_plain(v) for v in values]
    enc = kiln.Encoder(text, True).encode
    rows = [Contender("encode each value (floor)", FLOOR, lambda: [enc(v) for v in values])]
    impls = kiln_impls()
    # a kiln from before issue 40 has no write_many nor store_type: those rows say so
    new = hasattr(kiln.RecordWriter, "write_many")
    for im in impls:
        if im.kernels is None:
            rows.append(Contender("%s write" % im.name, "kiln", None, missing=im.missing))
            continue
        rows.append(Contender("%s write" % im.name, "kiln", _kiln_write(text, values, im.kernels)))
        rows.append(Contender("%s write_many" % im.name, VARIANT,
                              _kiln_write(text, values, im.kernels, True) if new else None,
                              missing=None if new else "not in this kiln"))
    best = next(im for im in impls if im.kernels is not None)
    if new:
        rows.append(Contender("%s write store_type=False" % best.name, VARIANT,
                              _kiln_write(text, values, best.kernels, store_type=False)))
    rows.append(Contender("msgpack length-prefixed", PEER, _lp_write(plain, msgpack.packb)))
    payload = sum(len(enc(v)) - 16 for v in values)
    sizes = {"kiln values alone (unframed)": payload,
             "kiln record file": len(_kiln_write(text, values, best.kernels)().getvalue()),
             "msgpack length-prefixed": len(_lp_write(plain, msgpack.packb)().getvalue())}
    if new:
        sizes["kiln record file, store_type=False"] = len(
            _kiln_write(text, values, best.kernels, store_type=False)().getvalue())
    try:
        import pyarrow as pa
        import pyarrow.ipc
    except ImportError:
        rows.append(Contender("pyarrow IPC file", PEER, None, missing="not installed"))
    else:
        def arrow():
            out = io.BytesIO()
            table = pa.Table.from_pylist(plain)
            with pa.ipc.new_file(out, table.schema) as wr:
                wr.write_table(table)
            return out
        rows.append(Contender("pyarrow IPC file", PEER, arrow))
        sizes["pyarrow IPC file"] = len(arrow().getvalue())
    return rows, sizes, payload


def build(shape, n, folder):
    """The contenders of the two ops for one shape: (iterate, random)."""
    import msgpack
    import msgspec
    text, make = SHAPES[shape]
    values = [make(i) for i in range(n)]
    impls = kiln_impls()
    listbuf = kiln.encode(values, "list<%s>" % text)
    path = os.path.join(folder, "%s.kilnr" % shape)
    with kiln.RecordWriter(path, text) as w:
        for v in values:
            w.write(v)
    with open(path, "rb") as f:
        raw = f.read()
    idx = [random.Random(33).randrange(n) for _ in range(n)]

    it = [Contender("list<...> decode (baseline)", FLOOR,
                    lambda: kiln.decode(listbuf, "list<%s>" % text))]
    rnd = []
    for im in impls:
        if im.kernels is None:
            it.append(Contender(im.name, "kiln", None, missing=im.missing))
            rnd.append(Contender(im.name, "kiln", None, missing=im.missing))
            continue
        rf = kiln.RecordFile(path, text, kernels=im.kernels)
        it.append(Contender(im.name, "kiln", lambda rf=rf: list(rf)))
        rnd.append(Contender(im.name, "kiln", lambda rf=rf: [rf[i] for i in idx]))
    best = next(im for im in impls if im.kernels is not None)
    quick = kiln.RecordFile(path, text, kernels=best.kernels, verify=False)
    it.append(Contender("%s verify=False" % best.name, VARIANT, lambda: list(quick)))
    it.append(Contender("%s iter_records" % best.name, VARIANT,
                        lambda: list(kiln.iter_records(io.BytesIO(raw), text,
                                                       kernels=best.kernels))))

    mp_path = os.path.join(folder, "%s.msgpack" % shape)
    offs = _lp_file(mp_path, values, msgpack.packb)
    with open(mp_path, "rb") as f:
        mp = f.read()
    spec_t = msgspec.defstruct("S", _SPEC_FIELDS[shape], array_like=False)
    dec = msgspec.msgpack.Decoder(spec_t)
    it.append(Contender("msgpack length-prefixed", PEER, lambda: _lp_iter(mp, msgpack.unpackb)))
    it.append(Contender("msgspec length-prefixed", PEER, lambda: _lp_iter(mp, dec.decode)))
    mv = memoryview(mp)

    def lp_random(unpack):
        out = []
        for i in idx:
            (k,) = _LEN.unpack_from(mv, offs[i])
            out.append(unpack(mv[offs[i] + 4:offs[i] + 4 + k]))
        return out
    rnd.append(Contender("msgpack length-prefixed", PEER, lambda: lp_random(msgpack.unpackb)))
    rnd.append(Contender("msgspec length-prefixed", PEER, lambda: lp_random(dec.decode)))
    try:
        import pyarrow as pa
        import pyarrow.ipc
    except ImportError:
        it.append(Contender("pyarrow IPC file", PEER, None, missing="not installed"))
    else:
        table = pa.Table.from_pylist([_plain(v) for v in values])
        ap = os.path.join(folder, "%s.arrow" % shape)
        with pa.OSFile(ap, "wb") as sink, pa.ipc.new_file(sink, table.schema) as wr:
            wr.write_table(table)
        it.append(Contender("pyarrow IPC file", PEER,
                            lambda: pa.ipc.open_file(pa.memory_map(ap)).read_all().to_pylist()))
    return it, rnd


def _per(c, n):
    return None if c.median is None else c.median / n * 1e6


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer records and repeats")
    ap.add_argument("--json", help="write the numbers as JSON here")
    args = ap.parse_args(argv)
    cfg = Config(repeats=3 if args.quick else 7, warmup=0 if args.quick else 1,
                 min_sample=0.05 if args.quick else 0.2)
    sizes = {"small": 5000 if args.quick else 50000, "user": 5000 if args.quick else 50000,
             "sample": 2000 if args.quick else 20000}
    report = {}
    with tempfile.TemporaryDirectory() as folder:
        for shape, n in sizes.items():
            it, rnd = build(shape, n, folder)
            measure(it, cfg, "%s iterate" % shape)
            measure(rnd, cfg, "%s random" % shape)
            wr, nbytes, payload = build_write(shape, n)
            measure(wr, cfg, "%s write" % shape)
            base = _per(it[0], n)
            kc = next((c for c in it if c.name == "kiln-cython" and c.median), None)
            rc = next((c for c in rnd if c.name == "kiln-cython" and c.median), None)
            rows = {"iterate": {c.name: _per(c, n) for c in it},
                    "random": {c.name: _per(c, n) for c in rnd},
                    "write": {c.name: _per(c, n) for c in wr}}
            targets = {}
            if kc is not None and rc is not None:
                targets = {"iterate / list decode": _per(kc, n) / base,
                           "random / iterate": _per(rc, n) / _per(kc, n)}
            kw = next((c for c in wr if c.name == "kiln-cython write" and c.median), None)
            mw = next((c for c in wr if c.name == "msgpack length-prefixed" and c.median), None)
            if kw is not None and mw is not None:
                targets["write / msgpack write"] = kw.median / mw.median
            per = {name: b / n for name, b in nbytes.items()}
            over = {name: (b - payload) / n for name, b in nbytes.items()}
            report[shape] = {"records": n, "us_per_record": rows, "ratios": targets,
                             "bytes_per_record": per, "overhead_bytes_per_record": over}
            print("\n%s: %d records (%s), microseconds per record (median of %d)"
                  % (shape, n, SHAPES[shape][0], cfg.repeats))
            for op, table in rows.items():
                for name, us in table.items():
                    print("  %-8s %-34s %s" % (op, name, "n/a" if us is None else "%.2f" % us))
            for name in per:
                print("  bytes    %-34s %.1f a record (%.1f over the values)"
                      % (name, per[name], over[name]))
            for name, r in targets.items():
                limit = 1.5 if name.startswith("iterate") else 1.2 if name.startswith("write") \
                    else 3.0
                print("  target %-22s %.2fx (<= %.1fx: %s)" % (name, r, limit,
                                                             "met" if r <= limit else "not met"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
