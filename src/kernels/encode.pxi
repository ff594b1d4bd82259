# Frozen encode: the Node tree walked over a Python value into a private
# bytes buffer.  The twin of kiln/_kernels_py/encode.py.

cdef struct Seg:
    int kind            # 0: list index, 1: dict key (owned), 2: struct field name (borrowed)
    Py_ssize_t index
    PyObject *obj


cdef struct Writer:
    PyObject *obj       # a bytes object the writer owns and grows until it is handed out
    char *data
    Py_ssize_t pos
    Py_ssize_t cap
    int depth
    bint round_floats   # float arrays may round to a narrower element
    Seg segs[MAXSEG]


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
    _PyBytes_Resize(&w.obj, newcap)   # on failure w.obj is NULL (released)
    w.data = PyBytes_AS_STRING(w.obj)
    w.cap = newcap
    return 0


cdef inline int w_reserve(Writer *w, Py_ssize_t extra) except -1:
    """Make room for ``extra`` bytes at w.pos."""
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


cdef int pod_store(int op, char *q, PyObject *o) noexcept:
    """Store one exact int, float or bool list item at ``q`` in wire form.

    Returns 1 when stored, 0 when the item is anything else or out of range:
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
        if not pod_store(op, q, o):
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


# what a list<T> refuses although it has a len(): no order, or not a list of T
cdef tuple _NOT_LISTS = (str, bytes, bytearray, dict, set, frozenset)


cdef int enc_list(Node nd, Writer *w, object v) except -1:
    cdef Py_ssize_t c, i, done = 0
    cdef bint more = False
    cdef int d
    cdef PyObject *xp
    cdef Node elem = nd.elem
    cdef bint is_list = PyList_CheckExact(v)
    cdef bint is_tuple = (not is_list) and PyTuple_CheckExact(v)
    if not (is_list or is_tuple):
        if isinstance(v, _NOT_LISTS) or not hasattr(v, "__len__"):
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
        raise count_lied(w.pos, c, "more" if more else done)
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
            try:   # (one snapshot: see kiln/_kernels_py/encode.py's enc_dict)
                snap = list(items())
            except RuntimeError as e:   # changed size while its items were listed
                raise mapping_changed(w.pos, e) from None
            for k, x in snap:
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
        raise missing_field(v, nd.names, w.pos) from None
    if len(v) != nd.nf:
        unknown_fields(nd, w, v)
    return vals


cdef int unknown_fields(Node nd, Writer *w, object v) except -1:
    # (kiln._convert: the keys from one snapshot; a mapping changed meanwhile
    # is an EncodeError too)
    raise _unknown_fields(v, nd.key_set, nd.text, w.pos)


cdef int field_kinds(Node nd) except -1:
    """Decide how read_fields reads each field of an object of exactly nd.cls
    (see src/kiln_fields.h); nd.ftag keeps the class's version tag."""
    cdef Py_ssize_t i, off
    cdef PyObject *d
    cdef FieldInfo *fi = nd.finfo
    cls = nd.cls
    nd.ftag = 0
    nd.fdict = False
    for i in range(nd.nf):
        fi[i].kind = KILN_FK_ATTR
        fi[i].off = 0
    if not isinstance(cls, type) or not kiln_generic_getattr(cls):
        return 0
    for i in range(nd.nf):
        d = kiln_type_lookup(cls, <object>fi[i].name)
        if d == NULL or not kiln_is_data_descr(d):
            if kiln_has_dict(cls):
                fi[i].kind = KILN_FK_DICT
            continue
        off = kiln_slot_offset(cls, d)
        if off >= 0:
            if not KILN_FREE_THREADED:  # a slot read there would race a store
                fi[i].kind = KILN_FK_SLOT
                fi[i].off = off
        elif type(<object>d) is _tuplegetter and issubclass(cls, tuple):
            fi[i].off = (<object>d).__reduce__()[1][0]
            fi[i].kind = KILN_FK_INDEX
    nd.fdict = nd.nf > 0
    for i in range(nd.nf):
        if fi[i].kind != KILN_FK_DICT:
            nd.fdict = False
    nd.ftag = kiln_type_tag(cls)
    return 0


