# Frozen encode, part: structs and tensor directories (see encode.pxi).

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
    nd.sfast = True
    for i in range(nd.nf):
        if fi[i].kind != KILN_FK_DICT:
            nd.fdict = False
        if fi[i].kind != KILN_FK_SLOT and fi[i].kind != KILN_FK_INDEX:
            nd.sfast = False
    nd.ftag = kiln_type_tag(cls)
    return 0


cdef int read_fields(Node nd, object v, PyObject **vals, Py_ssize_t *got) except -1:
    """Read every field of the nd.cls instance ``v`` into ``vals`` (owned refs,
    counted in ``got``), in field order, before anything is encoded: what
    getattr gives at that moment, without a call per field where the class
    allows it (a read that runs code ends that where it changed the class)."""
    cdef Py_ssize_t i, ix
    cdef FieldInfo *fi = nd.finfo
    cdef PyObject *o
    cdef PyObject *k
    cdef PyObject *dp = NULL
    cdef int kind
    cdef bint fast = False, ran
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
            ran = kind == KILN_FK_DICT   # (a key's __eq__ may run)
            if o == NULL:
                o = kiln_getattr(v, <object>fi[i].name)
                ran = True
            vals[i] = o
            got[0] = i + 1
            i += 1
            if fast and ran:
                # that read may have run code that changed the class (or the
                # instance's) or replaced the instance dict: the rest is read
                # as getattr reads it now (the pure kernel's rule), the dict
                # fetched again
                Py_XDECREF(dp)
                dp = NULL
                if kiln_type_tag(nd.cls) != nd.ftag or not kiln_exact_type(v, nd.cls):
                    fast = False
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


cdef extern from "Python.h":
    # (the same macros on borrowed pointers: no reference counting around them)
    void Py_DECREF_p "Py_DECREF"(PyObject *o)
    int PyUnicode_Compare_p "PyUnicode_Compare"(PyObject *a, PyObject *b) noexcept
    bint PyUnicode_CheckExact_p "PyUnicode_CheckExact"(PyObject *o)
    bint PyUnicode_IS_COMPACT_ASCII_p "PyUnicode_IS_COMPACT_ASCII"(PyObject *o)
    void *PyUnicode_DATA_p "PyUnicode_DATA"(PyObject *o)
    Py_ssize_t PyUnicode_GET_LENGTH_p "PyUnicode_GET_LENGTH"(PyObject *o)


cdef inline int enc_field(FieldInfo *f, Writer *w, PyObject *o) except -1:
    """One struct field.  An exact int for i64, float for f64 or ASCII str
    for str is written here, as enc_int, enc_float and enc_str write it (no
    Python code runs for these); anything else goes through enc."""
    cdef int op = f.op
    cdef long long x
    cdef int of = 0
    cdef Py_ssize_t ln
    if op == OP_I64:
        if PyLong_CheckExact(o):
            x = PyLong_AsLongLongAndOverflow(o, &of)
            if of == 0 and (x != -1 or PyErr_Occurred() == NULL):
                w_reserve(w, 8)
                kiln_st_u64(w.data + w.pos, <uint64_t>x)
                w.pos += 8
                return 0
            PyErr_Clear()   # (enc raises the error for this value itself)
    elif op == OP_F64:
        if PyFloat_CheckExact(o):
            w_reserve(w, 8)
            kiln_st_f64(w.data + w.pos, PyFloat_AS_DOUBLE(o))
            w.pos += 8
            return 0
    elif op == OP_STR:
        if PyUnicode_CheckExact_p(o) and PyUnicode_IS_COMPACT_ASCII_p(o):
            ln = PyUnicode_GET_LENGTH_p(o)
            if <uint64_t>ln <= U32_MAX:
                w_reserve(w, 4 + ln)
                kiln_st_u32(w.data + w.pos, <uint32_t>ln)
                memcpy(w.data + w.pos + 4, PyUnicode_DATA_p(o), ln)
                w.pos += 4 + ln
                return 0
    return enc(<Node>f.node, w, <object>o)


