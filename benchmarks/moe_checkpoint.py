"""A mixture-of-experts checkpoint at its real tensor count (issue 57 items 3, 4).

    python -m benchmarks.moe_checkpoint [--scale 64] [--repeat 3] [--gb 0]
                                        [--only save_file,load_file,...]

Every tensor and name of Qwen3-30B-A3B (48 layers x 128 experts x 3
projections, attention, norms, router, embeddings: 18,867 tensors, about
900 KB of names), each tensor's dimensions divided by ``--scale`` (at least
one element a dimension) so the whole fits in memory here; ``--gb 2`` picks
the scale that makes the payload about 2 GB instead.  bf16, page cache warm,
files in one temporary folder.  Each operation is timed against its
counterpart in interleaved rounds (median of ``--repeat``), and the table
prints both, their ratio and kiln's cost per tensor in microseconds:

* ``save_file``: ``kiln.torch.save_file`` against ``safetensors.torch.save_file``
  followed by an ``fsync`` of the file (kiln's save is atomic and durable);
* ``save_sharded``: ``kiln.torch.save_sharded`` (5 GB shards, its default,
  or ``--shard-mb``) against ``safetensors.torch.save_file`` of the same
  split, one file a shard, each fsynced, and the index written (what a
  sharded safetensors writer does);
* ``load_file``: ``kiln.torch.load_file`` against ``safetensors.torch.load_file``;
* ``load_model``: into a model whose parameters exist (copies), against
  ``safetensors.torch.load_model``;
* ``assign=True``: ``kiln.torch.load_model(meta_model, assign=True)``
  against ``meta_model.load_state_dict(safetensors.torch.load_file(p),
  assign=True)`` (a model made on the meta device each round, not timed);
* ``convert``: ``kiln convert`` of the sharded safetensors set into a kiln
  set against reading that set with ``safetensors.torch.load_file`` and
  writing it with ``safetensors.torch.save_file`` (the same bytes moved by
  safetensors alone).

Target (issue 57): each ratio at most 1.0.  Needs torch and safetensors.
"""

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import kiln  # noqa: E402

LAYERS, EXPERTS, HIDDEN, MOE_INTER, HEADS, KV, HEAD_DIM, VOCAB = \
    48, 128, 2048, 768, 32, 4, 128, 151936


def shapes():
    """name -> shape of every tensor of Qwen3-30B-A3B, in the Hub's names."""
    out = {"model.embed_tokens.weight": (VOCAB, HIDDEN)}
    for i in range(LAYERS):
        p = "model.layers.%d." % i
        out[p + "input_layernorm.weight"] = (HIDDEN,)
        out[p + "post_attention_layernorm.weight"] = (HIDDEN,)
        out[p + "self_attn.q_proj.weight"] = (HEADS * HEAD_DIM, HIDDEN)
        out[p + "self_attn.k_proj.weight"] = (KV * HEAD_DIM, HIDDEN)
        out[p + "self_attn.v_proj.weight"] = (KV * HEAD_DIM, HIDDEN)
        out[p + "self_attn.o_proj.weight"] = (HIDDEN, HEADS * HEAD_DIM)
        out[p + "self_attn.q_norm.weight"] = (HEAD_DIM,)
        out[p + "self_attn.k_norm.weight"] = (HEAD_DIM,)
        out[p + "mlp.gate.weight"] = (EXPERTS, HIDDEN)
        for e in range(EXPERTS):
            q = p + "mlp.experts.%d." % e
            out[q + "gate_proj.weight"] = (MOE_INTER, HIDDEN)
            out[q + "up_proj.weight"] = (MOE_INTER, HIDDEN)
            out[q + "down_proj.weight"] = (HIDDEN, MOE_INTER)
    out["model.norm.weight"] = (HIDDEN,)
    out["lm_head.weight"] = (VOCAB, HIDDEN)
    return out


