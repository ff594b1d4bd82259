# Compiled plans: one Node per plan node, shared by decode and encode.  The
# pure kernel has no twin file: it compiles plans into closures in decode.py
# and encode.py.

cdef struct FieldInfo:
    int op
    PyObject *node      # borrowed from Node.fields
    PyObject *name      # borrowed from Node.names
    int kind            # class-bound struct: how encode reads the field (KILN_FK_*)
    Py_ssize_t off      # KILN_FK_SLOT: the slot's offset; KILN_FK_INDEX: the tuple index
    Py_ssize_t woff     # KILN_BUILD_SLOTS: the slot decode stores the field in


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
    cdef int form           # pod list or list<u8>: the Python value (FORM_*)
    cdef unsigned int ftag  # struct: cls's version tag when finfo's kinds were decided
    cdef bint fdict         # struct: every field's kind is KILN_FK_DICT
    cdef bint sfast         # struct: every field's kind is KILN_FK_SLOT or KILN_FK_INDEX
    cdef int bkind          # struct: how decode builds the instance (KILN_BUILD_*)
    cdef unsigned int btag  # struct: cls's version tag when bkind was decided
    cdef object binit       # struct, built directly: the class's generated __init__
    cdef object bcode       # ... and its code when bkind was decided
    cdef object bclosure    # ... its closure (a tuple of cells, or None)
    cdef object bcells      # ... and what the cells held then (a tuple)
    cdef bint brecord       # struct: a kiln.Record, built by slot stores (KILN_BUILD_SLOTS)

    def __dealloc__(self):
        PyMem_Free(self.finfo)

    def __repr__(self):
        return "<kiln._kernels_c.Node %d %r>" % (self.op, self.text)


cdef int build_kind(Node nd) except -1:
    """Decide how dec_struct builds an instance of nd.cls (see src/kiln_fields.h);
    kiln._plan.direct_build says what the class allows."""
    cdef Py_ssize_t i, off
    cdef PyObject *d
    cdef FieldInfo *fi = nd.finfo
    nd.bkind = KILN_BUILD_CALL
    nd.btag = 0
    cls = nd.cls
    if not isinstance(cls, type):
        return 0
    kiln_type_lookup(cls, "__init__")  # gives the class a version tag if it has none
    nd.btag = kiln_type_tag(cls)       # before the question: a change in between shows
    direct = _P.direct_build(cls, nd.names)
    if direct == "tuple" and issubclass(cls, tuple):
        nd.bkind = KILN_BUILD_TUPLE
        return 0
    if direct == "record":
        return record_kind(nd)
    if direct != "object":
        return 0
    init = cls.__init__
    if type(init) is not _FunctionType:
        return 0
    # the closure's cells (a frozen class's __init__ stores through the object
    # in one) are part of the decision: what they hold is kept, and compared
    # on every build (kiln_build_ok)
    clo = init.__closure__
    try:
        cells = tuple([c.cell_contents for c in clo]) if clo is not None else ()
    except ValueError:   # an empty cell: direct_build refuses those
        return 0
    nd.binit, nd.bcode, nd.bclosure, nd.bcells = init, init.__code__, clo, cells
    nd.bkind = KILN_BUILD_SLOTS
    for i in range(nd.nf):
        d = kiln_type_lookup(cls, <object>fi[i].name)
        off = kiln_slot_offset_w(cls, d) if d != NULL else -1
        fi[i].woff = off
        if off < 0:
            nd.bkind = KILN_BUILD_INIT
    # the __init__ is called with the values by position (direct_build has
    # checked that its parameters are the fields in order) unless it takes
    # keyword-only ones; a frozen class's __init__ stores through
    # object.__setattr__ from Python.  Up to 4 fields object.__setattr__ from
    # C costs less than the frame (callgrind, CPython 3.11, a record of 4
    # fields: 3185 instructions against 3247; 6 fields, the build alone: 1957
    # against 1607)
    if nd.bkind == KILN_BUILD_INIT and (nd.nf <= 4 or init.__code__.co_kwonlyargcount
                                        or "__setattr__" in init.__code__.co_names):
        nd.bkind = KILN_BUILD_ATTRS
    if nd.btag != kiln_type_tag(cls) or nd.btag == 0:
        nd.bkind = KILN_BUILD_CALL
    return 0


