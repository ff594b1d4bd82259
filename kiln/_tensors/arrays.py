"""The numpy side of a tensor: the arrays ``Tensor.numpy()`` makes, and the
one owner of a payload's buffer export that every array views.

``numpy_py`` is ``Tensor.numpy()`` in Python: the pure kernel's tensor part
calls it for every tensor, the compiled one for the tensors it does not make
in C (see ``src/kernels/tensors.pxi``).
"""

import sys

import numpy as np

from .. import _wire as W
from .._wire import PACKED, R_BYTE_LENGTH, R_CODE, R_SHAPE
from .dtypes import SHAPED, _ML_NAMES, bits_dtype, element_count, ml_dtypes, ml_name, no_ml, \
    numpy_dtype
from .nibbles import unpack_nibbles

_frombuffer = np.frombuffer
_ndarray = np.ndarray


def numpy_py(t, _shaped=SHAPED, _code=R_CODE, _n=R_BYTE_LENGTH, _shape=R_SHAPE):
    """Tensor.numpy() in Python (the defaults: fast local names on this hot path)."""
    row = t._row
    dt = _shaped.get(row[_code])
    if dt is not None and row[_n]:
        # whole-element dtypes: one view of the payload (see view), shaped
        return view(t._buf, dt, row[_n] // dt.itemsize, t._off, row[_shape])
    return numpy_slow(t, row)


def numpy_slow(t, row, dt=None):
    """The array of any tensor: ``dt`` given, its bits in that dtype (a 1-D
    byte view for the packed and opaque dtypes); else :func:`numpy_dtype`'s."""
    code = row[R_CODE]
    if dt is None:
        if ml_name(code) is not None and ml_dtypes() is None:
            raise no_ml(code, t.name)
        dt = numpy_dtype(code)
        if code in PACKED:
            return unpacked(t, row, dt)
    n = row[R_BYTE_LENGTH]
    if code in PACKED or code >= W.OPAQUE_MIN:
        return view(t._buf, dt, n, t._off, (n,)) if n else np.empty(0, dt)
    if not n:
        return np.empty(row[R_SHAPE], dt)
    arr = view(t._buf, dt, n // dt.itemsize, t._off, row[R_SHAPE])
    if sys.byteorder == "big" and dt.itemsize > 1 and dt.kind == "V":  # pragma: no cover
        # an ml_dtypes type is host-ordered: swap the little-endian bits
        arr = arr.view(dt.newbyteorder("<")).astype(dt)
    return arr


def unpacked(t, row, dt):
    """A 4-bit tensor's elements, one per byte in ml_dtypes' type ``dt``: a new
    array (no dtype views two elements per byte), shaped."""
    shape = row[R_SHAPE]
    n = row[R_BYTE_LENGTH]
    if not n:
        return np.empty(shape, dt)
    raw = view(t._buf, np.dtype(np.uint8), n, t._off, (n,))
    return unpack_nibbles(raw, element_count(shape)).reshape(shape).view(dt)


def bits(t):
    """Tensor.bits(): the raw bit patterns (no copy)."""
    row = t._row
    code = row[R_CODE]
    if code in _ML_NAMES or code in PACKED:
        return numpy_slow(t, row, bits_dtype(code))
    return t.numpy()


def view(buf, dt, count, off, shape):
    """An array over ``count`` items of ``buf`` from byte ``off``, shaped.

    ``buf`` is the payload's owner (see owner): the array is a numpy view of
    it, so it holds the owner by reference, and through it the one buffer
    export of the caller's object (a bytearray cannot be resized nor an mmap
    unmapped under it) for its whole life; releasing the array releases
    nothing but its reference.  A memoryview ``buf`` (the compiled kernels'
    directories, with the GIL) goes through ``np.frombuffer``, whose base
    then holds an export of it.  Either way the array is read-only.
    """
    if type(buf) is np.ndarray:
        return _ndarray(shape, dt, buf, off)   # its base is the owner itself
    arr = _frombuffer(buf, dt, count, off)
    return arr if len(shape) == 1 else arr.reshape(shape)


def owner(buf):
    """The one object that holds the buffer export of a directory's (or a
    hand-made tensor's) bytes: a read-only 1-D uint8 array over ``buf``.

    Every array, ``data`` view and DLPack export handed out is made from it
    by numpy slicing (a reference to the owner, which CPython counts
    atomically, free-threaded builds included), never by a new export of one
    memoryview shared between threads: CPython keeps a memoryview's export
    count without a lock on free-threaded builds, and numpy releases its
    arrays' exports outside kiln, so a shared view could lose an export (and
    the caller's buffer be resized under a live array).
    """
    if type(buf) is np.ndarray and buf.dtype == np.uint8 and buf.ndim == 1 and \
            not buf.flags.writeable:
        return buf
    arr = np.frombuffer(buf, np.uint8)
    if arr.flags.writeable:
        arr.flags.writeable = False
    return arr


def as_array(array):
    """``array`` as a numpy array: itself, through DLPack, or over its buffer."""
    arr = array
    if not isinstance(arr, np.ndarray):
        if hasattr(arr, "__dlpack__"):
            try:
                arr = np.from_dlpack(arr)
            except (RuntimeError, BufferError, TypeError, ValueError) as e:
                # numpy's own words ("Unsupported dtype in DLTensor."), said as a TypeError
                # the encoders report naming the tensor
                raise TypeError("%s through DLPack: numpy cannot read it (%s)"
                                % (type(array).__name__, str(e).rstrip("."))) from None
        else:
            try:
                mv = memoryview(arr)
            except TypeError:
                raise TypeError("expected a numpy array, a kiln.Tensor, or an object with "
                                "__dlpack__ or the buffer protocol, got %s"
                                % type(array).__name__) from None
            arr = np.asarray(mv)
    return arr


def mapping_intact(obj, name="the file"):
    """``KilnError`` ``EOF`` when ``obj`` (an array, a memoryview, or the
    mapping itself) views a file mapping whose file is now shorter than the
    mapping: another program truncated it in place, and reading the lost
    pages would kill the process (SIGBUS).  kiln calls it before its own
    reads of a mapped file's payloads; the views it hands out are the
    documented exception (docs/files.md)."""
    import mmap
    for _ in range(16):   # array -> its base -> memoryview -> its object ... -> the mapping
        if isinstance(obj, mmap.mmap):
            break
        nxt = getattr(obj, "base", None) if isinstance(obj, np.ndarray) else \
            getattr(obj, "obj", None)
        if nxt is None:
            return
        obj = nxt
    else:
        return
    try:
        now, mapped = obj.size(), len(obj)
    except (OSError, ValueError):   # closed, or no file behind it
        return
    if now < mapped:
        from .._errors import KilnError
        raise KilnError("EOF", now, "%s: the file changed under the reader: it is %d bytes "
                        "now, %d when it was opened (truncated in place by another program); "
                        "open it again" % (name, now, mapped))


# The files open for reading, by their mapping: kiln's own copies out of a
# mapped file's tensors (copy_into) read the file with pread instead of the
# mapping while the file is open (a file truncated meanwhile is EOF, never
# SIGBUS).  Filled by the file layer (kiln._files.kilnfile), by id of the mapping.
_FILES = {}


def register_file(mm, fd, name):
    import weakref
    key = id(mm)
    # weakly: a file never closed must not keep its mapping; its entry goes with it
    _FILES[key] = (weakref.ref(mm, lambda _r, k=key: _FILES.pop(k, None)), fd, name)


def unregister_file(mm):
    _FILES.pop(id(mm), None)


def file_source(arr):
    """(the file's SharedFd, file offset, name) of the bytes of array ``arr`` when they
    are a view of a registered file's mapping, else None."""
    import mmap
    obj, start = arr, None
    for _ in range(16):
        if isinstance(obj, mmap.mmap):
            break
        if isinstance(obj, np.ndarray):
            start = obj
        obj = getattr(obj, "base", None) if isinstance(obj, np.ndarray) else \
            getattr(obj, "obj", None)
        if obj is None:
            return None
    else:
        return None
    found = _FILES.get(id(obj))
    if found is None or found[0]() is not obj or start is None:
        return None
    base = start.__array_interface__["data"][0]
    return found[1], arr.__array_interface__["data"][0] - base, found[2]