cdef int read_fields(Node nd, object v, PyObject **vals, Py_ssize_t *got) except -1:
    """Read every field of the nd.cls instance ``v`` into ``vals`` (owned refs,
    counted in ``got``), in field order, before anything is encoded: what
    getattr gives, without a call per field where the class allows it."""
    cdef Py_ssize_t i, ix
    cdef FieldInfo *fi = nd.finfo
    cdef PyObject *o
    cdef PyObject *k
    cdef PyObject *dp = NULL
    cdef int kind
    cdef bint fast = False
    cdef unsigned int tag
    if kiln_exact_type(v, nd.cls):
        tag = kiln_type_tag(nd.cls)
        if tag != nd.ftag and tag != 0 and not KILN_FREE_THREADED:
            field_kinds(nd)  # the class changed since: decide again
        fast = tag != 0 and tag == nd.ftag
    try:
        i = 0
        if fast and nd.fdict and not KILN_FREE_THREADED:
            # every field lives in the instance dict: its items, in the order
            # __init__ set them, are the fields (the same interned names)
            dp = PyObject_GenericGetDict(v, NULL)
            if dp == NULL:  # pragma: no cover - the class has a __dict__
                PyErr_Clear()
                fast = False
            else:
                ix = 0
                while i < nd.nf and PyDict_Next(<object>dp, &ix, &k, &o) and k == fi[i].name:
                    Py_INCREF(<object>o)
                    vals[i] = o
                    i += 1
                    got[0] = i
        while i < nd.nf:   # (the rest: by name)
            kind = fi[i].kind if fast else KILN_FK_ATTR
            o = NULL
            if kind == KILN_FK_DICT:
                if dp == NULL:
                    dp = PyObject_GenericGetDict(v, NULL)
                    if dp == NULL:  # pragma: no cover - the class has a __dict__
                        PyErr_Clear()
                        fast = False
                if dp != NULL:
                    kiln_dict_get_ref(<object>dp, <object>fi[i].name, &o)
            elif kind == KILN_FK_SLOT:
                o = kiln_slot_get(v, fi[i].off)
            elif kind == KILN_FK_INDEX:
                ix = fi[i].off
                if ix < PyTuple_GET_SIZE(v):
                    o = PyTuple_GET_ITEM(v, ix)
                    Py_INCREF(<object>o)
            if o == NULL:
                o = kiln_getattr(v, <object>fi[i].name)
            vals[i] = o
            got[0] = i + 1
            i += 1
    finally:
        Py_XDECREF(dp)
    return 0


cdef int dict_fields(Node nd, Writer *w, object v, PyObject **vals, Py_ssize_t *got) except -1:
    cdef Py_ssize_t i
    cdef FieldInfo *fi = nd.finfo
    cdef PyObject *o
    for i in range(nd.nf):
        if not kiln_dict_get_ref(v, <object>fi[i].name, &o):
            efail("TYPE", w.pos, "missing field %r" % (<object>fi[i].name,))
        vals[i] = o
        got[0] = i + 1
    if PyDict_GET_SIZE(v) != nd.nf:
        unknown_fields(nd, w, v)
    return 0


cdef int enc_struct(Node nd, Writer *w, object v) except -1:
    cdef Py_ssize_t i, nf = nd.nf, got = 0
    cdef FieldInfo *fi = nd.finfo
    cdef PyObject *stack[16]
    cdef PyObject **vals = stack
    cdef int d
    if nf > 16:
        vals = <PyObject **>PyMem_Malloc(sizeof(PyObject *) * nf)
        if vals == NULL:
            raise MemoryError()
    try:
        if nd.cls is not None and (kiln_exact_type(v, nd.cls) or PyObject_IsInstance(v, nd.cls)):
            read_fields(nd, v, vals, &got)
        elif PyDict_CheckExact(v):
            dict_fields(nd, w, v, vals, &got)
        else:
            tv = struct_values_generic(nd, w, v)
            for i in range(nf):
                vals[i] = PyTuple_GET_ITEM(tv, i)
                Py_INCREF(<object>vals[i])
                got = i + 1
        d = w.depth
        w.depth += 1
        if d < MAXSEG:
            w.segs[d].kind = 2
        for i in range(nf):
            if d < MAXSEG:
                w.segs[d].obj = fi[i].name
            enc(<Node>fi[i].node, w, <object>vals[i])
        seg_pop(w)
    finally:
        for i in range(got):
            Py_DECREF(<object>vals[i])
        if vals != stack:
            PyMem_Free(vals)
    return 0


