"""Compiled kernels: kiln._kernels_c.

Implements the kernel interface of ``kiln._kernel`` (described in the
``kiln._kernels_py`` docstring) with the same results, error codes and error
offsets as the pure kernels, in the same parts under the same names:

==============================  ===============================  =====================
part                            here                             pure twin
==============================  ===============================  =====================
wire constants (generated)      ``kernels/wire.pxi``             ``kiln/_wire.py``
reader, count rule, frame       ``kernels/reader.pxi``           ``reader.py``
compiled plan nodes             ``kernels/nodes.pxi``            (closures in decode/encode)
numpy arrays                    ``kernels/numpy.pxi``            (numpy's Python API)
tensor objects' part            ``kernels/tensors.pxi``          ``tensors.py``
Frozen decode                   ``kernels/decode.pxi``           ``decode.py``
Frozen encode                   ``kernels/encode.pxi``           ``encode.py``
directory checks                ``kernels/directory.pxi``        ``directory.py``
directory writing               ``kernels/dirwrite.pxi``         ``dirwrite.py``
record container loop           ``kernels/records.pxi``          ``records.py``
==============================  ===============================  =====================

A Plan is compiled once into a tree of ``Node`` objects; the decode and
encode loops over fields, elements and descriptors run in C.  This module
imports nothing from the pure kernels: shared conversions live in
``kiln._convert`` and every constant comes from ``kiln/_wire.py`` through the
generated ``src/kiln_wire.h``.

Byte order is decided at compile time (``KILN_HOST_BIG_ENDIAN`` from
kiln_endian.h).  Three test hooks are not part of the interface:
``HOST_BIG_ENDIAN``, ``set_force_byteswap(True)``, which makes the
pod-list paths behave as on a big-endian host, and ``set_crc_simd(False)``,
which makes the record CRC-32 use its table alone (src/kiln_crc32.h).

Only a C compiler, setuptools and Cython are needed to build this module:
numpy is used at run time through its Python API and its C-API capsule.
"""

cimport cython
from cpython.ref cimport PyObject, Py_INCREF, Py_DECREF, Py_XDECREF
from cpython.mem cimport PyMem_Malloc, PyMem_Realloc, PyMem_Free
from libc.stdint cimport uint8_t, uint16_t, uint32_t, uint64_t, int64_t
from libc.string cimport memcpy, memcmp, memset, memmove
from libc.stdlib cimport qsort
from libc.math cimport isinf

import numpy as _np
from sys import intern as _intern
from types import FunctionType as _FunctionType
from _thread import get_ident as _get_ident

from ._errors import KilnError, EncodeError, frame_hint
from . import _plan as _P
from ._plan import ConvError as _ConvError
from . import _wire as _W
from ._convert import as_pod_array, as_byte_run, scalar_error, as_bytes_view, count_lied
from ._convert import float_changed, inexact_error
from ._convert import missing_field, unknown_fields as _unknown_fields, mapping_changed

__all__ = ["compile_decoder", "compile_encoder", "validate_directory", "validate_directory_copy",
           "check_header", "check_payload", "write_directory",
           # the record container's loop (kernels/records.pxi)
           "crc32", "decode_records", "decode_stream", "encode_record", "encode_records",
           # the tensor part (kernels/tensors.pxi)
           "tensor_setup", "directory_setup", "tensor_numpy_method", "tensors_fill",
           "tensors_dict_method", "hold_buffer", "dlpack_destructor", "check_links"]


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
    int64_t kiln_first_bad_bool(const unsigned char *p, size_t n,
                                unsigned char *value) noexcept nogil
    int64_t kiln_utf8_first_error(const unsigned char *p, size_t n) noexcept nogil
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
    bint PyFloat_Check(PyObject *o)
    double PyFloat_AS_DOUBLE(PyObject *o)
    double PyFloat_AsDouble(object o) noexcept

    object PyBytes_FromStringAndSize(const char *s, Py_ssize_t n)
    PyObject *PyBytes_FromStringAndSize_raw "PyBytes_FromStringAndSize"(const char *s,
                                                                        Py_ssize_t n)
    bint PyBytes_CheckExact(object o)
    char *PyBytes_AS_STRING(PyObject *o)
    Py_ssize_t PyBytes_GET_SIZE(PyObject *o)
    int _PyBytes_Resize(PyObject **o, Py_ssize_t n) except -1
    void Py_SET_SIZE(PyObject *o, Py_ssize_t n)
    bint PyByteArray_CheckExact(object o)
    object PyByteArray_FromStringAndSize(const char *s, Py_ssize_t n)
    int PyByteArray_Resize(PyObject *o, Py_ssize_t n) except -1
    int PyByteArray_Resize_nc "PyByteArray_Resize"(PyObject *o, Py_ssize_t n) noexcept
    char *PyByteArray_AS_STRING(PyObject *o)
    Py_ssize_t PyByteArray_GET_SIZE(PyObject *o)

    object PyUnicode_DecodeUTF8(const char *s, Py_ssize_t n, const char *errors)
    const char *PyUnicode_AsUTF8(object o) except NULL
    PyObject *PyUnicode_DecodeUTF8_raw "PyUnicode_DecodeUTF8"(const char *s, Py_ssize_t n,
                                                                const char *errors)
    bint PyUnicode_Check(object o)
    bint PyUnicode_IS_COMPACT_ASCII(object o)
    void *PyUnicode_DATA(object o)
    Py_ssize_t PyUnicode_GET_LENGTH(object o)
    object PyUnicode_AsUTF8String(object o)
    const char *PyUnicode_AsUTF8AndSize(object o, Py_ssize_t *n)
    bint PyUnicode_CheckExact(object o)

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
    void PyObject_GC_UnTrack(object o)
    void PyObject_GC_Track(object o)

