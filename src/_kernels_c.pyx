"""Compiled kernels: kiln._kernels_c.

Implements the kernel interface documented at the top of kiln/_kernels_py.py
(the reference implementation) with the same names, results, error codes and
error offsets.  A Plan is compiled once into a tree of ``Node`` objects; the
decode and encode loops over fields, elements and descriptors run in C.

Byte order is decided at compile time (``KILN_HOST_BIG_ENDIAN`` from
kiln_endian.h).  ``set_force_byteswap(True)`` makes the pod-list paths behave
as on a big-endian host (tests use it to reach the byte-swapping loops).

Only a C compiler, setuptools and Cython are needed to build this module:
numpy is used at run time through its Python API.
"""

cimport cython
from cpython.ref cimport PyObject, Py_INCREF, Py_DECREF, Py_XDECREF
from cpython.mem cimport PyMem_Malloc, PyMem_Realloc, PyMem_Free
from libc.stdint cimport uint8_t, uint16_t, uint32_t, uint64_t, int64_t
from libc.string cimport memcpy, memcmp, memset
from libc.stdlib cimport qsort
from libc.math cimport isinf

import numpy as _np
from sys import intern as _intern

from ._errors import KilnError, EncodeError
from . import _plan as _P
from . import _kernels_py as _py
from ._kernels_py import as_pod_array, _as_byte_run, _scalar_error, _as_bytes_view

__all__ = ["compile_decoder", "compile_encoder", "validate_directory", "write_directory",
           "check_count", "check_frame", "check_written_directory", "as_pod_array",
           "set_force_byteswap", "BIG_ENDIAN_TEST_HOOK", "HOST_BIG_ENDIAN"]


# --- C declarations --------------------------------------------------------

cdef extern from "kiln_endian.h":
    int KILN_HOST_BIG_ENDIAN
    uint16_t kiln_ld_u16(const void *p) noexcept nogil
    uint32_t kiln_ld_u32(const void *p) noexcept nogil
    uint64_t kiln_ld_u64(const void *p) noexcept nogil
    float kiln_ld_f32(const void *p) noexcept nogil
    double kiln_ld_f64(const void *p) noexcept nogil
    void kiln_st_u16(void *p, uint16_t v) noexcept nogil
    void kiln_st_u32(void *p, uint32_t v) noexcept nogil
    void kiln_st_u64(void *p, uint64_t v) noexcept nogil
    void kiln_st_f32(void *p, float v) noexcept nogil
    void kiln_st_f64(void *p, double v) noexcept nogil
    void kiln_swap_copy(void *dst, const void *src, size_t n, int w) noexcept nogil
    int kiln_mul_u64(uint64_t a, uint64_t b, uint64_t *r) noexcept nogil
    int kiln_add_u64(uint64_t a, uint64_t b, uint64_t *r) noexcept nogil
    int64_t kiln_first_bad_bool(const unsigned char *p, size_t n) noexcept nogil
    int64_t kiln_utf8_first_error(const unsigned char *p, size_t n) noexcept nogil
    bint KILN_LIKELY(bint x) noexcept nogil
    bint KILN_UNLIKELY(bint x) noexcept nogil

from cpython.buffer cimport (PyObject_GetBuffer, PyBuffer_Release, PyBuffer_IsContiguous,
                             PyBUF_SIMPLE, PyBUF_WRITABLE, PyBUF_STRIDES,
                             PyBUF_C_CONTIGUOUS, PyBUF_ND)

cdef extern from "Python.h":
    Py_ssize_t PY_SSIZE_T_MAX

    PyObject *PyErr_Occurred()
    void PyErr_Clear()
    void PyErr_Fetch(PyObject **t, PyObject **v, PyObject **tb)
    void PyErr_Restore(PyObject *t, PyObject *v, PyObject *tb)
    void PyErr_NormalizeException(PyObject **t, PyObject **v, PyObject **tb)
    int PyErr_GivenExceptionMatches(PyObject *given, PyObject *exc)
    PyObject *PyExc_UnicodeDecodeError

    object PyLong_FromLong(long v)
    object PyLong_FromUnsignedLong(unsigned long v)
    object PyLong_FromLongLong(long long v)
    object PyLong_FromUnsignedLongLong(unsigned long long v)
    bint PyLong_Check(object o)
    bint PyLong_CheckExact(PyObject *o)
    long long PyLong_AsLongLongAndOverflow(PyObject *o, int *overflow) noexcept
    unsigned long long PyLong_AsUnsignedLongLong(PyObject *o) noexcept
    object PyNumber_Index(object o)
    object PyFloat_FromDouble(double v)
    bint PyFloat_CheckExact(PyObject *o)
    double PyFloat_AS_DOUBLE(PyObject *o)
    double PyFloat_AsDouble(object o) noexcept

    object PyBytes_FromStringAndSize(const char *s, Py_ssize_t n)
    PyObject *PyBytes_FromStringAndSize_raw "PyBytes_FromStringAndSize"(const char *s,
                                                                        Py_ssize_t n)
    bint PyBytes_CheckExact(object o)
    char *PyBytes_AS_STRING(PyObject *o)
    Py_ssize_t PyBytes_GET_SIZE(PyObject *o)
    int _PyBytes_Resize(PyObject **o, Py_ssize_t n) except -1
    bint PyByteArray_CheckExact(object o)
    object PyByteArray_FromStringAndSize(const char *s, Py_ssize_t n)
    int PyByteArray_Resize(PyObject *o, Py_ssize_t n) except -1
    int PyByteArray_Resize_nc "PyByteArray_Resize"(PyObject *o, Py_ssize_t n) noexcept
    char *PyByteArray_AS_STRING(PyObject *o)
    Py_ssize_t PyByteArray_GET_SIZE(PyObject *o)

    PyObject *PyUnicode_DecodeUTF8_raw "PyUnicode_DecodeUTF8"(const char *s, Py_ssize_t n,
                                                                const char *errors)
    bint PyUnicode_Check(object o)
    bint PyUnicode_IS_COMPACT_ASCII(object o)
    void *PyUnicode_DATA(object o)
    Py_ssize_t PyUnicode_GET_LENGTH(object o)
    object PyUnicode_AsUTF8String(object o)

    object PyList_New(Py_ssize_t n)
    void PyList_SET_ITEM(object l, Py_ssize_t i, PyObject *o)
    PyObject *PyList_GET_ITEM(object l, Py_ssize_t i)
    Py_ssize_t PyList_GET_SIZE(object l)
    bint PyList_CheckExact(object o)
    object PyTuple_New(Py_ssize_t n)
    void PyTuple_SET_ITEM(object t, Py_ssize_t i, PyObject *o)
    PyObject *PyTuple_GET_ITEM(object t, Py_ssize_t i)
    Py_ssize_t PyTuple_GET_SIZE(object t)
    bint PyTuple_CheckExact(object o)
    bint PyDict_CheckExact(object o)
    Py_ssize_t PyDict_GET_SIZE(object o)
    int PyDict_SetItem(object d, object k, object v) except -1
    int PyDict_Next(object d, Py_ssize_t *pos, PyObject **k, PyObject **v)
    int PyObject_IsInstance(object o, object cls) except -1
    Py_ssize_t PyObject_Size(object o) except -1

cdef extern from *:
    """
    /* Owned references to container items.  On a free-threaded build another
       thread may change a list or dict while we encode it, so a borrowed item
       could be freed under us: these take the reference atomically there
       (PyList_GetItemRef, PyDict_GetItemRef, 3.13+).  With the GIL they are the
       plain macro plus an incref.  kiln_list_item_ref returns NULL, with no
       error set, when i is past the end. */
    static PyObject *kiln_list_item_ref(PyObject *l, Py_ssize_t i) {
    #ifdef Py_GIL_DISABLED
        PyObject *o = PyList_GetItemRef(l, i);
        if (o == NULL) PyErr_Clear();
        return o;
    #else
        PyObject *o;
        if (i >= PyList_GET_SIZE(l)) return NULL;
        o = PyList_GET_ITEM(l, i);
        Py_INCREF(o);
        return o;
    #endif
    }
    #ifdef Py_GIL_DISABLED
    #define KILN_FREE_THREADED 1
    #else
    #define KILN_FREE_THREADED 0
    #endif
    /* 1 with *out owned, 0 when missing, -1 with an error set */
    static int kiln_dict_get_ref(PyObject *d, PyObject *k, PyObject **out) {
    #if PY_VERSION_HEX >= 0x030D0000
        return PyDict_GetItemRef(d, k, out);
    #else
        PyObject *o = PyDict_GetItemWithError(d, k);
        *out = o;
        if (o == NULL) return PyErr_Occurred() ? -1 : 0;
        Py_INCREF(o);
        return 1;
    #endif
    }
    """
    PyObject *kiln_list_item_ref(object l, Py_ssize_t i)
    int kiln_dict_get_ref(object d, object k, PyObject **out) except -1
    bint KILN_FREE_THREADED
    object PyDict_Copy(object d)

cdef enum:
    OP_BOOL = 1
    OP_I8 = 2
    OP_U8 = 3
    OP_I16 = 4
    OP_U16 = 5
    OP_I32 = 6
    OP_U32 = 7
    OP_I64 = 8
    OP_U64 = 9
    OP_F32 = 10
    OP_F64 = 11
    OP_STR = 12
    OP_BYTES = 13
    OP_PODLIST = 14
    OP_LIST = 15
    OP_OPT = 16
    OP_DICT = 17
    OP_STRUCT = 18
    OP_TENSORS = 19

cdef enum:
    WHAT_COUNT = 0
    WHAT_STR = 1
    WHAT_KEY = 2
    MAXSEG = 192

cdef extern from *:
    """
    #define KILN_U32_MAX UINT64_C(0xFFFFFFFF)
    #define KILN_U64_MAX UINT64_C(0xFFFFFFFFFFFFFFFF)
    """
    uint64_t U32_MAX "KILN_U32_MAX"
    uint64_t U64_MAX "KILN_U64_MAX"

# the ops must agree with kiln/_plan.py
for _name, _v in (("OP_BOOL", OP_BOOL), ("OP_I8", OP_I8), ("OP_U8", OP_U8), ("OP_I16", OP_I16),
                  ("OP_U16", OP_U16), ("OP_I32", OP_I32), ("OP_U32", OP_U32),
                  ("OP_I64", OP_I64), ("OP_U64", OP_U64), ("OP_F32", OP_F32),
                  ("OP_F64", OP_F64), ("OP_STR", OP_STR), ("OP_BYTES", OP_BYTES),
                  ("OP_PODLIST", OP_PODLIST), ("OP_LIST", OP_LIST), ("OP_OPT", OP_OPT),
                  ("OP_DICT", OP_DICT), ("OP_STRUCT", OP_STRUCT), ("OP_TENSORS", OP_TENSORS)):
    if getattr(_P, _name) != _v:  # pragma: no cover
        raise ImportError("kiln._kernels_c is out of date with kiln._plan (%s)" % _name)

# width in bytes of each scalar op (index = op)
cdef int SW[12]
SW[:] = [0, 1, 1, 1, 2, 2, 4, 4, 8, 8, 4, 8]

# value range of each narrow integer op (index = op; i64/u64 are checked by conversion)
cdef long long INT_LO[12]
cdef long long INT_HI[12]
INT_LO[:] = [0, 0, -128, 0, -32768, 0, -2147483648, 0, 0, 0, 0, 0]
INT_HI[:] = [0, 1, 127, 255, 32767, 65535, 2147483647, 4294967295, 0, 0, 0, 0]

# tensor dtype widths (index = code 1..19; 0 = packed nibbles)
cdef int DW[20]
DW[:] = [0, 8, 4, 2, 2, 1, 1, 1, 1, 1, 2, 2, 4, 4, 8, 8, 0, 0, 0, 1]

HOST_BIG_ENDIAN = bool(KILN_HOST_BIG_ENDIAN)

cdef int _force_swap = 0


def set_force_byteswap(flag):
    """Test hook: act as if the host were big-endian (True) or as built (False).

    While set, pod-list decode returns arrays of an explicitly big-endian
    dtype filled by the byte-swapping loop, and pod-list encode swaps
    big-endian arrays into little-endian wire bytes.
    """
    global _force_swap
    _force_swap = 1 if flag else 0


BIG_ENDIAN_TEST_HOOK = set_force_byteswap

cdef object _Some = _P.Some
cdef object _np_empty = _np.empty
cdef object _np_ndarray = _np.ndarray
cdef object _np_bool = _np.bool_
cdef object _np_ascontig = _np.ascontiguousarray


# --- small helpers ---------------------------------------------------------

cdef inline object _take(PyObject *p):
    """Turn an owned reference into an object without a net refcount change."""
    cdef object r = <object>p
    Py_DECREF(r)
    return r


cdef int kfail(str code, Py_ssize_t off, str msg) except -1:
    raise KilnError(code, off, msg)


