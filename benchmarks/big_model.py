"""The big-model speeds a user times first (issue 57 item 4).

    python -m benchmarks.big_model [--mb 400] [--repeat 11] [--busy 0]

A LLaMA-like bf16 state dict (hidden 2048, MLP 5632, grouped K/V of 512,
a 16,000-word vocabulary, as many layers as make about ``--mb`` MB: 3 for
400 MB, 21 for 2 GB), page cache warm, files in one temporary folder, each
op's contenders timed back to back in rounds (the order rotating; medians):

* ``save``: ``kiln.torch.save_file`` (atomic and durable: a temporary file,
  fsynced, renamed over the old one) against ``safetensors.torch.save_file``
  followed by an ``fsync`` of the file;
* ``assign``: ``kiln.torch.load_model(meta_model, path, assign=True)`` (the
  model built on the meta device before each call, untimed) against
  ``kiln.torch.load_model`` into a model whose memory was allocated and
  never touched (``to_empty(device="cpu")``, untimed): both first-touch the
  pages they fill (before each, the memory earlier rounds freed is given
  back to the system, ``malloc_trim``, so neither reuses touched pages);
* ``load_model``: ``kiln.torch.load_model`` into a model already in memory
  against ``safetensors.torch.load_model`` of the same model.

``--busy N`` runs N other jobs meanwhile (processes that spin a core and
rewrite a 64 MiB file of their own in a loop, as a neighbour's build or
training job would), stopped at the end.  Targets: ``save`` at most 1.0x,
``assign`` at most 1.1x, ``load_model`` at most 1.0x, quiet and busy.
Needs torch and safetensors.
"""

import argparse
import multiprocessing
import os
import shutil
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import kiln  # noqa: E402

from benchmarks.moe_checkpoint import module_for  # noqa: E402
from benchmarks.torch_checkpoint import _table, _verdicts  # noqa: E402

HIDDEN, MLP, KV, VOCAB = 2048, 5632, 512, 16000
LAYER_BYTES = 2 * (2 * HIDDEN * HIDDEN + 2 * KV * HIDDEN + 3 * HIDDEN * MLP + 2 * HIDDEN)


def shapes(mb):
    """name -> shape of a LLaMA-like model of about ``mb`` MB in bf16."""
    base = 2 * 2 * VOCAB * HIDDEN + 2 * HIDDEN
    layers = max(1, round((mb * 1e6 - base) / LAYER_BYTES))
    out = {"model.embed_tokens.weight": (VOCAB, HIDDEN)}
    for i in range(layers):
        p = "model.layers.%d." % i
        out[p + "input_layernorm.weight"] = (HIDDEN,)
        out[p + "post_attention_layernorm.weight"] = (HIDDEN,)
        out[p + "self_attn.q_proj.weight"] = (HIDDEN, HIDDEN)
        out[p + "self_attn.k_proj.weight"] = (KV, HIDDEN)
        out[p + "self_attn.v_proj.weight"] = (KV, HIDDEN)
        out[p + "self_attn.o_proj.weight"] = (HIDDEN, HIDDEN)
        out[p + "mlp.gate_proj.weight"] = (MLP, HIDDEN)
        out[p + "mlp.up_proj.weight"] = (MLP, HIDDEN)
        out[p + "mlp.down_proj.weight"] = (HIDDEN, MLP)
    out["model.norm.weight"] = (HIDDEN,)
    out["lm_head.weight"] = (VOCAB, HIDDEN)
    return out


def _trim():
    """Give the memory freed by earlier rounds back to the system (glibc's
    ``malloc_trim``), so that each ``assign`` contender fills memory that
    nothing has touched: otherwise one of them may get pages an earlier
    round freed and touched, and the other fresh ones, and the ratio
    measures the allocator's reuse, not the loads."""
    import ctypes
    import gc
    gc.collect()
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):   # not glibc: nothing to trim
        pass


def _busy(folder, stop):
    """A neighbour: spin a core and rewrite a file of its own until ``stop``."""
    block = os.urandom(1 << 20)
    path = os.path.join(folder, "busy-%d" % os.getpid())
    while not stop.is_set():
        with open(path, "wb") as f:
            for _ in range(64):
                f.write(block)
                sum(range(20000))
        os.remove(path)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mb", type=int, default=400)
    ap.add_argument("--repeat", type=int, default=11)
    ap.add_argument("--busy", type=int, default=0, help="other jobs running meanwhile")
    ap.add_argument("--only", default="", help="comma-separated ops: save,assign,load_model")
    args = ap.parse_args(argv)
    try:
        import torch
        import safetensors.torch as st
    except ImportError as e:
        print("big_model: %s: nothing to measure" % e)
        return 0
    import kiln.torch as kt

    sh = shapes(args.mb)
    g = torch.Generator().manual_seed(0)
    sd = {k: torch.empty(s, dtype=torch.bfloat16).uniform_(-1, 1, generator=g)
          for k, s in sh.items()}
    total = sum(v.numel() * 2 for v in sd.values())
    only = set(args.only.split(",")) if args.only else None
    folder = tempfile.mkdtemp(prefix="kiln-big-")
    kp, sp = os.path.join(folder, "m.kiln"), os.path.join(folder, "m.safetensors")
    stop = multiprocessing.Event()
    jobs = [multiprocessing.Process(target=_busy, args=(folder, stop), daemon=True)
            for _ in range(args.busy)]
    print("LLaMA-like bf16: %d tensors, %.0f MB, kiln %s, torch %s, %d other jobs running"
          % (len(sd), total / 1e6, kiln.IMPLEMENTATION, torch.__version__, args.busy))
    try:
        kt.save_file(sd, kp)
        st.save_file(sd, sp)
        for j in jobs:
            j.start()

        def st_save():
            st.save_file(sd, sp)
            fd = os.open(sp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

        model = module_for(torch, sh)
        model.load_state_dict(sd)

        def meta():
            _trim()
            return module_for(torch, sh, device="meta")

        def untouched():
            return meta().to_empty(device="cpu")

        rows = [
            ("save", "safetensors save_file + fsync", st_save),
            ("save", "kiln.torch.save_file", lambda: kt.save_file(sd, kp)),
            ("assign", "load_model (untouched memory)",
             (untouched, lambda m: kt.load_model(m, kp))),
            ("assign", "load_model (meta, assign=True)",
             (meta, lambda m: kt.load_model(m, kp, assign=True))),
            ("load_model", "safetensors.torch.load_model", lambda: st.load_model(model, sp)),
            ("load_model", "kiln.torch.load_model", lambda: kt.load_model(model, kp)),
        ]
        if only is not None:
            rows = [r for r in rows if r[0] in only]
        base = {"save": "safetensors save_file + fsync", "assign": "load_model (untouched memory)",
                "load_model": "safetensors.torch.load_model"}
        timed = _table(rows, args.repeat, total, base)
        _verdicts(timed, {"save": 1.0, "assign": 1.1, "load_model": 1.0}, base,
                  {"save": "kiln.torch.save_file", "assign": "load_model (meta, assign=True)",
                   "load_model": "kiln.torch.load_model"})
    finally:
        stop.set()
        for j in jobs:
            j.join(10)
            if j.is_alive():
                j.kill()
                j.join()
        shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
