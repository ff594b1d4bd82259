# The tensor part: the twin of kiln/_kernels_py/tensors.py.  Everything the
# tensor layer (kiln/_tensors/) and this module hand each other is here and in
# the kernel interface (kiln._kernel.Kernels, the tensor part), bound in one
# place, kiln/_tensors/bind.py.  The slot names come from kiln/_wire.py through
# the generated wire.pxi (TENSOR_SLOTS, DIRECTORY_SLOTS, indexed by TS_*/DS_*);
# rows are read by the generated R_* names.
#
# Tensor.numpy() and TensorDirectory.values() of a decoded directory:
# kiln/_tensors hands over its Tensor class (tensor_setup); a decoded
# directory holds one buffer export of its memoryview (hold_buffer), the base
# of every array made over it, so the caller's buffer stays exported (a
# bytearray cannot be resized, an mmap not closed) while any array lives,
# and the arrays are read-only (the holder exports nothing writable).

cdef extern from "kiln_numpy.h":
    object kiln_np_view(object descr, int nd, Py_ssize_t *dims, char *data, object base)


cdef class HeldBuffer:
    """One buffer export of a tensor directory's memoryview: the base of the
    arrays that Tensor.numpy makes over it."""
    cdef Py_buffer view
    cdef bint held

    def __dealloc__(self):
        if self.held:
            self.held = False
            PyBuffer_Release(&self.view)


def hold_buffer(mv):
    """A HeldBuffer over ``mv`` (a flat memoryview), or None when it cannot be held."""
    cdef HeldBuffer h = HeldBuffer.__new__(HeldBuffer)
    try:
        PyObject_GetBuffer(mv, &h.view, PyBUF_SIMPLE)
    except (BufferError, TypeError, ValueError):
        return None
    h.held = True
    return h


cdef object _T_cls = None       # kiln.Tensor
cdef dict _T_shaped = None      # whole-element dtype code -> numpy dtype
cdef object _T_py = None        # the Python Tensor.numpy, for everything else
cdef Py_ssize_t _T_off[6]       # slot offsets, by TS_* (TENSOR_SLOTS)
cdef bint _T_ok = False


def tensor_setup(cls, shaped, py_numpy):
    """Take kiln.Tensor, its whole-element dtypes (the dict itself, which the
    tensor layer extends when ml_dtypes arrives) and its Python numpy(); True
    when tensor_numpy_method and tensors_fill can be used."""
    global _T_cls, _T_shaped, _T_py, _T_ok, _T_last_code
    _T_ok = False
    _T_last_code = None   # (shaped_dtype's answer was for the dict before)
    if not _np_fast or KILN_FREE_THREADED or type(shaped) is not dict or \
            cls.__new__ is not object.__new__ or len(TENSOR_SLOTS) != 6:
        return False
    for i, nm in enumerate(TENSOR_SLOTS):
        d = cls.__dict__.get(nm)
        if d is None or kiln_slot_offset(cls, <PyObject *>d) < 0:
            return False
        _T_off[i] = kiln_slot_offset(cls, <PyObject *>d)
    _T_cls, _T_shaped, _T_py = cls, shaped, py_numpy
    _T_ok = True
    return True


cdef inline object t_slot(object t, int k):
    cdef PyObject *p = kiln_slot_get(t, _T_off[k])
    if p == NULL:
        return None
    o = <object>p
    Py_DECREF(o)  # the cast took its own reference
    return o


cdef inline object t_numpy(object t):
    if not _T_ok or not isinstance(t, _T_cls):
        return _T_py(t)
    arr = row_array(t_slot(t, TS_ROW), t_slot(t, TS_OWN), t_slot(t, TS_OFF))
    return _T_py(t) if arr is None else arr


def tensor_numpy_method(tensor):
    """kiln.Tensor.numpy with the compiled kernels (a compiled function binds
    to its instance as a Python function does: no Python frame per call):
    for a decoded tensor of a whole-element dtype the array is made here over
    the held buffer, shaped, read-only; else the Python one."""
    return t_numpy(tensor)


cdef object _T_last_dt = None   # the dtype whose itemsize was read last (held:
cdef uint64_t _T_last_size = 0  # its identity cannot be taken by another meanwhile)


cdef inline uint64_t dt_itemsize(object dt) except? 0:
    """``dt.itemsize`` (a numpy dtype's never changes), the attribute read
    once for the dtype of the tensors before (most tables hold one dtype)."""
    global _T_last_dt, _T_last_size
    if dt is not _T_last_dt:
        size = <uint64_t>dt.itemsize
        _T_last_dt, _T_last_size = dt, size
    return _T_last_size


cdef object _T_last_code = None   # the dtype code looked up last (held), its dtype
cdef object _T_last_shaped = None  # and the size of _T_shaped then
cdef Py_ssize_t _T_last_n = -1


