# Frozen encode, part: scalars, strings and byte runs (see encode.pxi).

cdef int scalar_fail(Node nd, Writer *w, object v) except -1:
    raise scalar_error(v, nd.op, nd.text, w.pos)


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
    elif type(v) is _np_bool:
        iv = 1 if v else 0      # numpy's bool, like Python's, is an integer here
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
    # (the rounding rule of kiln._convert: a value that would change is
    # refused unless round_floats; a float's own double is exact)
    cdef double x
    cdef float y
    cdef bint is_float = PyFloat_Check(<PyObject *>v)
    if PyFloat_CheckExact(<PyObject *>v):
        x = PyFloat_AS_DOUBLE(<PyObject *>v)
    else:
        x = PyFloat_AsDouble(v)
        if x == -1.0 and PyErr_Occurred() != NULL:
            PyErr_Clear()
            return scalar_fail(nd, w, v)
    if nd.op == OP_F64:
        if not is_float and not w.round_floats and float_changed(v, x):
            raise inexact_error(v, OP_F64, w.pos)
        w_reserve(w, 8)
        kiln_st_f64(w.data + w.pos, x)
        w.pos += 8
        return 0
    y = <float>x
    if isinf(y) and not isinf(x):
        return scalar_fail(nd, w, v)
    if not w.round_floats and ((<double>y != x and x == x) if is_float
                               else float_changed(v, <double>y)):
        raise inexact_error(v, OP_F32, w.pos)
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
        raise scalar_error(v, OP_BOOL, "bool", w.pos)
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
        run = as_byte_run(v, w.pos)
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
