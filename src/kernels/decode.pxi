# Frozen decode: the Node tree walked over the input, one function per op.
# The twin of kiln/_kernels_py/decode.py.

cdef struct DCtx:
    const uint8_t *d
    Py_ssize_t n
    Py_ssize_t pos
    uint64_t max_count
    uint64_t max_bytes
    uint64_t max_copy   # copies' cap (U64_MAX: none, or not copying)
    uint64_t bytes_cap
    uint64_t zbudget    # elements of minimum size 0 this decode may still build
    bint trusted
    bint copy
    bint shared         # the input may change under us (anything but exact bytes)
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
    return dec_text_at(c, <const char *>c.d + q, q, ln, what, c.shared)


cdef inline object dec_text_at(DCtx *c, const char *src, Py_ssize_t q, Py_ssize_t ln, int what,
                               bint shared):
    """Decode ``ln`` bytes at ``src`` (``shared``: they may change meanwhile,
    so src/kiln_text.h decodes a private copy); errors are reported at input
    offset ``q``."""
    cdef const char *errors = NULL
    cdef PyObject *r
    if c.trusted:
        errors = "surrogateescape"
    r = kiln_text(src, ln, errors, shared)
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


cdef object dec_bytes(Node nd, DCtx *c):
    cdef uint32_t ln = 0
    cdef Py_ssize_t p = c.pos
    cdef int st = count_rule(c.d, c.n, p, c.bytes_cap, 1, &ln)
    cdef char *dst
    if KILN_UNLIKELY(st != 0):
        count_fail(st, WHAT_COUNT, p, ln, c.bytes_cap, 1, c.n, "max_bytes")
    c.pos = p + 4 + ln
    if nd.form == FORM_ARRAY:
        arr = new_array(nd.dt_native, ln, &dst)
        if ln:
            memcpy(dst, c.d + p + 4, ln)
        return arr
    raw = PyBytes_FromStringAndSize(<const char *>c.d + p + 4, ln)
    return list(raw) if nd.form == FORM_LIST else raw


cdef object dec_pod(Node nd, DCtx *c):
    cdef uint32_t cnt = 0
    cdef Py_ssize_t p = c.pos
    cdef Py_ssize_t q
    cdef int w = nd.width
    cdef int64_t bad
    cdef uint8_t bad_byte = 0
    cdef int st = count_rule(c.d, c.n, p, c.max_count, w, &cnt)
    cdef const uint8_t *src
    cdef char *dst
    cdef size_t nbytes
    if KILN_UNLIKELY(st != 0):
        count_fail(st, WHAT_COUNT, p, cnt, c.max_count, w, c.n)
    q = p + 4
    if nd.form == FORM_LIST:
        return pod_list(nd, c, q, cnt)
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
            bad = kiln_first_bad_bool(<const uint8_t *>dst, cnt, &bad_byte)
            if bad >= 0:
                kfail("TYPE", q + bad, "bool byte is %d, not 0 or 1" % bad_byte)
    c.pos = q + <Py_ssize_t>nbytes
    return arr


cdef object pod_list(Node nd, DCtx *c, Py_ssize_t q, uint32_t cnt):
    """A pod list as a Python list: each element read once, as the scalar it
    is (what ndarray.tolist() gives; a bad bool fails at its own byte, the
    first one first, as in the array path)."""
    cdef uint32_t i
    cdef int op = nd.elem_op
    cdef const uint8_t *src = c.d + q
    lst = PyList_New(cnt)
    # the commonest element types in a loop of their own (count_rule has
    # checked that the cnt elements are in the input)
    if op == OP_I32:
        for i in range(cnt):
            v = PyLong_FromLong(<int>kiln_ld_u32(src + 4 * <size_t>i))
            Py_INCREF(v)
            PyList_SET_ITEM(lst, i, <PyObject *>v)
    elif op == OP_I64:
        for i in range(cnt):
            v = PyLong_FromLongLong(<int64_t>kiln_ld_u64(src + 8 * <size_t>i))
            Py_INCREF(v)
            PyList_SET_ITEM(lst, i, <PyObject *>v)
    elif op == OP_F64:
        for i in range(cnt):
            v = PyFloat_FromDouble(kiln_ld_f64(src + 8 * <size_t>i))
            Py_INCREF(v)
            PyList_SET_ITEM(lst, i, <PyObject *>v)
    else:
        c.pos = q
        for i in range(cnt):
            v = dec_scalar(op, c)
            Py_INCREF(v)
            PyList_SET_ITEM(lst, i, <PyObject *>v)
        return lst
    c.pos = q + <Py_ssize_t>cnt * SW[op]
    return lst


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
            key = dec_text_at(c, <const char *>cur.p, q, ln, WHAT_KEY, False)
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


