"""Machine description, result rows, the printed tables, targets, JSON and the plot."""

import dataclasses
from typing import Optional
import gc
import json
import os
import platform
import re
import shutil
import subprocess
import sys
from importlib import metadata

from benchmarks.harness import FLOOR, KILN, PEER, VARIANT
from benchmarks import hostile


# --- machine ----------------------------------------------------------------------

def _version(dist):
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def machine():
    """What the numbers were measured on (lscpu fields, Python and library versions)."""
    cpu = {}
    if shutil.which("lscpu"):
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        for line in out.splitlines():
            k, _, v = line.partition(":")
            cpu[k.strip()] = v.strip()
    import numpy
    import kiln
    return {
        "cpu": cpu.get("Model name", platform.processor() or "unknown"),
        "cpus": os.cpu_count(),
        "threads_per_core": cpu.get("Thread(s) per core"),
        "hypervisor": cpu.get("Hypervisor vendor"),
        "l2": cpu.get("L2 cache"),
        "l3": cpu.get("L3 cache"),
        "platform": platform.platform(),
        "python": "%s %s" % (platform.python_implementation(), platform.python_version()),
        "numpy": numpy.__version__,
        "kiln": kiln.__version__,
        "msgspec": _version("msgspec"),
        "msgpack": _version("msgpack"),
        "safetensors": _version("safetensors"),
        "ml_dtypes": _version("ml_dtypes"),
        "gc_threshold": list(gc.get_threshold()),
        "loadavg_at_start": load_average(),
        "kiln_commit": kiln_commit(),
    }


