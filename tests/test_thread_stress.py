"""Threads that share kiln objects, each case in a child process under a time
limit, once per kernel: atomic replace from several threads, one TensorWriter
shared by threads, a file closed under its readers, one directory's arrays
made by many threads (tests/_stress_child.py holds the cases).

Bounded to a few seconds each.  tools/freethreaded-check.sh runs this file on
a free-threaded CPython with the GIL off, with more rounds
(``KILN_STRESS_ROUNDS``)."""

import os
import subprocess
import sys

import pytest

from conftest import compiled_kernels

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHILD = os.path.join(ROOT, "tests", "_stress_child.py")
ROUNDS = int(os.environ.get("KILN_STRESS_ROUNDS", "1"))
CASES = {"saves": 2, "writer": 6, "close_under_readers": 5, "shared_directory": 2}


@pytest.fixture(params=["cython", "python"])
def kernel_env(request):
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("KILN_PUREPYTHON", None)
    if request.param == "python":
        env["KILN_PUREPYTHON"] = "1"
    else:
        compiled_kernels(request.config)   # skipped (or an error under --c-extensions)
    return request.param, env


@pytest.mark.parametrize("case", sorted(CASES))
def test_threads_sharing_kiln_objects(kernel_env, case):
    name, env = kernel_env
    try:
        r = subprocess.run([sys.executable, CHILD, case, str(CASES[case] * ROUNDS)], env=env,
                           capture_output=True, text=True, timeout=120 * ROUNDS)
    except subprocess.TimeoutExpired as e:   # run() killed the child
        pytest.fail("%s hung (%s kernels): %s" % (case, name, e.stderr))
    assert r.returncode == 0, "%s, %s kernels: exit %d\n%s" % (case, name, r.returncode,
                                                                r.stderr[-3000:])
    assert r.stdout.split() == ["ok", case, "cython" if name == "cython" else "python"]


def test_a_closed_file_refuses_reads_and_keeps_what_it_handed_out(tmp_path):
    import gc
    import numpy as np
    import kiln
    p = tmp_path / "c.kiln"
    kiln.save_tensors(p, {"a": np.arange(4, dtype=np.float32)}, metadata={"m": 1})
    f = kiln.open(p)
    a, t = f["a"].numpy(), f["a"]
    f.close()
    for read in (lambda: f["a"], f.keys, lambda: len(f), lambda: list(f), lambda: "a" in f,
                 f.tensors, lambda: f.rows("a", 0, 1)):
        with pytest.raises(ValueError, match="closed"):
            read()
    assert repr(f).endswith("closed>") and f.metadata == {"m": 1}
    f.close()   # again: nothing
    assert a.tolist() == [0.0, 1.0, 2.0, 3.0] and t.numpy().tolist() == a.tolist()
    del a, t
    gc.collect()
