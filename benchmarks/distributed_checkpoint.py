"""kiln as torch.distributed.checkpoint's storage against torch's own (issue 59 item 6).

    python -m benchmarks.distributed_checkpoint [--mb 1024] [--ranks 4] [--repeat 1]

A LLaMA-like bf16 state dict of about ``--mb`` MB (embeddings, per layer
q/k/v/o, gate/up/down and two norms, a final norm and an output head), each
tensor a DTensor sharded ``Shard(0)`` over a CPU mesh of ``--ranks`` gloo
ranks (FSDP2's layout), the ranks forked from this process on loopback.
For each storage layer (``kiln``: ``kiln.torch.distributed.KilnStorageWriter``
/ ``KilnStorageReader`` with their defaults; ``kiln-crc``: the writer with
``checksum=True``, the CRC-32s checked by the loads; ``fs``: torch's ``FileSystemWriter``/``Reader``;
``hf``: torch's ``HuggingFaceStorageWriter(save_distributed=True)`` /
``HuggingFaceStorageReader``) it times, between barriers, on a warm page
cache, the median of ``--repeat`` rounds:

* ``save``: ``dcp.save`` by every rank into a fresh folder;
* ``load4``: ``dcp.load`` into every rank, the same layout;
* ``load2``: ``dcp.load`` into 2 of the ranks (their own group and mesh);
* ``consolidate``: the sharded checkpoint made one ordinary set by one
  process: ``kiln.torch.distributed.consolidate`` (4 threads) against
  ``consolidate_safetensors_files`` (4 threads; ``fs`` has none);
* ``disk``: the bytes in the checkpoint folder over the payload.

Prints one table; ``--json`` writes the numbers too.
"""

import argparse
import datetime
import json
import multiprocessing
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings


