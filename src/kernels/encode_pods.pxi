# Frozen encode, part: lists of fixed-width numbers (see encode.pxi).

cdef int pod_store(int op, char *q, PyObject *o, bint rf) noexcept:
    """Store one exact int, float or bool list item at ``q`` in wire form.

    Returns 1 when stored, 0 when the item is anything else, out of range or
    (unless ``rf``, round_floats) a float that f32 would change:
    the caller then takes kiln._convert.as_pod_array, which applies the full
    item rule.  No Python code runs here.
    """
    cdef long long x
    cdef unsigned long long ux
    cdef int of = 0
    cdef double f
    cdef float y
    if op == OP_F64 or op == OP_F32:
        if not PyFloat_CheckExact(o):
            return 0
        f = PyFloat_AS_DOUBLE(o)
        if op == OP_F64:
            kiln_st_f64(q, f)
            return 1
        y = <float>f
        if isinf(y) and not isinf(f):
            return 0
        if <double>y != f and f == f and not rf:
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
    if not PyLong_CheckExact(o):
        return 0
    x = PyLong_AsLongLongAndOverflow(o, &of)
    if op == OP_U64:
        if of < 0 or (of == 0 and x < 0):
            return 0
        if of > 0:
            ux = PyLong_AsUnsignedLongLong(o)
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
    """Write a list/tuple of exact Python scalars straight to the output.

    Returns 1 when done, 0 when an item is not an exact in-range scalar
    (nothing is written then; kiln._convert.as_pod_array takes over).
    """
    cdef int op = nd.elem_op
    cdef int w8 = nd.width
    cdef Py_ssize_t i
    cdef PyObject *o
    cdef char *q
    cdef bint is_list = PyList_CheckExact(seq)
    if <uint64_t>n > U32_MAX:
        return 0
    w_reserve(w, 4 + n * w8)
    q = w.data + w.pos + 4
    for i in range(n):
        o = PyList_GET_ITEM(seq, i) if is_list else PyTuple_GET_ITEM(seq, i)
        if not pod_store(op, q, o, w.round_floats):
            return 0
        q += w8
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
        arr = as_pod_array(v, nd.elem_op, w.pos, w.round_floats)
    PyObject_GetBuffer(arr, &view, PyBUF_SIMPLE)
    try:
        w_pod_run(w, <const char *>view.buf, view.len // width, width, swap)
    finally:
        PyBuffer_Release(&view)
    return 0