cdef bint same_decision(Node nd) except -1:
    """The class's version tag changed since build_kind (a class attribute
    set, by kiln's neighbours too: msgspec caches its own information on
    the classes it is given): is the decision still what it would be now?
    Then only the tag is renewed (one store: a decode in another thread
    reads the old tag or the new, and calls the class or builds it, both
    right); else nothing changes and the caller calls the class."""
    cdef Py_ssize_t i, off
    cdef PyObject *d
    cdef FieldInfo *fi = nd.finfo
    cls = nd.cls
    kiln_type_lookup(cls, "__init__")   # gives the class a version tag if it has none
    tag = kiln_type_tag(cls)
    if tag == 0:
        return False
    direct = _P.direct_build(cls, nd.names)
    if direct != ("record" if nd.brecord else "object"):
        return False
    if not nd.brecord:
        init = cls.__init__
        if init is not nd.binit or init.__code__ is not nd.bcode or \
                init.__closure__ is not nd.bclosure:
            return False
        if nd.bclosure is not None and tuple([c.cell_contents for c in nd.bclosure]) != \
                nd.bcells:
            return False
    for i in range(nd.nf):
        d = kiln_type_lookup(cls, <object>fi[i].name)
        # a Record's slots are sealed (read-only to their descriptors: record.pxi)
        off = -1 if d == NULL else kiln_record_slot(cls, d) if nd.brecord else \
            kiln_slot_offset_w(cls, d)
        if off != fi[i].woff and (nd.bkind == KILN_BUILD_SLOTS or off >= 0):
            return False
    if kiln_type_tag(cls) != tag:
        return False
    nd.btag = tag
    return True


cdef int record_kind(Node nd) except -1:
    """A kiln.Record: allocated and its slots stored (src/kernels/record.pxi)."""
    cdef Py_ssize_t i, off
    cdef PyObject *d
    cdef FieldInfo *fi = nd.finfo
    cls = nd.cls
    for i in range(nd.nf):
        d = kiln_type_lookup(cls, <object>fi[i].name)
        off = kiln_record_slot(cls, d) if d != NULL else -1   # (sealed: record.pxi)
        if off < 0:
            return 0   # not a slot of its own (a property put in its place): call it
        fi[i].woff = off
    if nd.btag != kiln_type_tag(cls) or nd.btag == 0:
        return 0
    nd.brecord = True
    nd.bkind = KILN_BUILD_SLOTS
    return 0


cdef Node compile_node(object plan):
    cdef Node nd = Node.__new__(Node)
    cdef Node f
    cdef Py_ssize_t i
    cdef int op = plan.op
    nd.op = op
    nd.text = plan.text
    if OP_BOOL <= op <= LAST_SCALAR:
        nd.width = SW[op]
    elif op == OP_PODLIST:
        le = _np.dtype(_W.NUMPY_LE[plan.elem.op])
        nd.elem_op = plan.elem.op
        nd.width = le.itemsize
        nd.dt_native = le.newbyteorder("=")
        nd.dt_big = le.newbyteorder(">")
        nd.dt_le = le
        nd.form = plan.form
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
            nd.finfo[i].kind = KILN_FK_ATTR
            nd.finfo[i].off = 0
            nd.finfo[i].woff = -1
            if f.has_tensors:
                nd.has_tensors = True
        if nd.cls is not None:
            field_kinds(nd)
            build_kind(nd)
    elif op == OP_CONV:
        # a Python-level conversion over the wire type (kiln._pyconv)
        nd.elem = compile_node(plan.elem)
        nd.make = plan.make
        nd.get = plan.get
    elif op == OP_TENSORS:
        nd.hooks = plan.tensors
        nd.has_tensors = True
    elif op == OP_BYTES:
        nd.form = plan.form
        nd.dt_native = _np.dtype("|u1")
    elif op == OP_STR:
        pass
    else:
        raise AssertionError("unknown op %r" % op)
    return nd