def kiln_commit():
    """The checkout measured: short commit, plus "+dirty" when kiln/ or src/ differ from it."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def git(*a):
        return subprocess.run(("git", "-C", root) + a, capture_output=True, text=True).stdout.strip()
    if not shutil.which("git"):
        return None
    head = git("rev-parse", "--short", "HEAD")
    return head + ("+dirty" if git("status", "--porcelain", "--", "kiln", "src") else "") \
        if head else None


def load_average():
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:  # pragma: no cover - not on every platform
        return None


def describe_machine(m):
    virt = ", %s guest" % m["hypervisor"] if m.get("hypervisor") else ""
    return ("%s, %d CPUs (%s thread(s)/core%s), L2 %s, L3 %s; %s; %s, numpy %s, msgspec %s, "
            "msgpack %s, safetensors %s; kiln %s; load average %s at start, %s at end" % (
                m["cpu"], m["cpus"], m["threads_per_core"], virt, m["l2"], m["l3"],
                m["platform"], m["python"], m["numpy"], m["msgspec"], m["msgpack"],
                m["safetensors"], m.get("kiln_commit") or "?", _loads(m.get("loadavg_at_start")),
                _loads(m.get("loadavg_at_end"))))


def _loads(v):
    return "/".join("%.2f" % x for x in v) if v else "?"


# --- rows -------------------------------------------------------------------------

def result_rows(w):
    """One dict per contender of a measured workload, with its ratios."""
    rows = []
    for op in w.ops:
        floor, best = op.floor, op.best_peer
        for c in op.contenders:
            row = dict(workload=w.name, size=w.size, op=op.name, contender=c.name,
                       kind=c.kind, gc=c.gc, missing=c.missing)
            if c.samples:
                row.update(median_s=c.median, min_s=c.min, max_s=c.max, number=c.number,
                           repeats=len(c.samples),
                           samples_s=c.samples,
                           x_floor=c.median / floor.median if floor.samples else None,
                           x_best_peer=c.median / best.median if best else None,
                           best_peer=best.name if best else None)
            rows.append(row)
    return rows


# --- formatting -------------------------------------------------------------------

UNITS = ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs"), (1e-9, "ns"))


def _unit(seconds):
    return next((scale, u) for scale, u in UNITS if seconds >= scale or scale == 1e-9)


def _num(v):
    return "%.3g" % v if v < 100 else "%.0f" % v


def fmt_time(s):
    scale, u = _unit(s)
    return "%s %s" % (_num(s / scale), u)


def fmt_range(lo, hi, like):
    scale, u = _unit(like)
    return "%s–%s %s" % (_num(lo / scale), _num(hi / scale), u)


def fmt_ratio(x):
    if x is None:
        return "—"
    return "%.2g" % x if x < 0.1 else "%.2f" % x if x < 100 else "%.0f" % x


def fmt_bytes(n):
    return "%d B" % n if n < 10240 else "%.1f KiB" % (n / 1024)


def table(headers, rows, right=()):
    """An aligned Markdown pipe table (readable in a terminal, pasteable in docs)."""
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *rows)]

    def line(cells):
        return "| " + " | ".join(str(c).rjust(w) if i in right else str(c).ljust(w)
                                 for i, (c, w) in enumerate(zip(cells, widths))) + " |"
    sep = "|" + "|".join(("-" * (w + 1) + ":") if i in right else "-" * (w + 2)
                         for i, w in enumerate(widths)) + "|"
    return "\n".join([line(headers), sep] + [line(r) for r in rows])


def results_table(rows):
    out, last = [], (None, None)
    for r in rows:
        key = (r["workload"] + " " + r["size"], r["op"])
        wl = key[0] if key[0] != last[0] else ""
        op = key[1] if key != last else ""
        last = key
        name = r["contender"]
        if r.get("median_s") is None:
            out.append([wl, op, name, r["missing"] or "not run", "", "", ""])
            continue
        out.append([wl, op, name, fmt_time(r["median_s"]),
                    fmt_range(r["min_s"], r["max_s"], r["median_s"]),
                    fmt_ratio(r["x_floor"]), fmt_ratio(r["x_best_peer"])])
    return table(["workload", "op", "contender", "median/call", "min–max", "× floor",
                  "× best peer"], out, right={3, 4, 5, 6})


def hostile_table(rows):
    out = []
    for r in rows:
        if r.get("missing"):
            out.append([r["case"], r["what"], r["impl"], r["missing"], "", "", "", "", ""])
            continue
        pts = r["points"]
        out.append([r["case"], r["what"], r["impl"], "/".join(r["codes"]),
                    fmt_time(pts[0]["median_s"]), fmt_time(pts[-1]["median_s"]),
                    "%.2f" % r["time_spread"],
                    "%s–%s" % (fmt_bytes(min(p["peak_bytes"] for p in pts)),
                               fmt_bytes(max(p["peak_bytes"] for p in pts))),
                    "flat" if r["flat"] else "NOT FLAT"])
    first, last = "10^3", "2^32-1"
    return table(["case", "claim", "impl", "code", "median @" + first, "median @" + last,
                  "time max/min", "peak traced alloc", "verdict"], out, right={4, 5, 6, 7})


# --- targets ----------------------------------------------------------------------

@dataclasses.dataclass
class Target:
    text: str
    workload: str
    op: str
    against: str          # a peer's name, or FLOOR
    limit: float          # met when the ratio is at or below this (strictly below for 1.0)
    rule: str
    impl: str = "kiln-cython"     # the row judged (a kiln row or variant)
    strict: Optional[bool] = None  # below (True) or at most (False); None: below for 1.0


TARGETS = [
    Target("records decode faster than msgspec", "records", "decode", "msgspec", 1.0,
           "kiln / msgspec < 1"),
    Target("many-tensors view decode far faster than safetensors", "many-tensors",
           "decode (views)", "safetensors.numpy.load", 0.2, "kiln / safetensors ≤ 0.2"),
    Target("big-tensor view decode far faster than safetensors", "big-tensor", "decode (view)",
           "safetensors (bytes)", 0.2, "kiln / safetensors ≤ 0.2"),
    Target("floats encode close to the copy floor", "floats", "encode", FLOOR, 1.5,
           "kiln / floor ≤ 1.5"),
    Target("floats decode close to the copy floor", "floats", "decode", FLOOR, 1.5,
           "kiln / floor ≤ 1.5"),
    Target("big-tensor copy decode close to the copy floor", "big-tensor", "decode (copy)",
           FLOOR, 1.5, "kiln / floor ≤ 1.5"),
    # issue 17, "Speed, round two"
    Target("#17 records encode", "records", "encode", "msgspec", 1.0,
           "kiln / msgspec ≤ 1.0", strict=False),
    Target("#17 records decode, GC on", "records", "decode", "msgspec", 0.9,
           "kiln / msgspec ≤ 0.9"),
    Target("#17 records decode [tags=list], GC on", "records", "decode", "msgspec", 0.9,
           "kiln / msgspec ≤ 0.9", impl="kiln-cython [tags=list]"),
    Target("#17 records decode, GC off", "records", "decode", "msgspec [gc off]", 1.0,
           "kiln [gc off] / msgspec [gc off] ≤ 1.0", impl="kiln-cython [gc off]", strict=False),
    Target("#17 records decode [tags=list], GC off", "records", "decode", "msgspec [gc off]",
           1.0, "kiln [tags=list, gc off] / msgspec [gc off] ≤ 1.0",
           impl="kiln-cython [tags=list, gc off]", strict=False),
    Target("#17 records decode [slots], GC on", "records", "decode", "msgspec", 0.9,
           "kiln [slots] / msgspec ≤ 0.9", impl="kiln-cython [slots]"),
    Target("#17 records decode [tags=list, slots], GC on", "records", "decode", "msgspec", 0.9,
           "kiln [tags=list, slots] / msgspec ≤ 0.9", impl="kiln-cython [tags=list, slots]"),
    Target("#17 records decode [slots], GC off", "records", "decode", "msgspec [gc off]", 1.0,
           "kiln [slots, gc off] / msgspec [gc off] ≤ 1.0", impl="kiln-cython [slots, gc off]",
           strict=False),
    Target("#17 records decode [tags=list, slots], GC off", "records", "decode",
           "msgspec [gc off]", 1.0, "kiln [tags=list, slots, gc off] / msgspec [gc off] ≤ 1.0",
           impl="kiln-cython [tags=list, slots, gc off]", strict=False),
    Target("#17 many-tensors decode (views)", "many-tensors", "decode (views)", FLOOR, 1.0,
           "kiln / floor ≤ 1.0", strict=False),
    Target("#17 many-tensors decode + .numpy()", "many-tensors", "decode + .numpy()", FLOOR,
           1.5, "kiln / floor ≤ 1.5"),
    Target("#17 many-tensors encode", "many-tensors", "encode", FLOOR, 10,
           "kiln / floor ≤ 10"),
    Target("#17 many-tensors encode against safetensors", "many-tensors", "encode",
           "safetensors.numpy.save", 0.2, "kiln / safetensors ≤ 0.2"),
    Target("#17 sample decode", "sample", "decode", FLOOR, 1.3, "kiln / floor ≤ 1.3"),
    Target("#17 sample encode", "sample", "encode", FLOOR, 1.5, "kiln / floor ≤ 1.5"),
    Target("#17 kiln-python records decode", "records", "decode", "msgspec", 4,
           "kiln-python / msgspec ≤ 4", impl="kiln-python"),
    # issue 52: every binding at most msgspec (its array_like Struct), GC on
    *[Target("#52 records %s [%s]" % (op, b) if b else "#52 records %s [dataclass]" % op,
             "records", op, "msgspec", 1.0,
             "kiln%s / msgspec ≤ 1.0" % (" [%s]" % b if b else ""),
             impl="kiln-cython [%s]" % b if b else "kiln-cython", strict=False)
      for op in ("encode", "decode") for b in ("", "namedtuple", "dict")],
    Target("#52 many-tensors decode + .numpy() against safetensors", "many-tensors",
           "decode + .numpy()", "safetensors.numpy.load", 0.12, "kiln / safetensors ≤ 0.12"),
]


def _ratio(rows, wl, size, op, impl, against, stat="median_s"):
    """``impl``'s time over the floor's or a named peer's, by ``stat`` (median_s or min_s)."""
    mine = [r for r in rows if r["workload"] == wl and r["size"] == size and r["op"] == op]
    me = next((r for r in mine if r["contender"] == impl), None)
    other = next((r for r in mine if (r["kind"] == FLOOR if against == FLOOR
                                      else r["contender"] == against)), None)
    if not me or not other or me.get(stat) is None or other.get(stat) is None:
        return None
    return me[stat] / other[stat]


