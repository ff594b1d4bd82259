# Writing a canonical tensor directory block (spec section 6).  The twin of
# kiln/_kernels_py/dirwrite.py: plan_heap, then write_dir.

cdef struct TRec:
    uint64_t code
    uint64_t rank
    uint64_t dims[MAX_RANK]
    const char *name
    Py_ssize_t name_len
    bint has_name
    const char *lay
    Py_ssize_t lay_len
    uint64_t block
    uint64_t scheme
    uint64_t axis
    uint64_t group
    uint64_t scale
    uint64_t outer
    uint64_t noff
    uint64_t loff
    uint64_t off
    Py_buffer pay
    bint held
    PyObject *rec       # owned: the record, whose name, layout and payload are borrowed


cdef inline bint _small_int(object o, uint64_t hi, uint64_t *out) noexcept:
    """An exact int in 0..hi (no Python code runs)."""
    cdef long long x
    cdef unsigned long long ux
    cdef int of = 0
    if not PyLong_CheckExact(<PyObject *>o):
        return False
    x = PyLong_AsLongLongAndOverflow(<PyObject *>o, &of)
    if of < 0 or (of == 0 and x < 0):
        return False
    if of > 0:
        ux = PyLong_AsUnsignedLongLong(<PyObject *>o)
        if ux == <unsigned long long>-1 and PyErr_Occurred() != NULL:
            PyErr_Clear()
            return False
    else:
        ux = <unsigned long long>x
    if ux > hi:
        return False
    out[0] = ux
    return True


cdef int parse_record(object rec, TRec *t) except -1:
    """Fill ``t`` from one normalized record; 0 if it is not well formed."""
    cdef Py_ssize_t k
    if not PyTuple_CheckExact(rec) or PyTuple_GET_SIZE(rec) != 11:
        return 0
    if not _small_int(rec[0], 0xFFFF, &t.code):
        return 0
    shape = rec[1]
    if not PyTuple_CheckExact(shape) or PyTuple_GET_SIZE(shape) > MAX_RANK:
        return 0
    t.rank = PyTuple_GET_SIZE(shape)
    for k in range(MAX_RANK):
        t.dims[k] = 0
    for k in range(<Py_ssize_t>t.rank):
        if not _small_int(<object>PyTuple_GET_ITEM(shape, k), U64_MAX, &t.dims[k]):
            return 0
    nm = rec[2]
    if nm is None:
        t.has_name = False
        t.name = NULL
        t.name_len = 0
    elif PyBytes_CheckExact(nm):
        t.has_name = True
        t.name = PyBytes_AS_STRING(<PyObject *>nm)
        t.name_len = PyBytes_GET_SIZE(<PyObject *>nm)
    else:
        return 0
    lay = rec[3]
    if lay is None:
        t.lay = NULL
        t.lay_len = 0
    elif PyBytes_CheckExact(lay):
        t.lay = PyBytes_AS_STRING(<PyObject *>lay)
        t.lay_len = PyBytes_GET_SIZE(<PyObject *>lay)
    else:
        return 0
    if not (_small_int(rec[4], U32_MAX, &t.block) and _small_int(rec[5], 0xFFFF, &t.scheme)
            and _small_int(rec[6], 0xFFFF, &t.axis) and _small_int(rec[7], U32_MAX, &t.group)
            and _small_int(rec[8], U32_MAX, &t.scale)
            and _small_int(rec[9], U32_MAX, &t.outer)):
        return 0
    pay = rec[10]
    try:
        PyObject_GetBuffer(pay, &t.pay, PyBUF_SIMPLE)
    except Exception:
        return 0
    t.held = True
    if PyObject_Size(pay) != t.pay.len:
        return 0
    return 1


cdef int plan_heap(TRec *recs, Py_ssize_t count, Py_ssize_t at, bint *named,
                   uint64_t *heap) except -1:
    """Name and layout offsets in the heap, with the reference writer's errors at ``at``."""
    cdef Py_ssize_t i
    cdef TRec *t
    cdef uint64_t heap_n = 0
    named[0] = False
    for i in range(count):
        if recs[i].has_name:
            named[0] = True
    for i in range(count):     # names first, then layouts
        t = &recs[i]
        if named[0]:
            if not t.has_name or t.name_len == 0:
                efail("TYPE", at, "when one tensor is named, all must be")
            t.noff = heap_n
            heap_n += t.name_len
        else:
            t.noff = NO_NAME
    for i in range(count):
        t = &recs[i]
        if t.lay_len:
            t.loff = heap_n
            heap_n += t.lay_len
        else:
            t.loff = NO_NAME
    for i in range(count):
        t = &recs[i]
        if (t.noff >= NO_NAME and t.noff != NO_NAME) or (t.loff >= NO_NAME and t.loff != NO_NAME) \
                or heap_n > U32_MAX:
            efail("LIMIT", at, "name heap of %d bytes does not fit u16 offsets" % heap_n)
    for i in range(count):
        if recs[i].name_len > U16_MAX or recs[i].lay_len > U16_MAX:
            efail("LIMIT", at, "a name is longer than 65535 bytes")
    heap[0] = heap_n
    return 0


