"""A RecordFile closed in one thread while others read it (issue 56 item 3).

Every read that races ``close()`` either returns the record it asked for or
raises the documented ``ValueError``: never another file's record (a
descriptor the system handed to a file opened meanwhile), ``EBADF``, nor a
bare ``AttributeError`` or ``TypeError``.  Real threads, real files: other
record files are opened and closed all the while, so a descriptor number
closed too early is soon given to one of them.
"""

import sys
import threading

import pytest

import kiln

T = "struct{id:i64,pad:list<u8>,}"
N = 400


def _write(path, base, kernels):
    with kiln.RecordWriter(str(path), T, kernels=kernels) as w:
        for i in range(N):
            w.write({"id": base + i, "pad": bytes(i % 7)})


def _race(a_path, b_path, kernels, rounds):
    """Run ``rounds`` closes under readers; the faults and wrong values seen."""
    bad = []
    stop = threading.Event()

    def churn():   # other files open and close all the time: descriptor numbers are reused
        while not stop.is_set():
            with kiln.RecordFile(str(b_path), T, kernels=kernels) as b:
                b[0]

    opener = threading.Thread(target=churn)
    opener.start()
    try:
        for r in range(rounds):
            rf = kiln.RecordFile(str(a_path), T, kernels=kernels)
            go = threading.Barrier(4)

            def read(k, rf=rf, go=go):
                go.wait()
                i = k
                while True:
                    i = (i * 7 + 3) % N
                    try:
                        got = rf[i]["id"] if k % 2 else rf[i:i + 2][0]["id"]
                    except ValueError:
                        return   # closed: the documented error
                    except BaseException as e:   # noqa: BLE001 - any other is the bug
                        bad.append("A[%d]: %s: %s" % (i, type(e).__name__, e))
                        return
                    if got != i:
                        bad.append("asked A[%d], got id %d" % (i, got))
                        return

            readers = [threading.Thread(target=read, args=(k,)) for k in range(3)]
            for t in readers:
                t.start()
            go.wait()
            for _ in range(r % 5):   # close after a few reads, a different moment each round
                rf[0]
            rf.close()
            for t in readers:
                t.join()
            with pytest.raises(ValueError):
                rf[1]
    finally:
        stop.set()
        opener.join()
    return bad


def test_reads_racing_close_are_right_or_valueerror(impl, tmp_path):
    a, b = tmp_path / "a.kilnr", tmp_path / "b.kilnr"
    _write(a, 0, impl.kernels)
    _write(b, 1_000_000, impl.kernels)   # the same records, other ids: a wrong file shows
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)   # threads switch often: the race's window is hit
    try:
        bad = _race(a, b, impl.kernels, 150)
    finally:
        sys.setswitchinterval(old)
    assert bad == []


def test_file_object_source_closed_is_valueerror(impl, tmp_path):
    """A file object without a descriptor (its bytes held in memory): a read
    after close is ValueError too, not AttributeError."""
    import io
    a = tmp_path / "a.kilnr"
    _write(a, 0, impl.kernels)
    rf = kiln.RecordFile(io.BytesIO(a.read_bytes()), T, kernels=impl.kernels)
    assert rf[5]["id"] == 5
    rf.close()
    with pytest.raises(ValueError):
        rf[5]
    with pytest.raises(ValueError):
        rf[2:4]
