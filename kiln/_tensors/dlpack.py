"""DLPack export of a tensor's payload, with no copy and no compiled code of kiln's.

A versioned capsule (``"dltensor_versioned"``, DLPack 1.0) carries the
read-only flag, so a consumer such as ``numpy.from_dlpack`` or
``torch.from_dlpack`` knows not to write into the caller's buffer.  A consumer
that only understands the old unversioned capsule gets one only for a
writable payload: the old form has no way to say read-only.

The capsule keeps the numpy view of the payload alive, and that view holds a
buffer export of the caller's buffer, so the memory stays valid and
unresized for as long as the consumer holds the tensor.  A capsule nobody
consumes releases the view when it is collected.

With numpy 2.1 or later (whose arrays export versioned capsules) the capsule
is numpy's own, made from the view, so its destructor and deleter are
numpy's compiled ones: collecting an unused capsule releases the view, with
or without an exception in flight, in both kernels and in the pure wheel.
kiln then only corrects the type code of bf16 (numpy sees its bits as
``uint16``) and sets the copied flag.  With an older numpy the capsule is
built here with ctypes; its destructor is then the bound kernel's
``dlpack_destructor()`` (kiln/_tensors/bind.py): the compiled kernels' C one,
and with the pure kernels none (an unused capsule keeps its payload alive
until the process ends), since a ctypes callback cannot keep a pending
exception across the release.  Nothing here imports a kernel.
"""

import ctypes
import sys
import threading
import weakref

import numpy as np

from .. import _wire as W

KDL_CPU = 1
_READ_ONLY = 1 << 0
_IS_COPIED = 1 << 1

# DLDataTypeCode: the DLPack 1.0 codes, and the DLPack 1.1 float8 and float4
# codes (kDLFloat8_e4m3fn, kDLFloat8_e5m2, kDLFloat8_e8m0fnu, kDLFloat4_e2m1fn),
# which torch exports and reads for its float8 dtypes and float4_e2m1fn_x2
_INT, _UINT, _FLOAT, _BFLOAT, _BOOL = 0, 1, 2, 4, 6
_V11 = {"f8e4m3": (10, 8, 1), "f8e5m2": (12, 8, 1), "e8m0": (14, 8, 1),
        "e2m1": (17, 4, 2)}   # e2m1: two 4-bit lanes a byte, as torch's float4_e2m1fn_x2
# Kiln dtype code -> (type code, bits, lanes)
_DL_TYPES = {}
for _code, (_name, _width, _np_name, _ml) in W.DTYPES.items():
    if _name == "bool":
        _DL_TYPES[_code] = (_BOOL, 8, 1)
    elif _name == "bf16":
        _DL_TYPES[_code] = (_BFLOAT, 16, 1)
    elif _name in _V11:
        _DL_TYPES[_code] = _V11[_name]
    elif _ml is None and _width:
        _DL_TYPES[_code] = ({"f": _FLOAT, "i": _INT, "u": _UINT}[np.dtype(_np_name).kind],
                            8 * _width, 1)


def _minor(dl):
    """The DLPack minor version a type code needs: 1 for the 1.1 codes."""
    return 1 if dl[0] > _BOOL else 0