cdef int write_dir(Writer *w, object records) except -1:
    """Append the canonical block of ``records`` at w.pos (see write_directory)."""
    cdef TRec *recs = NULL
    cdef Py_ssize_t count, i
    cdef bint named = False
    cdef uint64_t heap_n = 0
    if not (PyList_CheckExact(records) or PyTuple_CheckExact(records)):
        raise TypeError("tensor records must be a list or tuple")
    count = len(records)
    if <uint64_t>count > U32_MAX:
        efail("LIMIT", w.pos, "%d tensors exceed u32" % count)
    recs = <TRec *>PyMem_Malloc(sizeof(TRec) * (count + 1))
    if recs == NULL:
        raise MemoryError()
    for i in range(count):
        recs[i].held = False
        recs[i].rec = NULL
    try:
        for i in range(count):
            # each record held while its borrowed name, layout and payload are
            # used: a payload's buffer export may run code that changes the list
            if i >= len(records):
                raise TypeError("tensor records changed while they were written")
            rec = records[i]
            Py_INCREF(rec)
            recs[i].rec = <PyObject *>rec
            if not parse_record(rec, &recs[i]):
                raise TypeError("tensor record %d is not a well-formed write record" % i)
        plan_heap(recs, count, w.pos, &named, &heap_n)
        write_block(w, recs, count, named, heap_n)
    finally:
        for i in range(count):
            if recs[i].held:
                PyBuffer_Release(&recs[i].pay)
            Py_XDECREF(recs[i].rec)
        PyMem_Free(recs)
    return 0


cdef int write_block(Writer *w, TRec *recs, Py_ssize_t count, bint named,
                     uint64_t heap_n) except -1:
    """Place the payloads and write header, descriptors, heap and payloads."""
    cdef TRec *t
    cdef Py_ssize_t i, k
    cdef uint64_t dir_bytes, base, r, o, total
    cdef char *q
    cdef char *p0
    dir_bytes = <uint64_t>count * DESC_SIZE + heap_n
    base = dir_align(HEADER_SIZE + dir_bytes)
    r = 0
    for i in range(count):
        t = &recs[i]
        o = dir_align(r)
        t.off = o
        if kiln_add_u64(o, <uint64_t>t.pay.len, &r) or r > <uint64_t>PY_SSIZE_T_MAX:
            raise MemoryError()
    if kiln_add_u64(base, r, &total) or total > <uint64_t>PY_SSIZE_T_MAX:
        raise MemoryError()
    w_reserve(w, <Py_ssize_t>total)
    p0 = w.data + w.pos
    memset(p0, 0, total)
    memcpy(p0, b"KLNT", 4)
    p0[H_VERSION] = DIR_VERSION
    p0[H_FLAGS] = FLAG_LITTLE | (FLAG_NAMED if named else 0)
    kiln_st_u32(p0 + H_COUNT, <uint32_t>count)
    kiln_st_u32(p0 + H_NAME_BYTES, <uint32_t>heap_n)
    kiln_st_u64(p0 + H_PAYLOAD_BYTES, r)
    kiln_st_u64(p0 + H_DIRECTORY_BYTES, dir_bytes)
    for i in range(count):
        t = &recs[i]
        q = p0 + HEADER_SIZE + DESC_SIZE * i
        kiln_st_u16(q + D_DTYPE, <uint16_t>t.code)
        q[D_RANK] = <char>(<uint8_t>t.rank)
        kiln_st_u16(q + D_NAME_OFF, <uint16_t>t.noff)
        kiln_st_u16(q + D_NAME_LEN, <uint16_t>(t.name_len if named else 0))
        kiln_st_u16(q + D_LAYOUT_OFF, <uint16_t>t.loff)
        kiln_st_u16(q + D_LAYOUT_LEN, <uint16_t>t.lay_len)
        kiln_st_u32(q + D_BLOCK_SIZE, <uint32_t>t.block)
        kiln_st_u16(q + D_QUANT_SCHEME, <uint16_t>t.scheme)
        kiln_st_u16(q + D_QUANT_AXIS, <uint16_t>t.axis)
        kiln_st_u32(q + D_GROUP_SIZE, <uint32_t>t.group)
        kiln_st_u32(q + D_SCALE_INDEX, <uint32_t>t.scale)
        kiln_st_u32(q + D_OUTER_INDEX, <uint32_t>t.outer)
        kiln_st_u64(q + D_BYTE_OFFSET, t.off)
        kiln_st_u64(q + D_BYTE_LENGTH, <uint64_t>t.pay.len)
        for k in range(MAX_RANK):
            kiln_st_u64(q + D_SHAPE + 8 * k, t.dims[k])
    q = p0 + HEADER_SIZE + DESC_SIZE * count
    if named:
        for i in range(count):
            memcpy(q, recs[i].name, recs[i].name_len)
            q += recs[i].name_len
    for i in range(count):
        if recs[i].lay_len:
            memcpy(q, recs[i].lay, recs[i].lay_len)
            q += recs[i].lay_len
    for i in range(count):
        t = &recs[i]
        if t.pay.len:
            memcpy(p0 + base + t.off, t.pay.buf, t.pay.len)
    w.pos += <Py_ssize_t>total
    return 0