cdef int efail(str code, Py_ssize_t off, str msg) except -1:
    raise EncodeError(code, off, msg)


cdef inline uint64_t _cap(object x):
    """A non-negative Python int cap as u64 (caps above u64 act as u64 max)."""
    if x >= 0xFFFFFFFFFFFFFFFF:
        return U64_MAX
    if x <= 0:
        return 0
    return <uint64_t>x


cdef int get_view(object buf, Py_buffer *view) except -1:
    """Hold ``buf`` through the buffer protocol; it must be C-contiguous."""
    PyObject_GetBuffer(buf, view, PyBUF_STRIDES)
    if not PyBuffer_IsContiguous(view, b'C'):
        PyBuffer_Release(view)
        raise TypeError("kiln needs a contiguous buffer")
    return 0


# --- the allocation rule ---------------------------------------------------

cdef inline int count_rule(const uint8_t *d, Py_ssize_t n, Py_ssize_t pos, uint64_t cap,
                           uint64_t m, uint32_t *out) noexcept nogil:
    """The five-step rule for one u32 count/length word at ``pos``.

    1. the word needs 4 bytes (EOF), 2. read it, 3. it must not exceed the cap
    (LIMIT), 4. count * m must not overflow u64 (LIMIT), 5. count * m must not
    exceed the bytes after the word (EOF).  Returns 0 or the failing step.
    """
    cdef uint64_t c, need
    if n - pos < 4:
        return 1
    c = kiln_ld_u32(d + pos)
    out[0] = <uint32_t>c
    if c > cap:
        return 3
    if kiln_mul_u64(c, m, &need):
        return 4
    if need > <uint64_t>(n - pos - 4):
        return 5
    return 0


cdef int count_fail(int st, int what, Py_ssize_t pos, uint64_t c, uint64_t cap, uint64_t m,
                    Py_ssize_t n, str capname=None) except -1:
    cdef Py_ssize_t rem = n - pos - 4
    cdef str nm = "count" if what == WHAT_COUNT else (
        "string length" if what == WHAT_STR else "key length")
    if st == 1:
        if what == WHAT_COUNT:
            kfail("EOF", pos, "count word needs 4 bytes, %d remain" % max(n - pos, 0))
        kfail("EOF", pos, "%s needs 4 bytes, %d remain" % (nm, max(n - pos, 0)))
    if st == 3:
        if capname is None:
            capname = "max_count" if what == WHAT_COUNT else "max_bytes"
        kfail("LIMIT", pos, "%s %d is above the cap %s=%d" % (nm, c, capname, cap))
    if st == 4:
        kfail("LIMIT", pos, "count %d times %d bytes overflows u64" % (c, m))
    if what == WHAT_COUNT:
        kfail("EOF", pos, "count %d needs at least %d bytes, %d remain" % (c, c * m, rem))
    kfail("EOF", pos, "%s %d, %d bytes remain" % (nm, c, rem))
    return -1


cdef int zero_budget_fail(Py_ssize_t pos, uint64_t c, uint64_t left, uint64_t cap) except -1:
    kfail("LIMIT", pos, "count %d of zero-size elements is above what is left (%d) of the "
          "max_count budget %d that all such elements of one value share" % (c, left, cap))
    return -1


cdef int eof_fail(Py_ssize_t pos, int size, Py_ssize_t n) except -1:
    kfail("EOF", pos, "%d-byte value needs more bytes, %d remain" % (size, max(n - pos, 0)))
    return -1


# --- compiled plans --------------------------------------------------------

cdef struct FieldInfo:
    int op
    PyObject *node      # borrowed from Node.fields
    PyObject *name      # borrowed from Node.names


cdef class Node:
    """One compiled plan node."""
    cdef int op
    cdef int width          # scalar width, or pod element width
    cdef int elem_op        # pod element op
    cdef uint64_t elem_min  # list: elem.min_size; dict: 4 + elem.min_size
    cdef Node elem
    cdef tuple fields
    cdef tuple names
    cdef Py_ssize_t nf
    cdef FieldInfo *finfo
    cdef object make
    cdef object get
    cdef object cls
    cdef object key_set
    cdef object hooks
    cdef object text
    cdef object dt_native   # pod: native-order dtype
    cdef object dt_big      # pod: big-endian dtype
    cdef object dt_le       # pod: the wire's little-endian dtype
    cdef bint has_tensors

    def __dealloc__(self):
        PyMem_Free(self.finfo)

    def __repr__(self):
        return "<kiln._kernels_c.Node %d %r>" % (self.op, self.text)


cdef Node compile_node(object plan):
    cdef Node nd = Node.__new__(Node)
    cdef Node f
    cdef Py_ssize_t i
    cdef int op = plan.op
    nd.op = op
    nd.text = plan.text
    if OP_BOOL <= op <= OP_F64:
        nd.width = SW[op]
    elif op == OP_PODLIST:
        le = _np.dtype(_P.NUMPY_LE[plan.elem.op])
        nd.elem_op = plan.elem.op
        nd.width = le.itemsize
        nd.dt_native = le.newbyteorder("=")
        nd.dt_big = le.newbyteorder(">")
        nd.dt_le = le
    elif op == OP_LIST or op == OP_OPT:
        nd.elem = compile_node(plan.elem)
        nd.elem_min = plan.elem.min_size
        nd.has_tensors = nd.elem.has_tensors
    elif op == OP_DICT:
        nd.elem = compile_node(plan.elem)
        nd.elem_min = 4 + plan.elem.min_size
        nd.has_tensors = nd.elem.has_tensors
    elif op == OP_STRUCT:
        nd.fields = tuple([compile_node(p) for p in plan.fields])
        nd.names = tuple([_intern(nm) for nm in plan.names])
        nd.nf = len(nd.fields)
        if len(nd.names) != nd.nf:
            raise ValueError("struct plan has %d names for %d fields" % (len(nd.names), nd.nf))
        nd.make = plan.make
        nd.get = plan.get
        nd.cls = plan.cls
        nd.key_set = frozenset(nd.names)
        nd.finfo = <FieldInfo *>PyMem_Malloc(sizeof(FieldInfo) * (nd.nf + 1))
        if nd.finfo == NULL:
            raise MemoryError()
        for i in range(nd.nf):
            f = <Node>nd.fields[i]
            nd.finfo[i].op = f.op
            nd.finfo[i].node = <PyObject *>f
            nd.finfo[i].name = <PyObject *>nd.names[i]
            if f.has_tensors:
                nd.has_tensors = True
    elif op == OP_TENSORS:
        nd.hooks = plan.tensors
        nd.has_tensors = True
    elif op == OP_STR or op == OP_BYTES:
        pass
    else:
        raise AssertionError("unknown op %r" % op)
    return nd


# --- decoding ----------------------------------------------------------------

cdef struct DCtx:
    const uint8_t *d
    Py_ssize_t n
    Py_ssize_t pos
    uint64_t max_count
    uint64_t max_bytes
    uint64_t bytes_cap
    uint64_t zbudget    # elements of minimum size 0 this decode may still build
    bint trusted
    bint copy
    PyObject *buf       # borrowed: the caller's buffer object
    PyObject *mv        # owned, made on first use: a flat 'B' memoryview of buf


cdef int utf8_fail(Py_ssize_t q, int what) except -1:
    """Turn the pending UnicodeDecodeError into a UTF8 KilnError at q + start."""
    cdef PyObject *t = NULL
    cdef PyObject *v = NULL
    cdef PyObject *tb = NULL
    PyErr_Fetch(&t, &v, &tb)
    PyErr_NormalizeException(&t, &v, &tb)
    if v == NULL or not PyErr_GivenExceptionMatches(v, PyExc_UnicodeDecodeError):
        PyErr_Restore(t, v, tb)
        return -1
    ex = <object>v
    Py_XDECREF(t)
    Py_XDECREF(v)
    Py_XDECREF(tb)
    if what == WHAT_KEY:
        kfail("UTF8", q + ex.start, "invalid UTF-8 in key (%s)" % ex.reason)
    kfail("UTF8", q + ex.start, "invalid UTF-8 (%s)" % ex.reason)
    return -1


cdef inline object dec_text(DCtx *c, Py_ssize_t q, Py_ssize_t ln, int what):
    return dec_text_at(c, <const char *>c.d + q, q, ln, what)


cdef inline object dec_text_at(DCtx *c, const char *src, Py_ssize_t q, Py_ssize_t ln, int what):
    """Decode ``ln`` bytes at ``src``; errors are reported at input offset ``q``."""
    cdef PyObject *r
    if c.trusted:
        r = PyUnicode_DecodeUTF8_raw(src, ln, "surrogateescape")
    else:
        r = PyUnicode_DecodeUTF8_raw(src, ln, NULL)
    if r == NULL:
        utf8_fail(q, what)
        return None
    return _take(r)


cdef inline object dec_scalar(int op, DCtx *c):
    cdef Py_ssize_t p = c.pos
    cdef int w = SW[op]
    cdef const uint8_t *q
    cdef uint8_t b0
    if KILN_UNLIKELY(c.n - p < w):
        eof_fail(p, w, c.n)
        return None
    q = c.d + p
    if op == OP_BOOL:
        b0 = q[0]  # read once: the input may change under us
        if b0 > 1:
            kfail("TYPE", p, "bool byte is %d, not 0 or 1" % b0)
        c.pos = p + 1
        return True if b0 else False
    c.pos = p + w
    if op == OP_I64:
        return PyLong_FromLongLong(<int64_t>kiln_ld_u64(q))
    elif op == OP_F64:
        return PyFloat_FromDouble(kiln_ld_f64(q))
    elif op == OP_I32:
        return PyLong_FromLong(<int>kiln_ld_u32(q))
    elif op == OP_U32:
        return PyLong_FromUnsignedLong(kiln_ld_u32(q))
    elif op == OP_F32:
        return PyFloat_FromDouble(<double>kiln_ld_f32(q))
    elif op == OP_U64:
        return PyLong_FromUnsignedLongLong(kiln_ld_u64(q))
    elif op == OP_I16:
        return PyLong_FromLong(<short>kiln_ld_u16(q))
    elif op == OP_U16:
        return PyLong_FromLong(kiln_ld_u16(q))
    elif op == OP_I8:
        return PyLong_FromLong(<signed char>q[0])
    elif op == OP_U8:
        return PyLong_FromLong(q[0])
    return None  # not reached: every scalar op is handled above


cdef object dec_str(DCtx *c):
    cdef uint32_t ln = 0
    cdef Py_ssize_t p = c.pos
    cdef int st = count_rule(c.d, c.n, p, c.max_bytes, 1, &ln)
    if KILN_UNLIKELY(st != 0):
        count_fail(st, WHAT_STR, p, ln, c.max_bytes, 1, c.n)
    c.pos = p + 4 + ln
    return dec_text(c, p + 4, ln, WHAT_STR)


cdef object dec_bytes(DCtx *c):
    cdef uint32_t ln = 0
    cdef Py_ssize_t p = c.pos
    cdef int st = count_rule(c.d, c.n, p, c.bytes_cap, 1, &ln)
    if KILN_UNLIKELY(st != 0):
        count_fail(st, WHAT_COUNT, p, ln, c.bytes_cap, 1, c.n,
                   "max_bytes" if c.max_bytes < c.max_count else "max_count")
    c.pos = p + 4 + ln
    return PyBytes_FromStringAndSize(<const char *>c.d + p + 4, ln)


cdef extern from *:
    """
    /* numpy's C-API table, read at run time from numpy's _ARRAY_API capsule
       (no numpy headers at build time).  Slot 0 is PyArray_GetNDArrayCVersion,
       slot 2 &PyArray_Type, slot 94 PyArray_NewFromDescr: the same slots for
       numpy 1.x and 2.x.  Used only after kiln_np_setup's checks pass. */
    typedef unsigned int (*kiln_npver_t)(void);
    typedef PyObject *(*kiln_npnew_t)(PyTypeObject *, PyObject *, int, Py_ssize_t *,
                                      Py_ssize_t *, void *, int, PyObject *);
    static void **kiln_np_api = NULL;
    static unsigned int kiln_np_abi(void) { return ((kiln_npver_t)kiln_np_api[0])(); }
    static void *kiln_np_type(void) { return kiln_np_api[2]; }
    static PyObject *kiln_np_new(PyObject *descr, Py_ssize_t n) {
        Py_INCREF(descr);  /* PyArray_NewFromDescr steals the descriptor */
        return ((kiln_npnew_t)kiln_np_api[94])((PyTypeObject *)kiln_np_api[2], descr, 1, &n,
                                               NULL, NULL, 0, NULL);
    }
    /* PyArrayObject_fields: the data pointer follows PyObject_HEAD */
    static char *kiln_np_data(PyObject *a) { return *(char **)((char *)a + sizeof(PyObject)); }
    /* The head of PyArrayObject_fields (numpy's public, ABI-stable layout in
       1.x and 2.x).  kiln_np_plain_1d: is `a` a 1-D C-contiguous array whose
       descriptor is exactly `descr`?  Then its data and length, without the
       buffer protocol's bookkeeping.  Checked against the buffer protocol in
       _np_setup before it is ever used. */
    typedef struct {
        PyObject_HEAD
        char *data;
        int nd;
        Py_ssize_t *dimensions;
        Py_ssize_t *strides;
        PyObject *base;
        PyObject *descr;
        int flags;
    } kiln_np_head;
    static int kiln_np_plain_1d(PyObject *a, PyObject *descr, char **data, Py_ssize_t *n) {
        kiln_np_head *h = (kiln_np_head *)a;
        if (h->descr != descr || h->nd != 1 || !(h->flags & 0x0001)) return 0;
        *data = h->data;
        *n = h->dimensions[0];
        return 1;
    }
    """
    void **kiln_np_api
    unsigned int kiln_np_abi()
    void *kiln_np_type()
    object kiln_np_new(object descr, Py_ssize_t n)
    char *kiln_np_data(object a)
    int kiln_np_plain_1d(object a, object descr, char **data, Py_ssize_t *n)

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