def _shapes(mb):
    """(name, shape) of a LLaMA-like model of about ``mb`` MB in bf16."""
    h = 1024
    while True:   # h a multiple of 256, vocab 8h, 2.75h intermediate, layers to fit
        inter, vocab = h * 11 // 4, h * 8
        per_layer = 4 * h * h + 3 * h * inter + 2 * h
        layers = max(1, (mb * 10**6 // 2 - 2 * vocab * h) // per_layer)
        if layers <= 32 or h >= 8192:
            break
        h += 256
    out = [("model.embed_tokens.weight", (vocab, h))]
    for i in range(layers):
        p = "model.layers.%d." % i
        out += [(p + "self_attn.%s_proj.weight" % x, (h, h)) for x in "qkvo"]
        out += [(p + "mlp.gate_proj.weight", (inter, h)), (p + "mlp.up_proj.weight", (inter, h)),
                (p + "mlp.down_proj.weight", (h, inter)),
                (p + "input_layernorm.weight", (h,)), (p + "post_attention_layernorm.weight", (h,))]
    out += [("model.norm.weight", (h,)), ("lm_head.weight", (vocab, h))]
    return out


def _local(torch, shape, rank, world, fill):
    rows = -(-shape[0] // world)
    lo, hi = min(rank * rows, shape[0]), min((rank + 1) * rows, shape[0])
    t = torch.empty((hi - lo,) + tuple(shape[1:]), dtype=torch.bfloat16)
    t.view(torch.int16).fill_(fill)   # any bits: storage layers copy bytes
    return t


def _state(torch, mesh, shapes, zero=False):
    from torch.distributed.tensor import DTensor, Shard
    rank, world = mesh.get_local_rank(), mesh.size()
    return {name: DTensor.from_local(_local(torch, shape, rank, world,
                                            0 if zero else 0x3f80 + i % 7),
                                     mesh, [Shard(0)], shape=torch.Size(shape),
                                     stride=torch.empty(shape, device="meta").stride(),
                                     run_check=False)
            for i, (name, shape) in enumerate(shapes)}


def _layers(dcp):
    import kiln.torch.distributed as kd
    from torch.distributed.checkpoint import (FileSystemReader, FileSystemWriter,
                                              HuggingFaceStorageReader, HuggingFaceStorageWriter)
    return {
        "kiln": (lambda p: kd.KilnStorageWriter(p), kd.KilnStorageReader),   # the defaults
        "kiln-crc": (lambda p: kd.KilnStorageWriter(p, checksum=True), kd.KilnStorageReader),
        "fs": (lambda p: FileSystemWriter(p), FileSystemReader),
        "hf": (lambda p: HuggingFaceStorageWriter(p, save_distributed=True),
               HuggingFaceStorageReader),
    }


def _rank(rank, world, store, root, mb, repeat, out):
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=600))
    shapes = _shapes(mb)
    mesh = init_device_mesh("cpu", (world,))
    sub = DeviceMesh("cpu", [0, 1])
    sd = _state(torch, mesh, shapes)
    times = {}

    def timed(key, fn, group=None):
        dist.barrier()
        t = time.perf_counter()
        fn()
        dist.barrier()
        times.setdefault(key, []).append(time.perf_counter() - t)

    for r in range(repeat):
        for name, (writer, reader) in _layers(dcp).items():
            path = os.path.join(root, "%s-%d" % (name, r))
            timed(name + ":save", lambda: dcp.save(sd, storage_writer=writer(path)))
            back = [_state(torch, mesh, shapes, zero=True)]
            timed(name + ":load4", lambda: dcp.load(back[0], storage_reader=reader(path)))
            if rank == 0:
                a, b = sd[shapes[1][0]].to_local(), back[0][shapes[1][0]].to_local()
                assert torch.equal(a.view(torch.int16), b.view(torch.int16)), name
            back.clear()

            def load2():
                if rank < 2:
                    back2 = _state(torch, sub, shapes, zero=True)
                    dcp.load(back2, storage_reader=reader(path), process_group=sub.get_group())
            timed(name + ":load2", load2)
    if rank == 0:
        with open(out, "w") as f:
            json.dump(times, f)
    dist.destroy_process_group()


def _consolidate(root, repeat, mb):
    import kiln.torch.distributed as kd
    from torch.distributed.checkpoint._consolidate_hf_safetensors import \
        consolidate_safetensors_files
    shapes = _shapes(mb)
    mapping = {}
    size, shard = 0, 1
    for name, shape in shapes:   # 5 GB shards, as the kiln set's default
        n = 2
        for d in shape:
            n *= d
        if size and size + n > 5 * 10**9:
            shard, size = shard + 1, 0
        mapping[name] = shard
        size += n
    times = {}
    for r in range(repeat):
        out = os.path.join(root, "kiln-set-%d" % r)
        t = time.perf_counter()
        kd.consolidate(os.path.join(root, "kiln-%d" % r), out, thread_count=4)
        times.setdefault("kiln:consolidate", []).append(time.perf_counter() - t)
        out = os.path.join(root, "hf-set-%d" % r)
        os.makedirs(out)
        t = time.perf_counter()
        consolidate_safetensors_files(os.path.join(root, "hf-%d" % r), out, mapping, 4)
        times.setdefault("hf:consolidate", []).append(time.perf_counter() - t)
    return times


def _disk(folder):
    total = 0
    for dirpath, _, files in os.walk(folder):
        total += sum(os.path.getsize(os.path.join(dirpath, f)) for f in files)
    return total


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mb", type=int, default=1024)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    import torch   # imported once, before the ranks fork
    import kiln.torch.distributed as kd
    assert kd.KilnStorageWriter   # (imported before the fork too)
    shapes = _shapes(args.mb)
    payload = sum(2 * int(__import__("math").prod(s)) for _, s in shapes)
    root = tempfile.mkdtemp(prefix="kiln-dcp-bench-")
    try:
        out = os.path.join(root, "times.json")
        ctx = multiprocessing.get_context("fork")
        procs = [ctx.Process(target=_rank, args=(r, args.ranks, os.path.join(root, "store"), root,
                                                 args.mb, args.repeat, out))
                 for r in range(args.ranks)]
        try:
            for p in procs:
                p.start()
            for p in procs:
                p.join()
        finally:
            for p in procs:
                if p.exitcode is None:
                    p.kill()
                    p.join()
        if any(p.exitcode for p in procs):
            print("a rank failed: exit codes %s" % [p.exitcode for p in procs])
            return 1
        with open(out) as f:
            times = json.load(f)
        warnings.simplefilter("ignore")
        times.update(_consolidate(root, args.repeat, args.mb))
        disk = {name: _disk(os.path.join(root, "%s-0" % name))
                for name in ("kiln", "kiln-crc", "fs", "hf")}
        med = {k: statistics.median(v) for k, v in times.items()}
        print("payload %.0f MB in %d tensors, bf16, %d ranks, median of %d, torch %s"
              % (payload / 1e6, len(shapes), args.ranks, args.repeat, torch.__version__))
        print("%-12s %9s %9s %9s %9s %11s %11s" % ("", "kiln s", "kiln-crc s", "fs s", "hf s",
                                                   "kiln/best", "crc/best"))
        for op in ("save", "load4", "load2", "consolidate"):
            row = [med.get("%s:%s" % (n, op)) for n in ("kiln", "kiln-crc", "fs", "hf")]
            best = min(x for x in row[2:] if x is not None)
            print("%-12s %9s %9s %9s %9s %10.2fx %10s" % (
                op, *("%.3f" % x if x is not None else "-" for x in row), row[0] / best,
                "-" if row[1] is None else "%.2fx" % (row[1] / best)))
        print("%-12s %9.4f %9.4f %9.4f %9.4f   (bytes on disk / payload)"
              % ("disk", *(disk[n] / payload for n in ("kiln", "kiln-crc", "fs", "hf"))))
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"payload": payload, "times": times, "disk": disk}, f, indent=1)
        return 0
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