def scaled(full, scale):
    return {k: tuple(max(1, d // scale) for d in s) for k, s in full.items()}


def payload(sh):
    n = 0
    for s in sh.values():
        k = 2
        for d in s:
            k *= d
        n += k
    return n


def scale_for(full, gb):
    """The smallest scale whose payload is at most ``gb`` GB."""
    scale = 1
    while payload(scaled(full, scale)) > gb * 1e9:
        scale += 1
    return scale


def state_dict(torch, sh):
    g = torch.Generator().manual_seed(0)
    return {k: torch.empty(s, dtype=torch.bfloat16).uniform_(-1, 1, generator=g)
            for k, s in sh.items()}


def module_for(torch, sh, device=None):
    """A module tree whose state dict has exactly the names of ``sh``."""
    root = torch.nn.Module()
    for name, s in sh.items():
        *path, leaf = name.split(".")
        m = root
        for part in path:
            child = m._modules.get(part)
            if child is None:
                child = torch.nn.Module()
                m.add_module(part, child)
            m = child
        m.register_parameter(leaf, torch.nn.Parameter(
            torch.empty(s, dtype=torch.bfloat16, device=device), requires_grad=False))
    return root


def _fsync(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _split(sd, limit):
    """Shards of at most ``limit`` bytes, in name order (as save_sharded cuts)."""
    shards, cur, size = [], {}, 0
    for k in sorted(sd):
        n = sd[k].numel() * sd[k].element_size()
        if cur and size + n > limit:
            shards.append(cur)
            cur, size = {}, 0
        cur[k] = sd[k]
        size += n
    if cur:
        shards.append(cur)
    return shards


def st_save_sharded(st, sd, folder, limit):
    os.makedirs(folder, exist_ok=True)
    shards = _split(sd, limit)
    weight_map = {}
    for i, part in enumerate(shards):
        name = "model-%05d-of-%05d.safetensors" % (i + 1, len(shards))
        path = os.path.join(folder, name)
        st.save_file(part, path)
        _fsync(path)
        weight_map.update({k: name for k in part})
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)


def _time(pairs, repeat, setup=None):
    """Interleaved rounds: {label: [seconds]}."""
    out = {label: [] for label, _ in pairs}
    for _ in range(repeat):
        for label, fn in pairs:
            arg = setup() if setup else None
            t = time.perf_counter()
            r = fn(arg) if setup else fn()
            out[label].append(time.perf_counter() - t)
            del r
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scale", type=int, default=64)
    ap.add_argument("--gb", type=float, default=0.0,
                    help="pick the scale for about this many GB of payload (e.g. 2)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--shard-mb", type=int, default=0,
                    help="shard size of the sharded rows (default: a quarter of the payload)")
    ap.add_argument("--only", default="",
                    help="comma-separated rows: save_file,save_sharded,load_file,"
                         "load_model,assign,convert")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    try:
        import torch
        import safetensors.torch as st
    except ImportError as e:
        print("moe_checkpoint: %s: nothing to measure" % e)
        return 0
    import kiln.torch as kt
    from kiln.cli import main as kiln_main

    full = shapes()
    scale = scale_for(full, args.gb) if args.gb else args.scale
    sh = scaled(full, scale)
    sd = state_dict(torch, sh)
    total = payload(sh)
    names = sum(len(k) for k in sh)
    only = set(args.only.split(",")) if args.only else None
    limit = (args.shard_mb << 20) if args.shard_mb else max(1, total // 4)
    folder = tempfile.mkdtemp(prefix="kiln-moe-")
    kp, sp = os.path.join(folder, "m.kiln"), os.path.join(folder, "m.safetensors")
    report = {"tensors": len(sh), "name_bytes": names, "payload": total, "scale": scale,
              "kiln": kiln.IMPLEMENTATION, "torch": torch.__version__, "rows": []}
    print("Qwen3-30B-A3B-shaped: %d tensors, %d bytes of names, scale 1/%d, %.1f MB of "
          "payload, kiln %s, torch %s" % (len(sh), names, scale, total / 1e6,
                                          kiln.IMPLEMENTATION, torch.__version__))
    print("%-14s %12s %12s %7s %14s" % ("op", "kiln s", "peer s", "ratio", "kiln us/tensor"))

    def row(op, timed, mine, peer):
        k, p = statistics.median(timed[mine]), statistics.median(timed[peer])
        print("%-14s %12.4f %12.4f %7.2f %14.1f" % (op, k, p, k / p, k / len(sh) * 1e6))
        report["rows"].append({"op": op, "kiln_s": k, "peer_s": p, "ratio": k / p,
                               "kiln_us_per_tensor": k / len(sh) * 1e6,
                               "kiln_all": timed[mine], "peer_all": timed[peer]})

    def want(op):
        return only is None or op in only

    try:
        kt.save_file(sd, kp)
        st.save_file(sd, sp)
        if want("save_file"):
            def st_save():
                st.save_file(sd, sp)
                _fsync(sp)
            row("save_file", _time([("k", lambda: kt.save_file(sd, kp)), ("s", st_save)],
                                   args.repeat), "k", "s")
        ks, ss = os.path.join(folder, "kset"), os.path.join(folder, "sset")
        if want("save_sharded") or want("convert"):
            kt.save_sharded(sd, ks, max_shard_size=limit)
            st_save_sharded(st, sd, ss, limit)
        if want("save_sharded"):
            row("save_sharded", _time(
                [("k", lambda: kt.save_sharded(sd, ks, max_shard_size=limit)),
                 ("s", lambda: st_save_sharded(st, sd, ss, limit))], args.repeat), "k", "s")
        if want("load_file"):
            row("load_file", _time([("k", lambda: kt.load_file(kp)),
                                    ("s", lambda: st.load_file(sp))], args.repeat), "k", "s")
        if want("load_model"):
            model = module_for(torch, sh)
            row("load_model", _time([("k", lambda: kt.load_model(model, kp)),
                                     ("s", lambda: st.load_model(model, sp))],
                                    args.repeat), "k", "s")
            del model
        if want("assign"):
            def meta():
                return module_for(torch, sh, device="meta")
            row("assign=True", _time(
                [("k", lambda m: kt.load_model(m, kp, assign=True)),
                 ("s", lambda m: m.load_state_dict(st.load_file(sp), assign=True))],
                args.repeat, setup=meta), "k", "s")
        if want("convert"):
            kout = os.path.join(folder, "kconv")
            sout = os.path.join(folder, "sconv")
            src = os.path.join(ss, "model.safetensors.index.json")

            def kconv():
                shutil.rmtree(kout, ignore_errors=True)
                assert kiln_main(["convert", src, os.path.join(kout, "model.kiln.index.json")]) == 0

            def sconv():
                shutil.rmtree(sout, ignore_errors=True)
                os.makedirs(sout)
                for name in sorted(set(os.listdir(ss)) - {"model.safetensors.index.json"}):
                    path = os.path.join(sout, name)
                    st.save_file(st.load_file(os.path.join(ss, name)), path)
                    _fsync(path)
            row("convert", _time([("k", kconv), ("s", sconv)], args.repeat), "k", "s")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
