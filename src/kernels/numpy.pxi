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
