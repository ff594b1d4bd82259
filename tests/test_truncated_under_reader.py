"""Files that another program truncates while kiln has them open (issue 51,
item 2): every call of kiln that reads an open file's payloads (a tensor's
first read with its checks and CRC, verify, rows, tensors, values,
copy_into, load_tensors into targets; a record file's get, slice and
iteration) ends in ``KilnError`` ``EOF`` ("the file changed under the
reader", the path and where the file now ends), never SIGBUS.

The cases run in a child process per kernel, so a crash fails the test (the
child dies by a signal) instead of ending the run.  Oracle: hand-written
expectations (the code, the words, the offset is the new size)."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

import kiln

PY = os.path.dirname(os.path.dirname(os.path.abspath(kiln.__file__)))

_CHILD = """
    import json, os, sys
    import numpy as np
    import kiln, kiln._access
    folder = sys.argv[1]
    T = "struct{id:i64,x:tensors,}"
    calls = {
        "getitem": lambda f, p: f["b"],
        "verify": lambda f, p: f.verify(),
        "rows": lambda f, p: f.rows("b", 0, 10),
        "tensors": lambda f, p: f.tensors(),
        "values": lambda f, p: f.values(),
        "copy_into": lambda f, p: f.held.copy_into(np.empty(300000, np.float32)),
        "dir_copy_into": lambda f, p: f.held_dir.copy_into(
            {"b": np.empty(300000, np.float32)}, strict=False),
    }
    out = []
    for where in ("start", "middle", "table"):
        for name, call in sorted(calls.items()):
            p = os.path.join(folder, "%s-%s.kiln" % (where, name))
            kiln.save_tensors(p, {"a": np.arange(300000, dtype=np.float32),
                                  "b": np.ones(300000, np.float32),
                                  "flag": np.zeros(5000, np.bool_)}, checksum=True)
            f = kiln.open(p, verify=False)
            held = f.values()   # taken before the cut (views: not read after it)
            f.held, f.held_dir = held[1], kiln.open(p, verify=False).tensors()
            start = kiln._access.file_offset(kiln._access.table(f)["a"])
            cut = {"start": 0, "middle": start + 600000, "table": start}[where]
            os.truncate(p, cut)
            try:
                call(f, p)
                out.append([where, name, "no error", cut])
            except kiln.KilnError as e:
                named = p in str(e) or name.endswith("copy_into")   # a tensor alone
                out.append([where, name, e.code, e.offset == cut and    # knows no path
                            "changed under the reader" in str(e) and named])
    for frac in (0.0, 0.5, 0.99):
        for name in ("get", "iter", "slice"):
            p = os.path.join(folder, "r-%s-%s.kilnr" % (frac, name))
            with kiln.RecordWriter(p, T) as w:
                for i in range(300):
                    w.write({"id": i, "x": {"w": np.full(1000, i, np.float32)}})
            rf = kiln.RecordFile(p, T)
            cut = int(os.path.getsize(p) * frac)
            os.truncate(p, cut)
            try:
                got = {"get": lambda: [rf[250]], "iter": lambda: list(rf),
                       "slice": lambda: rf[100:290]}[name]()
                # records read with pread: whole ones read right are no fault
                first = {"get": 250, "iter": 0, "slice": 100}[name]
                out.append([frac, name, "EOF", [r["id"] for r in got] ==
                            list(range(first, first + len(got))) and len(got) > 0])
            except kiln.KilnError as e:
                out.append([frac, name, e.code, e.offset == cut and
                            "changed under the reader" in str(e)])
    print(json.dumps(out))
"""


@pytest.mark.parametrize("pure", [False, True], ids=["default", "pure"])
def test_every_read_of_a_truncated_file_is_eof_never_sigbus(tmp_path, pure):
    env = dict(os.environ, PYTHONPATH=PY)
    if pure:
        env["KILN_PUREPYTHON"] = "1"
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(_CHILD), str(tmp_path)],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])   # -7: SIGBUS
    results = json.loads(r.stdout.splitlines()[-1])
    assert len(results) == 3 * 7 + 3 * 3
    wrong = [x for x in results if x[2:] != ["EOF", True]]
    assert wrong == []


def test_a_shared_descriptor_closes_once_the_reads_holding_it_end(tmp_path):
    """kiln._pread.SharedFd: close() while a read holds the descriptor leaves it
    open for that read and closes it at its drop; no hold after the close."""
    import os
    from kiln._pread import SharedFd
    p = tmp_path / "f"
    p.write_bytes(b"abc")
    h = SharedFd(os.open(p, os.O_RDONLY))
    fd = h.hold()
    h.close()
    assert os.pread(fd, 3, 0) == b"abc"   # still this file's descriptor
    assert h.hold() is None
    h.drop()
    with pytest.raises(OSError):
        os.fstat(fd)
    h.close()   # again: nothing
    h2 = SharedFd(os.open(p, os.O_RDONLY))
    fd2 = h2.hold()
    h2.drop()
    h2.close()   # no read holds it: closed now
    with pytest.raises(OSError):
        os.fstat(fd2)
