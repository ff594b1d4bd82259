"""A checkpoint straight into GPU memory (issue 50): kiln's pipelined loader
against the link itself and the peers, in one run.

    python -m benchmarks.gpu_load [--gib 7.8] [--tensors 181] [--repeat 3]
                                  [--device cuda] [--cold] [--json PATH]

A bf16 checkpoint of ``--tensors`` tensors (LLaMA-7B-like layers, ``--gib``
GiB in all) is saved once as ``.kiln`` (by ``kiln.torch.save_file``) and as
``.safetensors``, in a temporary folder.  Rows, each the median of
``--repeat`` loads (GB/s of payload, and the growth of this process's peak
RSS over the run so far):

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
Without CUDA and without ``--device cpu`` it says so and exits 0.
"""

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import kiln  # noqa: E402


def _state_dict(torch, n, gib):
    """``n`` bf16 tensors of about ``gib`` GiB: 4096-wide projections, LLaMA-like."""
    total = int(gib * (1 << 30)) // 2
    per = max(1, total // n)
    width = 4096
    sd = {}
    g = torch.Generator().manual_seed(0)
    for i in range(n):
        rows = max(1, per // width)
        sd["model.layers.%03d.weight" % i] = \
            torch.empty(rows, width, dtype=torch.bfloat16).uniform_(-1, 1, generator=g)
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


def _peers(torch, device, kp, sp, sd):
    """(row name, function) of each contender; the model targets made once."""
    import kiln.torch as kt
    rows = []
    total = sum(v.numel() * v.element_size() for v in sd.values())
    if device.type == "cuda":
        pinned = torch.empty(total, dtype=torch.uint8, pin_memory=True)
        dev_buf = torch.empty(total, dtype=torch.uint8, device=device)
        rows.append(("pinned floor (the link)", lambda: dev_buf.copy_(pinned, non_blocking=True),
                     False))
    rows.append(("kiln.torch.load_file", lambda: kt.load_file(kp, device=str(device)), True))
    model = torch.nn.ParameterDict({k.replace(".", "_"): torch.nn.Parameter(
        torch.empty_like(v, device=device)) for k, v in sd.items()})
    kp2 = kp + ".model.kiln"
    kt.save_file({k.replace(".", "_"): v for k, v in sd.items()}, kp2)
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
    import instanttensor   # type: ignore
    with instanttensor.safe_open(sp, framework="pt", device=str(device)) as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gib", type=float, default=7.8)
    ap.add_argument("--tensors", type=int, default=181)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--cold", action="store_true")
    ap.add_argument("--stage", action="store_true",
                    help="--device cpu: read through the staging ring (the device's path)")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("gpu_load: torch is not installed: nothing to measure")
        return 0
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("gpu_load: no CUDA device here (torch %s sees none): nothing measured; "
              "--device cpu measures the readers into host memory" % torch.__version__)
        return 0
    import kiln.torch as kt
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    folder = tempfile.mkdtemp(prefix="kiln-gpu-load-")
    sd = _state_dict(torch, args.tensors, args.gib)
    kp, sp = os.path.join(folder, "m.kiln"), os.path.join(folder, "m.safetensors")
    kt.save_file(sd, kp)
    try:
        import safetensors.torch as st
        st.save_file(sd, sp)
    except ImportError:
        pass
    rows, total = _peers(torch, device, kp, sp, sd)
    if args.stage and device.type == "cpu":
        from kiln.torch import _pipeline
        real = _pipeline.load
        _pipeline.load = lambda items, dev, **kw: real(items, dev, stage=True, **kw)
    del sd
    base_rss = _peak_rss()
    report = {"device": str(device), "bytes": total, "tensors": args.tensors, "rows": []}
    print("%d tensors, %.2f GiB, %s, torch %s, kiln %s" % (
        args.tensors, total / (1 << 30), device, torch.__version__, kiln.IMPLEMENTATION))
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
            med, lo, hi = _time(fn, args.repeat, sync, kp if cold else None)
            growth = _peak_rss() - base_rss
            label = name + (" (cold)" if cold else "")
            print("%-34s %10.4f %8.2f %10.2f GB" % (label, med, total / med / 1e9, growth / 1e9))
            report["rows"].append({"row": label, "median_s": med, "min_s": lo, "max_s": hi,
                                   "gbps": total / med / 1e9, "rss_growth": growth})
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
