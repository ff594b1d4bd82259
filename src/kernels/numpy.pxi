# numpy arrays from C: numpy's C-API table, read at run time from its
# _ARRAY_API capsule (no numpy headers at build time; see src/kiln_numpy.h),
# used only after _np_setup's checks pass, with numpy.empty as the fallback.

cdef extern from "kiln_numpy.h":
    void **kiln_np_api
    unsigned int kiln_np_abi()
    void *kiln_np_type()
    object kiln_np_new(object descr, Py_ssize_t n)
    char *kiln_np_data(object a)
    int kiln_np_plain_1d(object a, object descr, char **data, Py_ssize_t *n)
    ctypedef struct kiln_np_head:
        char *data
        int nd
        Py_ssize_t *dimensions
        Py_ssize_t *strides
        PyObject *base
        PyObject *descr
        int flags

from cpython.pycapsule cimport PyCapsule_GetPointer

cdef bint _np_fast = False


cdef char *buffer_data(object arr) except NULL:
    cdef Py_buffer v
    cdef char *p
    PyObject_GetBuffer(arr, &v, PyBUF_SIMPLE | PyBUF_WRITABLE)
    p = <char *>v.buf
    PyBuffer_Release(&v)
    return p


def _np_setup():
    """Use numpy's C-API table for pod-list arrays if it is the table we know."""
    global _np_fast, kiln_np_api
    _np_fast = False
    try:
        try:
            from numpy._core import _multiarray_umath as mu
        except ImportError:
            from numpy.core import _multiarray_umath as mu
        kiln_np_api = <void **>PyCapsule_GetPointer(mu._ARRAY_API, NULL)
        if kiln_np_abi() not in (0x01000009, 0x02000000):
            return False
        if kiln_np_type() != <void *>_np_ndarray:
            return False
        for dt, n in (("<f8", 3), (">i2", 5), ("|b1", 0), ("<u8", 1)):
            d = _np.dtype(dt)
            a = kiln_np_new(d, n)
            if type(a) is not _np_ndarray or a.shape != (n,) or a.dtype != d or \
                    not a.flags.c_contiguous or not a.flags.owndata or not a.flags.writeable:
                return False
            if n and kiln_np_data(a) != buffer_data(a):
                return False
        # the array head as kiln_np_plain_1d reads it, against numpy's own view
        a = _np.arange(12, dtype="<i4")
        d = a.dtype
        e = _np.empty(0, "<i4")
        if not _np_head_agrees(a, d, True) or not _np_head_agrees(a[::2], d, False) or \
                not _np_head_agrees(a.reshape(3, 4), d, False) or \
                not _np_head_agrees(a.astype(">i4"), d, False) or \
                not _np_head_agrees(e, e.dtype, True):
            return False
    except Exception:
        return False
    _np_fast = True
    return True


cdef bint _np_head_agrees(object a, object descr, bint plain) except -1:
    cdef char *p = NULL
    cdef Py_ssize_t n = -1
    if kiln_np_plain_1d(a, descr, &p, &n) != plain:
        return False
    if plain:
        return n == a.shape[0] and (n == 0 or p == buffer_data(a))
    return True


_np_setup()


cdef inline object new_array(object dt, Py_ssize_t n, char **data):
    """A fresh, owned, C-contiguous 1-D array of ``n`` items of ``dt``."""
    if _np_fast:
        arr = kiln_np_new(dt, n)
        data[0] = kiln_np_data(arr)
    else:
        arr = _np_empty(n, dt)
        data[0] = buffer_data(arr) if n else NULL
    return arr




# --- Tensor.numpy() and TensorDirectory.values() of a decoded directory -----
# kiln._tensor hands over its Tensor class (tensor_setup); a decoded
# directory holds one buffer export of its memoryview (hold_buffer), the base
# of every array made over it, so the caller's buffer stays exported (a
# bytearray cannot be resized, an mmap not closed) while any array lives,
# and the arrays are read-only (the holder exports nothing writable).

cdef extern from "kiln_numpy.h":
    object kiln_np_view(object descr, int nd, Py_ssize_t *dims, char *data, object base)


