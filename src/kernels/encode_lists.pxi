# Frozen encode, part: lists of any element, and dicts (see encode.pxi).

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
            if elem.op == OP_STRUCT:
                enc_struct(elem, w, x)
            else:
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
