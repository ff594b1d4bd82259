"""A torch checkpoint, kiln.torch against safetensors.torch (issue 39).

    python -m benchmarks.torch_checkpoint [--tensors 50] [--mib 200] [--repeat 7]

A bf16 state dict (``--tensors`` tensors, ``--mib`` MiB in all, shapes of a
transformer's projections) saved and loaded by both, side by side in one
process, page cache warm, the files in one temporary folder:

* ``save``: ``kiln.torch.save_file`` (atomic: a temporary file, fsynced,
  renamed) and ``safetensors.torch.save_file`` (written in place, no fsync);
* ``load_file``: the state dict of both (each: CPU tensors over a mapping
  of the file, nothing read yet);
* ``load_file + read``: the same, then every tensor read once (``clone()``);
* ``load_model``: ``kiln.torch.load_model(model, path)`` (open, check, one
  copy from the mapping into each parameter) against
  ``model.load_state_dict(sd)`` of a state dict already loaded into memory
  (the copies alone) and ``safetensors.torch.load_model``.

Targets: kiln at most 1.0x safetensors on ``save`` and ``load_file``, and
``load_model`` at most 1.1x ``load_state_dict`` of loaded tensors, judged on
the ratio of medians (the ratio of the fastest samples printed beside it).
The contenders of one op are timed in interleaved rounds.  Each row: median
seconds over ``--repeat`` calls (min..max), GB/s of payload.
Needs torch and safetensors (neither in kiln's CI extras).
"""

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import kiln  # noqa: E402