cdef class HeldBuffer:
    """One buffer export of a tensor directory's memoryview: the base of the
    arrays that Tensor.numpy makes over it."""
    cdef Py_buffer view
    cdef bint held

    def __dealloc__(self):
        if self.held:
            self.held = False
            PyBuffer_Release(&self.view)


def hold_buffer(mv):
    """A HeldBuffer over ``mv`` (a flat memoryview), or None when it cannot be held."""
    cdef HeldBuffer h = HeldBuffer.__new__(HeldBuffer)
    try:
        PyObject_GetBuffer(mv, &h.view, PyBUF_SIMPLE)
    except (BufferError, TypeError, ValueError):
        return None
    h.held = True
    return h


cdef object _T_cls = None       # kiln.Tensor
cdef dict _T_shaped = None      # whole-element dtype code -> numpy dtype
cdef object _T_py = None        # the Python Tensor.numpy, for everything else
cdef Py_ssize_t _T_off[6]       # slot offsets: name, layout, _row, _buf, _off, _own
cdef bint _T_ok = False
_T_SLOTS = ("name", "layout", "_row", "_buf", "_off", "_own")


def tensor_setup(cls, shaped, py_numpy):
    """Take kiln.Tensor, its whole-element dtypes and its Python numpy();
    True when tensor_numpy_method and tensors_fill are in use."""
    global _T_cls, _T_shaped, _T_py, _T_ok
    _T_ok = False
    if not _np_fast or KILN_FREE_THREADED or cls.__new__ is not object.__new__:
        return False
    for i, nm in enumerate(_T_SLOTS):
        d = cls.__dict__.get(nm)
        if d is None or kiln_slot_offset(cls, <PyObject *>d) < 0:
            return False
        _T_off[i] = kiln_slot_offset(cls, <PyObject *>d)
    _T_cls, _T_shaped, _T_py = cls, dict(shaped), py_numpy
    _T_ok = True
    return True


cdef inline object t_slot(object t, int k):
    cdef PyObject *p = kiln_slot_get(t, _T_off[k])
    if p == NULL:
        return None
    o = <object>p
    Py_DECREF(o)  # the cast took its own reference
    return o


cdef inline object t_numpy(object t):
    if not _T_ok or not isinstance(t, _T_cls):
        return _T_py(t)
    arr = row_array(t_slot(t, 2), t_slot(t, 5), t_slot(t, 4))
    return _T_py(t) if arr is None else arr


def tensor_numpy_method(self):
    """kiln.Tensor.numpy with the compiled kernels (a compiled function binds
    to its instance as a Python function does: no Python frame per call):
    for a decoded tensor of a whole-element dtype the array is made here over
    the held buffer, shaped, read-only; else the Python one."""
    return t_numpy(self)


cdef object row_array(object row, object own, object offo):
    """The array over a table row's payload at byte ``offo`` of the held buffer
    ``own``, or None when the Python path must make it."""
    cdef Py_ssize_t dims[8]
    cdef Py_ssize_t k, rank, off, nbytes
    cdef uint64_t prod = 1
    cdef HeldBuffer h
    if type(own) is not HeldBuffer or type(row) is not tuple or PyTuple_GET_SIZE(row) != 12:
        return None
    dt = _T_shaped.get(<object>PyTuple_GET_ITEM(row, 0))
    nbytes = <object>PyTuple_GET_ITEM(row, 11)
    shape = <object>PyTuple_GET_ITEM(row, 1)
    if dt is None or nbytes <= 0 or type(shape) is not tuple or type(offo) is not int:
        return None
    rank = PyTuple_GET_SIZE(shape)
    if rank > 8:
        return None
    for k in range(rank):
        dims[k] = <object>PyTuple_GET_ITEM(shape, k)
        if dims[k] <= 0 or kiln_mul_u64(prod, <uint64_t>dims[k], &prod):
            return None
    h = <HeldBuffer>own
    off = offo
    if prod * <uint64_t>(<object>dt).itemsize != <uint64_t>nbytes or off < 0 or \
            nbytes > h.view.len - off:
        return None
    return kiln_np_view(dt, <int>rank, dims, <char *>h.view.buf + off, own)


