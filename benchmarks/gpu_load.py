"""A checkpoint straight into GPU memory (issue 50): kiln's pipelined loader
against the link itself and the peers, in one run.

    python -m benchmarks.gpu_load [--gib 7.8] [--tensors 181] [--repeat 3]
                                  [--shape plain|llama|moe] [--checksum]
                                  [--device cuda] [--stand-in] [--cold]
                                  [--page-cache] [--json PATH]

A bf16 checkpoint of about ``--gib`` GiB is saved once as ``.kiln`` (by
``kiln.torch.save_file``, with recorded CRC-32s under ``--checksum``) and as
``.safetensors``, in a temporary folder.  ``--shape``: ``plain`` is
``--tensors`` equal 4096-wide projections; ``llama`` is LLaMA-7B's layer
shapes in file order (q/k/v/o, gate/up/down, two norms of 4096 elements a
layer, embeddings and head), so small payloads sit between large ones;
``moe`` is a mixture of experts (attention, a router and many small expert
projections a layer, Qwen3-MoE-like names).  Rows, each the median of
``--repeat`` loads (GB/s of payload, and the growth of this process's peak
RSS over the run so far):

* ``page cache, T threads``: T threads ``pread`` the warm file into their
  own (pinned, where CUDA is) 8 MiB buffers, T = 1, 2, 4, 8, 16: the host's
  ceiling for any loader that reads through the page cache (``--page-cache``,
  or always on a device);
* ``pinned floor``: one pinned host buffer of the whole checkpoint copied to
  the device (the link itself; nothing read from disk);
* ``kiln.torch.load_file(path, device=...)``;
* ``kiln.torch.load_model(model_on_device, path)``;
* ``safetensors.torch.load_file(path, device=...)`` and its ``load_model``;
* InstantTensor and fastsafetensors, where they are installed.

``--cold`` also times each file loader after dropping the file from the page
cache (``posix_fadvise(DONTNEED)`` on the file; ``/proc/sys/vm/drop_caches``
when writable) beside an O_DIRECT sequential read of the file (the disk's
rate), the reference of the cold target.

Targets on an H200-class host, same checkpoint: warm at least 45 GB/s for
``load_file`` and ``load_model`` into CUDA parameters, cold at least 0.9x the
O_DIRECT read, host RSS growth at most 1 GiB.  ``--device cpu`` runs the same
rows into host memory (the loader's readers and, with ``--stage``, its
staging ring with the host standing in for the device) against a plain
sequential ``pread`` of the file: what can be measured where there is no GPU.
``--stand-in`` is ``--device cpu --stage``: every row with the host standing
in for the device, kiln's rows also printing their checkpoint, ``plain`` or
``checksummed`` and ``link bytes / payload bytes`` (``load(counts=)``).  Without CUDA and without ``--device cpu`` or
``--stand-in`` it says so and exits 0.
"""

import argparse
import json
import os
import resource
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import kiln  # noqa: E402


