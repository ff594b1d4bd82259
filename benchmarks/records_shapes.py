"""Record shapes against msgspec (issue 31 items 3 and 4).

    python -m benchmarks.records_shapes [--sizes 20000,100000] [--repeat 7]
                                        [--pure] [--only NAME,...] [--json PATH]

Two shapes: ``flat`` (id: int, name: str of 10 chars, score: float) and
``list`` (the same with ``tags: list[int]``, three ints).  For each, a list of
``n`` records is encoded and decoded by kiln (``kiln.Encoder(list[C])``) and
by msgspec (``msgspec.msgpack.Encoder()`` / ``Decoder(list[C])``), with the
same Python class ``C`` on both sides:

- ``plain``, ``slots``, ``frozen``: a dataclass, ``slots=True``, ``frozen=True``;
- ``namedtuple``: a ``typing.NamedTuple``;
- ``dict``: dicts (kiln through the type text, msgspec through a
  ``TypedDict`` of the same fields; both are given the same dicts to encode);
- ``record``: ``kiln.Record`` against ``msgspec.Struct(array_like=True)``,
  each side's class for speed (the ``vs Struct`` rows; the other classes are
  compared with the Struct too, in the JSON);
- ``slots`` against the Struct as well (the fastest standard class).

Method: one process, inputs built once; each contender's encode input is a
list of its own class's instances (the same field values), its decode input
its own encoder's bytes.  Two columns: ``frozen`` (``gc.collect();
gc.freeze()`` after the inputs are built, collector on: the inputs are out of
its way, what a long-running service gets after start-up) and ``unfrozen``
(``gc.unfreeze(); gc.collect()``, collector on: every collection of the
oldest generation walks the inputs too).  Every sample is one call, after
an untimed ``gc.collect()`` (so each call meets the collector in the same
state); kiln and msgspec alternate call by call, the one that goes first
swapped every round (``--repeat`` rounds, median of each); the result is
dropped before the next call.  Ratios are kiln's median over
msgspec's (<= 1.0: kiln is at least as fast).  Targets: <= 1.0 for the same
class (compiled kernels) and for kiln's fastest holder against the Struct;
pure kernels (``--pure``) records decode <= 4.
"""

import argparse
import dataclasses
import gc
import json
import os
import random
import statistics
import string
import sys
import time
import typing
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if __package__ in (None, ""):
    sys.path.insert(0, str(ROOT))

import msgspec  # noqa: E402

import kiln  # noqa: E402
from kiln._types import List as _List  # noqa: E402  (a list<i64> that decodes to a list)


# --- the classes -------------------------------------------------------------------

@dataclasses.dataclass
class Plain:
    id: int
    name: str
    score: float


@dataclasses.dataclass(slots=True)
class Slots:
    id: int
    name: str
    score: float


@dataclasses.dataclass(frozen=True)
class Frozen:
    id: int
    name: str
    score: float


class NT(typing.NamedTuple):
    id: int
    name: str
    score: float


class TD(typing.TypedDict):
    id: int
    name: str
    score: float


class MStruct(msgspec.Struct, array_like=True):
    id: int
    name: str
    score: float


@dataclasses.dataclass
class PlainL:
    id: int
    name: str
    score: float
    tags: list[int]


@dataclasses.dataclass(slots=True)
class SlotsL:
    id: int
    name: str
    score: float
    tags: list[int]


@dataclasses.dataclass(frozen=True)
class FrozenL:
    id: int
    name: str
    score: float
    tags: list[int]


class NTL(typing.NamedTuple):
    id: int
    name: str
    score: float
    tags: list[int]


class TDL(typing.TypedDict):
    id: int
    name: str
    score: float
    tags: list[int]


class MStructL(msgspec.Struct, array_like=True):
    id: int
    name: str
    score: float
    tags: list[int]


Record = getattr(kiln, "Record", None)
if Record is not None:
    class Rec(Record):
        id: int
        name: str
        score: float

    class RecL(Record):
        id: int
        name: str
        score: float
        tags: list[int]
else:   # (a tree without kiln.Record)
    Rec = RecL = None


SHAPES = {
    "flat": dict(plain=Plain, slots=Slots, frozen=Frozen, namedtuple=NT, dict=TD,
                 struct=MStruct, record=Rec,
                 text=[("id", kiln.i64), ("name", kiln.str_), ("score", kiln.f64)]),
    "list": dict(plain=PlainL, slots=SlotsL, frozen=FrozenL, namedtuple=NTL, dict=TDL,
                 struct=MStructL, record=RecL,
                 text=[("id", kiln.i64), ("name", kiln.str_), ("score", kiln.f64),
                       ("tags", _List(kiln.i64, form="list"))]),
}
SAME = ("plain", "slots", "frozen", "namedtuple", "dict")


def fields(n, shape):
    rng = random.Random(31)
    alnum = string.ascii_letters + string.digits
    out = []
    for _ in range(n):
        f = [rng.randrange(1 << 53), "".join(rng.choices(alnum, k=10)), rng.uniform(-1e3, 1e3)]
        if shape == "list":
            f.append([rng.randrange(-(1 << 31), 1 << 31) for _ in range(3)])
        out.append(f)
    return out


def build(cls, rows, names):
    if cls is dict:
        return [dict(zip(names, r)) for r in rows]
    return [cls(*r) for r in rows]