cdef object dec_pod(Node nd, DCtx *c):
    cdef uint32_t cnt = 0
    cdef Py_ssize_t p = c.pos
    cdef Py_ssize_t q
    cdef int w = nd.width
    cdef int64_t bad
    cdef int st = count_rule(c.d, c.n, p, c.max_count, w, &cnt)
    cdef const uint8_t *src
    cdef char *dst
    cdef size_t nbytes
    if KILN_UNLIKELY(st != 0):
        count_fail(st, WHAT_COUNT, p, cnt, c.max_count, w, c.n)
    q = p + 4
    src = c.d + q
    nbytes = <size_t>cnt * <size_t>w
    arr = new_array(nd.dt_big if _force_swap else nd.dt_native, cnt, &dst)
    if cnt:
        if (KILN_HOST_BIG_ENDIAN or _force_swap) and w > 1:
            if nbytes > 262144:
                with nogil:
                    kiln_swap_copy(dst, src, cnt, w)
            else:
                kiln_swap_copy(dst, src, cnt, w)
        elif nbytes > 262144:
            with nogil:
                memcpy(dst, src, nbytes)
        else:
            memcpy(dst, src, nbytes)
        if nd.elem_op == OP_BOOL:
            # checked in the copy, so the bytes checked are the bytes returned
            bad = kiln_first_bad_bool(<const uint8_t *>dst, cnt)
            if bad >= 0:
                kfail("TYPE", q + bad, "bool byte is %d, not 0 or 1" % (<uint8_t *>dst)[bad])
    c.pos = q + <Py_ssize_t>nbytes
    return arr


cdef object dec_list(Node nd, DCtx *c):
    cdef uint32_t cnt = 0
    cdef uint32_t i
    cdef Py_ssize_t p = c.pos
    cdef int st = count_rule(c.d, c.n, p, c.max_count, nd.elem_min, &cnt)
    cdef Node elem = nd.elem
    if KILN_UNLIKELY(st != 0):
        count_fail(st, WHAT_COUNT, p, cnt, c.max_count, nd.elem_min, c.n)
    if nd.elem_min == 0:
        # the input's bytes do not bound these elements: one budget for the value
        if cnt > c.zbudget:
            zero_budget_fail(p, cnt, c.zbudget, c.max_count)
        c.zbudget -= cnt
    c.pos = p + 4
    lst = PyList_New(cnt)
    if elem.op == OP_STR:
        for i in range(cnt):
            v = dec_str(c)
            Py_INCREF(v)
            PyList_SET_ITEM(lst, i, <PyObject *>v)
    elif elem.op == OP_STRUCT:
        for i in range(cnt):
            v = dec_struct(elem, c)
            Py_INCREF(v)
            PyList_SET_ITEM(lst, i, <PyObject *>v)
    else:
        for i in range(cnt):
            v = dec(elem, c)
            Py_INCREF(v)
            PyList_SET_ITEM(lst, i, <PyObject *>v)
    return lst


cdef struct KeyBuf:
    uint8_t *p
    size_t cap
    uint32_t ln


cdef int keybuf_take(KeyBuf *k, const uint8_t *src, uint32_t ln) except -1:
    """Copy a key's bytes out of the input (grown on demand; freed by the caller)."""
    cdef uint8_t *np
    if ln > k.cap:
        np = <uint8_t *>PyMem_Realloc(k.p, ln)
        if np == NULL:
            raise MemoryError()
        k.p = np
        k.cap = ln
    if ln:
        memcpy(k.p, src, ln)
    k.ln = ln
    return 0


cdef object dec_dict(Node nd, DCtx *c):
    cdef uint32_t cnt = 0
    cdef uint32_t i
    cdef uint32_t ln = 0
    cdef KeyBuf kb[2]
    cdef KeyBuf *cur
    cdef KeyBuf *prev
    cdef Py_ssize_t p = c.pos
    cdef Py_ssize_t kp, q
    cdef int cmp
    cdef int st = count_rule(c.d, c.n, p, c.max_count, nd.elem_min, &cnt)
    cdef Node elem = nd.elem
    if KILN_UNLIKELY(st != 0):
        count_fail(st, WHAT_COUNT, p, cnt, c.max_count, nd.elem_min, c.n)
    c.pos = p + 4
    out = {}
    memset(kb, 0, sizeof(kb))
    try:
        for i in range(cnt):
            kp = c.pos
            st = count_rule(c.d, c.n, kp, c.max_bytes, 1, &ln)
            if KILN_UNLIKELY(st != 0):
                count_fail(st, WHAT_KEY, kp, ln, c.max_bytes, 1, c.n)
            q = kp + 4
            # one copy of the key: its order is checked on the bytes it is decoded
            # from, even if the input changes under us
            cur = &kb[i & 1]
            prev = &kb[(i & 1) ^ 1]
            keybuf_take(cur, c.d + q, ln)
            key = dec_text_at(c, <const char *>cur.p, q, ln, WHAT_KEY)
            if i:
                cmp = memcmp(prev.p, cur.p, prev.ln if prev.ln < ln else ln) \
                    if prev.ln and ln else 0
                if cmp > 0 or (cmp == 0 and prev.ln >= ln):
                    kfail("TYPE", kp, "dict key %r is not after the previous key" % key)
            c.pos = q + ln
            v = dec(elem, c)
            PyDict_SetItem(out, key, v)
    finally:
        PyMem_Free(kb[0].p)
        PyMem_Free(kb[1].p)
    return out


cdef object dec_struct(Node nd, DCtx *c):
    cdef Py_ssize_t i
    cdef Py_ssize_t nf = nd.nf
    cdef FieldInfo *fi = nd.finfo
    cdef int fop
    if nd.make is None:
        out = {}
        for i in range(nf):
            fop = fi[i].op
            if fop <= OP_F64:
                v = dec_scalar(fop, c)
            elif fop == OP_STR:
                v = dec_str(c)
            else:
                v = dec(<Node>fi[i].node, c)
            PyDict_SetItem(out, <object>fi[i].name, v)
        return out
    vals = PyTuple_New(nf)
    for i in range(nf):
        fop = fi[i].op
        if fop <= OP_F64:
            v = dec_scalar(fop, c)
        elif fop == OP_STR:
            v = dec_str(c)
        else:
            v = dec(<Node>fi[i].node, c)
        Py_INCREF(v)
        PyTuple_SET_ITEM(vals, i, <PyObject *>v)
    return nd.make(*vals)


cdef object ctx_mv(DCtx *c):
    if c.mv == NULL:
        mv = _as_bytes_view(<object>c.buf)
        Py_INCREF(mv)
        c.mv = <PyObject *>mv
    return <object>c.mv


cdef object dec_tensors(Node nd, DCtx *c, bint standalone):
    cdef Py_ssize_t p = c.pos
    cdef Py_ssize_t end = 0
    cdef uint64_t base = 0
    table = vdir(c.d, c.n, p, standalone, c.trusted, c.max_count, c.max_bytes, c.copy, True,
                 &end, &base)
    mv = ctx_mv(c)
    res = nd.hooks.build(mv, p, base, table, c.copy, c.trusted)
    c.pos = end
    return res


cdef object dec(Node nd, DCtx *c):
    cdef int op = nd.op
    cdef Py_ssize_t p
    cdef uint8_t pres
    if op <= OP_F64:
        return dec_scalar(op, c)
    if op == OP_STR:
        return dec_str(c)
    if op == OP_STRUCT:
        return dec_struct(nd, c)
    if op == OP_PODLIST:
        return dec_pod(nd, c)
    if op == OP_LIST:
        return dec_list(nd, c)
    if op == OP_OPT:
        p = c.pos
        if p >= c.n:
            eof_fail(p, 1, c.n)
        pres = c.d[p]  # read once: the input may change under us
        if pres == 0:
            c.pos = p + 1
            return None
        if pres != 1:
            kfail("TYPE", p, "optional presence byte is %d, not 0 or 1" % pres)
        c.pos = p + 1
        r = dec(nd.elem, c)
        if nd.elem.op == OP_OPT and (r is None or type(r) is _Some):
            return _Some(r)  # present, and the inner optional is empty: keep the level
        return r
    if op == OP_BYTES:
        return dec_bytes(c)
    if op == OP_DICT:
        return dec_dict(nd, c)
    if op == OP_TENSORS:
        return dec_tensors(nd, c, False)
    raise AssertionError("unknown op %r" % op)


cdef Py_ssize_t frame_check(const uint8_t *b, Py_ssize_t n, bint hash_ok,
                            uint64_t want) except -1:
    cdef int i
    cdef uint64_t h
    if n < 4:
        kfail("EOF", 0, "a frame needs 16 bytes, the buffer has %d" % n)
    if memcmp(b, b"KLN0", 4) != 0:
        kfail("FRAME", 0, "frame magic is %r, not b'KLN0'" % ((<const char *>b)[:4],))
    if n < 16:
        kfail("EOF", 0, "a frame needs 16 bytes, the buffer has %d" % n)
    if b[4] != 0:
        kfail("FRAME", 4, "frame profile is %d, not 0 (Frozen)" % b[4])
    if b[5] != 0:
        kfail("FRAME", 5, "frame flags are %d, not 0" % b[5])
    for i in range(6, 8):
        if b[i] != 0:
            kfail("FRAME", i, "reserved frame byte is %d, not 0" % b[i])
    h = kiln_ld_u64(b + 8)
    if not hash_ok or h != want:
        kfail("SCHEMA", 8, "frame schema hash %#018x does not match the type's %#018x"
              % (h, want))
    return 16


cdef class DecodeProgram:
    """A plan compiled for decoding with fixed options."""
    cdef readonly object plan
    cdef readonly object frame_hash
    cdef readonly bint trusted
    cdef readonly object max_count
    cdef readonly object max_bytes
    cdef readonly bint copy
    cdef Node root
    cdef bint framed
    cdef bint hash_ok
    cdef uint64_t hash
    cdef uint64_t cmax_count
    cdef uint64_t cmax_bytes
    cdef bint top_tensors

    def __init__(self, plan, frame_hash, trusted, max_count, max_bytes, copy):
        self.plan = plan
        self.frame_hash = frame_hash
        self.trusted = bool(trusted)
        self.max_count = int(max_count)
        self.max_bytes = int(max_bytes)
        self.copy = bool(copy)
        self.cmax_count = _cap(self.max_count)
        self.cmax_bytes = _cap(self.max_bytes)
        self.framed = frame_hash is not None
        if self.framed:
            fh = int(frame_hash)
            self.hash_ok = 0 <= fh <= 0xFFFFFFFFFFFFFFFF
            self.hash = <uint64_t>fh if self.hash_ok else 0
        self.root = compile_node(plan)
        self.top_tensors = self.root.op == OP_TENSORS

    def decode(self, buf):
        """Decode one value that fills the whole of ``buf`` (any contiguous buffer)."""
        cdef Py_buffer view
        cdef DCtx c
        get_view(buf, &view)
        c.d = <const uint8_t *>view.buf
        c.n = view.len
        c.pos = 0
        c.max_count = self.cmax_count
        c.max_bytes = self.cmax_bytes
        c.bytes_cap = self.cmax_count if self.cmax_count < self.cmax_bytes else self.cmax_bytes
        c.zbudget = self.cmax_count
        c.trusted = self.trusted
        c.copy = self.copy
        c.buf = <PyObject *>buf
        c.mv = NULL
        try:
            if self.framed:
                c.pos = frame_check(c.d, c.n, self.hash_ok, self.hash)
            if self.top_tensors:
                return dec_tensors(self.root, &c, True)
            v = dec(self.root, &c)
            if c.pos != c.n:
                kfail("TRAILING", c.pos, "%d bytes follow the value" % (c.n - c.pos))
            return v
        finally:
            Py_XDECREF(c.mv)
            PyBuffer_Release(&view)


