"""Record writers that never change the bytes a reader holds (issue 51, items
1 and 6): a RecordWriter on an existing path writes a new file and puts it in
place (at close by default), so records read from that path, in this process
or another, stay readable while it is rewritten; and write_many runs the
caller's iterator with no lock held.

Each case that could kill its process (SIGBUS on a truncated mapping) runs in
a child, so a crash fails the test instead of ending the run.  Oracles: the
values written, hand-written."""

import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import kiln

T = "struct{id:i64,x:tensors,}"
PY = os.path.dirname(os.path.dirname(os.path.abspath(kiln.__file__)))


def _child(code, *args, timeout=120):
    env = dict(os.environ, PYTHONPATH=PY)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)] + [str(a) for a in args],
                          capture_output=True, text=True, timeout=timeout, env=env)


_FILTER_IN_PLACE = """
    import sys, numpy as np, kiln
    path, impl = sys.argv[1], sys.argv[2]
    T = "struct{id:i64,x:tensors,}"
    kernels = None
    if impl == "python":
        import kiln._kernels_py as kernels
    with kiln.RecordWriter(path, T, kernels=kernels) as w:
        for i in range(200):
            w.write({"id": i, "x": {"w": np.full(4096, i, np.float32)}})
    rf = kiln.RecordFile(path, T, kernels=kernels)
    kept = [r for r in rf if r["id"] % 3 == 0]       # zero-copy views of the file
    with kiln.RecordWriter(path, T, kernels=kernels) as w:
        for r in kept:                                # read while the path is rewritten
            w.write({"id": r["id"], "x": {"w": r["x"]["w"].numpy() * 2}})
    total = sum(float(r["x"]["w"].numpy()[0]) for r in kept)   # the old views, still whole
    back = [(r["id"], float(r["x"]["w"].numpy()[-1])) for r in kiln.RecordFile(path, T)]
    print(len(kept), total, back[:3], len(back))
"""


def test_records_read_from_a_path_are_written_back_to_it(impl, tmp_path):
    r = _child(_FILTER_IN_PLACE, tmp_path / "r.kilnr", impl.name)
    assert r.returncode == 0, (r.returncode, r.stderr)   # -7 is SIGBUS
    ids = list(range(0, 200, 3))
    assert r.stdout.split()[:2] == [str(len(ids)), repr(float(sum(ids)))]
    assert "[(0, 0.0), (3, 6.0), (6, 12.0)] %d" % len(ids) in r.stdout
    assert kiln.records.unfinished(tmp_path / "r.kilnr") == []


_READER = """
    import sys, time, kiln
    path = sys.argv[1]
    rf = kiln.RecordFile(path, "struct{id:i64,x:tensors,}")
    print("open", flush=True)
    n = 0
    while True:                       # the old file's records, again and again
        for i, r in enumerate(rf):
            assert r["id"] == i and float(r["x"]["w"].numpy().sum()) == 16.0 * i, (i, r)
        n += 1
        if n % 20 == 0:
            print("ok", n, flush=True)
"""


def test_a_reader_in_another_process_keeps_its_file_while_the_path_is_rewritten(tmp_path):
    p = tmp_path / "r.kilnr"
    with kiln.RecordWriter(p, T) as w:
        for i in range(300):
            w.write({"id": i, "x": {"w": np.full(16, i, np.float32)}})
    env = dict(os.environ, PYTHONPATH=PY)
    reader = subprocess.Popen([sys.executable, "-u", "-c", textwrap.dedent(_READER), str(p)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert reader.stdout.readline().strip() == "open"
        for round_ in range(3):   # rewrite the path three times, smaller each time
            with kiln.RecordWriter(p, T) as w:
                for i in range(10 * (3 - round_)):
                    w.write({"id": i, "x": {"w": np.zeros(1, np.float32)}})
                    w.flush()
            assert len(kiln.RecordFile(p, T)) == 10 * (3 - round_)
        line = reader.stdout.readline()   # it read the whole old file 20 times since
        assert line.startswith("ok"), line
        assert reader.poll() is None, reader.stderr.read()   # alive: no SIGBUS
    finally:
        reader.kill()
        reader.wait()


def test_replace_open_shows_the_records_at_once_in_a_new_file(impl, tmp_path):
    p = tmp_path / "log.kilnr"
    with kiln.RecordWriter(p, "str", kernels=impl.kernels) as w:
        w.write("old")
    old_inode = os.stat(p).st_ino
    held = kiln.RecordFile(p, "str", kernels=impl.kernels)
    w = kiln.RecordWriter(p, "str", kernels=impl.kernels, replace="open")
    assert os.stat(p).st_ino != old_inode   # a new file took the name at once
    w.write("a")
    w.flush()
    with kiln.RecordFile(p, "str", recover=True, kernels=impl.kernels) as rf:
        assert list(rf) == ["a"]
    w.close()
    assert list(held) == ["old"] and list(kiln.RecordFile(p, "str")) == ["a"]
    with pytest.raises(ValueError, match="replace"):
        kiln.RecordWriter(p, "str", replace="later")


def test_a_writer_keeps_the_mode_of_the_file_it_replaces(tmp_path):
    p = tmp_path / "m.kilnr"
    with kiln.RecordWriter(p, "str") as w:
        w.write("x")
    os.chmod(p, 0o640)
    with kiln.RecordWriter(p, "str") as w:
        w.write("y")
    assert os.stat(p).st_mode & 0o777 == 0o640


def test_write_many_runs_the_callers_iterator_without_the_lock(impl, tmp_path):
    w = kiln.RecordWriter(tmp_path / "d.kilnr", "i64", kernels=impl.kernels)
    done = threading.Event()

    def other():
        w.write(-1)   # deadlocks if write_many holds the lock while it iterates
        done.set()

    def values():
        yield 1
        t = threading.Thread(target=other)
        t.start()
        assert done.wait(20), "write() from another thread waited on write_many's lock"
        t.join()
        yield 2

    assert w.write_many(values()) == 2
    w.close()
    assert sorted(kiln.RecordFile(tmp_path / "d.kilnr", "i64")) == [-1, 1, 2]
