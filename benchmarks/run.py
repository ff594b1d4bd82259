"""Run the kiln benchmarks and print one report.

    python -m benchmarks [--quick] [--json PATH] [--plot PATH.png] [--only NAME,...]
    python benchmarks/run.py ...        (the same)

Every workload is timed for kiln-cython, kiln-python, kiln variants, the
peers and the workload's floor in this one process, interleaved, after a
warm-up; the report gives the median time per call, the min-max over the
repeats and the ratios to the floor and to the best peer.
"""

import argparse
import dataclasses
import datetime
import gc
import json
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import harness, hostile, report  # noqa: E402
from benchmarks import workloads  # noqa: E402,F401  (registers the workloads)

MODES = {
    # quick: a smoke run of smaller sizes in well under a minute
    "quick": harness.Config(repeats=3, warmup=0, min_sample=0.005),
    "full": harness.Config(repeats=7, warmup=1, min_sample=0.05),
}

GC_STATEMENT = ("the collector is enabled while every sample runs, after an untimed "
                "gc.collect(); rows marked [gc off] run with gc.disable()")


def parse_args(argv):
    names = list(harness.REGISTRY) + ["hostile"]
    ap = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, 3 repeats (< 1 minute)")
    ap.add_argument("--json", metavar="PATH", help="also write every number to PATH")
    ap.add_argument("--plot", metavar="PATH.png", help="draw the ratios (needs matplotlib)")
    ap.add_argument("--only", metavar="NAME,...", help="run only these of: " + ", ".join(names))
    ap.add_argument("--repeats", type=int, help="timed samples per contender")
    ap.add_argument("--load", metavar="PATH", help="measure nothing: print (and --plot) the "
                    "report saved by an earlier --json")
    args = ap.parse_args(argv)
    args.selected = names if not args.only else args.only.split(",")
    unknown = [n for n in args.selected if n not in names]
    if unknown:
        ap.error("unknown workload(s) %s; choose from %s" % (unknown, ", ".join(names)))
    return args


def run_workloads(selected, mode, impls, cfg):
    rows, notes = [], {}
    for name in selected:
        spec = harness.REGISTRY.get(name)
        if spec is None:
            continue
        for size in getattr(spec, mode):
            harness.progress("%s %s: building inputs" % (name, size))
            w = spec.build(size, impls)
            try:
                harness.measure(w.contenders, cfg, "%s %s" % (w.name, w.size))
                rows += report.result_rows(w)
                notes.setdefault(w.name, w.notes)
            finally:
                if w.cleanup:
                    w.cleanup()
            del w
            gc.collect()
    return rows, notes


def measure_all(args):
    """Run the selected workloads; return the report document (what --json writes)."""
    mode = "quick" if args.quick else "full"
    cfg = MODES[mode]
    if args.repeats:
        cfg = dataclasses.replace(cfg, repeats=args.repeats)
    impls = harness.kiln_impls()
    mach = report.machine()
    started = datetime.datetime.now().astimezone()
    t0 = time.perf_counter()
    rows, notes = run_workloads(args.selected, mode, impls, cfg)
    hostile_rows = hostile.run(impls, cfg, args.quick) if "hostile" in args.selected else []
    mach["loadavg_at_end"] = report.load_average()
    return dict(mode=mode, started=started.isoformat(), elapsed_s=time.perf_counter() - t0,
                config=dataclasses.asdict(cfg), machine=mach,
                kernels={im.name: im.status for im in impls}, gc=GC_STATEMENT, notes=notes,
                results=rows, hostile=hostile_rows,
                targets=report.evaluate_targets(rows, hostile_rows))


def render(doc):
    """The printed report: header, results table, hostile table, targets."""
    cfg, mach = doc["config"], doc["machine"]
    started = datetime.datetime.fromisoformat(doc["started"])
    out = ["# kiln benchmarks: %s mode, %s, %.0f s"
           % (doc["mode"], started.strftime("%Y-%m-%d %H:%M %Z"), doc["elapsed_s"]), "",
           "- machine: " + report.describe_machine(mach),
           "- method: one process; per workload every contender is calibrated and warmed up, "
           "then timed in %d interleaved rounds (order rotating); a sample batches calls to "
           ">= %g ms; median per call and min-max over the %d samples; ratios are of medians."
           % (cfg["repeats"], cfg["min_sample"] * 1e3, cfg["repeats"]),
           "- GC: %s; thresholds %s." % (doc["gc"], tuple(mach["gc_threshold"])),
           "- kernels: " + "; ".join("%s = %s" % kv for kv in doc["kernels"].items())]
    out += ["- %s: %s" % (name, n) for name, ns in doc["notes"].items() for n in ns]
    out.append("")
    if doc["results"]:
        out += [report.results_table(doc["results"]), ""]
    if doc["hostile"]:
        out += ["Hostile counts (claimed count 10^3 ... 2^32-1; caps raised to 2^32-1 except "
                "count-cap):", "", report.hostile_table(doc["hostile"]), ""]
    out.append(report.targets_table(doc["targets"]))
    return "\n".join(out)


def main(argv=None):
    args = parse_args(argv)
    if args.load:
        with open(args.load) as f:
            doc = json.load(f)
        doc["targets"] = report.evaluate_targets(doc["results"], doc["hostile"])
    else:
        doc = measure_all(args)
    print(render(doc))
    if args.json:
        report.write_json(args.json, doc)
        harness.progress("wrote " + args.json)
    if args.plot and report.plot(args.plot, doc["results"], doc["hostile"],
                                 report.short_title(doc["machine"], doc["mode"])):
        harness.progress("wrote " + args.plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