cdef object name_str(object b, const char *errors, bint small):
    if b is None:
        return None
    if type(b) is not bytes:
        return b.decode("utf-8", (<bytes>errors).decode())
    if small:   # (only small directories' names are cached: see make_table)
        u = cached_name_str(b)   # valid UTF-8: the same str whatever the error handler
        if u is not None:
            return u
    return PyUnicode_DecodeUTF8(PyBytes_AS_STRING(<PyObject *>b),
                                PyBytes_GET_SIZE(<PyObject *>b), errors)


def tensors_fill(d):
    """TensorDirectory.values() of a decoded directory: make each Tensor not
    yet made (as TensorDirectory._make does); returns d._tensors, or None
    when the Python path must do it.

    Python code may run in the loop (an allocation starts a collection, whose
    callbacks run; a name that is not bytes decodes itself) and change the
    directory: both lists are measured again before every read and store
    (not copied: on 3.11 the allocation of a copy can start a collection that
    shortens the list being copied), each row and each Tensor made is held
    while it is used, and the errors string is held here."""
    cdef Py_ssize_t i, n, made = 0
    cdef const char *errs
    cdef PyObject **fresh = NULL
    if _D_ok and type(d) is _D_cls:
        tensors, rows, buf, own, pb = d_slot(d, 0), d_slot(d, 1), d_slot(d, 2), d_slot(d, 7), \
            d_slot(d, 3)
        errors = d_slot(d, 4)
    else:
        tensors, rows, buf, own, pb = d._tensors, d._rows, d._buf, d._own, d._pb
        errors = d._errors
    if not _T_ok or type(tensors) is not list or type(rows) is not list or \
            len(tensors) != len(rows) or type(errors) is not str:
        return None
    errs = PyUnicode_AsUTF8(errors)
    n = PyList_GET_SIZE(rows)
    fresh = <PyObject **>PyMem_Malloc(sizeof(PyObject *) * (n + 1))
    if fresh == NULL:
        raise MemoryError()
    try:
        for i in range(n):
            if i >= PyList_GET_SIZE(tensors) or i >= PyList_GET_SIZE(rows):
                return None   # shortened meanwhile
            if PyList_GET_ITEM(tensors, i) != <PyObject *>None:
                continue
            row = <object>PyList_GET_ITEM(rows, i)   # (held from here)
            if type(row) is not tuple or PyTuple_GET_SIZE(row) != 12:   # (make_table's rows)
                return None
            nm, kd, off = <object>PyTuple_GET_ITEM(row, 2), \
                <object>PyTuple_GET_ITEM(row, 3), <object>PyTuple_GET_ITEM(row, 10)
            t = kiln_alloc(_T_cls)
            # untracked while they are made: a collection that the allocations
            # start meanwhile does not walk them; each is held here (owned,
            # whatever happens to the list) and tracked again below
            PyObject_GC_UnTrack(t)
            Py_INCREF(t)
            fresh[made] = <PyObject *>t
            made += 1
            kiln_slot_set(t, _T_off[0], name_str(nm, errs, n <= 64))
            kiln_slot_set(t, _T_off[1], name_str(kd, errs, False))
            kiln_slot_set(t, _T_off[2], row)
            kiln_slot_set(t, _T_off[3], buf)
            kiln_slot_set(t, _T_off[4], pb + off)
            kiln_slot_set(t, _T_off[5], own)
            if i >= PyList_GET_SIZE(tensors):
                return None
            tensors[i] = t      # the list owns it from here (measured just above)
    finally:
        for i in range(made):   # every Tensor made is tracked again, error or not
            PyObject_GC_Track(<object>fresh[i])
            Py_XDECREF(fresh[i])
        PyMem_Free(fresh)
    return tensors


def tensors_dict_method(self):
    """kiln.TensorDirectory.to_dict with the compiled kernels (bound as a
    Python function is): {t.name: t.numpy()}, the tensors and arrays of a
    decoded directory made here (by tensors_fill's rules)."""
    if (d_slot(self, 1) if _D_ok and type(self) is _D_cls else self._rows) is not None:
        out = t_dict(self)
        if out is not None:
            return out
    return {t.name: t.numpy() for t in self.values()}