def compile_decoder(plan, frame_hash, trusted, max_count, max_bytes, copy):
    """Compile ``plan`` into a decode program (see kiln._kernels_py)."""
    return DecodeProgram(plan, frame_hash, trusted, max_count, max_bytes, copy)


def check_frame(mv, expected_hash):
    """Check the 16-byte frame at the start of ``mv``; returns 16."""
    cdef Py_buffer view
    eh = int(expected_hash)
    ok = 0 <= eh <= 0xFFFFFFFFFFFFFFFF
    get_view(mv, &view)
    try:
        return frame_check(<const uint8_t *>view.buf, view.len, ok, <uint64_t>eh if ok else 0)
    finally:
        PyBuffer_Release(&view)


def check_count(buf, pos, cap, min_size, capname="max_count"):
    """Read the u32 count at ``pos`` and apply the five-step allocation rule."""
    cdef Py_buffer view
    cdef uint32_t c = 0
    cdef int st
    cdef uint64_t ccap, m
    cdef Py_ssize_t p
    if pos < 0 or cap < 0 or min_size < 0 or min_size > 0xFFFFFFFFFFFFFFFF:
        return _py.check_count(buf, pos, cap, min_size, capname)
    ccap = _cap(cap)
    m = <uint64_t>min_size
    get_view(buf, &view)
    try:
        p = pos
        st = count_rule(<const uint8_t *>view.buf, view.len, p, ccap, m, &c)
        if st:
            count_fail(st, WHAT_COUNT, p, c, ccap, m, view.len, str(capname))
        return c
    finally:
        PyBuffer_Release(&view)


# --- encoding ----------------------------------------------------------------

cdef struct Seg:
    int kind            # 0: list index, 1: dict key (owned), 2: struct field name (borrowed)
    Py_ssize_t index
    PyObject *obj


cdef struct Writer:
    PyObject *obj       # bytes (owned, encode) or bytearray (borrowed, encode_into)
    char *data
    Py_ssize_t pos
    Py_ssize_t cap
    bint is_bytes
    int depth
    Seg segs[192]


cdef int w_grow(Writer *w, Py_ssize_t extra) except -1:
    cdef Py_ssize_t need, newcap
    if extra > PY_SSIZE_T_MAX - w.pos:
        raise MemoryError()
    need = w.pos + extra
    if w.cap < PY_SSIZE_T_MAX // 2:
        newcap = w.cap * 2
    else:
        newcap = PY_SSIZE_T_MAX
    if newcap < need:
        newcap = need
    if newcap < 256:
        newcap = 256
    if w.is_bytes:
        _PyBytes_Resize(&w.obj, newcap)   # on failure w.obj is NULL (released)
        w.data = PyBytes_AS_STRING(w.obj)
    else:
        PyByteArray_Resize(w.obj, newcap)
        w.data = PyByteArray_AS_STRING(w.obj)
    w.cap = newcap
    return 0


cdef inline int w_reserve(Writer *w, Py_ssize_t extra) except -1:
    """Make room for ``extra`` bytes at w.pos.  No Python code may run between
    this call and the writes it makes room for."""
    if not w.is_bytes:
        # user code may have touched the caller's bytearray since the last write
        if PyByteArray_GET_SIZE(w.obj) != w.cap:
            raise RuntimeError("the bytearray changed size while encode_into was writing it")
        w.data = PyByteArray_AS_STRING(w.obj)
    if KILN_UNLIKELY(extra > w.cap - w.pos):
        return w_grow(w, extra)
    return 0


cdef inline int w_bytes(Writer *w, const void *p, Py_ssize_t n) except -1:
    w_reserve(w, n)
    if n:
        memcpy(w.data + w.pos, p, n)
    w.pos += n
    return 0


cdef inline void seg_pop(Writer *w) noexcept:
    cdef Seg *s
    w.depth -= 1
    if w.depth < MAXSEG:
        s = &w.segs[w.depth]
        if s.kind == 1:
            Py_XDECREF(s.obj)
            s.obj = NULL


cdef int fix_path(Writer *w, object e) except -1:
    """On an error: prepend the recorded path to an EncodeError; drop owned refs."""
    cdef int i, top = w.depth if w.depth < MAXSEG else MAXSEG
    cdef Seg *s
    parts = []
    for i in range(top):
        s = &w.segs[i]
        if s.kind == 0:
            parts.append("[%d]" % s.index)
        elif s.kind == 1:
            parts.append("[%r]" % (<object>s.obj,))
        else:
            parts.append("." + <object>s.obj)
    for i in range(top):
        s = &w.segs[i]
        if s.kind == 1:
            Py_XDECREF(s.obj)
            s.obj = NULL
    w.depth = 0
    if parts and isinstance(e, EncodeError):
        e.add_path("".join(parts))
    return 0


cdef int scalar_fail(Node nd, Writer *w, object v) except -1:
    raise _scalar_error(v, nd.op, nd.text, w.pos)


cdef object index_or_none(object v):
    try:
        return PyNumber_Index(v)
    except (TypeError, OverflowError, ValueError):
        return None


cdef int enc_int(Node nd, Writer *w, object v) except -1:
    cdef long long x
    cdef unsigned long long ux
    cdef int of = 0
    cdef int op = nd.op
    cdef object iv
    if PyLong_Check(v):
        iv = v
    else:
        iv = index_or_none(v)
        if iv is None:
            return scalar_fail(nd, w, v)
    if op == OP_U64:
        ux = PyLong_AsUnsignedLongLong(<PyObject *>iv)
        if ux == <unsigned long long>-1 and PyErr_Occurred() != NULL:
            PyErr_Clear()
            return scalar_fail(nd, w, v)
        w_reserve(w, 8)
        kiln_st_u64(w.data + w.pos, ux)
        w.pos += 8
        return 0
    x = PyLong_AsLongLongAndOverflow(<PyObject *>iv, &of)
    if of:
        return scalar_fail(nd, w, v)
    if x == -1 and PyErr_Occurred() != NULL:  # pragma: no cover - an int always converts
        return -1
    if op != OP_I64 and (x < INT_LO[op] or x > INT_HI[op]):
        return scalar_fail(nd, w, v)
    w_put_le(w, <uint64_t>x, SW[op])
    return 0


cdef inline void st_le(char *q, uint64_t x, int width) noexcept nogil:
    """Store the low ``width`` bytes of ``x`` at ``q``, little-endian."""
    if width == 8:
        kiln_st_u64(q, x)
    elif width == 4:
        kiln_st_u32(q, <uint32_t>x)
    elif width == 2:
        kiln_st_u16(q, <uint16_t>x)
    else:
        q[0] = <char>(<uint8_t>x)


cdef inline int w_put_le(Writer *w, uint64_t x, int width) except -1:
    """Append the low ``width`` bytes of ``x``, little-endian."""
    w_reserve(w, width)
    st_le(w.data + w.pos, x, width)
    w.pos += width
    return 0


cdef int enc_float(Node nd, Writer *w, object v) except -1:
    cdef double x
    cdef float y
    if PyFloat_CheckExact(<PyObject *>v):
        x = PyFloat_AS_DOUBLE(<PyObject *>v)
    else:
        x = PyFloat_AsDouble(v)
        if x == -1.0 and PyErr_Occurred() != NULL:
            PyErr_Clear()
            return scalar_fail(nd, w, v)
    if nd.op == OP_F64:
        w_reserve(w, 8)
        kiln_st_f64(w.data + w.pos, x)
        w.pos += 8
        return 0
    y = <float>x
    if isinf(y) and not isinf(x):
        return scalar_fail(nd, w, v)
    w_reserve(w, 4)
    kiln_st_f32(w.data + w.pos, y)
    w.pos += 4
    return 0


cdef int enc_bool(Writer *w, object v) except -1:
    cdef char b = 0
    if v is True:
        b = 1
    elif v is False:
        b = 0
    elif type(v) is _np_bool:
        b = 1 if v else 0
    else:
        efail("TYPE", w.pos, "expected bool, got %s" % type(v).__name__)
    w_reserve(w, 1)
    w.data[w.pos] = b
    w.pos += 1
    return 0


cdef object utf8_of(object u, const char **p, Py_ssize_t *ln, Py_ssize_t pos, str what):
    """Point ``p``/``ln`` at the UTF-8 bytes of str ``u``; returns what keeps them
    alive (None when the ASCII data of ``u`` itself is used)."""
    if PyUnicode_IS_COMPACT_ASCII(u):
        p[0] = <const char *>PyUnicode_DATA(u)
        ln[0] = PyUnicode_GET_LENGTH(u)
        return None
    try:
        b = PyUnicode_AsUTF8String(u)
    except UnicodeEncodeError as ex:
        raise EncodeError("UTF8", pos, "%s has no UTF-8 form (%s)" % (what, ex.reason)) from None
    p[0] = PyBytes_AS_STRING(<PyObject *>b)
    ln[0] = PyBytes_GET_SIZE(<PyObject *>b)
    return b


cdef int enc_str(Writer *w, object v) except -1:
    cdef const char *p
    cdef Py_ssize_t ln
    cdef object b
    if not PyUnicode_Check(v):
        efail("TYPE", w.pos, "expected str, got %s" % type(v).__name__)
    b = utf8_of(v, &p, &ln, w.pos, "string")
    if <uint64_t>ln > U32_MAX:
        efail("LIMIT", w.pos, "string of %d bytes exceeds u32" % ln)
    w_reserve(w, 4 + ln)
    kiln_st_u32(w.data + w.pos, <uint32_t>ln)
    memcpy(w.data + w.pos + 4, p, ln)
    w.pos += 4 + ln
    return 0


cdef int enc_bytes(Writer *w, object v) except -1:
    cdef Py_buffer view
    cdef object run
    if PyBytes_CheckExact(v):
        run = v
    elif PyByteArray_CheckExact(v):
        run = v
    else:
        run = _as_byte_run(v, w.pos)
    PyObject_GetBuffer(run, &view, PyBUF_SIMPLE)
    try:
        if <uint64_t>view.len > U32_MAX:
            efail("LIMIT", w.pos, "byte run of %d exceeds u32" % view.len)
        w_reserve(w, 4 + view.len)
        kiln_st_u32(w.data + w.pos, <uint32_t>view.len)
        if view.len:
            memcpy(w.data + w.pos + 4, view.buf, view.len)
        w.pos += 4 + view.len
    finally:
        PyBuffer_Release(&view)
    return 0


cdef int pod_store(int op, char *q, PyObject *o, bint loose) except -1:
    """Store one list item at ``q`` in wire form.

    Returns 1 when stored, 0 when the item needs the numpy path.  With
    ``loose`` false only exact ints / floats / bools are taken and no Python
    code runs.  With ``loose`` true the item is converted the way struct.pack
    converts it (the reference kernel packs short lists with struct): ints and
    bools and ``__index__`` objects for integer ops, anything
    ``PyFloat_AsDouble`` takes for float ops; conversion errors struct reports
    mean 0, any other exception propagates.
    """
    cdef long long x
    cdef unsigned long long ux
    cdef int of = 0
    cdef double f
    cdef float y
    cdef object iv
    if op == OP_F64 or op == OP_F32:
        if PyFloat_CheckExact(o):
            f = PyFloat_AS_DOUBLE(o)
        elif not loose:
            return 0
        else:
            f = PyFloat_AsDouble(<object>o)
            if f == -1.0 and PyErr_Occurred() != NULL:
                PyErr_Clear()   # struct turns every failure here into struct.error
                return 0
        if op == OP_F64:
            kiln_st_f64(q, f)
            return 1
        y = <float>f
        if isinf(y) and not isinf(f):
            return 0
        kiln_st_f32(q, y)
        return 1
    if op == OP_BOOL:
        if o == <PyObject *>True:
            q[0] = 1
        elif o == <PyObject *>False:
            q[0] = 0
        else:
            return 0
        return 1
    if PyLong_CheckExact(o):
        iv = <object>o
    elif not loose:
        return 0
    elif PyLong_Check(<object>o):
        iv = <object>o
    else:
        iv = index_or_none(<object>o)
        if iv is None:
            return 0
    x = PyLong_AsLongLongAndOverflow(<PyObject *>iv, &of)
    if op == OP_U64:
        if of < 0 or (of == 0 and x < 0):
            return 0
        if of > 0:
            if not loose:
                # numpy reads ints >= 2**63 next to smaller ones as float64:
                # leave them to as_pod_array
                return 0
            ux = PyLong_AsUnsignedLongLong(<PyObject *>iv)
            if ux == <unsigned long long>-1 and PyErr_Occurred() != NULL:
                PyErr_Clear()
                return 0
        else:
            ux = <unsigned long long>x
        kiln_st_u64(q, ux)
        return 1
    if of:
        return 0
    if op != OP_I64 and (x < INT_LO[op] or x > INT_HI[op]):
        return 0
    st_le(q, <uint64_t>x, SW[op])
    return 1