cdef inline int put_exact(FieldInfo *f, Writer *w, PyObject *o) except -1:
    """Write ``o`` as field ``f`` when it is an exact int, float, bool, ASCII
    str or list of such numbers in range of the field's type (what enc writes
    for it; no Python code runs): 1.  Anything else: 0, and nothing is
    written (the general path then raises any error)."""
    cdef int op = f.op
    cdef long long x
    cdef int of = 0
    cdef Py_ssize_t ln, c
    cdef char *src
    cdef float y
    cdef double fx
    if op <= OP_U64 and op != OP_BOOL and op != OP_U64:
        if not PyLong_CheckExact(o):
            return 0
        x = PyLong_AsLongLongAndOverflow(o, &of)
        if of or (x == -1 and PyErr_Occurred() != NULL):
            PyErr_Clear()
            return 0
        if op != OP_I64 and (x < INT_LO[op] or x > INT_HI[op]):
            return 0
        w_put_le(w, <uint64_t>x, SW[op])
        return 1
    if op == OP_F64 or op == OP_F32:
        if not PyFloat_CheckExact(o):
            return 0
        fx = PyFloat_AS_DOUBLE(o)
        w_reserve(w, 8)
        if op == OP_F64:
            kiln_st_f64(w.data + w.pos, fx)
            w.pos += 8
            return 1
        y = <float>fx
        if isinf(y) and not isinf(fx):
            return 0
        if <double>y != fx and fx == fx and not w.round_floats:
            return 0   # (enc_float refuses it: it would change)
        kiln_st_f32(w.data + w.pos, y)
        w.pos += 4
        return 1
    if op == OP_STR:
        if not (PyUnicode_CheckExact_p(o) and PyUnicode_IS_COMPACT_ASCII_p(o)):
            return 0
        ln = PyUnicode_GET_LENGTH_p(o)
        if <uint64_t>ln > U32_MAX:
            return 0
        w_reserve(w, 4 + ln)
        kiln_st_u32(w.data + w.pos, <uint32_t>ln)
        memcpy(w.data + w.pos + 4, PyUnicode_DATA_p(o), ln)
        w.pos += 4 + ln
        return 1
    if op == OP_BOOL:
        if o != <PyObject *>True and o != <PyObject *>False:
            return 0
        w_reserve(w, 1)
        w.data[w.pos] = 1 if o == <PyObject *>True else 0
        w.pos += 1
        return 1
    if op == OP_PODLIST and not KILN_FREE_THREADED:
        if PyList_CheckExact(<object>o):
            return pod_fast_seq(<Node>f.node, w, <object>o, PyList_GET_SIZE(<object>o))
        # a 1-D C-contiguous array of the wire dtype: enc_pod's one copy
        if _np_fast and type(<object>o) is _np_ndarray and \
                kiln_np_plain_1d(<object>o, (<Node>f.node).dt_le, &src, &c) and <uint64_t>c <= U32_MAX:
            w_pod_run(w, src, c, (<Node>f.node).width, False)
            return 1
    return 0


cdef int struct_fast(Node nd, Writer *w, object v) except -1:
    """An object of exactly nd.cls whose fields all live in slots or tuple
    items (nd.sfast) and hold exact values put_exact writes: written from the
    borrowed fields (no Python code runs meanwhile, so none can change them),
    1.  Else 0 with nothing written: the general path reads and encodes."""
    cdef Py_ssize_t i, ix, start = w.pos
    cdef FieldInfo *fi = nd.finfo
    cdef PyObject *o
    for i in range(nd.nf):
        if fi[i].kind == KILN_FK_SLOT:
            o = kiln_slot_peek(v, fi[i].off)
        else:
            ix = fi[i].off
            o = PyTuple_GET_ITEM(v, ix) if ix < PyTuple_GET_SIZE(v) else NULL
        if o == NULL or not put_exact(&fi[i], w, o):
            w.pos = start
            return 0
    return 1


cdef int dict_fast(Node nd, Writer *w, object v) except -1:
    """An exact dict whose keys are exactly the fields, in field order (the
    same str objects or equal exact strs), with values put_exact writes:
    written from the borrowed items in one walk of the dict (no Python code
    runs meanwhile), 1.  Else 0 with nothing written: dict_fields looks the
    fields up by name and the general path raises any error."""
    cdef Py_ssize_t i = 0, ix = 0, start = w.pos
    cdef FieldInfo *fi = nd.finfo
    cdef PyObject *k
    cdef PyObject *o
    if KILN_FREE_THREADED or PyDict_GET_SIZE(v) != nd.nf:
        return 0
    while PyDict_Next(v, &ix, &k, &o):
        if k != fi[i].name and not (PyUnicode_CheckExact_p(k) and   # (exact strs: no
                                    PyUnicode_Compare_p(k, fi[i].name) == 0):   # code runs)
            w.pos = start
            return 0
        if not put_exact(&fi[i], w, o):
            w.pos = start
            return 0
        i += 1
    return 1


cdef int enc_struct(Node nd, Writer *w, object v) except -1:
    cdef Py_ssize_t i, nf = nd.nf, got = 0
    cdef FieldInfo *fi = nd.finfo
    cdef PyObject *stack[16]
    cdef PyObject **vals = stack
    cdef int d
    if nd.sfast and kiln_exact_type(v, nd.cls) and nd.ftag != 0 and \
            kiln_type_tag(nd.cls) == nd.ftag and struct_fast(nd, w, v):
        return 0
    if nd.cls is None and PyDict_CheckExact(v) and dict_fast(nd, w, v):
        return 0
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
                w.segs[d].obj = fi[i].name
                enc_field(&fi[i], w, vals[i])
        else:
            for i in range(nf):
                enc_field(&fi[i], w, vals[i])
        seg_pop(w)
    finally:
        for i in range(got):
            Py_DECREF_p(vals[i])
        if vals != stack:
            PyMem_Free(vals)
    return 0


cdef int enc_tensors(Node nd, Writer *w, object v) except -1:
    cdef Py_ssize_t start = w.pos
    cdef int fast = fast_tensors(nd, w, v)
    if not fast:
        try:
            records = nd.hooks.normalize(v)
        except EncodeError as e:
            e.offset = start
            raise
        write_dir(w, records)
    if fast != 2:   # a block of plain arrays is valid as written (fast_tensors)
        check_written(<const uint8_t *>w.data, w.pos, start)
    # the first block with payload bytes: an aligned record pads so that it
    # starts on a 64-byte boundary (its payloads are 64-aligned to its start)
    if w.first_dir < 0 and kiln_ld_u64(<const uint8_t *>w.data + start + 16) != 0:
        w.first_dir = start
    return 0