cdef inline object dec_field(FieldInfo *f, DCtx *c):
    """One struct field (scalars and strings without the dispatch of dec)."""
    cdef int fop = f.op
    if fop <= LAST_SCALAR:
        return dec_scalar(fop, c)
    if fop == OP_STR:
        return dec_str(c)
    return dec(<Node>f.node, c)


cdef object dec_struct(Node nd, DCtx *c):
    cdef Py_ssize_t i
    cdef Py_ssize_t nf = nd.nf
    cdef FieldInfo *fi = nd.finfo
    cdef int kind = nd.bkind
    if nd.make is None:
        out = {}
        for i in range(nf):
            v = dec_field(&fi[i], c)
            PyDict_SetItem(out, <object>fi[i].name, v)
        return out
    if kind == KILN_BUILD_SLOTS or kind == KILN_BUILD_INIT or kind == KILN_BUILD_ATTRS:
        return build_direct(nd, c)
    if kind == KILN_BUILD_TUPLE:
        return build_tuple(nd, c)
    vals = PyTuple_New(nf)
    for i in range(nf):
        v = dec_field(&fi[i], c)
        Py_INCREF(v)
        PyTuple_SET_ITEM(vals, i, <PyObject *>v)
    return nd.make(*vals)


cdef object build_tuple(Node nd, DCtx *c):
    """A NamedTuple: what ``make`` (``tuple.__new__(cls, values)``) gives,
    without the tuple of values it copies: the fields are decoded first,
    then the instance is allocated as tuple.__new__ allocates it (cls's
    tp_alloc; no instance with empty items is ever seen) and takes them
    over.  An instance of atomic values only is left untracked by the
    collector (as the collector itself untracks such exact tuples)."""
    cdef Py_ssize_t i, got = 0
    cdef Py_ssize_t nf = nd.nf
    cdef FieldInfo *fi = nd.finfo
    cdef PyObject *stack[16]
    cdef PyObject **args = stack
    cdef bint atomic = True
    if nf > 16:
        args = <PyObject **>PyMem_Malloc(sizeof(PyObject *) * nf)
        if args == NULL:
            raise MemoryError()
    try:
        for i in range(nf):
            v = dec_field(&fi[i], c)
            Py_INCREF(v)
            args[i] = <PyObject *>v
            got = i + 1
            if not kiln_atomic(args[i]):
                atomic = False
        out = kiln_tuple_alloc(nd.cls, nf)
        for i in range(nf):
            PyTuple_SET_ITEM(out, i, args[i])   # (takes the reference over)
        got = 0
        # (a subclass of the NamedTuple without __slots__ has an instance
        # dict: anything stored there later would not track it again)
        if atomic and not KILN_FREE_THREADED and not kiln_has_dict(nd.cls):
            PyObject_GC_UnTrack(out)
        return out
    finally:
        for i in range(got):
            Py_DECREF(<object>args[i])
        if args != stack:
            PyMem_Free(args)


cdef object build_direct(Node nd, DCtx *c):
    """An instance of a class that kiln._plan.direct_build lets us build
    (src/kiln_fields.h): every field decoded first, as calling the class
    does, then object.__new__(cls) and what its generated __init__ would do:
    slot stores, object.__setattr__ from C, or the __init__ itself with the
    values as a C array; the class itself when it changed since."""
    cdef Py_ssize_t i, got = 0
    cdef Py_ssize_t nf = nd.nf
    cdef FieldInfo *fi = nd.finfo
    cdef PyObject *stack[17]
    cdef PyObject **args = stack
    cdef int kind = nd.bkind
    if nf > 16:
        args = <PyObject **>PyMem_Malloc(sizeof(PyObject *) * (nf + 1))
        if args == NULL:
            raise MemoryError()
    try:
        for i in range(nf):
            v = dec_field(&fi[i], c)
            Py_INCREF(v)
            args[i + 1] = <PyObject *>v
            got = i + 1
        if not (kiln_record_ok(nd.cls, nd.btag) if nd.brecord else
                kiln_build_ok(nd.cls, nd.btag, nd.binit, nd.bcode, nd.bclosure, nd.bcells)) \
                and not same_decision(nd):
            vals = PyTuple_New(nf)   # the class changed since: call it
            for i in range(nf):
                Py_INCREF(<object>args[i + 1])
                PyTuple_SET_ITEM(vals, i, args[i + 1])
            return nd.make(*vals)
        if nd.brecord:
            return record_build(nd, args, &got)
        out = kiln_object_new(nd.cls, ())
        if kind == KILN_BUILD_INIT:
            args[0] = <PyObject *>out
            kiln_call_init(nd.binit, args, nf + 1)
        elif kind == KILN_BUILD_SLOTS:
            got = 0   # the slots take the references over
            for i in range(nf):
                kiln_slot_steal(out, fi[i].woff, args[i + 1])
        else:
            for i in range(nf):
                kiln_setattr(out, <object>fi[i].name, <object>args[i + 1])
        return out
    finally:
        for i in range(got):
            Py_DECREF(<object>args[i + 1])
        if args != stack:
            PyMem_Free(args)