cdef int pod_fast_seq(Node nd, Writer *w, object seq, Py_ssize_t n) except -1:
    """Write a list/tuple of Python scalars straight to the output.

    Returns 1 when done, 0 when the caller must take the numpy path (nothing
    is written then).  An exact list of at most 64 items of a non-bool op
    follows struct.pack's conversions (the reference kernel's short-list
    path); other sequences take only exact scalars, where the result equals
    as_pod_array's.
    """
    cdef int op = nd.elem_op
    cdef int w8 = nd.width
    cdef Py_ssize_t i, j
    cdef PyObject *o
    cdef PyObject *snap[64]
    cdef char *q
    cdef int r = 1
    cdef bint is_list = PyList_CheckExact(seq)
    cdef bint loose = is_list and n <= 64 and op != OP_BOOL
    if <uint64_t>n > U32_MAX:
        return 0
    w_reserve(w, 4 + n * w8)
    q = w.data + w.pos + 4
    i = 0
    while i < n:
        o = PyList_GET_ITEM(seq, i) if is_list else PyTuple_GET_ITEM(seq, i)
        if not pod_store(op, q, o, False):
            break
        q += w8
        i += 1
    if i < n:
        if not loose:
            return 0
        # the rest may run Python code (__index__, __float__): convert a
        # snapshot of the items, as struct.pack(n, *v) does, into a scratch
        # area that stays valid whatever that code does
        for j in range(n):
            snap[j] = PyList_GET_ITEM(seq, j)
            Py_INCREF(<object>snap[j])
        try:
            scratch = PyBytes_FromStringAndSize(NULL, (n - i) * w8)
            q = PyBytes_AS_STRING(<PyObject *>scratch)
            for j in range(i, n):
                if not pod_store(op, q, snap[j], True):
                    r = 0
                    break
                q += w8
        finally:
            for j in range(n):
                Py_DECREF(<object>snap[j])
        if not r:
            return 0
        w_reserve(w, 4 + n * w8)
        memcpy(w.data + w.pos + 4 + i * w8, PyBytes_AS_STRING(<PyObject *>scratch),
               (n - i) * w8)
    kiln_st_u32(w.data + w.pos, <uint32_t>n)
    w.pos += 4 + n * w8
    return 1


cdef int w_pod_run(Writer *w, const char *src, Py_ssize_t c, int width, bint swap) except -1:
    """Write the count and ``c`` elements of ``width`` bytes from ``src``, as
    they are or byte-swapped into the wire's order."""
    if <uint64_t>c > U32_MAX:
        efail("LIMIT", w.pos, "list of %d exceeds u32" % c)
    w_reserve(w, 4 + c * width)
    kiln_st_u32(w.data + w.pos, <uint32_t>c)
    if swap:
        kiln_swap_copy(w.data + w.pos + 4, src, c, width)
    elif c:
        memcpy(w.data + w.pos + 4, src, c * width)
    w.pos += 4 + c * width
    return 0