cdef int enc_tensors(Node nd, Writer *w, object v) except -1:
    cdef Py_ssize_t start = w.pos
    if fast_tensors(nd, w, v):
        check_written(<const uint8_t *>w.data, w.pos, start)
        return 0
    try:
        records = nd.hooks.normalize(v)
    except EncodeError as e:
        e.offset = start
        raise
    write_dir(w, records)
    check_written(<const uint8_t *>w.data, w.pos, start)
    return 0


cdef int enc(Node nd, Writer *w, object v) except -1:
    cdef int op = nd.op
    if op == OP_BOOL:
        return enc_bool(w, v)
    if op <= OP_U64:
        return enc_int(nd, w, v)
    if op <= LAST_SCALAR:
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
    cdef readonly bint round_floats
    cdef Node root
    cdef bytes prefix
    cdef Py_ssize_t hint

    def __init__(self, plan, frame_hash, round_floats=False):
        self.plan = plan
        self.frame_hash = frame_hash
        self.round_floats = bool(round_floats)
        self.root = compile_node(plan)
        self.prefix = None if frame_hash is None else _W.FRAME.pack(_W.FRAME_MAGIC, 0, 0, 0,
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
        w.depth = 0
        w.round_floats = self.round_floats
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
        (the buffer then ends at ``offset``).

        Each of the two steps on ``buffer`` (size, resize, fill; size check,
        resize, copy) holds the bytearray's critical section on a
        free-threaded build (nothing with the GIL), so no other thread's
        resize can come between a size read and the write it allows (see
        docs/threads.md)."""
        cdef Py_ssize_t off, want, n = 0
        if type(buffer) is not bytearray:
            raise TypeError("encode_into needs a bytearray, not %s" % type(buffer).__name__)
        want = offset   # (an __index__ runs here, outside the critical section)
        with cython.critical_section(buffer):
            off = into_start(buffer, want)
        try:
            out = self.run(value, False, &n)
        except EncodeError as e:
            e.offset += off  # offsets count from the start of ``buffer``
            raise
        with cython.critical_section(buffer):
            into_finish(buffer, off, out, n)
        return off + n


cdef Py_ssize_t into_start(object buffer, Py_ssize_t offset) except -1:
    """encode_into's first step (under the bytearray's critical section):
    the buffer made to end at ``offset`` (negative: its end); returns that
    offset.  No Python code runs here."""
    cdef Py_ssize_t size = PyByteArray_GET_SIZE(<PyObject *>buffer)
    cdef Py_ssize_t off = size if offset < 0 else offset
    if off > size:
        PyByteArray_Resize(<PyObject *>buffer, off)
        memset(PyByteArray_AS_STRING(<PyObject *>buffer) + size, 0, off - size)
    elif off < size:
        PyByteArray_Resize(<PyObject *>buffer, off)  # BufferError if it has exports
    return off


cdef int into_finish(object buffer, Py_ssize_t off, object out, Py_ssize_t n) except -1:
    """encode_into's last step (under the bytearray's critical section): the
    size checked, the buffer grown and the encoding copied in, with no other
    thread's resize in between."""
    if PyByteArray_GET_SIZE(<PyObject *>buffer) != off:
        raise RuntimeError("the bytearray changed size while encode_into was writing it")
    PyByteArray_Resize(<PyObject *>buffer, off + n)
    memcpy(PyByteArray_AS_STRING(<PyObject *>buffer) + off,
           PyBytes_AS_STRING(<PyObject *>out), n)
    return 0


def compile_encoder(plan, frame_hash, round_floats=False):
    """Compile ``plan`` into an encode program (see kiln._kernels_py)."""
    return EncodeProgram(plan, frame_hash, round_floats)


