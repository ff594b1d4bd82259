#!/usr/bin/env python3
"""Decode inputs that another process keeps rewriting, for minutes per field.

    tools/mutation-stress.py [--seconds-per-field N] [--impl python|cython|both]
                             [--field NAME ...] [--threads] [--list]

The long form of tests/test_shared_mutation.py, sharing its harness
(tests/_mutation.py): for each field and implementation a worker process
decodes a valid tensor directory or framed record held in an anonymous
MAP_SHARED mmap while a forked child flips that field between its valid value
and hostile ones.  ``--threads`` uses a second thread and a bytearray instead
(meaningful on a free-threaded build with the GIL off).

Prints, per field, the number of decodes that returned a correct result and
that raised KilnError (with the codes).  Exits 1 if any worker died of a
signal, raised anything but KilnError, returned a result with a byte from
outside the buffer or different from what was written, or left its child
running; 2 on a usage error.  Run it from a checkout whose kiln is importable
(the dev venv, or PYTHONPATH).
"""

import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))

import _mutation  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].strip())
    ap.add_argument("--seconds-per-field", type=float, default=60.0, metavar="N",
                    help="decode each field for N seconds per implementation (default 60)")
    ap.add_argument("--impl", choices=("python", "cython", "both"), default="both")
    ap.add_argument("--field", action="append", choices=_mutation.FIELD_NAMES, metavar="NAME",
                    help="only this field (repeatable; see --list)")
    ap.add_argument("--threads", action="store_true",
                    help="a second thread mutates a bytearray instead of a forked child "
                         "mutating a shared mmap (needs a free-threaded build to mean much)")
    ap.add_argument("--list", action="store_true", help="list the fields and exit")
    args = ap.parse_args(argv)

    if args.list:
        for f in _mutation.FIELDS.values():
            print("%-24s %s" % (f.name, f.doc))
        return 0
    if args.seconds_per_field <= 0:
        ap.error("--seconds-per-field must be positive")
    mode = "thread" if args.threads else "fork"
    if mode == "fork" and not hasattr(os, "fork"):
        ap.error("fork mode needs os.fork(); try --threads")
    if mode == "thread" and not _mutation.free_threaded():
        print("warning: the GIL is enabled, so the writer thread only runs between "
              "bytecodes; use a free-threaded build for a real test", file=sys.stderr)
    impls = ["python", "cython"] if args.impl == "both" else [args.impl]
    names = args.field or _mutation.FIELD_NAMES

    print("kiln from %s, %s mode, %g s per field" % (
        os.path.dirname(_mutation.kiln.__file__), mode, args.seconds_per_field))
    print("%-7s %-24s %10s %10s %7s  %s" % ("impl", "field", "ok", "KilnError", "secs",
                                           "verdict"))
    failed = []
    start = time.monotonic()
    for impl in impls:
        for name in names:
            t0 = time.monotonic()
            r = _mutation.run_worker(mode, name, args.seconds_per_field, impl)
            took = time.monotonic() - t0
            problems = r.problems()
            s = r.stats or {}
            codes = ", ".join("%s %d" % kv for kv in sorted(s.get("codes", {}).items()))
            verdict = "FAIL: " + "; ".join(problems) if problems else "ok (%s)" % codes
            print("%-7s %-24s %10s %10s %7.1f  %s" % (
                impl, name, s.get("ok", "-"), s.get("kiln_error", "-"), took, verdict),
                flush=True)
            if problems:
                failed.append((impl, name, r))
    print("%d runs in %.0f s, %d failed" % (len(impls) * len(names),
                                            time.monotonic() - start, len(failed)))
    for impl, name, r in failed:
        print("\n=== %s %s ===\n%s" % (impl, name, r.report()))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