def _state_dict(torch, n, mib):
    """n bf16 tensors of about mib MiB in all: square and 4x-wide projections."""
    per = (mib << 20) // n // 2          # elements per tensor
    width = 1024
    g = torch.Generator().manual_seed(0)
    sd = {}
    for i in range(n):
        rows = max(1, per // width)
        if i % 4 == 3:                    # an mlp's wide projection, same element count
            shape = (rows // 4 or 1, width * 4)
        else:
            shape = (rows, width)
        sd["model.layers.%02d.weight" % i] = torch.randn(shape, generator=g).to(torch.bfloat16)
    return sd


def _rows(torch, kp, sp, sd, names):
    import safetensors.torch as sttorch
    kt = kiln.torch
    model = torch.nn.ParameterDict({names[k]: torch.nn.Parameter(torch.empty_like(v))
                                    for k, v in sd.items()})
    renamed = {names[k]: v for k, v in sd.items()}
    kp2, sp2 = kp + ".m", sp + ".m"
    kt.save_file(renamed, kp2)
    sttorch.save_file(renamed, sp2)
    loaded = {k: v.clone() for k, v in sttorch.load_file(sp2).items()}   # in memory

    def read_all(d):
        return [v.clone() for v in d.values()]

    return [   # the baseline of each op first: the ratios are to it
        ("save", "safetensors.torch.save_file", lambda: sttorch.save_file(sd, sp)),
        ("save", "kiln.torch.save_file", lambda: kt.save_file(sd, kp)),
        ("load_file", "safetensors.torch.load_file", lambda: sttorch.load_file(sp)),
        ("load_file", "kiln.torch.load_file", lambda: kt.load_file(kp)),
        ("load_file + read", "safetensors.torch.load_file",
         lambda: read_all(sttorch.load_file(sp))),
        ("load_file + read", "kiln.torch.load_file", lambda: read_all(kt.load_file(kp))),
        ("load_model", "load_state_dict (loaded)", lambda: model.load_state_dict(loaded)),
        ("load_model", "kiln.torch.load_model", lambda: kt.load_model(model, kp2)),
        ("load_model", "safetensors.torch.load_model",
         lambda: sttorch.load_model(model, sp2)),
    ]


def _time_op(fns, repeat):
    """Samples of each of one op's contenders, timed in interleaved rounds
    (the order rotating), after one untimed warm-up call each (page cache,
    imports): a neighbour's load that comes and goes hits all of them alike.
    A contender given as ``(setup, fn)`` is timed as ``fn(setup())``, the
    setup untimed (a fresh model to load into)."""
    fns = [f if isinstance(f, tuple) else (None, f) for f in fns]

    def call(i):
        setup, fn = fns[i]
        if setup is None:
            t = time.perf_counter()
            fn()
            return time.perf_counter() - t
        arg = setup()
        t = time.perf_counter()
        fn(arg)
        return time.perf_counter() - t

    for i in range(len(fns)):
        call(i)
    times = [[] for _ in fns]
    for r in range(repeat):
        order = list(range(len(fns)))
        order = order[r % len(order):] + order[:r % len(order)]
        for i in order:
            times[i].append(call(i))
    return times


TARGETS = {"save": 1.0, "load_file": 1.0, "load_model": 1.1}
BASE = {"save": "safetensors.torch.save_file", "load_file": "safetensors.torch.load_file",
        "load_file + read": "safetensors.torch.load_file",
        "load_model": "load_state_dict (loaded)"}
KILN = {"save": "kiln.torch.save_file", "load_file": "kiln.torch.load_file",
        "load_model": "kiln.torch.load_model"}


def _table(rows, repeat, total, base):
    """Time each op's contenders (the first row of an op is its baseline) and
    print a row each: {(op, label): (median, fastest)}."""
    out = {}
    print("%-22s %-36s %9s %17s %7s %7s" % ("op", "contender", "median s", "min..max",
                                            "GB/s", "ratio"))
    for op in dict.fromkeys(r[0] for r in rows):
        mine = [r for r in rows if r[0] == op]
        for (_, label, _), times in zip(mine, _time_op([r[2] for r in mine], repeat)):
            med = statistics.median(times)
            out[(op, label)] = (med, min(times))
            ratio = "" if label == base[op] else "%.2fx" % (med / out[(op, base[op])][0])
            print("%-22s %-36s %9.4f %8.4f..%-8.4f %7.2f %7s" % (
                op, label, med, min(times), max(times), total / med / 1e9, ratio))
    return out


def _verdicts(timed, targets, base, mine):
    for op, target in targets.items():
        if (op, mine[op]) not in timed:
            continue
        (k, k_min), (b, b_min) = timed[(op, mine[op])], timed[(op, base[op])]
        print("target %-22s %s / %s = %.2fx of medians, %.2fx of fastest (at most %.1fx): %s"
              % (op, mine[op], base[op], k / b, k_min / b_min, target,
                 "met" if k / b <= target else "NOT MET"))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tensors", type=int, default=50)
    ap.add_argument("--mib", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--models", default="gpt2,llama",
                    help="Hugging Face-like models to time (gpt2, llama; 'none' for the "
                         "state dict alone); needs transformers")
    ap.add_argument("--layers", type=int, default=2, help="layers of each model")
    ap.add_argument("--state-dict", action=argparse.BooleanOptionalAction, default=True,
                    help="time the bf16 state dict (--tensors, --mib)")
    args = ap.parse_args(argv)
    import torch
    import safetensors
    import kiln.torch  # noqa: F401
    print("kiln %s, torch %s, safetensors %s, %d threads"
          % (kiln.IMPLEMENTATION, torch.__version__, safetensors.__version__,
             torch.get_num_threads()))
    if args.state_dict:
        _state_dict_section(torch, args)
    models = [m for m in args.models.split(",") if m and m != "none"]
    if models:
        try:
            import transformers
        except ImportError:
            print("\ntransformers is not installed: the model rows are not timed")
            return
        from benchmarks.torch_models import model_section
        for name in models:
            model_section(torch, transformers, name, args.layers, args.repeat)


def _state_dict_section(torch, args):
    sd = _state_dict(torch, args.tensors, args.mib)
    names = {k: k.replace(".", "_") for k in sd}   # a ParameterDict's names have no dots
    total = sum(v.numel() * v.element_size() for v in sd.values())
    with tempfile.TemporaryDirectory() as folder:
        kp, sp = os.path.join(folder, "m.kiln"), os.path.join(folder, "m.safetensors")
        kiln.torch.save_file(sd, kp)
        import safetensors.torch as sttorch
        sttorch.save_file(sd, sp)
        print("\n%d bf16 tensors, %.0f MiB" % (len(sd), total / 2**20))
        timed = _table(_rows(torch, kp, sp, sd, names), args.repeat, total, BASE)
        _verdicts(timed, TARGETS, BASE, KILN)


if __name__ == "__main__":
    main()