def evaluate_targets(rows, hostile_rows):
    """One verdict per target instance, judged on kiln-cython (kiln-python shown too).

    The verdict uses the ratio of medians; the ratio of the fastest samples is
    reported beside it as a check on neighbour noise.
    """
    out = []
    for t in TARGETS:
        for size in dict.fromkeys(r["size"] for r in rows if r["workload"] == t.workload):
            args = (rows, t.workload, size, t.op)
            cy = _ratio(*args, t.impl, t.against)
            strict = t.limit == 1.0 if t.strict is None else t.strict
            ok = None if cy is None else (cy < t.limit if strict else cy <= t.limit)
            out.append(dict(target=t.text, instance="%s %s, %s" % (t.workload, size, t.op),
                            rule=t.rule, cython=cy, met=ok,
                            cython_fastest=_ratio(*args, t.impl, t.against, "min_s"),
                            python=(_ratio(*args, "kiln-python", t.against)
                                    if t.impl == "kiln-cython" else None)))
    for case in dict.fromkeys(r["case"] for r in hostile_rows):
        res = {r["impl"]: r for r in hostile_rows if r["case"] == case}

        def spread(impl):
            r = res.get(impl)
            if not r or r.get("missing"):
                return None, None
            return r, "time ×%.2f, alloc +%d B" % (r["time_spread"], r["alloc_spread"])
        cy, cy_text = spread("kiln-cython")
        _, py_text = spread("kiln-python")
        out.append(dict(target="hostile: flat time and allocation", instance=case,
                        rule="time max/min ≤ %g, alloc spread ≤ %d B"
                        % (hostile.TIME_SPREAD_MAX, hostile.ALLOC_SPREAD_MAX),
                        cython=cy_text, python=py_text, met=None if cy is None else cy["flat"]))
    return out


