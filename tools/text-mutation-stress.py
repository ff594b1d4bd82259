#!/usr/bin/env python3
"""Decode strings that another process (or thread) keeps rewriting, for longer.

    tools/text-mutation-stress.py [--seconds N] [--impl python|cython|both] [--threads]

The long form of tests/test_shared_strings.py, on its harness
(tests/_text_mutation.py): a worker process decodes records of long ASCII,
non-ASCII, one-byte strings and dict keys held in an anonymous MAP_SHARED
mmap while a forked child rewrites them (``--threads``: a second thread and a
bytearray).  Prints the decodes that passed and that raised KilnError; exits
1 if a worker died, raised anything but KilnError or returned an invalid or
foreign string.
"""

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))

import _text_mutation  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].strip())
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--impl", choices=("python", "cython", "both"), default="both")
    ap.add_argument("--threads", action="store_true")
    a = ap.parse_args(argv)
    bad = 0
    for impl in (("python", "cython") if a.impl == "both" else (a.impl,)):
        rc, stats, out = _text_mutation.run_worker("thread" if a.threads else "fork",
                                                   a.seconds, impl)
        if rc != 0 or stats is None or stats["failures"] or stats["final"]:
            bad = 1
            print("%s: FAILED (exit %s)\n%s" % (impl, rc, out[-3000:]))
        else:
            print("%s: %d decodes, %d passed, %d KilnError" % (
                impl, stats["decodes"], stats["ok"], stats["kiln_error"]))
    return bad


if __name__ == "__main__":
    sys.exit(main())