cdef int enc_pod_buffer(Writer *w, object v, int width) except -1:
    """Copy a 1-D C-contiguous array of the wire dtype; 0 when it is not one."""
    cdef Py_buffer view
    try:
        PyObject_GetBuffer(v, &view, PyBUF_C_CONTIGUOUS | PyBUF_ND)
    except (BufferError, ValueError, TypeError):
        return 0  # not C-contiguous: the general path copies it
    try:
        if view.ndim != 1:
            return 0
        w_pod_run(w, <const char *>view.buf, view.len // width, width, False)
    finally:
        PyBuffer_Release(&view)
    return 1


cdef int enc_pod(Node nd, Writer *w, object v) except -1:
    cdef Py_buffer view
    cdef Py_ssize_t c
    cdef char *src
    cdef int width = nd.width
    cdef bint swap = False
    cdef int done
    if PyList_CheckExact(v):
        # the list's lock (free-threaded builds; nothing with the GIL) keeps
        # its items alive while borrowed
        with cython.critical_section(v):
            done = pod_fast_seq(nd, w, v, PyList_GET_SIZE(v))
        if done:
            return 0
    elif PyTuple_CheckExact(v):
        if pod_fast_seq(nd, w, v, PyTuple_GET_SIZE(v)):
            return 0
    if type(v) is _np_ndarray:
        # already the wire's bits: one copy, whatever the host (bool arrays
        # hold 0/1).  With the GIL nothing can resize the array between
        # reading its head and the copy; a free-threaded build takes a buffer
        # export instead, which blocks a resize meanwhile.
        if _np_fast and not KILN_FREE_THREADED and \
                kiln_np_plain_1d(v, nd.dt_le, &src, &c):
            return w_pod_run(w, src, c, width, False)
        if v.dtype == nd.dt_le and enc_pod_buffer(w, v, width) == 1:
            return 0
    if width > 1 and type(v) is _np_ndarray and v.ndim == 1 and v.dtype == nd.dt_big:
        # a big-endian array (host order on a big-endian host): swap it into the wire
        arr = _np_ascontig(v)
        swap = True
    else:
        arr = as_pod_array(v, nd.elem_op, w.pos)
    PyObject_GetBuffer(arr, &view, PyBUF_SIMPLE)
    try:
        w_pod_run(w, <const char *>view.buf, view.len // width, width, swap)
    finally:
        PyBuffer_Release(&view)
    return 0


cdef int enc_list(Node nd, Writer *w, object v) except -1:
    cdef Py_ssize_t c, i, done = 0
    cdef bint more = False
    cdef int d
    cdef PyObject *xp
    cdef Node elem = nd.elem
    cdef bint is_list = PyList_CheckExact(v)
    cdef bint is_tuple = (not is_list) and PyTuple_CheckExact(v)
    if not (is_list or is_tuple):
        if isinstance(v, (str, bytes, bytearray, dict)) or not hasattr(v, "__len__"):
            efail("TYPE", w.pos, "expected a sequence for %s, got %s"
                  % (nd.text, type(v).__name__))
    c = len(v)
    if <uint64_t>c > U32_MAX:
        efail("LIMIT", w.pos, "list of %d exceeds u32" % c)
    w_reserve(w, 4)
    kiln_st_u32(w.data + w.pos, <uint32_t>c)
    w.pos += 4
    d = w.depth
    w.depth += 1
    if d < MAXSEG:
        w.segs[d].kind = 0
        w.segs[d].index = 0
        w.segs[d].obj = NULL
    if is_list:
        i = 0
        while True:
            xp = kiln_list_item_ref(v, i)
            if xp == NULL:
                break
            x = <object>xp
            Py_DECREF(x)  # the cast took its own reference
            if done == c:
                more = True
                break
            if d < MAXSEG:
                w.segs[d].index = i
            enc(elem, w, x)
            done += 1
            i += 1
    elif is_tuple:
        for i in range(c):
            if d < MAXSEG:
                w.segs[d].index = i
            enc(elem, w, <object>PyTuple_GET_ITEM(v, i))
            done += 1
    else:
        i = 0
        for x in v:
            if done == c:
                more = True
                break
            if d < MAXSEG:
                w.segs[d].index = i
            enc(elem, w, x)
            done += 1
            i += 1
    seg_pop(w)
    if more or done != c:
        # the count word says c: the items written must be exactly c
        efail("TYPE", w.pos, "len() said %d items but the sequence gave %s (it changed length "
              "while encoding, or its len() is wrong)" % (c, "more" if more else done))
    return 0


cdef struct DEnt:
    PyObject *k         # owned
    PyObject *x         # owned
    PyObject *kb        # owned UTF-8 bytes, or NULL when k's ASCII data is used
    const char *p
    Py_ssize_t ln
    Py_ssize_t idx


cdef inline int cmp_bytes_then_index(const void *p1, Py_ssize_t l1, Py_ssize_t i1,
                                     const void *p2, Py_ssize_t l2, Py_ssize_t i2) noexcept nogil:
    """Order byte strings as Python compares bytes; ties go by index (a stable sort)."""
    cdef Py_ssize_t m = l1 if l1 < l2 else l2
    cdef int r = memcmp(p1, p2, m) if m else 0
    if r:
        return r
    if l1 != l2:
        return -1 if l1 < l2 else 1
    return -1 if i1 < i2 else (1 if i1 > i2 else 0)


cdef int cmp_dent(const void *a, const void *b) noexcept nogil:
    cdef const DEnt *x = <const DEnt *>a
    cdef const DEnt *y = <const DEnt *>b
    return cmp_bytes_then_index(x.p, x.ln, x.idx, y.p, y.ln, y.idx)


cdef int dent_add(DEnt *e, Py_ssize_t idx, object k, object x, Writer *w) except -1:
    """Check the key and fill ``e`` (refs taken only once nothing can fail)."""
    cdef object kb = None
    cdef const char *p
    cdef Py_ssize_t ln
    if not PyUnicode_Check(k):
        efail("TYPE", w.pos, "dict key %r is not a str" % (k,))
    kb = utf8_of(k, &p, &ln, w.pos, "key")
    Py_INCREF(k)
    Py_INCREF(x)
    e.k = <PyObject *>k
    e.x = <PyObject *>x
    if kb is not None:
        Py_INCREF(kb)
        e.kb = <PyObject *>kb
    else:
        e.kb = NULL
    e.p = p
    e.ln = ln
    e.idx = idx
    return 0


cdef int enc_dict(Node nd, Writer *w, object v) except -1:
    cdef DEnt *ents = NULL
    cdef DEnt *grown
    cdef Py_ssize_t n = 0, cap = 0, i, pos = 0
    cdef PyObject *kp
    cdef PyObject *xp
    cdef int d
    cdef Node elem = nd.elem
    try:
        if PyDict_CheckExact(v):
            # PyDict_Next lends its items.  With the GIL nothing in this loop
            # lets other code run; a free-threaded build walks a copy, made in
            # one step under the dict's lock, that no other thread can reach
            src = PyDict_Copy(v) if KILN_FREE_THREADED else v
            cap = PyDict_GET_SIZE(src)
            ents = <DEnt *>PyMem_Malloc(sizeof(DEnt) * (cap + 1))
            if ents == NULL:
                raise MemoryError()
            while PyDict_Next(src, &pos, &kp, &xp):
                if n >= cap:  # pragma: no cover - nothing here can grow the dict
                    raise RuntimeError("dictionary changed size during encoding")
                dent_add(&ents[n], n, <object>kp, <object>xp, w)
                n += 1
        else:
            items = getattr(v, "items", None)
            if items is None:
                efail("TYPE", w.pos, "expected a mapping for %s, got %s"
                      % (nd.text, type(v).__name__))
            for k, x in items():
                if n >= cap:
                    cap = cap * 2 + 8
                    grown = <DEnt *>PyMem_Realloc(ents, sizeof(DEnt) * cap)
                    if grown == NULL:
                        raise MemoryError()
                    ents = grown
                dent_add(&ents[n], n, k, x, w)
                n += 1
        if n > 1:
            qsort(ents, n, sizeof(DEnt), cmp_dent)
        if <uint64_t>n > U32_MAX:
            efail("LIMIT", w.pos, "dict of %d exceeds u32" % n)
        w_reserve(w, 4)
        kiln_st_u32(w.data + w.pos, <uint32_t>n)
        w.pos += 4
        d = w.depth
        w.depth += 1
        if d < MAXSEG:
            w.segs[d].kind = 1
            w.segs[d].obj = NULL
        for i in range(n):
            if i and ents[i].ln == ents[i - 1].ln and \
                    memcmp(ents[i].p, ents[i - 1].p, ents[i].ln) == 0:
                efail("TYPE", w.pos, "the mapping gave the key %r twice" % (<object>ents[i].k,))
            w_reserve(w, 4 + ents[i].ln)
            kiln_st_u32(w.data + w.pos, <uint32_t>ents[i].ln)
            memcpy(w.data + w.pos + 4, ents[i].p, ents[i].ln)
            w.pos += 4 + ents[i].ln
            if d < MAXSEG:
                Py_XDECREF(w.segs[d].obj)
                Py_INCREF(<object>ents[i].k)
                w.segs[d].obj = ents[i].k
            enc(elem, w, <object>ents[i].x)
        seg_pop(w)
    finally:
        for i in range(n):
            Py_XDECREF(ents[i].k)
            Py_XDECREF(ents[i].x)
            Py_XDECREF(ents[i].kb)
        PyMem_Free(ents)
    return 0


cdef tuple struct_values_generic(Node nd, Writer *w, object v):
    # the reference kernel's values_of for objects other than exact dicts
    items = getattr(v, "keys", None)
    if items is None or not hasattr(v, "__getitem__"):
        want = nd.cls.__qualname__ if nd.cls is not None else "a mapping"
        efail("TYPE", w.pos, "expected %s for %s, got %s" % (want, nd.text, type(v).__name__))
    try:
        vals = tuple([v[nm] for nm in nd.names])
    except KeyError:
        missing = [nm for nm in nd.names if nm not in v]
        raise EncodeError("TYPE", w.pos, "missing field %r" % missing[0]) from None
    if len(v) != nd.nf:
        unknown_fields(nd, w, v)
    return vals


cdef int unknown_fields(Node nd, Writer *w, object v) except -1:
    key_set = nd.key_set
    extra = sorted([k for k in v.keys() if k not in key_set])
    efail("TYPE", w.pos, "unknown fields %s for %s" % (extra, nd.text))
    return -1


cdef int enc_struct(Node nd, Writer *w, object v) except -1:
    cdef Py_ssize_t i, nf = nd.nf
    cdef PyObject *o
    cdef FieldInfo *fi = nd.finfo
    cdef int d
    cdef tuple vals
    if nd.cls is not None and PyObject_IsInstance(v, nd.cls):
        g = nd.get(v)
        vals = g if type(g) is tuple else tuple(g)
    elif PyDict_CheckExact(v):
        vals = PyTuple_New(nf)
        for i in range(nf):
            if not kiln_dict_get_ref(v, <object>fi[i].name, &o):
                efail("TYPE", w.pos, "missing field %r" % (<object>fi[i].name,))
            PyTuple_SET_ITEM(vals, i, o)  # steals the owned reference
        if PyDict_GET_SIZE(v) != nf:
            unknown_fields(nd, w, v)
    else:
        vals = struct_values_generic(nd, w, v)
    d = w.depth
    w.depth += 1
    if d < MAXSEG:
        w.segs[d].kind = 2
    for i in range(nf):
        if i >= PyTuple_GET_SIZE(vals):
            raise IndexError("tuple index out of range")
        if d < MAXSEG:
            w.segs[d].obj = fi[i].name
        enc(<Node>fi[i].node, w, <object>PyTuple_GET_ITEM(vals, i))
    seg_pop(w)
    return 0


cdef int enc_tensors(Node nd, Writer *w, object v) except -1:
    cdef Py_ssize_t start = w.pos
    try:
        records = nd.hooks.normalize(v)
    except EncodeError as e:
        e.offset = start
        raise
    if write_dir(w, records):
        write_dir_py(w, records)
    check_written(<const uint8_t *>w.data, w.pos, start)
    return 0


cdef int enc(Node nd, Writer *w, object v) except -1:
    cdef int op = nd.op
    if op == OP_BOOL:
        return enc_bool(w, v)
    if op <= OP_U64:
        return enc_int(nd, w, v)
    if op <= OP_F64:
        return enc_float(nd, w, v)
    if op == OP_STR:
        return enc_str(w, v)
    if op == OP_STRUCT:
        return enc_struct(nd, w, v)
    if op == OP_PODLIST:
        return enc_pod(nd, w, v)
    if op == OP_LIST:
        return enc_list(nd, w, v)
    if op == OP_OPT:
        if v is None:
            w_reserve(w, 1)
            w.data[w.pos] = 0
            w.pos += 1
            return 0
        w_reserve(w, 1)
        w.data[w.pos] = 1
        w.pos += 1
        if type(v) is _Some:
            return enc(nd.elem, w, (<object>v).value)
        return enc(nd.elem, w, v)
    if op == OP_BYTES:
        return enc_bytes(w, v)
    if op == OP_DICT:
        return enc_dict(nd, w, v)
    if op == OP_TENSORS:
        return enc_tensors(nd, w, v)
    raise AssertionError("unknown op %r" % op)


cdef class EncodeProgram:
    """A plan compiled for encoding."""
    cdef readonly object plan
    cdef readonly object frame_hash
    cdef Node root
    cdef bytes prefix
    cdef Py_ssize_t hint

    def __init__(self, plan, frame_hash):
        self.plan = plan
        self.frame_hash = frame_hash
        self.root = compile_node(plan)
        self.prefix = None if frame_hash is None else _py._FRAME.pack(b"KLN0", 0, 0, 0,
                                                                      frame_hash)
        self.hint = 256

    cdef object run(self, object value, bint trim, Py_ssize_t *end):
        """Encode ``value`` into a private bytes object; ``end`` gets its length.

        With ``trim`` the object is cut to that length, else it may be longer.
        The output is private until it is returned, so nothing the value's own
        code does while it is encoded (an ``__index__``, an ``items()``) can
        reach the bytes already written."""
        cdef Writer w
        cdef Py_ssize_t cap0 = self.hint
        w.obj = PyBytes_FromStringAndSize_raw(NULL, cap0)
        if w.obj == NULL:
            raise MemoryError()
        w.data = PyBytes_AS_STRING(w.obj)
        w.cap = cap0
        w.pos = 0
        w.is_bytes = True
        w.depth = 0
        try:
            if self.prefix is not None:
                w_bytes(&w, PyBytes_AS_STRING(<PyObject *>self.prefix), 16)
            enc(self.root, &w, value)
        except BaseException as e:
            fix_path(&w, e)
            Py_XDECREF(w.obj)
            w.obj = NULL
            raise
        # start the next encode at this size: values of one type are often alike.  Not
        # more: a block just above the one freed would make malloc map fresh pages.
        self.hint = 256 if w.pos < 192 else (w.pos + 64 if w.pos < (1 << 26) else (1 << 26))
        end[0] = w.pos
        if trim:
            _PyBytes_Resize(&w.obj, w.pos)  # on failure w.obj is NULL (released)
        return _take(w.obj)

    def encode(self, value):
        """Encode ``value``; returns bytes."""
        cdef Py_ssize_t n = 0
        return self.run(value, True, &n)

    def encode_into(self, value, buffer, offset=0):
        """Write ``value`` into the bytearray ``buffer`` at ``offset`` (-1 appends);
        the buffer is resized to end where the encoding ends; returns that end.

        The value is encoded into private memory first and then copied, so
        the bytes before ``offset`` are kept and nothing is written on error
        (the buffer then ends at ``offset``)."""
        cdef Py_ssize_t off, size, n = 0
        if type(buffer) is not bytearray:
            raise TypeError("encode_into needs a bytearray, not %s" % type(buffer).__name__)
        size = PyByteArray_GET_SIZE(<PyObject *>buffer)
        off = size if offset < 0 else offset
        if off > size:
            PyByteArray_Resize(<PyObject *>buffer, off)
            memset(PyByteArray_AS_STRING(<PyObject *>buffer) + size, 0, off - size)
        elif off < size:
            PyByteArray_Resize(<PyObject *>buffer, off)  # BufferError if it has exports
        try:
            out = self.run(value, False, &n)
        except EncodeError as e:
            e.offset += off  # offsets count from the start of ``buffer``
            raise
        if PyByteArray_GET_SIZE(<PyObject *>buffer) != off:
            raise RuntimeError("the bytearray changed size while encode_into was writing it")
        PyByteArray_Resize(<PyObject *>buffer, off + n)
        memcpy(PyByteArray_AS_STRING(<PyObject *>buffer) + off,
               PyBytes_AS_STRING(<PyObject *>out), n)
        return off + n


def compile_encoder(plan, frame_hash):
    """Compile ``plan`` into an encode program (see kiln._kernels_py)."""
    return EncodeProgram(plan, frame_hash)


# --- tensor directory: validation ------------------------------------------

cdef struct NameRef:
    const uint8_t *p
    uint32_t ln
    uint32_t idx


cdef int cmp_nameref(const void *a, const void *b) noexcept nogil:
    cdef const NameRef *x = <const NameRef *>a
    cdef const NameRef *y = <const NameRef *>b
    return cmp_bytes_then_index(x.p, x.ln, x.idx, y.p, y.ln, y.idx)


cdef struct Range:
    uint64_t off
    uint64_t idx


cdef int cmp_range(const void *a, const void *b) noexcept nogil:
    cdef const Range *x = <const Range *>a
    cdef const Range *y = <const Range *>b
    if x.off != y.off:
        return -1 if x.off < y.off else 1
    return -1 if x.idx < y.idx else (1 if x.idx > y.idx else 0)


cdef object vdir(const uint8_t *b, Py_ssize_t n, Py_ssize_t s, bint standalone, bint trusted,
                 uint64_t max_count, uint64_t max_bytes, bint copy, bint want_table,
                 Py_ssize_t *endp, uint64_t *basep):
    """The directory at ``s`` in the 12-step order of kiln._kernels_py.validate_directory.

    Nothing is allocated before step 5 bounds the descriptor count by the
    buffer, and no Python object is built per descriptor before every check
    has passed.
    """
    cdef Py_ssize_t avail = n - s
    cdef const uint8_t *h
    cdef const uint8_t *dp
    cdef const uint8_t *hp
    cdef uint8_t hdr[64]
    cdef uint8_t *priv = NULL
    cdef uint8_t version, flags
    cdef uint64_t count, name_bytes, payload_bytes, directory_bytes, want, base, block
    cdef uint64_t cursor, noff, nlen, loff, llen, code, rank, ne, blen, need, off, e
    cdef uint64_t block_size, r, want_off, scheme, axis, group, scale, outer, groups, dim
    cdef uint64_t top_end, top_i
    cdef Py_ssize_t heap_end, pb, heap0, a, dpos, k, end = 0
    cdef uint64_t i, j, nr
    cdef int64_t bad
    cdef bint named, opaque, have_top, zero, big
    cdef uint64_t *counts = NULL
    cdef NameRef *refs = NULL
    cdef Range *ranges = NULL
    cdef int w
    # 1. magic and header size
    if avail < 4:
        kfail("EOF", s, "a directory needs 4 bytes for its magic, %d remain" % max(avail, 0))
    h = b + s
    if memcmp(h, b"KLNT", 4) != 0:
        kfail("FRAME", s, "directory magic is %r, not b'KLNT'" % ((<const char *>h)[:4],))
    if avail < 64:
        kfail("EOF", s, "a directory header needs 64 bytes, %d remain" % avail)
    # every header field comes from one private copy: another process or
    # thread changing the input cannot make a checked field differ from a used one
    memcpy(hdr, h, 64)
    h = hdr
    version = h[4]
    flags = h[5]
    count = kiln_ld_u32(h + 8)
    name_bytes = kiln_ld_u32(h + 12)
    payload_bytes = kiln_ld_u64(h + 16)
    directory_bytes = kiln_ld_u64(h + 24)
    # 2. envelope
    if version != 2:
        kfail("FRAME", s + 4, "directory version is %d, not 2" % version)
    if flags & ~3:
        kfail("FRAME", s + 5, "unknown directory flag bits %#x" % (flags & ~3))
    if not flags & 2:
        kfail("FRAME", s + 5, "the little-endian flag is clear")
    for k in range(6, 8):
        if h[k]:
            kfail("FRAME", s + k, "reserved header byte is not 0")
    for k in range(32, 64):
        if h[k]:
            kfail("FRAME", s + k, "reserved header byte is not 0")
    # 3. caps
    if count > max_count:
        kfail("LIMIT", s + 8, "tensor count %d is above the cap max_count=%d" % (count, max_count))
    if name_bytes > max_bytes:
        kfail("LIMIT", s + 12, "name heap of %d bytes is above the cap max_bytes=%d"
              % (name_bytes, max_bytes))
    # 4. directory arithmetic (count < 2**32, so this cannot overflow)
    want = count * 128 + name_bytes
    if directory_bytes != want:
        kfail("TYPE", s + 24, "directory_bytes is %d, count and heap give %d"
              % (directory_bytes, want))
    # 5. the directory fits
    if 64 + want > <uint64_t>avail:
        kfail("EOF", s + 8, "%d descriptors and %d heap bytes need %d bytes, %d remain"
              % (count, name_bytes, 64 + want, avail))
    # 6. the block fits
    base = (64 + want + 63) & ~(<uint64_t>63)
    if kiln_add_u64(base, payload_bytes, &block):
        kfail("LIMIT", s + 16, "payload_base + payload_bytes overflows u64")
    if block > <uint64_t>avail:
        kfail("EOF", s + 16, "the block needs %d bytes, %d remain" % (block, avail))
    # 7. zero padding
    heap_end = s + 64 + <Py_ssize_t>want
    pb = s + <Py_ssize_t>base
    for k in range(heap_end, pb):
        if b[k]:
            kfail("TYPE", k, "padding byte is not 0")
    # the descriptors and the name heap (bounded by step 5) are copied once
    # too, and every descriptor field and name is read from that copy
    priv = <uint8_t *>PyMem_Malloc(<size_t>(64 + want))
    if priv == NULL:
        raise MemoryError()
    memcpy(priv, hdr, 64)
    memcpy(priv + 64, b + s + 64, <size_t>want)
    h = priv
    hp = h + 64 + 128 * count
    try:
        # 8a. descriptor reserved bytes
        for i in range(count):
            dp = h + 64 + 128 * i
            dpos = s + 64 + 128 * <Py_ssize_t>i
            if dp[3]:
                kfail("FRAME", dpos + 3, "reserved descriptor byte is not 0")
            for k in range(112, 128):
                if dp[k]:
                    kfail("FRAME", dpos + k, "reserved descriptor byte is not 0")
        # 8b. names and the heap
        named = (flags & 1) != 0
        if named and count == 0:
            kfail("TYPE", s + 5, "name flag set on an empty directory")
        cursor = 0
        for i in range(count):
            dp = h + 64 + 128 * i
            dpos = s + 64 + 128 * <Py_ssize_t>i
            noff = kiln_ld_u16(dp + 4)
            nlen = kiln_ld_u16(dp + 6)
            if not named:
                if nlen != 0 or noff != 0xFFFF:
                    kfail("TYPE", dpos + 4, "tensor has a name but the name flag is clear")
                continue
            if nlen == 0:
                kfail("TYPE", dpos + 4, "tensor has no name but the name flag is set")
            if noff != cursor or cursor + nlen > name_bytes:
                kfail("TYPE", dpos + 4, "name slice (%d, %d) is not the next %d heap bytes"
                      % (noff, nlen, nlen))
            cursor += nlen
        for i in range(count):
            dp = h + 64 + 128 * i
            dpos = s + 64 + 128 * <Py_ssize_t>i
            loff = kiln_ld_u16(dp + 8)
            llen = kiln_ld_u16(dp + 10)
            if llen == 0:
                if loff != 0xFFFF:
                    kfail("TYPE", dpos + 8, "empty layout name with offset %d" % loff)
                continue
            if loff != cursor or cursor + llen > name_bytes:
                kfail("TYPE", dpos + 8, "layout slice (%d, %d) is not the next heap bytes"
                      % (loff, llen))
            cursor += llen
        if cursor != name_bytes:
            kfail("TYPE", s + 12, "name heap has %d bytes, names use %d" % (name_bytes, cursor))
        heap0 = s + 64 + 128 * <Py_ssize_t>count
        if not trusted:
            if named:
                for i in range(count):
                    dp = h + 64 + 128 * i
                    noff = kiln_ld_u16(dp + 4)
                    bad = kiln_utf8_first_error(hp + noff, kiln_ld_u16(dp + 6))
                    if bad >= 0:
                        kfail("UTF8", heap0 + <Py_ssize_t>noff + bad, "invalid UTF-8 in a tensor name")
            for i in range(count):
                dp = h + 64 + 128 * i
                llen = kiln_ld_u16(dp + 10)
                if llen:
                    loff = kiln_ld_u16(dp + 8)
                    bad = kiln_utf8_first_error(hp + loff, llen)
                    if bad >= 0:
                        kfail("UTF8", heap0 + <Py_ssize_t>loff + bad, "invalid UTF-8 in a layout name")
        if named and count > 1:
            refs = <NameRef *>PyMem_Malloc(sizeof(NameRef) * count)
            if refs == NULL:
                raise MemoryError()
            for i in range(count):
                dp = h + 64 + 128 * i
                refs[i].p = hp + kiln_ld_u16(dp + 4)
                refs[i].ln = kiln_ld_u16(dp + 6)
                refs[i].idx = <uint32_t>i
            qsort(refs, count, sizeof(NameRef), cmp_nameref)
            j = count
            for i in range(1, count):
                if refs[i].ln == refs[i - 1].ln and \
                        memcmp(refs[i].p, refs[i - 1].p, refs[i].ln) == 0:
                    if refs[i].idx < j:
                        j = refs[i].idx
            if j < count:
                dp = h + 64 + 128 * j
                nm = (<const char *>hp + kiln_ld_u16(dp + 4))[:kiln_ld_u16(dp + 6)]
                kfail("TYPE", s + 64 + 128 * <Py_ssize_t>j + 4, "tensor name %r repeats" % nm)
            PyMem_Free(refs)
            refs = NULL
        # 9. dtype, rank, shape, lengths, ranges
        counts = <uint64_t *>PyMem_Malloc(sizeof(uint64_t) * (count + 1))
        if counts == NULL:
            raise MemoryError()
        nr = 0
        for i in range(count):
            dp = h + 64 + 128 * i
            dpos = s + 64 + 128 * <Py_ssize_t>i
            code = kiln_ld_u16(dp)
            rank = dp[2]
            opaque = 4096 <= code <= 32767
            if not opaque and not (1 <= code <= 19):
                kfail("TYPE", dpos, "dtype code %d is not defined" % code)
            if rank > 8:
                kfail("TYPE", dpos + 2, "rank %d is above 8" % rank)
            for k in range(<Py_ssize_t>rank, 8):
                if kiln_ld_u64(dp + 48 + 8 * k):
                    kfail("TYPE", dpos + 48 + 8 * k, "shape slot %d past rank %d is not 0"
                          % (k, rank))
            ne = 1
            zero = False
            for k in range(<Py_ssize_t>rank):
                if kiln_ld_u64(dp + 48 + 8 * k) == 0:
                    zero = True
            if zero:  # a zero dimension makes the exact product 0
                ne = 0
            else:
                for k in range(<Py_ssize_t>rank):
                    if kiln_mul_u64(ne, kiln_ld_u64(dp + 48 + 8 * k), &ne):
                        kfail("LIMIT", dpos + 48, "element count overflows u64")
            counts[i] = ne
            block_size = kiln_ld_u32(dp + 12)
            blen = kiln_ld_u64(dp + 40)
            llen = kiln_ld_u16(dp + 10)
            if opaque:
                if llen == 0:
                    kfail("TYPE", dpos + 8, "opaque dtype %d needs a layout name" % code)
                if block_size == 0:
                    kfail("TYPE", dpos + 12, "opaque dtype %d needs a block size" % code)
                if blen % block_size:
                    kfail("TYPE", dpos + 40, "byte length %d is not a multiple of block size %d"
                          % (blen, block_size))
            else:
                if block_size:
                    kfail("TYPE", dpos + 12, "block size %d on a non-opaque dtype" % block_size)
                if llen:
                    kfail("TYPE", dpos + 8, "layout name on a non-opaque dtype")
                w = DW[code]
                if w == 0:
                    need = ne // 2 + (ne & 1)
                elif kiln_mul_u64(ne, w, &need):
                    kfail("LIMIT", dpos + 40, "byte length of %d elements overflows u64" % ne)
                if blen != need:
                    kfail("TYPE", dpos + 40, "byte length is %d, %d elements of %s need %d"
                          % (blen, ne, _py.DTYPES[code][0], need))
            off = kiln_ld_u64(dp + 32)
            if kiln_add_u64(off, blen, &e):
                kfail("LIMIT", dpos + 32, "payload range end overflows u64")
            if e > payload_bytes:
                kfail("TYPE", dpos + 32, "payload range [%d, %d) is past payload_bytes %d"
                      % (off, e, payload_bytes))
            if blen:
                nr += 1
        if nr > 1:
            ranges = <Range *>PyMem_Malloc(sizeof(Range) * nr)
            if ranges == NULL:
                raise MemoryError()
            j = 0
            for i in range(count):
                dp = h + 64 + 128 * i
                if kiln_ld_u64(dp + 40):
                    ranges[j].off = kiln_ld_u64(dp + 32)
                    ranges[j].idx = i
                    j += 1
            qsort(ranges, nr, sizeof(Range), cmp_range)
            have_top = False
            top_end = 0
            top_i = 0
            for j in range(nr):
                off = ranges[j].off
                i = ranges[j].idx
                if have_top and off < top_end:
                    k = <Py_ssize_t>(i if i > top_i else top_i)
                    kfail("TYPE", s + 64 + 128 * k + 32, "payload ranges of tensors %d and %d overlap"
                          % (i if i < top_i else top_i, k))
                e = off + kiln_ld_u64(h + 64 + 128 * i + 40)
                if not have_top or e > top_end:
                    top_end = e
                    top_i = i
                    have_top = True
            PyMem_Free(ranges)
            ranges = NULL
        # 10. canonical placement
        r = 0
        for i in range(count):
            dp = h + 64 + 128 * i
            want_off = (r + 63) & ~(<uint64_t>63)
            off = kiln_ld_u64(dp + 32)
            if off != want_off:
                kfail("TYPE", s + 64 + 128 * <Py_ssize_t>i + 32,
                      "byte_offset %d is not the canonical %d" % (off, want_off))
            r = want_off + kiln_ld_u64(dp + 40)
        if payload_bytes != r:
            kfail("TYPE", s + 16, "payload_bytes is %d, the canonical end is %d"
                  % (payload_bytes, r))
        r = 0
        for i in range(count):
            dp = h + 64 + 128 * i
            off = kiln_ld_u64(dp + 32)
            if off > r:
                for k in range(pb + <Py_ssize_t>r, pb + <Py_ssize_t>off):
                    if b[k]:
                        kfail("TYPE", k, "alignment gap byte is not 0")
            r = off + kiln_ld_u64(dp + 40)
        # 11a. bool bytes and packed tails
        for i in range(count):
            dp = h + 64 + 128 * i
            code = kiln_ld_u16(dp)
            a = pb + <Py_ssize_t>kiln_ld_u64(dp + 32)
            blen = kiln_ld_u64(dp + 40)
            if code == 7 and blen:
                bad = kiln_first_bad_bool(b + a, blen)
                if bad >= 0:
                    kfail("TYPE", a + bad, "bool byte is %d, not 0 or 1" % b[a + bad])
            elif 16 <= code <= 18 and counts[i] & 1:
                if b[a + blen - 1] & 0xF0:
                    kfail("TYPE", a + <Py_ssize_t>blen - 1,
                          "high nibble of an odd packed tail is not 0")
        # 11b. quantization links
        for i in range(count):
            dp = h + 64 + 128 * i
            dpos = s + 64 + 128 * <Py_ssize_t>i
            scheme = kiln_ld_u16(dp + 16)
            axis = kiln_ld_u16(dp + 18)
            group = kiln_ld_u32(dp + 20)
            scale = kiln_ld_u32(dp + 24)
            outer = kiln_ld_u32(dp + 28)
            if scheme > 2:
                kfail("TYPE", dpos + 16, "quant scheme %d is not 0, 1 or 2" % scheme)
            if scheme == 0:
                if axis != 0xFFFF:
                    kfail("TYPE", dpos + 18, "quant axis set without a scheme")
                if group:
                    kfail("TYPE", dpos + 20, "group size set without a scheme")
                if scale != U32_MAX:
                    kfail("TYPE", dpos + 24, "scale index set without a scheme")
                if outer != U32_MAX:
                    kfail("TYPE", dpos + 28, "outer index set without a scheme")
                continue
            rank = dp[2]
            if rank == 0 or axis >= rank:
                kfail("TYPE", dpos + 18, "quant axis %d is not below rank %d" % (axis, rank))
            if group == 0:
                kfail("TYPE", dpos + 20, "group size is 0")
            if scale >= count or scale == i:
                kfail("TYPE", dpos + 24, "scale index %d does not name another tensor" % scale)
            if kiln_ld_u16(h + 64 + 128 * scale + 16) != 0:
                kfail("TYPE", dpos + 24, "scale tensor %d is itself quantized (a chain)" % scale)
            if scheme == 1:
                if outer != U32_MAX:
                    kfail("TYPE", dpos + 28, "outer index set on scheme 1")
            else:
                if outer >= count or outer == i or outer == scale:
                    kfail("TYPE", dpos + 28, "outer index %d does not name a third tensor"
                          % outer)
                if kiln_ld_u16(h + 64 + 128 * outer) != 2 or \
                        kiln_ld_u16(h + 64 + 128 * outer + 16) != 0 or counts[outer] != 1:
                    kfail("TYPE", dpos + 28, "outer tensor %d is not one unquantized f32"
                          % outer)
            if not trusted:
                dim = kiln_ld_u64(dp + 48 + 8 * axis)
                groups = dim // group + (1 if dim % group else 0)
                zero = groups == 0
                big = False
                for k in range(<Py_ssize_t>rank):
                    if k != <Py_ssize_t>axis:
                        dim = kiln_ld_u64(dp + 48 + 8 * k)
                        if dim == 0:
                            zero = True
                        elif not big and kiln_mul_u64(groups, dim, &groups):
                            big = True
                if zero:
                    groups = 0
                    big = False
                if big or counts[scale] != groups:
                    kfail("TYPE", dpos + 24, "scale tensor has %d elements, %d groups need %d"
                          % (counts[scale], groups, groups))
        # 12. trailing bytes
        end = s + <Py_ssize_t>block
        if standalone and end != n:
            kfail("TRAILING", end, "%d bytes follow the directory" % (n - end))
        if copy:
            for i in range(count):
                blen = kiln_ld_u64(h + 64 + 128 * i + 40)
                if blen > max_bytes:
                    kfail("LIMIT", s + 64 + 128 * <Py_ssize_t>i + 40,
                          "payload of %d bytes is above the copy cap max_bytes=%d" % (blen, max_bytes))
        endp[0] = end
        basep[0] = base
        if not want_table:
            return None
        # every check passed: now one tuple per descriptor
        table = PyList_New(<Py_ssize_t>count)
        for i in range(count):
            dp = h + 64 + 128 * i
            rank = dp[2]
            shape = PyTuple_New(<Py_ssize_t>rank)
            for k in range(<Py_ssize_t>rank):
                dv = PyLong_FromUnsignedLongLong(kiln_ld_u64(dp + 48 + 8 * k))
                Py_INCREF(dv)
                PyTuple_SET_ITEM(shape, k, <PyObject *>dv)
            if named:
                nm = PyBytes_FromStringAndSize(<const char *>hp + kiln_ld_u16(dp + 4),
                                               kiln_ld_u16(dp + 6))
            else:
                nm = None
            llen = kiln_ld_u16(dp + 10)
            if llen:
                lay = PyBytes_FromStringAndSize(<const char *>hp + kiln_ld_u16(dp + 8),
                                                <Py_ssize_t>llen)
            else:
                lay = None
            row = (kiln_ld_u16(dp), shape, nm, lay, kiln_ld_u32(dp + 12), kiln_ld_u16(dp + 16),
                   kiln_ld_u16(dp + 18), kiln_ld_u32(dp + 20), kiln_ld_u32(dp + 24),
                   kiln_ld_u32(dp + 28), kiln_ld_u64(dp + 32), kiln_ld_u64(dp + 40))
            Py_INCREF(row)
            PyList_SET_ITEM(table, i, <PyObject *>row)
        return table
    finally:
        PyMem_Free(refs)
        PyMem_Free(counts)
        PyMem_Free(ranges)
        PyMem_Free(priv)


def validate_directory(buf, start, standalone, trusted, max_count, max_bytes, copy):
    """Check the tensor directory at ``start`` of ``buf``; returns (end, payload_base, table)."""
    cdef Py_buffer view
    cdef Py_ssize_t end = 0
    cdef uint64_t base = 0
    if start < 0 or max_count < 0 or max_bytes < 0:
        return _py.validate_directory(buf, start, standalone, trusted, max_count, max_bytes,
                                      copy)
    get_view(buf, &view)
    try:
        table = vdir(<const uint8_t *>view.buf, view.len, start, bool(standalone),
                     bool(trusted), _cap(max_count), _cap(max_bytes), bool(copy), True,
                     &end, &base)
    finally:
        PyBuffer_Release(&view)
    return end, base, table


cdef int check_written(const uint8_t *b, Py_ssize_t n, Py_ssize_t start) except -1:
    cdef Py_ssize_t end = 0
    cdef uint64_t base = 0
    try:
        vdir(b, n, start, False, False, U32_MAX, U32_MAX, False, False, &end, &base)
    except EncodeError:
        raise
    except KilnError as e:
        err = EncodeError(e.code, e.offset, "tensors break a directory rule: " + e.reason)
    else:
        return 0
    raise err


def check_written_directory(out, start):
    """Validate a block the encoder just wrote, so encode never emits bytes decode rejects."""
    cdef Py_buffer view
    get_view(out, &view)
    try:
        check_written(<const uint8_t *>view.buf, view.len, start)
    finally:
        PyBuffer_Release(&view)


# --- tensor directory: writing ---------------------------------------------

cdef struct TRec:
    uint64_t code
    uint64_t rank
    uint64_t dims[8]
    const char *name
    Py_ssize_t name_len
    bint has_name
    const char *lay
    Py_ssize_t lay_len
    uint64_t block
    uint64_t scheme
    uint64_t axis
    uint64_t group
    uint64_t scale
    uint64_t outer
    uint64_t noff
    uint64_t loff
    uint64_t off
    Py_buffer pay
    bint held


cdef inline bint _small_int(object o, uint64_t hi, uint64_t *out) noexcept:
    """An exact int in 0..hi (no Python code runs)."""
    cdef long long x
    cdef unsigned long long ux
    cdef int of = 0
    if not PyLong_CheckExact(<PyObject *>o):
        return False
    x = PyLong_AsLongLongAndOverflow(<PyObject *>o, &of)
    if of < 0 or (of == 0 and x < 0):
        return False
    if of > 0:
        ux = PyLong_AsUnsignedLongLong(<PyObject *>o)
        if ux == <unsigned long long>-1 and PyErr_Occurred() != NULL:
            PyErr_Clear()
            return False
    else:
        ux = <unsigned long long>x
    if ux > hi:
        return False
    out[0] = ux
    return True


cdef int write_dir_py(Writer *w, object records) except -1:
    """The reference writer, for records the C writer does not take as they are
    (it raises the reference kernel's exact errors)."""
    cdef Py_ssize_t extra
    ba = PyByteArray_FromStringAndSize(w.data, w.pos)
    _py.write_directory(records, ba)
    extra = len(ba) - w.pos
    w_reserve(w, extra)
    memcpy(w.data + w.pos, PyByteArray_AS_STRING(<PyObject *>ba) + w.pos, extra)
    w.pos += extra
    return 0


cdef int parse_record(object rec, TRec *t) except -1:
    """Fill ``t`` from one normalized record; 0 if it is not plainly well formed."""
    cdef Py_ssize_t k
    if not PyTuple_CheckExact(rec) or PyTuple_GET_SIZE(rec) != 11:
        return 0
    if not _small_int(rec[0], 0xFFFF, &t.code):
        return 0
    shape = rec[1]
    if not PyTuple_CheckExact(shape) or PyTuple_GET_SIZE(shape) > 8:
        return 0
    t.rank = PyTuple_GET_SIZE(shape)
    for k in range(8):
        t.dims[k] = 0
    for k in range(<Py_ssize_t>t.rank):
        if not _small_int(<object>PyTuple_GET_ITEM(shape, k), U64_MAX, &t.dims[k]):
            return 0
    nm = rec[2]
    if nm is None:
        t.has_name = False
        t.name = NULL
        t.name_len = 0
    elif PyBytes_CheckExact(nm):
        t.has_name = True
        t.name = PyBytes_AS_STRING(<PyObject *>nm)
        t.name_len = PyBytes_GET_SIZE(<PyObject *>nm)
    else:
        return 0
    lay = rec[3]
    if lay is None:
        t.lay = NULL
        t.lay_len = 0
    elif PyBytes_CheckExact(lay):
        t.lay = PyBytes_AS_STRING(<PyObject *>lay)
        t.lay_len = PyBytes_GET_SIZE(<PyObject *>lay)
    else:
        return 0
    if not (_small_int(rec[4], U32_MAX, &t.block) and _small_int(rec[5], 0xFFFF, &t.scheme)
            and _small_int(rec[6], 0xFFFF, &t.axis) and _small_int(rec[7], U32_MAX, &t.group)
            and _small_int(rec[8], U32_MAX, &t.scale)
            and _small_int(rec[9], U32_MAX, &t.outer)):
        return 0
    pay = rec[10]
    try:
        PyObject_GetBuffer(pay, &t.pay, PyBUF_SIMPLE)
    except Exception:
        return 0
    t.held = True
    if PyObject_Size(pay) != t.pay.len:
        return 0
    return 1


cdef int write_dir(Writer *w, object records) except -1:
    """Append the canonical block of ``records`` at w.pos (write_directory).

    Returns 0 when written, or 1 without writing anything when the records are
    not plainly well formed: the reference writer must then run, for its
    exact errors.
    """
    cdef TRec *recs = NULL
    cdef TRec *t
    cdef Py_ssize_t count, i, k
    cdef bint named = False, ok = True
    cdef uint64_t heap_n = 0, dir_bytes, base, r, o, total
    cdef char *q
    cdef char *p0
    if not (PyList_CheckExact(records) or PyTuple_CheckExact(records)):
        return 1
    count = len(records)
    if <uint64_t>count > U32_MAX:
        return 1
    recs = <TRec *>PyMem_Malloc(sizeof(TRec) * (count + 1))
    if recs == NULL:
        raise MemoryError()
    for i in range(count):
        recs[i].held = False
    try:
        for i in range(count):
            rec = records[i]
            if not parse_record(rec, &recs[i]):
                ok = False
                break
        if ok:
            for i in range(count):
                if recs[i].has_name:
                    named = True
            # name heap: names first, then layouts (as the reference writer)
            for i in range(count):
                t = &recs[i]
                if named:
                    if not t.has_name or t.name_len == 0:
                        ok = False
                        break
                    t.noff = heap_n
                    heap_n += t.name_len
                else:
                    t.noff = 0xFFFF
        if ok:
            for i in range(count):
                t = &recs[i]
                if t.lay_len:
                    t.loff = heap_n
                    heap_n += t.lay_len
                else:
                    t.loff = 0xFFFF
            if heap_n > U32_MAX:
                ok = False
            for i in range(count):
                t = &recs[i]
                if (t.noff > 0xFFFE and t.noff != 0xFFFF) or \
                        (t.loff > 0xFFFE and t.loff != 0xFFFF):
                    ok = False
                if t.name_len > 0xFFFF or t.lay_len > 0xFFFF:
                    ok = False
        if not ok:
            return 1
        dir_bytes = <uint64_t>count * 128 + heap_n
        base = (64 + dir_bytes + 63) & ~(<uint64_t>63)
        r = 0
        for i in range(count):
            t = &recs[i]
            o = (r + 63) & ~(<uint64_t>63)
            t.off = o
            if kiln_add_u64(o, <uint64_t>t.pay.len, &r) or r > <uint64_t>PY_SSIZE_T_MAX:
                raise MemoryError()
        if kiln_add_u64(base, r, &total) or total > <uint64_t>PY_SSIZE_T_MAX:
            raise MemoryError()
        w_reserve(w, <Py_ssize_t>total)
        p0 = w.data + w.pos
        memset(p0, 0, total)
        # header
        memcpy(p0, b"KLNT", 4)
        p0[4] = 2
        p0[5] = 2 | (1 if named else 0)
        kiln_st_u32(p0 + 8, <uint32_t>count)
        kiln_st_u32(p0 + 12, <uint32_t>heap_n)
        kiln_st_u64(p0 + 16, r)
        kiln_st_u64(p0 + 24, dir_bytes)
        # descriptors
        for i in range(count):
            t = &recs[i]
            q = p0 + 64 + 128 * i
            kiln_st_u16(q, <uint16_t>t.code)
            q[2] = <char>(<uint8_t>t.rank)
            kiln_st_u16(q + 4, <uint16_t>t.noff)
            kiln_st_u16(q + 6, <uint16_t>(t.name_len if named else 0))
            kiln_st_u16(q + 8, <uint16_t>t.loff)
            kiln_st_u16(q + 10, <uint16_t>t.lay_len)
            kiln_st_u32(q + 12, <uint32_t>t.block)
            kiln_st_u16(q + 16, <uint16_t>t.scheme)
            kiln_st_u16(q + 18, <uint16_t>t.axis)
            kiln_st_u32(q + 20, <uint32_t>t.group)
            kiln_st_u32(q + 24, <uint32_t>t.scale)
            kiln_st_u32(q + 28, <uint32_t>t.outer)
            kiln_st_u64(q + 32, t.off)
            kiln_st_u64(q + 40, <uint64_t>t.pay.len)
            for k in range(8):
                kiln_st_u64(q + 48 + 8 * k, t.dims[k])
        # name heap
        q = p0 + 64 + 128 * count
        if named:
            for i in range(count):
                memcpy(q, recs[i].name, recs[i].name_len)
                q += recs[i].name_len
        for i in range(count):
            if recs[i].lay_len:
                memcpy(q, recs[i].lay, recs[i].lay_len)
                q += recs[i].lay_len
        # payloads
        for i in range(count):
            t = &recs[i]
            if t.pay.len:
                memcpy(p0 + base + t.off, t.pay.buf, t.pay.len)
        w.pos += <Py_ssize_t>total
    finally:
        for i in range(count):
            if recs[i].held:
                PyBuffer_Release(&recs[i].pay)
        PyMem_Free(recs)
    return 0


def write_directory(records, out):
    """Append the canonical block of normalized tensor ``records`` to the bytearray ``out``."""
    cdef Writer w
    cdef Py_ssize_t start
    if type(out) is not bytearray:
        return _py.write_directory(records, out)
    start = PyByteArray_GET_SIZE(<PyObject *>out)
    w.obj = <PyObject *>out
    w.data = PyByteArray_AS_STRING(w.obj)
    w.pos = start
    w.cap = start
    w.is_bytes = False
    w.depth = 0
    try:
        again = write_dir(&w, records)
    finally:
        if w.cap != w.pos and PyByteArray_GET_SIZE(w.obj) == w.cap:
            if PyByteArray_Resize_nc(w.obj, w.pos) < 0:
                PyErr_Clear()
    if again:
        return _py.write_directory(records, out)
    return start