# --- encoding a dict of plain arrays without normalize_tensors ---------------
# The common tensors value, {str: ndarray} with C-contiguous little-endian
# arrays of a dtype kiln has a code for, is described here from the arrays'
# heads (kiln_np_head) and written in one pass, with the records
# normalize_tensors would give.  Anything else, or any doubt, returns 0 and
# the caller takes the Python path, which also raises every error.  A dtype
# is learnt from the hooks' fast_code (Python) once; its descriptor object is
# then recognised by identity.

DEF DCACHE = 32
cdef PyObject *_dc_descr[DCACHE]   # owned
cdef uint64_t _dc_code[DCACHE]
cdef Py_ssize_t _dc_size[DCACHE]
cdef int _dc_n = 0


cdef int dtype_slot(PyObject *descr) noexcept:
    cdef int i
    for i in range(_dc_n):
        if _dc_descr[i] == descr:
            return i
    return -1


cdef int learn_dtype(object hooks, object descr) except -2:
    """Ask the hooks about a dtype seen for the first time: its cache slot, or -1."""
    global _dc_n
    fast_code = getattr(hooks, "fast_code", None)
    got = None if fast_code is None else fast_code(descr)
    if got is None or _dc_n >= DCACHE:
        return -1
    if dtype_slot(<PyObject *>descr) >= 0:
        return dtype_slot(<PyObject *>descr)
    code, size = got
    Py_INCREF(descr)
    _dc_descr[_dc_n] = <PyObject *>descr
    _dc_code[_dc_n] = code
    _dc_size[_dc_n] = size
    _dc_n += 1
    return _dc_n - 1


cdef int cmp_trec_name(const void *a, const void *b) noexcept nogil:
    cdef const TRec *x = <const TRec *>a
    cdef const TRec *y = <const TRec *>b
    return cmp_bytes_then_index(x.name, x.name_len, x.noff, y.name, y.name_len, y.noff)


cdef int array_trec(object x, TRec *t) noexcept:
    """Describe a plain array for the fast path: 1 done, 0 not plain, -1 dtype unknown."""
    cdef kiln_np_head *h
    cdef int slot, k
    cdef uint64_t n
    if type(x) is not _np_ndarray:
        return 0
    h = <kiln_np_head *><PyObject *>x
    if not (h.flags & 0x0001) or h.nd > MAX_RANK:
        return 0
    slot = dtype_slot(h.descr)
    if slot < 0:
        return -1
    n = <uint64_t>_dc_size[slot]
    t.rank = h.nd
    for k in range(MAX_RANK):
        t.dims[k] = <uint64_t>h.dimensions[k] if k < h.nd else 0
        if k < h.nd and kiln_mul_u64(n, t.dims[k], &n):
            return 0
    t.code = _dc_code[slot]
    t.lay = NULL
    t.lay_len = 0
    t.block = 0
    t.scheme = 0
    t.axis = NO_AXIS
    t.group = 0
    t.scale = U32_MAX
    t.outer = U32_MAX
    t.held = False
    t.pay.buf = h.data
    t.pay.len = <Py_ssize_t>n
    return 1