def targets_table(targets):
    def val(v):
        return "—" if v is None else v if isinstance(v, str) else fmt_ratio(v)
    out = [[t["target"], t["instance"], t["rule"], val(t["cython"]),
            {True: "met", False: "not met", None: "n/a (kiln-cython not built)"}[t["met"]],
            val(t.get("cython_fastest")), val(t["python"])] for t in targets]
    return table(["target (kiln-cython)", "measured on", "rule", "kiln-cython", "verdict",
                  "fastest samples (check)", "kiln-python (info)"], out)


# --- JSON and plot ----------------------------------------------------------------

def _parent(path):
    d = os.path.dirname(path)
    if d:
        os.makedirs(d, exist_ok=True)


def write_json(path, doc):
    _parent(path)
    with open(path, "w") as f:
        json.dump(doc, f, indent=1, ensure_ascii=False)
        f.write("\n")


COLORS = {FLOOR: "#9e9e9e", PEER: "#2c7fb8", VARIANT: "#e6ab02",
          "kiln-cython": "#d95f02", "kiln-python": "#fdae6b"}


def plot(path, rows, hostile_rows, title):
    """Bar charts of × floor per op (log scale), plus the hostile times; needs matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import NullFormatter
    except ImportError:
        print("--plot: matplotlib is not installed (pip install matplotlib); no chart written",
              file=sys.stderr)
        return False
    groups = list(dict.fromkeys((r["workload"], r["size"], r["op"]) for r in rows))
    panels = len(groups) + (1 if hostile_rows else 0)
    ncol = 3
    nrow = -(-panels // ncol)
    heights = []
    for i in range(nrow):
        sizes = [sum(1 for r in rows if (r["workload"], r["size"], r["op"]) == g)
                 for g in groups[i * ncol:(i + 1) * ncol]] or [6]
        heights.append(max(2.4, 0.28 * max(sizes) + 1.0))
    fig, axes = plt.subplots(nrow, ncol, figsize=(18, sum(heights)),
                             gridspec_kw=dict(height_ratios=heights), squeeze=False)
    for ax, g in zip(axes.flat, groups):
        grows = [r for r in rows if (r["workload"], r["size"], r["op"]) == g]
        names = [r["contender"] for r in grows]
        vals = [r.get("x_floor") or 0 for r in grows]
        colors = [COLORS[r["contender"] if r["kind"] == KILN else r["kind"]] for r in grows]
        y = range(len(grows))[::-1]
        ax.barh(list(y), [v if v else 0 for v in vals], color=colors, log=True)
        ax.set_yticks(list(y))
        ax.set_yticklabels(names, fontsize=8)
        ax.axvline(1.0, color="black", lw=0.8)
        ax.set_title("%s %s — %s" % g, fontsize=10)
        ax.set_xlabel("time / floor (log)", fontsize=8)
        positive = [v for v in vals if v]
        lo, hi = min(positive + [1.0]), max(positive + [1.0])
        ax.set_xlim(lo / 2, hi * 4)
        ax.xaxis.set_minor_formatter(NullFormatter())
        for yi, r, v in zip(y, grows, vals):
            label = fmt_ratio(v) if v else r.get("missing") or "not run"
            ax.text(v if v else lo / 1.8, yi, " " + label, va="center", fontsize=7)
    if hostile_rows:
        ax = axes.flat[len(groups)]
        for r in hostile_rows:
            if r.get("missing"):
                continue
            xs = [p["count"] for p in r["points"]]
            ys = [p["median_s"] * 1e6 for p in r["points"]]
            ax.plot(xs, ys, marker="o", ms=3, ls="-" if r["impl"] == "kiln-cython" else "--",
                    label="%s (%s)" % (r["case"], r["impl"]))
        ax.set_xscale("log")
        ax.set_ylim(0, ax.get_ylim()[1] * 1.7)
        ax.set_xlabel("claimed count", fontsize=8)
        ax.set_ylabel("µs to reject (median)", fontsize=8)
        ax.set_title("hostile: time to reject vs claimed count", fontsize=10)
        ax.legend(fontsize=6, ncol=2, loc="upper center")
    for ax in list(axes.flat)[panels:]:
        ax.axis("off")
    fig.suptitle(title, fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.98))
    _parent(path)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


def short_title(m, mode):
    return "kiln benchmarks (%s mode) — %s, %d CPUs, %s, numpy %s" % (
        mode, re.sub(r"\s+", " ", m["cpu"]), m["cpus"], m["python"], m["numpy"])
