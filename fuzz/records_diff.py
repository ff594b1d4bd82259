"""A bounded differential fuzz of the record container between the kernels.

    python fuzz/records_diff.py TARGET SECONDS [SEED]     TARGET: file | stream

See records_diff_oracle.py for the mutations and what is checked; each new
kind of failure is printed and its input saved as
/tmp/kiln-fuzz-records-TARGET-N (minimize it, fix both kernels, and add it to
fuzz/corpus/records under a ``finding-`` name).
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import records_diff_oracle as D  # noqa: E402


def main():
    if len(sys.argv) < 3 or sys.argv[1] not in ("file", "stream"):
        raise SystemExit(__doc__)
    target, secs = sys.argv[1], float(sys.argv[2])
    if D.O._kernels_c is None:
        raise SystemExit("the compiled kernels are not built: nothing to compare")
    seed = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    start = time.time()
    runs, findings = D.run(target, seconds=secs, seed=seed)
    print("%s: %d runs in %.0f s, %d findings" % (target, runs, time.time() - start,
                                                  len(findings)))
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
