"""A DLPack capsule nobody consumes releases its payload's buffer when it is
collected, in both kernels and with nothing compiled of kiln's imported under
KILN_PUREPYTHON=1; each case in a child process (a fresh interpreter picks
its kernels at import)."""

import os
import subprocess
import sys

import pytest

from conftest import compiled_kernels

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHILD = r'''
import ctypes, gc, sys
import numpy as np
import kiln

def locked(buf):
    try:
        buf.append(0)
    except BufferError:
        return True
    buf.pop()
    return False

arrays = {"f": np.arange(6, dtype=np.float32), "b": np.array([True, False]),
          "h": np.zeros(3, np.uint16)}
buf = bytearray(kiln.encode_tensors(arrays))

def tensor(name):
    """A tensor of a directory over ``buf``, with nothing else of it left alive."""
    t = kiln.decode_tensors(buf, copy=False)[name]
    gc.collect()
    return t

cap = tensor("f").__dlpack__(max_version=(1, 0))   # taken by nobody
gc.collect()
assert locked(buf), "the capsule holds the buffer"
del cap
gc.collect()
assert not locked(buf), "an unconsumed capsule kept the buffer exported"

def unused_capsule_then_error():
    return tensor("b").__dlpack__(max_version=(1, 0)), 1 / 0
try:
    unused_capsule_then_error()
except ZeroDivisionError:
    pass                                   # the pending error survived the release
gc.collect()
assert not locked(buf)

a = np.from_dlpack(tensor("f"))            # consumed: held by the consumer's array
gc.collect()
assert a.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0] and not a.flags.writeable
assert locked(buf)
del a
gc.collect()
assert not locked(buf)

# bf16 goes out with DLPack's bfloat type code (4), 16 bits (through .numpy(), which
# needs ml_dtypes for bf16: without it the parent reports this part as skipped)
import importlib.util
if importlib.util.find_spec("ml_dtypes") is None:
    print("ok", kiln.IMPLEMENTATION, "no-ml_dtypes")
    raise SystemExit(0)
t = kiln.Tensor(b"\x80\x3f\x00\x40", dtype="bf16", shape=(2,))
cap = t.__dlpack__(max_version=(1, 0))
get = ctypes.pythonapi.PyCapsule_GetPointer
get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
p = get(cap, b"dltensor_versioned")
# DLManagedTensorVersioned: version (8), manager_ctx, deleter (16), flags (8), then DLTensor:
# data (8), device (8), ndim (4), dtype {code u8, bits u8, lanes u16}
raw = ctypes.string_at(p + 8 + 16 + 8 + 8 + 8 + 4, 4)
flags = int.from_bytes(ctypes.string_at(p + 24, 8), "little")
assert (raw[0], raw[1]) == (4, 16), raw
assert flags & 1, "read-only flag"
del cap
gc.collect()
assert ("kiln._kernels_c" in sys.modules) == (kiln.IMPLEMENTATION == "cython")
print("ok", kiln.IMPLEMENTATION)
'''


@pytest.mark.parametrize("kind", ["cython", "python"])
def test_an_unconsumed_capsule_releases_its_buffer(request, kind):
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("KILN_PUREPYTHON", None)
    if kind == "python":
        env["KILN_PUREPYTHON"] = "1"
    else:
        compiled_kernels(request.config)
    r = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Exception ignored" not in r.stderr
    if r.stdout.split() == ["ok", kind, "no-ml_dtypes"]:   # everything but the bf16 export
        pytest.skip("the bf16 DLPack export not checked: ml_dtypes is not installed "
                    "(Tensor.__dlpack__ takes the array from .numpy())")
    assert r.stdout.split() == ["ok", kind]