def _state_dict(torch, n, gib, shape="plain"):
    """About ``gib`` GiB of bf16 tensors in one of three shapes (module doc)."""
    g = torch.Generator().manual_seed(0)

    def t(*dims):
        return torch.empty(*dims, dtype=torch.bfloat16).uniform_(-1, 1, generator=g)

    total = int(gib * (1 << 30)) // 2   # elements
    sd = {}
    if shape == "plain":
        per = max(1, total // n)
        width = 4096
        for i in range(n):
            sd["model.layers.%03d.weight" % i] = t(max(1, per // width), width)
        return sd
    if shape == "llama":
        # LLaMA-7B per layer: 4 x 4096^2 + 3 x 4096 x 11008 elements, 2 norms
        h, f = 4096, 11008
        per_layer = 4 * h * h + 3 * h * f
        scale = max(1e-6, min(1.0, total / (32 * per_layer)))
        hs = max(64, int(h * scale ** 0.5) // 64 * 64)
        fs = max(64, int(f * scale ** 0.5) // 64 * 64)
        layers = max(1, min(32, int(total // (4 * hs * hs + 3 * hs * fs))))
        sd["model.embed_tokens.weight"] = t(max(1, 32000 * hs // h), hs)
        for i in range(layers):
            p = "model.layers.%d." % i
            for k in ("q", "k", "v", "o"):
                sd[p + "self_attn.%s_proj.weight" % k] = t(hs, hs)
            sd[p + "mlp.gate_proj.weight"] = t(fs, hs)
            sd[p + "mlp.up_proj.weight"] = t(fs, hs)
            sd[p + "mlp.down_proj.weight"] = t(hs, fs)
            sd[p + "input_layernorm.weight"] = t(hs)
            sd[p + "post_attention_layernorm.weight"] = t(hs)
        sd["model.norm.weight"] = t(hs)
        sd["lm_head.weight"] = t(max(1, 32000 * hs // h), hs)
        return sd
    # moe: Qwen3-30B-A3B-like, 48 layers x 128 experts x 3 projections (scaled)
    layers, experts, hidden = 48, 128, 2048
    per_layer = 4 * hidden * hidden + experts * 3 * hidden * 768
    scale = max(1e-8, min(1.0, total / (layers * per_layer)))
    layers = max(1, min(layers, int(48 * scale) or 1))
    inter = max(8, int(768 * total / (layers * (experts * 3 * hidden * 768 + 4 * hidden * hidden))))
    inter = min(inter, 768)
    for i in range(layers):
        p = "model.layers.%d." % i
        for k in ("q", "k", "v", "o"):
            sd[p + "self_attn.%s_proj.weight" % k] = t(hidden // 8, hidden)
        sd[p + "input_layernorm.weight"] = t(hidden)
        sd[p + "post_attention_layernorm.weight"] = t(hidden)
        sd[p + "mlp.gate.weight"] = t(experts, hidden)
        for e in range(experts):
            q = p + "mlp.experts.%d." % e
            sd[q + "gate_proj.weight"] = t(inter, hidden)
            sd[q + "up_proj.weight"] = t(inter, hidden)
            sd[q + "down_proj.weight"] = t(hidden, inter)
    return sd


def _peak_rss():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _drop(path):
    """The file out of the page cache, as far as this process can."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("1\n")
    except OSError:
        pass


def _time(fn, repeat, sync, cold_path=None):
    times = []
    for _ in range(repeat):
        if cold_path is not None:
            _drop(cold_path)
        sync()
        t = time.perf_counter()
        out = fn()
        sync()
        times.append(time.perf_counter() - t)
        del out
    return statistics.median(times), min(times), max(times)


def _page_cache(torch, path, threads, pinned, piece=8 << 20):
    """Seconds for ``threads`` threads to ``pread`` the (warm) file, each its
    share of ``piece``-sized reads in turn, into its own buffer (pinned host
    memory when ``pinned``): the page-cache ceiling of the host."""
    size = os.path.getsize(path)
    fd = os.open(path, os.O_RDONLY)
    bufs = []
    for _ in range(threads):
        b = torch.empty(piece, dtype=torch.uint8, pin_memory=pinned)
        bufs.append(memoryview(b.numpy()))
    errors = []

    def work(k):
        try:
            mv = bufs[k]
            for at in range(k * piece, size, threads * piece):
                os.preadv(fd, [mv[:min(piece, size - at)]], at)
        except BaseException as e:   # reported below
            errors.append(e)
    try:
        ts = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
        t0 = time.perf_counter()
        for th in ts:
            th.start()
        for th in ts:
            th.join()
        dt = time.perf_counter() - t0
    finally:
        os.close(fd)
    if errors:
        raise errors[0]
    return dt


def _odirect_read(path, chunk=64 << 20):
    """Seconds to read ``path`` sequentially with O_DIRECT (buffered if refused)."""
    import mmap
    flags = os.O_RDONLY | getattr(os, "O_DIRECT", 0)
    try:
        fd = os.open(path, flags)
    except OSError:
        fd = os.open(path, os.O_RDONLY)
    buf = mmap.mmap(-1, chunk)   # page-aligned, as O_DIRECT needs
    t = time.perf_counter()
    try:
        at = 0
        while True:
            n = os.preadv(fd, [buf], at)
            if n <= 0:
                break
            at += n
    finally:
        os.close(fd)
        buf.close()
    return time.perf_counter() - t


def _staged_load_file(torch, kp):
    """``load_file(kp, device=...)``'s body with the host standing in for the
    device (on the CPU ``load_file`` hands out views of the mapping instead)."""
    import kiln.torch._load as L
    from kiln.torch import _pipeline
    with kiln.open(kp) as f, L._Files() as files:
        entries = files.entries(f)
        items = [L._item(torch, n, e, L._torch_dtype(torch, e.t, e.src.name), None)
                 for n, e in entries.items()]
        return dict(zip(entries, _pipeline.load(items, "cpu")))


def _peers(torch, device, kp, sp, sd, checksum=False, stage=False):
    """(row name, function) of each contender; the model targets made once."""
    import kiln.torch as kt
    rows = []
    total = sum(v.numel() * v.element_size() for v in sd.values())
    if device.type == "cuda":
        pinned = torch.empty(total, dtype=torch.uint8, pin_memory=True)
        dev_buf = torch.empty(total, dtype=torch.uint8, device=device)
        rows.append(("pinned floor (the link)", lambda: dev_buf.copy_(pinned, non_blocking=True),
                     False))
    if device.type == "cpu" and stage:   # what load_file(device=...) runs, staged
        rows.append(("kiln.torch.load_file", lambda: _staged_load_file(torch, kp), True))
    else:
        rows.append(("kiln.torch.load_file", lambda: kt.load_file(kp, device=str(device)),
                     True))
    model = torch.nn.ParameterDict({k.replace(".", "_"): torch.nn.Parameter(
        torch.empty_like(v, device=device)) for k, v in sd.items()})
    kp2 = kp + ".model.kiln"
    kt.save_file({k.replace(".", "_"): v for k, v in sd.items()}, kp2, checksum=checksum)
    rows.append(("kiln.torch.load_model", lambda: kt.load_model(model, kp2), True))
    try:
        import safetensors.torch as st
    except ImportError:
        st = None
    if st is not None:
        rows.append(("safetensors.torch.load_file",
                     lambda: st.load_file(sp, device=str(device)), True))
        sp2 = sp + ".model.safetensors"
        st.save_file({k.replace(".", "_"): v for k, v in sd.items()}, sp2)
        rows.append(("safetensors.torch.load_model",
                     lambda: st.load_model(model, sp2, device=str(device)), True))
    if device.type == "cuda":
        try:
            from fastsafetensors import fastsafe_open   # type: ignore
            rows.append(("fastsafetensors", lambda: _fastsafe(fastsafe_open, sp, device), True))
        except ImportError:
            pass
        try:
            import instanttensor   # type: ignore  # noqa: F401
            rows.append(("InstantTensor", lambda: _instant(sp, device), True))
        except ImportError:
            pass
    return rows, total


def _fastsafe(fastsafe_open, sp, device):
    with fastsafe_open(filenames=[sp], device=str(device)) as f:
        return {k: f.get_tensor(k).clone() for k in f.keys()}


def _instant(sp, device):
    # InstantTensor's reader yields (name, tensor) pairs from its own
    # buffers, reused as it goes: each is cloned (its README says so)
    import instanttensor   # type: ignore
    index = device.index if device.index is not None else 0
    with instanttensor.safe_open(sp, framework="pt", device=index) as f:
        return {k: t.clone() for k, t in f.tensors()}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gib", type=float, default=7.8)
    ap.add_argument("--tensors", type=int, default=181)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--cold", action="store_true")
    ap.add_argument("--stage", action="store_true",
                    help="--device cpu: read through the staging ring (the device's path)")
    ap.add_argument("--stand-in", action="store_true",
                    help="--device cpu --stage: the host standing in for the device")
    ap.add_argument("--shape", choices=("plain", "llama", "moe"), default="plain")
    ap.add_argument("--checksum", action="store_true",
                    help="save the .kiln files with recorded CRC-32s (checked as loaded)")
    ap.add_argument("--page-cache", action="store_true",
                    help="the page-cache rows (always on a device)")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("gpu_load: torch is not installed: nothing to measure")
        return 0
    if args.stand_in:
        args.device, args.stage = "cpu", True
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("gpu_load: no CUDA device here (torch %s sees none): nothing measured; "
              "--stand-in runs every row with the host standing in for the device"
              % torch.__version__)
        return 0
    folder = tempfile.mkdtemp(prefix="kiln-gpu-load-")
    try:   # the files are gigabytes: never left behind, however the run ends
        return _measure(args, torch, device, folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _measure(args, torch, device, folder):
    import kiln.torch as kt
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sd = _state_dict(torch, args.tensors, args.gib, args.shape)
    args.tensors = len(sd)
    kp, sp = os.path.join(folder, "m.kiln"), os.path.join(folder, "m.safetensors")
    kt.save_file(sd, kp, checksum=args.checksum)
    try:
        import safetensors.torch as st
        st.save_file(sd, sp)
    except ImportError:
        pass
    rows, total = _peers(torch, device, kp, sp, sd, args.checksum, args.stage)
    counts = {}   # the loader's link and payload bytes (load(counts=)), row by row
    if args.stage and device.type == "cpu":
        from kiln.torch import _pipeline
        real = _pipeline.load
        _pipeline.load = lambda items, dev, **kw: real(items, dev, stage=True, counts=counts,
                                                       **kw)
    del sd
    base_rss = _peak_rss()
    report = {"device": str(device), "bytes": total, "tensors": args.tensors, "rows": []}
    kind = "checksummed" if args.checksum else "plain"
    report.update(shape=args.shape, checksum=args.checksum, stand_in=bool(args.stage))
    print("%s checkpoint, %d tensors, %.2f GiB, %s, %s%s, torch %s, kiln %s" % (
        args.shape, args.tensors, total / (1 << 30), kind, device,
        " (host standing in for the device)" if args.stage and device.type == "cpu" else "",
        torch.__version__, kiln.IMPLEMENTATION))
    if args.page_cache or device.type == "cuda":
        pinned = device.type == "cuda"
        with open(kp, "rb") as f:   # warm the page cache
            while f.read(64 << 20):
                pass
        for threads in (1, 2, 4, 8, 16):
            dt = min(_page_cache(torch, kp, threads, pinned) for _ in range(args.repeat))
            label = "page cache, %d threads%s" % (threads, " (pinned)" if pinned else "")
            print("%-34s %10.4f %8.2f" % (label, dt, os.path.getsize(kp) / dt / 1e9))
            report["rows"].append({"row": label, "median_s": dt,
                                   "gbps": os.path.getsize(kp) / dt / 1e9})
    if device.type == "cpu":
        def plain():
            fd = os.open(kp, os.O_RDONLY)
            try:
                buf = bytearray(64 << 20)
                at = 0
                while os.preadv(fd, [buf], at) > 0:
                    at += len(buf)
            finally:
                os.close(fd)
        rows.insert(0, ("sequential pread of the file", plain, False))
    print("%-34s %10s %8s %12s" % ("row", "median s", "GB/s", "RSS growth"))
    for name, fn, is_file in rows:
        for cold in ([False, True] if args.cold and is_file else [False]):
            counts.clear()
            med, lo, hi = _time(fn, args.repeat, sync, kp if cold else None)
            growth = _peak_rss() - base_rss
            label = name + (" (cold)" if cold else "")
            ratio = (counts["link_bytes"] / counts["payload_bytes"]
                     if counts.get("payload_bytes") else None)
            print("%-34s %10.4f %8.2f %10.2f GB%s" % (
                label, med, total / med / 1e9, growth / 1e9, "" if ratio is None else
                "  %s %s, link bytes / payload bytes: %.3f" % (args.shape, kind, ratio)))
            report["rows"].append({"row": label, "median_s": med, "min_s": lo, "max_s": hi,
                                   "gbps": total / med / 1e9, "rss_growth": growth,
                                   "link_ratio": ratio})
    if args.cold:
        t = _odirect_read(kp)
        print("%-34s %10.4f %8.2f" % ("O_DIRECT sequential read (disk)", t, total / t / 1e9))
        report["odirect_gbps"] = total / t / 1e9
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
