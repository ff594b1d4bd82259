"""The benchmark model, the workload registry and the one timing helper.

A *workload* (say ``records``) is built for one size and yields *ops*
(``encode``, ``decode``, ...).  Each op has *contenders*: exactly one floor
(the cheapest thing that could possibly do the job), one row per kiln
implementation, optional kiln variants, and the peers.  A contender is a
zero-argument callable; everything it needs (encoders, input buffers) is
built before timing starts.

:func:`measure` times every contender of a workload in the same process,
interleaved: after each contender's warm-up, every repeat round runs one
sample of each contender (the order rotates by one each round), so slow drift
of the machine (frequency, page cache, neighbours) lands on all of them alike.
"""

import dataclasses
import gc
import importlib
import math
import statistics
import sys
from time import perf_counter
from typing import Callable, List, Optional

FLOOR = "floor"
KILN = "kiln"
VARIANT = "kiln-variant"
PEER = "peer"

# the cap on calls batched into one sample (for calls of a few hundred ns)
MAX_NUMBER = 1_000_000


# --- the model ----------------------------------------------------------------

@dataclasses.dataclass
class Contender:
    """One thing being timed: a zero-argument callable and its samples."""

    name: str
    kind: str                       # FLOOR, KILN, VARIANT or PEER
    fn: Optional[Callable[[], object]]
    gc: bool = True                 # False: the collector is disabled while it runs
    missing: Optional[str] = None   # why fn is None (e.g. kernels not built)
    number: int = 0                 # calls per sample, set by calibration
    samples: List[float] = dataclasses.field(default_factory=list)  # seconds per call

    @property
    def median(self):
        return statistics.median(self.samples) if self.samples else None

    @property
    def min(self):
        return min(self.samples) if self.samples else None

    @property
    def max(self):
        return max(self.samples) if self.samples else None


@dataclasses.dataclass
class Op:
    """One operation of a workload (``encode``, ``decode (views)``...)."""

    name: str
    contenders: List[Contender]

    @property
    def floor(self):
        return next(c for c in self.contenders if c.kind == FLOOR)

    @property
    def best_peer(self):
        peers = [c for c in self.contenders if c.kind == PEER and c.samples]
        return min(peers, key=lambda c: c.median) if peers else None


@dataclasses.dataclass
class Workload:
    """A workload built for one size."""

    name: str
    size: str                       # e.g. "100,000 records"
    ops: List[Op]
    notes: List[str] = dataclasses.field(default_factory=list)
    cleanup: Optional[Callable[[], None]] = None

    @property
    def contenders(self):
        return [c for op in self.ops for c in op.contenders]


@dataclasses.dataclass
class Spec:
    """A registered workload: ``build(size, impls) -> Workload`` and its sizes."""

    name: str
    build: Callable
    quick: tuple
    full: tuple
    doc: str


REGISTRY = {}


def workload(name, *, quick, full):
    """Register ``build(size, impls) -> Workload`` under ``name``.

    ``quick`` and ``full`` are the sizes run in each mode (one workload
    instance per size).
    """
    def deco(build):
        REGISTRY[name] = Spec(name, build, tuple(quick), tuple(full),
                              (build.__doc__ or "").strip())
        return build
    return deco


@dataclasses.dataclass
class Config:
    repeats: int          # timed samples per contender
    warmup: int           # untimed samples per contender after calibration
    min_sample: float     # seconds: fast calls are batched into samples this long


# --- kiln implementations -------------------------------------------------------

@dataclasses.dataclass
class Impl:
    name: str             # "kiln-cython" / "kiln-python"
    kernels: object       # the kernel module, or None when it cannot be imported
    missing: Optional[str] = None   # short, for table cells: "not built"
    reason: Optional[str] = None    # the import error

    @property
    def status(self):
        return self.kernels.__name__ if self.kernels else "%s (%s)" % (self.missing, self.reason)


def kiln_impls():
    """kiln-cython (``kiln._kernels_c``, when importable) and kiln-python."""
    impls = []
    for name, mod in (("kiln-cython", "kiln._kernels_c"), ("kiln-python", "kiln._kernels_py")):
        try:
            impls.append(Impl(name, importlib.import_module(mod)))
        except ImportError as e:
            impls.append(Impl(name, None, "not built", "import %s failed: %s" % (mod, e)))
    return impls


def kiln_contenders(impls, make):
    """One contender per kiln implementation; ``make(kernels)`` returns the callable.

    A missing implementation still gets its row, with the reason instead of
    numbers.
    """
    return [Contender(im.name, KILN, None, missing=im.missing) if im.kernels is None
            else Contender(im.name, KILN, make(im.kernels)) for im in impls]


def kiln_variant(impls, label, make, gc=True):
    """A variant (another binding, option or GC state) on the fastest available kernels."""
    im = next(im for im in impls if im.kernels is not None)
    return Contender("%s %s" % (im.name, label), VARIANT, make(im.kernels), gc=gc)


# --- timing ---------------------------------------------------------------------

def time_calls(fn, number, gc_enabled=True):
    """Seconds per call over ``number`` back-to-back calls of ``fn``.

    The only timing primitive.  ``gc.collect()`` runs first, untimed, so
    garbage left by the previous sample is not charged to this one; the
    collector is then enabled (or disabled when ``gc_enabled`` is False) for
    the sample and restored afterwards.  The result of each call is dropped
    inside the timed region, so freeing it is part of the cost.
    """
    gc.collect()
    was = gc.isenabled()
    if gc_enabled:
        gc.enable()
    else:
        gc.disable()
    try:
        t0 = perf_counter()
        for _ in range(number):
            fn()
        t1 = perf_counter()
    finally:
        if was:
            gc.enable()
        else:
            gc.disable()
    return (t1 - t0) / number


def calibrate(c, min_sample):
    """Warm ``c`` up and choose how many calls make one sample of >= min_sample.

    The first call (cold caches, first-touch page faults, lazy set-up) is not
    used for the estimate.
    """
    time_calls(c.fn, 1, c.gc)
    n = 1
    while True:
        t = time_calls(c.fn, n, c.gc)
        if t * n >= min_sample / 10 or n >= MAX_NUMBER:
            break
        n = min(MAX_NUMBER, n * 10)
    c.number = max(1, min(MAX_NUMBER, math.ceil(min_sample / max(t, 1e-9))))


def measure(contenders, cfg, label=""):
    """Time ``contenders`` interleaved: warm-up, then ``cfg.repeats`` rotating rounds."""
    live = [c for c in contenders if c.fn is not None]
    for c in live:
        c.samples = []
        calibrate(c, cfg.min_sample)
        for _ in range(cfg.warmup):
            time_calls(c.fn, c.number, c.gc)
    for r in range(cfg.repeats):
        progress("%s: round %d/%d" % (label, r + 1, cfg.repeats))
        k = r % len(live) if live else 0
        for c in live[k:] + live[:k]:
            c.samples.append(time_calls(c.fn, c.number, c.gc))


def progress(msg):
    print("  .. " + msg, file=sys.stderr, flush=True)


def median_time(fn, repeat):
    """(median, min, max) seconds of ``repeat`` calls of ``fn`` after one warm
    call (page cache, imports): for the whole-operation benchmarks that time
    one call at a time (checksum, sharded)."""
    fn()
    times = []
    for _ in range(repeat):
        t = perf_counter()
        fn()
        times.append(perf_counter() - t)
    return statistics.median(times), min(times), max(times)