cdef inline object shaped_dtype(object code):
    """``_T_shaped.get(code)``, the lookup made once for a run of one code.
    The tensor layer only adds codes to that dict (ml_dtypes' when it
    arrives; the dtypes of the codes already there are numpy's own, the
    same objects when computed again), so the answer for a code stays the
    same while the dict's size does."""
    global _T_last_code, _T_last_shaped, _T_last_n
    if code is _T_last_code and PyDict_GET_SIZE(_T_shaped) == _T_last_n:
        return _T_last_shaped
    dt = _T_shaped.get(code)
    if dt is not None:
        _T_last_code, _T_last_shaped, _T_last_n = code, dt, PyDict_GET_SIZE(_T_shaped)
    return dt


cdef object row_array(object row, object own, object offo):
    """The array over a table row's payload at byte ``offo`` of the held buffer
    ``own``, or None when the Python path must make it."""
    cdef Py_ssize_t dims[8]
    cdef Py_ssize_t k, rank, off, nbytes
    cdef uint64_t prod = 1
    cdef HeldBuffer h
    if type(own) is not HeldBuffer or type(row) is not tuple or PyTuple_GET_SIZE(row) != ROW_SIZE:
        return None
    dt = shaped_dtype(<object>PyTuple_GET_ITEM(row, R_CODE))
    nbytes = <object>PyTuple_GET_ITEM(row, R_BYTE_LENGTH)
    shape = <object>PyTuple_GET_ITEM(row, R_SHAPE)
    if dt is None or nbytes <= 0 or type(shape) is not tuple or type(offo) is not int:
        return None
    rank = PyTuple_GET_SIZE(shape)
    if rank > 8:
        return None
    for k in range(rank):
        dims[k] = <object>PyTuple_GET_ITEM(shape, k)
        if dims[k] <= 0 or kiln_mul_u64(prod, <uint64_t>dims[k], &prod):
            return None
    h = <HeldBuffer>own
    off = offo
    if prod * dt_itemsize(dt) != <uint64_t>nbytes or off < 0 or nbytes > h.view.len - off:
        return None
    return kiln_np_view(dt, <int>rank, dims, <char *>h.view.buf + off, own)


cdef object name_str(object b, const char *errors, bint small):
    cdef PyObject *r
    if b is None:
        return None
    if type(b) is not bytes:
        return b.decode("utf-8", (<bytes>errors).decode())
    if small:   # (only small directories' names are cached: see make_table)
        u = cached_name_str(b)   # valid UTF-8: the same str whatever the error handler
        if u is not None:
            return u
    # (kiln_text: an ASCII name straight into its str, about half the
    # instructions of PyUnicode_DecodeUTF8; exact bytes cannot change)
    r = kiln_text(PyBytes_AS_STRING(<PyObject *>b), PyBytes_GET_SIZE(<PyObject *>b), errors, 0)
    if r != NULL:
        return _take(r)
    PyErr_Clear()   # (its error, raised again by the decoder itself)
    return PyUnicode_DecodeUTF8(PyBytes_AS_STRING(<PyObject *>b),
                                PyBytes_GET_SIZE(<PyObject *>b), errors)


cdef extern from "Python.h":
    Py_ssize_t kiln_as_ssize "PyLong_AsSsize_t"(object o)   # (-1 and an error set: cleared)
    object kiln_from_ssize "PyLong_FromSsize_t"(Py_ssize_t v)


cdef inline object abs_offset(object pb, object off):
    """``pb + off`` (the payload base and a row's byte offset), added in C
    when both are exact ints that fit."""
    cdef Py_ssize_t a, b
    if PyLong_CheckExact(<PyObject *>pb) and PyLong_CheckExact(<PyObject *>off):
        a = kiln_as_ssize(pb)
        b = kiln_as_ssize(off)
        if a >= 0 and b >= 0 and a <= PY_SSIZE_T_MAX - b:
            return kiln_from_ssize(a + b)
        PyErr_Clear()
    return pb + off


