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