cdef extern from "kiln_ft.h":
    PyObject *kiln_list_item_ref(object l, Py_ssize_t i)
    int kiln_dict_get_ref(object d, object k, PyObject **out) except -1
    bint KILN_FREE_THREADED
    object PyDict_Copy(object d)

cdef extern from *:
    """
    #define KILN_DLTENSOR_SIZE (sizeof(void *) + 8 + 4 + 4 + 2 * sizeof(void *) + 8)
    """
cdef extern from "kiln_text.h":
    PyObject *kiln_text(const char *s, Py_ssize_t n, const char *errors, int shared)

cdef extern from "kiln_fields.h":
    int KILN_FK_ATTR, KILN_FK_DICT, KILN_FK_SLOT, KILN_FK_INDEX
    unsigned int kiln_type_tag(object cls)
    bint kiln_generic_getattr(object cls)
    bint kiln_has_dict(object cls)
    PyObject *kiln_type_lookup(object cls, object name)
    bint kiln_is_data_descr(PyObject *d)
    Py_ssize_t kiln_slot_offset(object cls, PyObject *d)
    PyObject *kiln_slot_get(object v, Py_ssize_t off)
    PyObject *kiln_slot_peek(object v, Py_ssize_t off)
    bint kiln_exact_type(object v, object cls)
    void kiln_slot_set(object v, Py_ssize_t off, object x)
    void kiln_slot_steal(object v, Py_ssize_t off, PyObject *x)
    object kiln_alloc(object cls)
    int KILN_BUILD_CALL, KILN_BUILD_INIT, KILN_BUILD_ATTRS, KILN_BUILD_SLOTS, KILN_BUILD_TUPLE
    Py_ssize_t kiln_slot_offset_w(object cls, PyObject *d)
    bint kiln_build_ok(object cls, unsigned int tag, object init, object code, object closure,
                       object cells)
    object kiln_object_new(object cls, object empty)
    object kiln_tuple_new(object cls, object args)
    object kiln_tuple_alloc(object cls, Py_ssize_t n)
    bint kiln_atomic(PyObject *o)
    bint kiln_is_gc(object o)
    bint kiln_gc_tracked(object o)
    bint kiln_record_ok(object cls, unsigned int tag)
    bint kiln_record_seal_slot(object cls, PyObject *d)
    Py_ssize_t kiln_record_slot(object cls, PyObject *d)
    int kiln_slot_clear(object v, Py_ssize_t off)
    Py_ssize_t kiln_refcnt(PyObject *o)
    int kiln_delattr "PyObject_GenericSetAttr"(object o, object name, PyObject *v) except -1
    int kiln_call_init(object init, PyObject **args, size_t n) except -1
    int kiln_setattr "PyObject_GenericSetAttr"(object o, object name, object v) except -1
    PyObject *PyObject_GenericGetDict(object o, void *ctx)
    PyObject *kiln_getattr "PyObject_GetAttr"(object o, object name) except NULL

cdef extern from "kiln_dlpack.h":
    void kiln_dl_destroy(object capsule)


include "kernels/wire.pxi"

cdef enum:
    WHAT_COUNT = 0
    WHAT_STR = 1
    WHAT_KEY = 2
    MAXSEG = MAX_DEPTH + 1      # one path segment per container level

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


cdef object _Some = _P.Some
cdef object _np_empty = _np.empty
cdef object _np_ndarray = _np.ndarray
cdef object _np_bool = _np.bool_
cdef object _np_ascontig = _np.ascontiguousarray
from collections import namedtuple as _namedtuple
cdef object _tuplegetter = type(_namedtuple("_T", "a").a)

include "kernels/reader.pxi"
include "kernels/nodes.pxi"
include "kernels/numpy.pxi"
include "kernels/decode.pxi"
include "kernels/decode_runs.pxi"
include "kernels/encode.pxi"
include "kernels/conv.pxi"
include "kernels/directory.pxi"
include "kernels/directory_quant.pxi"
include "kernels/directory_rows.pxi"
include "kernels/dirwrite.pxi"
include "kernels/tensors.pxi"
include "kernels/records.pxi"
include "kernels/record.pxi"