cdef object t_dict(object d):
    """{t.name: t.numpy()} of a decoded directory, or None when tensors_fill
    would decline it.  Python code runs in the loop (t.numpy(), d._tensor(i),
    collections): both lists are measured again before every read (see
    tensors_fill)."""
    cdef Py_ssize_t i, n
    cdef const char *errs
    if _D_ok and type(d) is _D_cls:
        tensors, rows, own, pb = d_slot(d, 0), d_slot(d, 1), d_slot(d, 7), d_slot(d, 3)
        errors = d_slot(d, 4)
    else:
        tensors, rows, own, pb = d._tensors, d._rows, d._own, d._pb
        errors = d._errors
    if not _T_ok or type(tensors) is not list or type(rows) is not list or \
            len(tensors) != len(rows) or type(errors) is not str:
        return None
    errs = PyUnicode_AsUTF8(errors)
    out = {}
    n = PyList_GET_SIZE(rows)
    for i in range(n):
        if i >= PyList_GET_SIZE(tensors) or i >= PyList_GET_SIZE(rows):
            return None   # shortened meanwhile: the Python path
        t = <object>PyList_GET_ITEM(tensors, i)
        if t is not None:   # made before: its name as it is now, its numpy()
            PyDict_SetItem(out, t.name, t.numpy())
            continue
        # not made yet: the array straight from the row (the Tensor would give the same)
        if i >= PyList_GET_SIZE(rows):
            return None
        row = <object>PyList_GET_ITEM(rows, i)
        if type(row) is not tuple or PyTuple_GET_SIZE(row) != 12:
            return None
        arr = row_array(row, own, pb + <object>PyTuple_GET_ITEM(row, 10))
        if arr is None:
            t = d._tensor(i)
            arr = t.numpy()
        PyDict_SetItem(out, name_str(<object>PyTuple_GET_ITEM(row, 2), errs, n <= 64), arr)
    return out


cdef object _D_cls = None       # kiln.TensorDirectory
cdef object _D_hooks = None     # kiln._tensor.HOOKS
cdef Py_ssize_t _D_off[8]
cdef bint _D_ok = False
_D_SLOTS = ("_tensors", "_rows", "_buf", "_pb", "_errors", "_index", "_names", "_own")


def directory_setup(cls, hooks):
    """Take kiln.TensorDirectory and the tensor hooks: decode then builds a
    view directory (what hooks.build does with copy=False) in C.  True when in use."""
    global _D_cls, _D_hooks, _D_ok
    _D_ok = False
    if not _T_ok or cls.__new__ is not object.__new__:
        return False
    for i, nm in enumerate(_D_SLOTS):
        d = cls.__dict__.get(nm)
        if d is None or kiln_slot_offset(cls, <PyObject *>d) < 0:
            return False
        _D_off[i] = kiln_slot_offset(cls, <PyObject *>d)
    _D_cls, _D_hooks = cls, hooks
    _D_ok = True
    return True


cdef inline object d_slot(object d, int k):
    """A TensorDirectory slot (by _D_SLOTS index); an empty one is AttributeError."""
    cdef PyObject *p = kiln_slot_get(d, _D_off[k])
    if p == NULL:
        raise AttributeError(_D_SLOTS[k])
    o = <object>p
    Py_DECREF(o)  # the cast took its own reference
    return o


cdef object view_directory(object mv, object pb, list table, bint trusted):
    """TensorDirectory._from_table(table, mv.toreadonly(), pb, errors)."""
    buf = mv.toreadonly()
    d = kiln_alloc(_D_cls)
    kiln_slot_set(d, _D_off[1], table)
    kiln_slot_set(d, _D_off[2], buf)
    kiln_slot_set(d, _D_off[3], pb)
    kiln_slot_set(d, _D_off[4], "surrogateescape" if trusted else "strict")
    kiln_slot_set(d, _D_off[0], [None] * PyList_GET_SIZE(table))
    kiln_slot_set(d, _D_off[5], None)
    kiln_slot_set(d, _D_off[6], None)
    kiln_slot_set(d, _D_off[7], hold_buffer(buf))
    return d