def tensors_fill(directory):
    """TensorDirectory.values() of a decoded directory: make each Tensor not
    yet made (as TensorDirectory._make does); returns d._tensors, or None
    when the Python path must do it.

    Python code may run in the loop (an allocation starts a collection, whose
    callbacks run; a name that is not bytes decodes itself) and change the
    directory: both lists are measured again before every read and store
    (not copied: on 3.11 the allocation of a copy can start a collection that
    shortens the list being copied), each row and each Tensor made is held
    while it is used, and the errors string is held here."""
    cdef Py_ssize_t i, n, made = 0
    cdef const char *errs
    cdef PyObject **fresh = NULL
    d = directory
    if _D_ok and type(d) is _D_cls:
        tensors, rows, buf, own, pb = d_slot(d, DS_TENSORS), d_slot(d, DS_ROWS), \
            d_slot(d, DS_BUF), d_slot(d, DS_OWN), d_slot(d, DS_PB)
        errors = d_slot(d, DS_ERRORS)
    else:
        tensors, rows, buf, own, pb = d._tensors, d._rows, d._buf, d._own, d._pb
        errors = d._errors
    if not _T_ok or type(tensors) is not list or type(rows) is not list or \
            len(tensors) != len(rows) or type(errors) is not str:
        return None
    errs = PyUnicode_AsUTF8(errors)
    n = PyList_GET_SIZE(rows)
    fresh = <PyObject **>PyMem_Malloc(sizeof(PyObject *) * (n + 1))
    if fresh == NULL:
        raise MemoryError()
    try:
        for i in range(n):
            if i >= PyList_GET_SIZE(tensors) or i >= PyList_GET_SIZE(rows):
                return None   # shortened meanwhile
            if PyList_GET_ITEM(tensors, i) != <PyObject *>None:
                continue
            row = <object>PyList_GET_ITEM(rows, i)   # (held from here)
            if type(row) is not tuple or PyTuple_GET_SIZE(row) != ROW_SIZE:   # (make_table's)
                return None
            nm, kd, off = <object>PyTuple_GET_ITEM(row, R_NAME), \
                <object>PyTuple_GET_ITEM(row, R_LAYOUT), <object>PyTuple_GET_ITEM(row, R_BYTE_OFFSET)
            t = kiln_alloc(_T_cls)
            # untracked while they are made: a collection that the allocations
            # start meanwhile does not walk them; each is held here (owned,
            # whatever happens to the list) and tracked again below
            PyObject_GC_UnTrack(t)
            Py_INCREF(t)
            fresh[made] = <PyObject *>t
            made += 1
            kiln_slot_set(t, _T_off[TS_NAME], name_str(nm, errs, n <= 64))
            kiln_slot_set(t, _T_off[TS_LAYOUT], name_str(kd, errs, False))
            kiln_slot_set(t, _T_off[TS_ROW], row)
            kiln_slot_set(t, _T_off[TS_BUF], buf)
            kiln_slot_set(t, _T_off[TS_OFF], abs_offset(pb, off))
            kiln_slot_set(t, _T_off[TS_OWN], own)
            if i >= PyList_GET_SIZE(tensors):
                return None
            tensors[i] = t      # the list owns it from here (measured just above)
    finally:
        for i in range(made):   # every Tensor made is tracked again, error or not
            PyObject_GC_Track(<object>fresh[i])
            Py_XDECREF(fresh[i])
        PyMem_Free(fresh)
    return tensors


def tensors_dict_method(directory):
    """kiln.TensorDirectory.to_dict with the compiled kernels (bound as a
    Python function is): {t.name: t.numpy()}, the tensors and arrays of a
    decoded directory made here (by tensors_fill's rules)."""
    d = directory
    if (d_slot(d, DS_ROWS) if _D_ok and type(d) is _D_cls else d._rows) is not None:
        out = t_dict(d)
        if out is not None:
            return out
    return {t.name: t.numpy() for t in d.values()}


cdef object t_dict(object d):
    """{t.name: t.numpy()} of a decoded directory, or None when tensors_fill
    would decline it.  Python code runs in the loop (t.numpy(), d._tensor(i),
    collections): both lists are measured again before every read (see
    tensors_fill)."""
    cdef Py_ssize_t i, n
    cdef const char *errs
    if _D_ok and type(d) is _D_cls:
        tensors, rows, own, pb = d_slot(d, DS_TENSORS), d_slot(d, DS_ROWS), d_slot(d, DS_OWN), \
            d_slot(d, DS_PB)
        errors = d_slot(d, DS_ERRORS)
    else:
        tensors, rows, own, pb = d._tensors, d._rows, d._own, d._pb
        errors = d._errors
    if not _T_ok or type(tensors) is not list or type(rows) is not list or \
            len(tensors) != len(rows) or type(errors) is not str:
        return None
    errs = PyUnicode_AsUTF8(errors)
    out = {}
    n = PyList_GET_SIZE(rows)
    for i in range(n):
        if i >= PyList_GET_SIZE(tensors) or i >= PyList_GET_SIZE(rows):
            return None   # shortened meanwhile: the Python path
        t = <object>PyList_GET_ITEM(tensors, i)
        if t is not None:   # made before: its name as it is now, its numpy()
            PyDict_SetItem(out, t.name, t.numpy())
            continue
        # not made yet: the array straight from the row (the Tensor would give the same)
        if i >= PyList_GET_SIZE(rows):
            return None
        row = <object>PyList_GET_ITEM(rows, i)
        if type(row) is not tuple or PyTuple_GET_SIZE(row) != ROW_SIZE:
            return None
        arr = row_array(row, own, pb + <object>PyTuple_GET_ITEM(row, R_BYTE_OFFSET))
        if arr is None:
            t = d._tensor(i)
            arr = t.numpy()
        PyDict_SetItem(out, name_str(<object>PyTuple_GET_ITEM(row, R_NAME), errs, n <= 64), arr)
    return out