class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _Device), ("ndim", ctypes.c_int32),
                ("dtype", _DataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


_DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class _Version(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class _ManagedVersioned(ctypes.Structure):
    _fields_ = [("version", _Version), ("manager_ctx", ctypes.c_void_p),
                ("deleter", _DELETER), ("flags", ctypes.c_uint64), ("dl_tensor", _DLTensor)]


class _Managed(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", _DELETER)]


_NAME_VERSIONED = b"dltensor_versioned"
_NAME_LEGACY = b"dltensor"

# what each live export keeps alive, by the address of its managed struct
_live = {}
_lock = threading.Lock()


def _release(addr):
    with _lock:
        _live.pop(addr, None)


@_DELETER
def _deleter(addr):
    # called by the consumer when it is done (or by the capsule, unconsumed)
    _release(addr)


_PyCapsule_New = ctypes.pythonapi.PyCapsule_New
_PyCapsule_New.restype = ctypes.py_object
_PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


# the capsule destructor by capsule name (_bind): the compiled module's C one
# when the compiled tensor part is bound (it keeps an exception pending while
# the capsule dies across the release); with the pure part none, and a capsule
# that no consumer ever takes keeps its payload alive until the process ends
_DESTROY = {_NAME_VERSIONED: None, _NAME_LEGACY: None}


def _bind(part):
    """Build capsules with ``part.dlpack_destructor()`` (kiln/_tensors/bind.py
    calls this, and only it)."""
    address = part.dlpack_destructor()
    _DESTROY.update({_NAME_VERSIONED: address, _NAME_LEGACY: address})

_PyCapsule_GetPointer = ctypes.pythonapi.PyCapsule_GetPointer
_PyCapsule_GetPointer.restype = ctypes.c_void_p
_PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]

# the views numpy-made capsules (or their consumers) hold, by id
_held = {}
_NUMPY_EXPORTS = []


def numpy_exports():
    """True when numpy's arrays export versioned capsules (numpy 2.1 and later)."""
    if not _NUMPY_EXPORTS:
        try:
            np.empty(1, np.uint8).__dlpack__(max_version=(1, 0))
            ok = True
        except TypeError:  # pragma: no cover - numpy before 2.1
            ok = False
        _NUMPY_EXPORTS.append(ok)
    return _NUMPY_EXPORTS[0]


def _forget(key):
    return lambda ref: _held.pop(key, None)


def _numpy_export(arr, code, copied, versioned):
    """numpy's capsule over ``arr`` (its compiled destructor and deleter release
    ``arr``), with kiln's type code and the copied flag set."""
    dl = _DL_TYPES[code]
    view = arr.view(np.uint16) if dl[0] == _BFLOAT else arr
    cap = view.__dlpack__(max_version=(1, 0) if versioned else None)
    name = _NAME_VERSIONED if versioned else _NAME_LEGACY
    addr = _PyCapsule_GetPointer(cap, name)
    m = (_ManagedVersioned if versioned else _Managed).from_address(addr)
    t = m.dl_tensor
    if (t.dtype.code, t.dtype.bits, t.dtype.lanes) != dl:
        t.dtype.code, t.dtype.bits, t.dtype.lanes = dl
    if versioned and _minor(dl) > m.version.minor:
        m.version.minor = _minor(dl)   # a 1.1 type code: the capsule says 1.1
    if versioned and copied:
        m.flags |= _IS_COPIED
    key = id(view)
    _held[key] = weakref.ref(view, _forget(key))
    return cap


def dlpack_code(code):
    """(type code, bits, lanes) of a Kiln dtype code, or None when DLPack has no type
    for it (i4, u4, opaque)."""
    return _DL_TYPES.get(code)


def export(arr, code, read_only, copied, versioned):
    """A DLPack capsule over the C-contiguous little-endian array ``arr``."""
    if sys.byteorder != "little" and arr.dtype.itemsize > 1:  # pragma: no cover
        arr = arr.astype(arr.dtype.newbyteorder("="))  # DLPack data is in host order
    if numpy_exports():
        return _numpy_export(arr, code, copied, versioned)
    dl = _DL_TYPES[code]
    shape = (ctypes.c_int64 * max(arr.ndim, 1))(*arr.shape)
    if versioned:
        m = _ManagedVersioned()
        m.version = _Version(1, _minor(dl))
        m.flags = (_READ_ONLY if read_only else 0) | (_IS_COPIED if copied else 0)
        name = _NAME_VERSIONED
    else:
        m = _Managed()
        name = _NAME_LEGACY
    t = m.dl_tensor
    t.data = arr.ctypes.data if arr.size else None
    t.device = _Device(KDL_CPU, 0)
    t.ndim = arr.ndim
    t.dtype = _DataType(*dl)
    t.shape = shape
    t.strides = None   # C-contiguous
    t.byte_offset = 0
    m.deleter = _deleter
    addr = ctypes.addressof(m)
    with _lock:
        _live[addr] = (m, shape, arr)
    try:
        return _PyCapsule_New(addr, name, _DESTROY[name])
    except BaseException:
        _release(addr)
        raise


def live_exports():
    """How many exports a consumer (or an unconsumed capsule) still holds (for tests)."""
    return len(_live) + sum(1 for r in list(_held.values()) if r() is not None)
