"""The thread stress cases of tests/test_thread_stress.py, each run in a child
process (a crash must not take the test run down): ``python _stress_child.py
CASE ROUNDS``.  Prints ``ok CASE`` and exits 0 when every round held; any
wrong result raises (exit 1); a crash is a signal.

The kernels are the ones ``KILN_PUREPYTHON`` picks; on a free-threaded
CPython the threads run without the GIL (tools/freethreaded-check.sh)."""

import gc
import os
import sys
import tempfile
import threading

import numpy as np

import kiln

THREADS = 8


def run_threads(target, n=THREADS):
    """Start ``n`` threads on ``target(k)`` at once; re-raise the first error."""
    errors = []
    start = threading.Barrier(n)

    def body(k):
        try:
            start.wait()
            target(k)
        except BaseException as e:  # noqa: BLE001 - re-raised in the main thread
            errors.append(e)

    ts = [threading.Thread(target=body, args=(k,)) for k in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if errors:
        raise errors[0]


def saves(folder, rounds):
    """8 threads saving to one path: no temporary name collides, the last writer wins."""
    p = os.path.join(folder, "s.kiln")
    arrays = [np.full(256, k, np.int32) for k in range(THREADS)]
    for _ in range(rounds):
        run_threads(lambda k: [kiln.save_tensors(p, {"w": arrays[k]}) for _ in range(10)])
        last = kiln.load_tensors(p)["w"].numpy()
        assert any(np.array_equal(last, a) for a in arrays)
        assert not [n for n in os.listdir(folder) if n.endswith(".kiln-tmp")]


def writer(folder, rounds):
    """One TensorWriter shared by 8 threads: each writes its own tensors (and
    its rows of a shared one); the file holds every payload where it belongs."""
    p = os.path.join(folder, "w.kiln")
    want = {"t%d" % k: np.arange(k * 1000, k * 1000 + 999 + k, dtype=np.int32)
            for k in range(THREADS)}
    rows = np.arange(THREADS * 16 * 3, dtype=np.float64).reshape(THREADS * 16, 3)
    for _ in range(rounds):
        w = kiln.TensorWriter(p, metadata={"round": 1})
        for name, a in want.items():
            w.add(name, "i32", a.shape)
        w.add("rows", "f64", rows.shape)
        w.add("once", "u8", (4,))
        twice = []

        def work(k):
            w.write("t%d" % k, want["t%d" % k])
            for j in range(k * 16, k * 16 + 16, 4):
                w.write_rows("rows", j, rows[j:j + 4])
            try:
                w.write("once", np.full(4, k, np.uint8))
            except ValueError as e:
                twice.append(str(e))

        run_threads(work)
        w.close()
        assert len(twice) == THREADS - 1, twice
        d = kiln.load_tensors(p)
        for name, a in want.items():
            assert np.array_equal(d[name].numpy(), a), name
        assert np.array_equal(d["rows"].numpy(), rows)
        assert len(set(d["once"].numpy().tolist())) == 1
        del d
        gc.collect()


def close_under_readers(folder, rounds):
    """Threads reading a tensor while another closes the file: arrays handed
    out stay valid, reads after the close raise ValueError, nothing crashes.
    Every other round the file records checksums, so a read first decodes the
    metadata and sums the payload with pread on the descriptor the close
    closes (once no read holds it: never EBADF, never another file's bytes)."""
    for k in range(rounds):
        _close_under_readers(folder, 1, checksum=bool(k % 2))


def _close_under_readers(folder, rounds, checksum):
    p = os.path.join(folder, "c.kiln")
    a = np.arange(1 << 14, dtype=np.float32)
    kiln.save_tensors(p, {"a": a, "b": np.ones(8, np.int8)}, metadata={"m": 1},
                      checksum=checksum)
    total = float(a.sum())
    for _ in range(rounds):
        f = kiln.open(p)
        kept = []

        def work(k):
            if k == 0:
                f.close()
                return
            for _ in range(200):
                try:
                    x = f["a"].numpy()
                except ValueError as e:
                    assert "closed" in str(e), e
                    break
                kept.append(x)
                assert float(x.sum()) == total

        run_threads(work)
        for x in kept[-50:]:
            assert float(x.sum()) == total   # still mapped after the close
        del kept
        gc.collect()


def shared_directory(folder, rounds):
    """8 threads calling to_dict(), values() and .numpy() on one directory decoded
    from a bytearray: no export is lost (the bytearray stays locked while any
    array lives, and is free once none does)."""
    arrays = {"x%d" % k: np.arange(64 * k, 64 * k + 64, dtype=np.float32) for k in range(16)}
    for _ in range(rounds):
        buf = bytearray(kiln.encode_tensors(arrays))
        d = kiln.decode_tensors(buf)
        kept = []

        def work(k):
            for _ in range(50):
                out = d.to_dict()
                kept.append(out["x%d" % (k % 16)])
                kept.append(d["x3"].numpy())
                kept.append(np.asarray(d.values()[k].data))
                assert float(out["x5"][1]) == 321.0

        run_threads(work)
        del d
        gc.collect()
        try:
            buf.append(0)
        except BufferError:
            pass
        else:
            raise AssertionError("the bytearray was resized while arrays of it live")
        assert all(x.nbytes == 256 for x in kept)
        del kept
        gc.collect()
        buf.append(0)   # every export is gone


CASES = {f.__name__: f for f in (saves, writer, close_under_readers, shared_directory)}


def main():
    case, rounds = sys.argv[1], int(sys.argv[2])
    with tempfile.TemporaryDirectory() as folder:
        CASES[case](folder, rounds)
    print("ok", case, kiln.IMPLEMENTATION)


if __name__ == "__main__":
    main()