cdef object record_build(Node nd, PyObject **args, Py_ssize_t *got):
    """A kiln.Record from its decoded fields (args[1:nf + 1], whose references
    its slots take over): what RecordBase.__init__ does, untracked by the
    collector when every field is atomic (src/kernels/record.pxi)."""
    cdef Py_ssize_t i
    cdef FieldInfo *fi = nd.finfo
    cdef bint atomic = True
    out = kiln_alloc(nd.cls)
    got[0] = 0
    for i in range(nd.nf):
        if not kiln_atomic(args[i + 1]):
            atomic = False
        kiln_slot_steal(out, fi[i].woff, args[i + 1])
    record_untrack(out, atomic)
    return out


cdef object ctx_mv(DCtx *c):
    if c.mv == NULL:
        buf = <object>c.buf
        # bytes: already flat, one byte per item (as as_bytes_view would give)
        mv = memoryview(buf) if PyBytes_CheckExact(buf) and PyBytes_GET_SIZE(c.buf) \
            else as_bytes_view(buf)
        Py_INCREF(mv)
        c.mv = <PyObject *>mv
    return <object>c.mv


cdef object dec_tensors(Node nd, DCtx *c, bint standalone):
    cdef Py_ssize_t p = c.pos
    cdef Py_ssize_t end = 0
    cdef uint64_t base = 0
    # (exact bytes cannot change: the table is checked and read where it is)
    table = vdir(c.d, c.n, p, standalone, c.trusted, c.max_count, c.max_bytes, c.max_copy, True,
                 &end, &base, -1, not c.shared)
    mv = ctx_mv(c)
    if _D_ok and nd.hooks is _D_hooks and not c.copy:
        res = view_directory(mv, p + base, <list>table, c.trusted)
    else:
        res = nd.hooks.build(mv, p, base, table, c.copy, c.trusted)
    c.pos = end
    return res


cdef object dec(Node nd, DCtx *c):
    cdef int op = nd.op
    cdef Py_ssize_t p
    cdef uint8_t pres
    if op <= LAST_SCALAR:
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
        return dec_bytes(nd, c)
    if op == OP_DICT:
        return dec_dict(nd, c)
    if op == OP_TENSORS:
        return dec_tensors(nd, c, False)
    if op == OP_CONV:
        return dec_conv(nd, c)
    raise AssertionError("unknown op %r" % op)



cdef class DecodeProgram:
    """A plan compiled for decoding with fixed options."""
    cdef readonly object plan
    cdef readonly object frame_hash
    cdef readonly bint trusted
    cdef readonly object max_count
    cdef readonly object max_bytes
    cdef readonly bint copy
    cdef readonly object max_copy
    cdef Node root
    cdef bint framed
    cdef bint hash_ok
    cdef uint64_t hash
    cdef uint64_t cmax_count
    cdef uint64_t cmax_bytes
    cdef bint top_tensors

    def __init__(self, plan, frame_hash, trusted, max_count, max_bytes, copy, max_copy=None):
        self.plan = plan
        self.frame_hash = frame_hash
        self.trusted = bool(trusted)
        self.max_count = int(max_count)
        self.max_bytes = int(max_bytes)
        self.copy = bool(copy)
        self.max_copy = None if max_copy is None else int(max_copy)
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
        ctx_start(self, &c)
        c.d = <const uint8_t *>view.buf
        c.n = view.len
        c.buf = <PyObject *>buf
        c.shared = not PyBytes_CheckExact(buf)
        try:
            return ctx_run(self, &c)
        except KilnError as e:
            if not self.framed and c.n >= 4 and memcmp(c.d, b"KLN0", 4) == 0:
                frame_hint(e)
            raise
        finally:
            Py_XDECREF(c.mv)
            PyBuffer_Release(&view)

    def list_head(self, buf, length=None):
        """The head of a list value in ``buf``: see decode_runs.pxi."""
        return program_list_head(self, buf, length)

    def decode_items(self, buf, at, count, out):
        """``count`` values back to back from ``at``: see decode_runs.pxi."""
        return program_decode_items(self, buf, at, count, out)


def compile_decoder(plan, frame_hash, trusted, max_count, max_bytes, copy, max_copy=None):
    """Compile ``plan`` into a decode program (see kiln._kernels_py)."""
    return DecodeProgram(plan, frame_hash, trusted, max_count, max_bytes, copy, max_copy)
