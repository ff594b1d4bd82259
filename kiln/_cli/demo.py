"""``kiln demo``: a small model-like record saved, opened, checked and timed."""

import os
from typing import Any

from .common import Fail, row, table_text
from .._wire import PACKED


def sample() -> Any:
    """A small model-like record: an id, a text, and tensors of several dtypes,
    including a 4-bit block-quantized weight linked to its scale tensor."""
    import numpy as np
    import kiln
    rng = np.random.default_rng(7)
    w = rng.standard_normal((64, 128)).astype(np.float32)
    groups = 32
    scale = (np.abs(w).reshape(64, -1, groups).max(axis=2) / 7).astype(np.float32)
    q = np.clip(np.round(w / np.repeat(scale, groups, axis=1)), -8, 7).astype(np.int8)
    tensors = [
        kiln.Tensor.from_numpy(w, name="dense.f32"),
        kiln.Tensor.from_numpy(w.astype(np.float16), name="dense.f16"),
        kiln.Tensor.from_numpy(rng.integers(-128, 127, 256).astype(np.int8), name="ids.i8"),
        kiln.Tensor(kiln.pack_nibbles(q), dtype="i4", shape=q.shape, name="dense.q4",
                    quant_scheme=1, quant_axis=1, group_size=groups, scale_index="dense.q4.scale"),
        kiln.Tensor.from_numpy(scale, name="dense.q4.scale"),
    ]
    try:
        import ml_dtypes
        tensors.insert(2, kiln.Tensor.from_numpy(w.astype(ml_dtypes.bfloat16),
                                                 name="dense.bf16"))
    except ImportError:
        tensors.insert(2, kiln.Tensor(w.astype(np.float32).view(np.uint32).__rshift__(16)
                                      .astype(np.uint16).tobytes(), dtype="bf16",
                                      shape=w.shape, name="dense.bf16"))
    return {"id": 42, "text": "a small model-like sample", "weights": tensors}


SAMPLE_TYPE = "struct{id:i64,text:str,weights:tensors,}"


def _best(fn: Any, n: int = 5) -> float:
    import time
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def cmd_demo(args: Any) -> int:
    import shutil
    import tempfile
    import kiln
    value = sample()
    if args.out:
        path = args.out
    else:   # a folder of its own, kept, so the file named below is there to look at
        path = os.path.join(tempfile.mkdtemp(prefix="kiln-demo-"), "sample.kiln")
    try:
        kiln.save(path, value, SAMPLE_TYPE)
    except (OSError, ValueError) as e:
        if not args.out:
            shutil.rmtree(os.path.dirname(path), ignore_errors=True)
        raise Fail("cannot write %s: %s" % (path, getattr(e, "strerror", None) or e))
    print("saved %s (%d bytes) as %s" % (path, os.path.getsize(path), SAMPLE_TYPE))
    print("(kept: open it with kiln inspect %s; delete it when done)" % path)
    back = kiln.load(path, SAMPLE_TYPE)
    d = back["weights"]
    print("opened zero-copy: id %d, text %r, %d tensors viewing the file's mapping"
          % (back["id"], back["text"], len(d)))
    print(table_text([row(k, t) for k, t in d.items()]))
    same = back["id"] == value["id"] and back["text"] == value["text"] and \
        all(bytes(a.data) == bytes(b.data) and a.shape == b.shape and a.dtype == b.dtype
            for a, b in zip(d.values(), value["weights"]))
    print("round trip bit for bit: %s" % ("ok" if same else "MISMATCH"))
    del d, back
    _demo_timings(value)
    return 0 if same else 1


def _demo_timings(value: Any) -> None:
    """Like with like: kiln and pickle both turn the whole record (id, text and
    every tensor) into bytes and back; safetensors holds tensors only."""
    import pickle
    import kiln
    try:
        import ml_dtypes  # noqa: F401
        raw = False
    except ImportError:   # bf16 as its bits: numpy() refuses it without ml_dtypes
        raw = True
    # (4-bit tensors as their packed bytes, what kiln holds: numpy() unpacks a copy)
    arrays = {t.name: t.bits() if (raw and t.dtype == "bf16") or t.code in PACKED
              else t.numpy() for t in value["weights"]}
    record = {"id": value["id"], "text": value["text"], "weights": arrays}
    buf = kiln.encode(value, SAMPLE_TYPE, frame=True)
    blob = pickle.dumps(record, protocol=5)
    rows = [("kiln encode (record)", _best(lambda: kiln.encode(value, SAMPLE_TYPE, frame=True))),
            ("kiln decode (views)", _best(lambda: kiln.decode(buf, SAMPLE_TYPE, frame=True))),
            ("pickle dumps (record)", _best(lambda: pickle.dumps(record, protocol=5))),
            ("pickle loads (copies)", _best(lambda: pickle.loads(blob)))]
    try:
        import safetensors.numpy as stnp
        plain = {k: v for k, v in arrays.items() if v.dtype.kind in "fiub"
                 and k != "dense.bf16" and k != "dense.q4"}
        st = stnp.save(plain)
        rows += [("safetensors save (%d of %d tensors)" % (len(plain), len(arrays)),
                  _best(lambda: stnp.save(plain))),
                 ("safetensors load", _best(lambda: stnp.load(st)))]
    except ImportError:
        pass
    print("timings (best of 5, %s kernels):" % kiln.IMPLEMENTATION)
    for label, secs in rows:
        print("  %-34s %9.1f us" % (label, secs * 1e6))