def contenders(shape, n, kernels):
    """[(holder, op, kiln callable, msgspec callable, kiln-vs-what)]"""
    spec = SHAPES[shape]
    rows = fields(n, shape)
    names = ["id", "name", "score", "tags"][:len(rows[0])]
    menc = msgspec.msgpack.Encoder()
    out = []
    mstruct = spec["struct"]
    m_in = build(mstruct, rows, names)
    m_buf = menc.encode(m_in)
    m_dec = msgspec.msgpack.Decoder(list[mstruct]).decode
    m_struct = (lambda: menc.encode(m_in), lambda: m_dec(m_buf))

    def kiln_pair(cls):
        # dicts: the struct of the same fields, tags as a Python list (what a
        # list[int] annotation gives)
        t = kiln.list_(kiln.struct(spec["text"])) if cls is dict else list[cls]
        ke = kiln.Encoder(t, kernels=kernels).encode
        kd = kiln.Decoder(t, kernels=kernels).decode
        k_in = build(cls, rows, names)
        k_buf = ke(k_in)
        assert kd(k_buf) == k_in
        return (lambda: ke(k_in)), (lambda: kd(k_buf))

    for holder in SAME:
        cls = spec[holder]
        ke, kd = kiln_pair(dict if holder == "dict" else cls)
        m_cls = cls
        m_in2 = build(dict if holder == "dict" else m_cls, rows, names)
        m_buf2 = menc.encode(m_in2)
        md = msgspec.msgpack.Decoder(list[m_cls]).decode
        assert md(m_buf2) == m_in2
        out.append((holder, "encode", ke, (lambda m=m_in2: menc.encode(m)), "same"))
        out.append((holder, "decode", kd, (lambda b=m_buf2, d=md: d(b)), "same"))
        if holder in ("slots", "namedtuple", "dict"):
            out.append((holder, "encode", ke, m_struct[0], "Struct"))
            out.append((holder, "decode", kd, m_struct[1], "Struct"))
    if spec["record"] is not None:
        ke, kd = kiln_pair(spec["record"])
        out.append(("record", "encode", ke, m_struct[0], "Struct"))
        out.append(("record", "decode", kd, m_struct[1], "Struct"))
    return out


def time_pair(a, b, repeat):
    """Medians (and minimums) of ``repeat`` calls of each, alternating, the
    one called first swapped every round; each call starts from a collection
    (untimed), so each meets the collector and the heap in the same state."""
    ta, tb = [], []
    a(), b()   # warm
    for r in range(repeat):
        for first in ((a, ta), (b, tb)) if r % 2 == 0 else ((b, tb), (a, ta)):
            fn, out = first
            gc.collect()
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
    return statistics.median(ta), statistics.median(tb), min(ta), min(tb)


def run(sizes, repeat, kernels, only=None):
    results = []
    for shape in SHAPES:
        for n in sizes:
            items = contenders(shape, n, kernels)
            if only:
                items = [it for it in items if it[0] in only]
            for mode in ("frozen", "unfrozen"):
                if mode == "frozen":
                    gc.collect()
                    gc.freeze()
                else:
                    gc.unfreeze()
                    gc.collect()
                for holder, op, k, m, vs in items:
                    tk, tm, fk, fm = time_pair(k, m, repeat)
                    results.append(dict(shape=shape, n=n, holder=holder, op=op, vs=vs,
                                        gc=mode, kiln_s=tk, msgspec_s=tm, ratio=tk / tm,
                                        kiln_min_s=fk, msgspec_min_s=fm, min_ratio=fk / fm))
            gc.unfreeze()
            del items
            gc.collect()
    return results


def table(results, key="ratio"):
    keys = []
    for r in results:
        k = (r["shape"], r["n"], r["holder"], r["vs"])
        if k not in keys:
            keys.append(k)
    by = {(r["shape"], r["n"], r["holder"], r["vs"], r["op"], r["gc"]): r for r in results}
    lines = ["| shape | n | kiln holder | msgspec holder | encode frozen | encode unfrozen "
             "| decode frozen | decode unfrozen |",
             "| --- | ---: | --- | --- | ---: | ---: | ---: | ---: |"]
    for shape, n, holder, vs in keys:
        cells = []
        for op in ("encode", "decode"):
            for mode in ("frozen", "unfrozen"):
                r = by.get((shape, n, holder, vs, op, mode))
                cells.append("%.2f" % r[key] if r else "")
        other = "same class" if vs == "same" else "Struct(array_like=True)"
        if vs == "same" and holder == "dict":
            other = "TypedDict"
        lines.append("| %s | %s | %s | %s | %s |" % (shape, f"{n:,}", holder, other,
                                                     " | ".join(cells)))
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="20000,100000")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--pure", action="store_true", help="the pure-Python kernels")
    ap.add_argument("--only", default="", help="holders to run (plain,slots,...,record)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    if a.pure:
        from kiln import _kernels_py as kernels
    else:
        from kiln import _kernels_c as kernels
    sizes = [int(s) for s in a.sizes.split(",")]
    only = set(a.only.split(",")) if a.only else None
    res = run(sizes, a.repeat, kernels, only)
    print("kernels: %s, %s, msgspec %s, repeat %d; ratio kiln / msgspec (median of each)"
          % ("pure" if a.pure else "compiled", sys.version.split()[0], msgspec.__version__,
             a.repeat))
    print(table(res))
    print()
    print("fastest samples: ratio of the minimum of each (a check on load from other processes)")
    print(table(res, "min_ratio"))
    if a.json:
        Path(a.json).write_text(json.dumps(dict(results=res, argv=sys.argv,
                                                python=sys.version, pid=os.getpid()),
                                           indent=1))


if __name__ == "__main__":
    main()
