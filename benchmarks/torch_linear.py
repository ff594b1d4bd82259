"""Costs linear in the tensor count (issue 57 item 3): two cases that were
quadratic, each side by side with its yardstick in one process.

    python -m benchmarks.torch_linear [--scalars 8000] [--views 4000] [--repeat 7]

* ``assign``: ``kiln.torch.load_model(model, path, assign=True)`` of
  ``--scalars`` 0-d parameters of one module (a model built on the meta
  device; the file about 1.5 MB, page cache warm) against torch's
  ``model.load_state_dict(sd, assign=True)`` of the same state dict already
  in memory.  Target: at most 2x.
* ``views``: ``kiln.torch.save_file`` of ``--views`` views of one flat
  storage (each 8 floats, disjoint) against ``save_file`` of as many clones
  (one storage each).  Target: at most 2x.

Each case also runs at half the count: a linear cost doubles with the count
(the ``x2`` column, the median at the full count over the median at half;
a quadratic one quadruples).  Rows: median seconds over ``--repeat`` calls
(min..max), microseconds per tensor; the contenders of a case are timed in
interleaved rounds.  Needs torch.
"""

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import kiln  # noqa: E402,F401


def _scalars_module(torch, n):
    class Scalars(torch.nn.Module):
        def __init__(self):
            super().__init__()
            for i in range(n):
                self.register_parameter("p%d" % i, torch.nn.Parameter(torch.zeros(())))
    return Scalars


def _interleaved(fns, repeat):
    """{name: [seconds]}: each contender called once per round, in turn."""
    out = {name: [] for name in fns}
    for name, fn in fns.items():   # one warm-up call each
        fn()
    for _ in range(repeat):
        for name, fn in fns.items():
            t = time.perf_counter()
            fn()
            out[name].append(time.perf_counter() - t)
    return out


def _assign_case(torch, n, repeat, folder):
    import kiln.torch as kt
    cls = _scalars_module(torch, n)
    src = cls()
    with torch.no_grad():
        for i, p in enumerate(src.parameters()):
            p.fill_(i)
    sd = {k: v.detach().clone() for k, v in src.state_dict().items()}
    path = Path(folder) / ("scalars-%d.kiln" % n)
    kt.save_file(sd, path)
    models = {}

    def fresh():
        with torch.device("meta"):
            return cls()

    # the model is built outside the timed call (the same for both)
    def kiln_call():
        models["kiln"] = fresh()
        t = time.perf_counter()
        kt.load_model(models["kiln"], path, assign=True)
        return time.perf_counter() - t

    def torch_call():
        models["torch"] = fresh()
        t = time.perf_counter()
        models["torch"].load_state_dict(sd, assign=True)
        return time.perf_counter() - t

    times = {"kiln load_model(assign=True)": [], "torch load_state_dict(assign=True)": []}
    kiln_call()
    torch_call()
    for _ in range(repeat):
        times["kiln load_model(assign=True)"].append(kiln_call())
        times["torch load_state_dict(assign=True)"].append(torch_call())
    assert models["kiln"].get_parameter("p%d" % (n - 1)).item() == n - 1
    return times


def _views_case(torch, n, repeat, folder):
    import kiln.torch as kt
    flat = torch.arange(n * 8, dtype=torch.float32)
    views = {"v%05d" % i: flat[8 * i:8 * i + 8] for i in range(n)}
    clones = {k: v.clone() for k, v in views.items()}
    a, b = Path(folder) / "views.kiln", Path(folder) / "clones.kiln"
    return _interleaved({"save_file of views of one storage": lambda: kt.save_file(views, a),
                         "save_file of clones": lambda: kt.save_file(clones, b)}, repeat)


def _report(title, n, full, half, target):
    print("\n%s (%d tensors)" % (title, n))
    print("  %-38s %10s %22s %9s %6s" % ("", "median s", "min..max", "us/tensor", "x2"))
    names = list(full)
    for name in names:
        s = full[name]
        med = statistics.median(s)
        print("  %-38s %10.4f %10.4f..%-10.4f %9.2f %6.2f" % (
            name, med, min(s), max(s), med / n * 1e6, med / statistics.median(half[name])))
    ours, theirs = full[names[0]], full[names[1]]
    ratio = statistics.median(ours) / statistics.median(theirs)
    best = min(ours) / min(theirs)
    print("  ratio %.2fx (fastest samples %.2fx), target at most %.1fx: %s"
          % (ratio, best, target, "met" if ratio <= target else "not met"))
    return ratio


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scalars", type=int, default=8000)
    ap.add_argument("--views", type=int, default=4000)
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args(argv)
    import torch
    print("kiln %s (%s kernels), torch %s" % (kiln.__version__, kiln.IMPLEMENTATION,
                                              torch.__version__))
    with tempfile.TemporaryDirectory(prefix="kiln-bench-") as folder:
        full = _assign_case(torch, args.scalars, args.repeat, folder)
        half = _assign_case(torch, args.scalars // 2, args.repeat, folder)
        _report("assign=True: 0-d parameters of one module", args.scalars, full, half, 2.0)
        full = _views_case(torch, args.views, args.repeat, folder)
        half = _views_case(torch, args.views // 2, args.repeat, folder)
        _report("save_file: views of one storage against clones", args.views, full, half, 2.0)


if __name__ == "__main__":
    main()