cdef bint plain_dtype(int slot) noexcept:
    """A cached dtype whose payload has no rule but its length: a defined
    code, not bool (bytes 0 or 1), not 4-bit (the odd tail's nibble), its
    item size the code's width."""
    cdef uint64_t code = _dc_code[slot]
    return 1 <= code <= DTYPE_MAX and code != DTYPE_BOOL and not PACKED[code] and \
        <Py_ssize_t>DW[code] == _dc_size[slot]


cdef int fast_tensors(Node nd, Writer *w, object v) except -1:
    """Write an exact dict of plain arrays; 1 when written, 0 for the Python path,
    2 when written and every dtype is plain_dtype.

    A block of 2 is valid by construction, and the caller need not check it
    (check_written): write_block writes the header's sizes from the
    descriptors and the heap, zeroes every gap and reserved byte, and places
    the payloads canonically; names are distinct str keys as UTF-8 (strict),
    sorted, their heap sized by plan_heap (which raises the reference
    writer's LIMIT errors); there is no quantization and no layout; each
    byte length is the element count (no overflow: array_trec) times the
    code's width; and a plain dtype has no rule on its payload bytes.

    With the GIL nothing else runs between reading the arrays' heads and
    copying their data (no Python code is called after the dtypes are known:
    every object is borrowed from the dict, which cannot change meanwhile)."""
    cdef TRec *recs = NULL
    cdef Py_ssize_t count, i, pos, ln
    cdef PyObject *kp
    cdef PyObject *xp
    cdef int r, tries = 0
    cdef bint named = True, ascending = True, plain = True
    cdef uint64_t heap_n = 0
    cdef const char *p
    if KILN_FREE_THREADED or not _np_fast or not PyDict_CheckExact(v):
        return 0
    count = PyDict_GET_SIZE(v)
    if count == 0 or <uint64_t>count > U32_MAX:
        return 0
    recs = <TRec *>PyMem_Malloc(sizeof(TRec) * count)
    if recs == NULL:
        raise MemoryError()
    try:
        while True:   # again after learning a dtype (Python code ran: start over)
            i = 0
            pos = 0
            r = 1
            while PyDict_Next(v, &pos, &kp, &xp):
                if i >= count or not PyUnicode_CheckExact(<object>kp):
                    return 0
                r = array_trec(<object>xp, &recs[i])
                if r != 1:
                    break
                if plain and not plain_dtype(dtype_slot((<kiln_np_head *>xp).descr)):
                    plain = False
                p = PyUnicode_AsUTF8AndSize(<object>kp, &ln)
                if p == NULL:
                    PyErr_Clear()
                    return 0
                if ln == 0:
                    return 0   # the Python path reports the empty name
                recs[i].name = p
                recs[i].name_len = ln
                recs[i].has_name = True
                recs[i].noff = <uint64_t>i   # the tie-break of the sort (names differ anyway)
                if i and ascending and cmp_bytes_then_index(recs[i - 1].name, recs[i - 1].name_len,
                                                            0, p, ln, 1) > 0:
                    ascending = False
                i += 1
            if r == 1:
                break
            if r == 0 or tries >= 4:
                return 0
            tries += 1
            if learn_dtype(nd.hooks, <object>(<kiln_np_head *>xp).descr) < 0:
                return 0
        if i != count:
            return 0
        if not ascending:
            qsort(recs, count, sizeof(TRec), cmp_trec_name)
        plan_heap(recs, count, w.pos, &named, &heap_n)
        write_block(w, recs, count, named, heap_n)
    finally:
        PyMem_Free(recs)
    return 2 if plain else 1


def write_directory(records, out):
    """Append the canonical block of normalized tensor ``records`` to the bytearray
    ``out``; returns where it starts."""
    cdef Writer w
    cdef Py_ssize_t start
    if type(out) is not bytearray:
        raise TypeError("write_directory needs a bytearray, not %s" % type(out).__name__)
    start = PyByteArray_GET_SIZE(<PyObject *>out)
    w.obj = PyBytes_FromStringAndSize_raw(NULL, 256)
    if w.obj == NULL:
        raise MemoryError()
    w.data = PyBytes_AS_STRING(w.obj)
    w.cap = 256
    w.pos = 0
    w.depth = 0
    w.first_dir = -1
    w.round_floats = False
    try:
        write_dir(&w, records)
        PyByteArray_Resize(<PyObject *>out, start + w.pos)
        memcpy(PyByteArray_AS_STRING(<PyObject *>out) + start, w.data, w.pos)
    except EncodeError as e:
        e.offset += start
        raise
    finally:
        Py_XDECREF(w.obj)
    return start
