"""Start-up and command-line latency against ``python -c "import numpy"`` (issues 31, 52).

    python -m benchmarks.startup [--repeat 15] [--before PATH] [--json PATH]

Each row is the median wall time of ``--repeat`` fresh interpreter starts
(from the child's start to its exit), the rows interleaved round by round
so a neighbour's load falls on all of them alike.  Bytecode caches are on, as
for an installed package (``PYTHONDONTWRITEBYTECODE`` is dropped, and
``PYTHONPYCACHEPREFIX`` points at a temporary folder, so numpy's and kiln's
``.pyc`` files are written there and nothing in the checkout); one untimed
round first writes them and warms the page cache.  The kiln rows run the
``kiln`` of this checkout, or of ``--root`` (``PYTHONPATH`` is set to it), with
the kernels it picks by itself; ``--pure`` sets ``KILN_PUREPYTHON=1``.  Ratios
are each row's median over the ``import numpy`` median; the targets are judged
on them.  The user plus system CPU time of each child (``os.wait4``) is shown
beside the wall time as a check on load from other processes.

The command-line rows run ``python -m kiln inspect`` and ``python -m kiln
check`` on a file holding one 4-byte tensor, written once into a temporary
folder.  ``--before PATH`` adds the kiln rows of another checkout (an older
tree, ``git archive`` of a commit) to the same rounds, marked ``(before)``:
on a shared machine a neighbour's load then falls on both trees alike.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if __package__ in (None, ""):
    sys.path.insert(0, str(ROOT))

TARGETS = {"import kiln": 1.25, "kiln inspect": 1.3, "kiln check": 1.3}   # issue 52


def rows(small, tag="", path=None):
    """(name, command, PYTHONPATH) of each row; ``tag`` and ``path``: the kiln
    rows of another checkout."""
    py = sys.executable
    kiln = [
        ("import kiln", [py, "-c", "import kiln"]),
        ("kiln inspect", [py, "-m", "kiln", "inspect", small]),
        ("kiln check", [py, "-m", "kiln", "check", small]),
    ]
    out = [(name + tag, cmd, path) for name, cmd in kiln]
    return out if tag else [("import numpy", [py, "-c", "import numpy"], None)] + out


def once(cmd, env, cwd):
    """(wall seconds, user+system CPU seconds) of one run of ``cmd``."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(p.pid, 0)
    dt = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        r = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True)
        raise SystemExit("%s failed (%d): %s" % (" ".join(cmd), p.returncode, r.stderr))
    return dt, usage.ru_utime + usage.ru_stime


def measure(repeat, pure=False, root=ROOT, before=None):
    env = dict(os.environ, PYTHONPATH=str(root))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if pure:
        env["KILN_PUREPYTHON"] = "1"
    else:
        env.pop("KILN_PUREPYTHON", None)
    with tempfile.TemporaryDirectory() as d:
        env["PYTHONPYCACHEPREFIX"] = os.path.join(d, "pycache")
        small = os.path.join(d, "small.kiln")
        subprocess.run([sys.executable, "-c", "import sys, numpy, kiln; kiln.save_tensors("
                        "sys.argv[1], {'x': numpy.float32([1.5])})", small],
                       env=env, check=True)
        table = rows(small) + (rows(small, " (before)", str(before)) if before else [])
        envs = {name: env if path is None else dict(env, PYTHONPATH=path)
                for name, _, path in table}
        samples = {name: [] for name, _, _ in table}
        cpu = {name: [] for name, _, _ in table}
        for name, cmd, _ in table:          # untimed: page cache, .pyc files
            once(cmd, envs[name], d)
        for _ in range(repeat):
            for name, cmd, _ in table:
                wall, used = once(cmd, envs[name], d)
                samples[name].append(wall)
                cpu[name].append(used)
    base = statistics.median(samples["import numpy"])
    base_cpu = statistics.median(cpu["import numpy"])
    out = []
    for name, _, _ in table:
        med = statistics.median(samples[name])
        med_cpu = statistics.median(cpu[name])
        out.append({"row": name, "median_s": med, "min_s": min(samples[name]),
                    "max_s": max(samples[name]), "ratio": med / base,
                    "cpu_median_s": med_cpu, "cpu_ratio": med_cpu / base_cpu,
                    "target": TARGETS.get(name.replace(" (before)", "")),
                    "samples": samples[name], "cpu": cpu[name]})
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m benchmarks.startup",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=15, help="process starts per row")
    ap.add_argument("--pure", action="store_true", help="KILN_PUREPYTHON=1 for the kiln rows")
    ap.add_argument("--root", metavar="PATH", default=str(ROOT),
                    help="the checkout whose kiln to time (default: this one)")
    ap.add_argument("--before", metavar="PATH",
                    help="also time the kiln rows of the checkout at PATH, in the same rounds")
    ap.add_argument("--json", metavar="PATH", help="also write every sample to PATH")
    args = ap.parse_args(argv)
    result = measure(args.repeat, args.pure, args.root, args.before)
    print("| row | median s | min-max s | / import numpy | CPU median s | CPU / import numpy "
          "| target |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in result:
        target = "" if r["target"] is None else "<= %.2f %s" % (
            r["target"], "met" if r["ratio"] <= r["target"] else "not met")
        print("| %s | %.3f | %.3f-%.3f | %.2f | %.3f | %.2f | %s |" % (
            r["row"], r["median_s"], r["min_s"], r["max_s"], r["ratio"], r["cpu_median_s"],
            r["cpu_ratio"], target))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