cdef object _D_cls = None       # kiln.TensorDirectory
cdef object _D_hooks = None     # kiln._tensors.hooks.HOOKS
cdef Py_ssize_t _D_off[8]       # slot offsets, by DS_* (DIRECTORY_SLOTS)
cdef bint _D_ok = False


def directory_setup(cls, hooks):
    """Take kiln.TensorDirectory and the tensor hooks: decode then builds a
    view directory (what hooks.build does with copy=False) in C.  True when in use."""
    global _D_cls, _D_hooks, _D_ok
    _D_ok = False
    if not _T_ok or cls.__new__ is not object.__new__ or len(DIRECTORY_SLOTS) != 8:
        return False
    for i, nm in enumerate(DIRECTORY_SLOTS):
        d = cls.__dict__.get(nm)
        if d is None or kiln_slot_offset(cls, <PyObject *>d) < 0:
            return False
        _D_off[i] = kiln_slot_offset(cls, <PyObject *>d)
    _D_cls, _D_hooks = cls, hooks
    _D_ok = True
    return True


cdef inline object d_slot(object d, int k):
    """A TensorDirectory slot (by its DS_* index); an empty one is AttributeError."""
    cdef PyObject *p = kiln_slot_get(d, _D_off[k])
    if p == NULL:
        raise AttributeError(DIRECTORY_SLOTS[k])
    o = <object>p
    Py_DECREF(o)  # the cast took its own reference
    return o


cdef object view_directory(object mv, object pb, list table, bint trusted):
    """TensorDirectory._from_table(table, mv.toreadonly(), pb, errors)."""
    buf = mv.toreadonly()
    d = kiln_alloc(_D_cls)
    kiln_slot_set(d, _D_off[DS_ROWS], table)
    kiln_slot_set(d, _D_off[DS_BUF], buf)
    kiln_slot_set(d, _D_off[DS_PB], pb)
    kiln_slot_set(d, _D_off[DS_ERRORS], "surrogateescape" if trusted else "strict")
    # the two lists hold rows (ints, bytes, None and untracked shape tuples)
    # and, once made, Tensors, which never refer to a directory: no cycle can
    # go through them, so the collector need not walk them (a record file
    # kept in a list otherwise pays a full collection for every tensor list)
    PyObject_GC_UnTrack(table)
    tensors = [None] * PyList_GET_SIZE(table)
    PyObject_GC_UnTrack(tensors)
    kiln_slot_set(d, _D_off[DS_TENSORS], tensors)
    kiln_slot_set(d, _D_off[DS_INDEX], None)
    kiln_slot_set(d, _D_off[DS_NAMES], None)
    kiln_slot_set(d, _D_off[DS_OWN], hold_buffer(buf))
    return d


def dlpack_destructor():
    """The address of the C capsule destructor kiln/_tensors/dlpack.py gives the
    capsules it builds with ctypes (numpy before 2.1): it keeps a pending
    exception across the deleter call."""
    return <size_t><void *>kiln_dl_destroy


def check_links(head):
    """The table rules that need the whole directory, over ``head``: the
    canonical header, descriptors and name heap of a directory of tensors built
    by hand (kiln._dirhead.block_head), without its payloads: the heap slices
    (step 8b), each descriptor (step 9) and the scale and outer links (step
    11b).  The same checks, in the same order, as the pure twin; a fault is a
    KilnError at its offset in ``head``."""
    cdef Dir st
    cdef Py_buffer view
    get_view(head, &view)
    st.b = <const uint8_t *>view.buf
    st.n = st.have = view.len
    st.s = 0
    st.standalone = False
    st.trusted = False
    st.max_copy = U64_MAX
    st.max_count = U32_MAX
    st.max_bytes = U32_MAX
    st.priv = NULL
    st.counts = NULL
    st.contents = False
    st.wide_ok = True
    try:
        step1_magic(&st)
        name_fields(&st)
        step4_arithmetic(&st)
        step5_fits(&st)
        st.heap0 = HEADER_SIZE + DESC_SIZE * <Py_ssize_t>st.count
        read_table(&st)
        step8b_heap(&st)
        step9_descriptors(&st)
        step11b_quantization(&st)
    finally:
        PyMem_Free(st.priv)
        PyMem_Free(st.counts)
        PyBuffer_Release(&view)
