"""Files are mapped copy-on-write: a consumer that ignores DLPack's read-only
flag and writes through the pointer it was handed (torch.from_dlpack does)
changes this process's private pages, never the file, and never crashes the
process.  kiln's own views stay read-only.

Each write runs in a child process (killed by the test when it outlives its
timeout), so a fault in it (SIGSEGV on a read-only mapping, as before the
change) fails the test instead of killing the run.
"""

import os
import subprocess
import sys

import numpy as np
import pytest

import kiln

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# the writer: DLManagedTensorVersioned is {u32 major, u32 minor, void *ctx,
# void *deleter, u64 flags, DLTensor {void *data, ...}}: data after 32 bytes
# on a 64-bit host (4 + 4 + 8 + 8 + 8); bit 0 of flags is READ_ONLY
WRITE = r"""
import ctypes, sys
import numpy as np
import kiln

path, how = sys.argv[1], sys.argv[2]
if how == "record":         # a record file's tensor views its mapping too
    rf = kiln.RecordFile(path, "struct{id:i64,t:tensors,}")
    t = rf[0]["t"]["w"]
    opened = lambda: kiln.RecordFile(path, "struct{id:i64,t:tensors,}")[0]["t"]
else:
    f = kiln.open(path) if how != "load_tensors" else kiln.load_tensors(path)
    t = f["w"]
    opened = lambda: kiln.open(path)
if how in ("numpy", "record"):   # numpy's from_dlpack: the array's address
    a = np.from_dlpack(t)
    writable, addr, n = a.flags.writeable, a.ctypes.data, a.nbytes
    keep = a
else:                       # the capsule's own DLTensor data pointer
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    keep = t.__dlpack__(max_version=(1, 0))
    m = get(keep, b"dltensor_versioned")
    flags = ctypes.c_uint64.from_address(m + 24).value
    writable = not flags & 1
    addr, n = ctypes.c_void_p.from_address(m + 32).value, t.nbytes
ctypes.memset(addr, 0x7F, n)   # a consumer that ignores the read-only flag
again = opened()["w"]
print(kiln.IMPLEMENTATION, writable, bytes(t.data).hex(), bytes(again.data).hex(),
      t.numpy().flags.writeable)
"""


def _run(impl, code, *args):
    env = dict(os.environ, PYTHONPATH=ROOT, KILN_PUREPYTHON="1" if impl.name == "python" else "0")
    p = subprocess.Popen([sys.executable, "-c", code] + [str(a) for a in args], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    return p.returncode, out, err


@pytest.mark.parametrize("how", ["numpy", "capsule", "load_tensors", "record"])
def test_a_write_through_the_dlpack_pointer_changes_private_pages_only(impl, tmp_path, how):
    if how not in ("numpy", "record") and ctypes_pointer_size() != 8:   # pragma: no cover
        pytest.skip("the capsule's field offsets here are a 64-bit host's")
    path = tmp_path / "small.kiln"
    if how == "record":
        path = tmp_path / "small.kilnr"
        with kiln.RecordWriter(path, "struct{id:i64,t:tensors,}") as w:
            w.write({"id": 1, "t": {"w": np.arange(8, dtype=np.uint8)}})
    else:
        kiln.save_tensors(path, {"w": np.arange(8, dtype=np.uint8)})
    before = path.read_bytes()
    rc, out, err = _run(impl, WRITE, path, how)
    assert rc == 0, "the writer died (%s): %s" % (rc, err[-2000:])
    name, writable, seen, again, view_writable = out.split()
    assert name == impl.name
    assert writable == "False"            # the export said read-only all along
    assert seen == "7f" * 8               # this process's copy took the write
    assert again == bytes(range(8)).hex()  # a second open reads the file, unchanged
    assert view_writable == "False"       # kiln's own views stay read-only
    assert path.read_bytes() == before    # and the file on disk is as written


def ctypes_pointer_size():
    import ctypes
    return ctypes.sizeof(ctypes.c_void_p)


def test_views_of_an_open_file_stay_read_only(api, tmp_path):
    # copy-on-write makes the mapping writable: kiln must not hand that out
    path = tmp_path / "m.kiln"
    kiln.save_tensors(path, {"w": np.arange(6, dtype=np.float32).reshape(2, 3)})
    with kiln.open(path) as f:
        t = f["w"]
        assert not t.numpy().flags.writeable
        assert t.data.readonly
        assert not f.rows("w", 0, 1).flags.writeable
        assert not np.from_dlpack(t).flags.writeable
    d = kiln.load_tensors(path)
    assert not d["w"].numpy().flags.writeable and d["w"].data.readonly


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a sparse file and Linux's "
                    "overcommit rules")
def test_a_file_larger_than_memory_is_mapped_copy_on_write_too(impl, tmp_path):
    # a private writable mapping is charged to the commit limit unless it is
    # MAP_NORESERVE: 32 GiB (a hole on disk) would not map, and the read-only
    # fallback would fault on the write
    if ctypes_pointer_size() != 8:   # pragma: no cover - 32-bit hosts
        pytest.skip("a 32 GiB mapping needs a 64-bit host")
    path = tmp_path / "huge.kiln"
    with kiln.TensorWriter(path) as w:
        w.add("big", "u8", (32 << 30,))
        w.add("w", "u8", (8,))
        w.write("big", None)
        w.write("w", np.arange(8, dtype=np.uint8))
    rc, out, err = _run(impl, WRITE, path, "capsule")
    assert rc == 0, "the writer died (%s): %s" % (rc, err[-2000:])
    assert out.split()[2:4] == ["7f" * 8, bytes(range(8)).hex()]
