# The directory check's results and entry points: the checked table handed up
# as rows (in the order kiln._wire.ROW_FIELDS names), the caches of the int
# and name objects rows repeat, and the calls the kernel interface declares
# (validate_directory, validate_directory_copy, check_header, check_payload)
# plus check_written for the encoder.  The steps themselves are in
# directory.pxi, included just before this file.


cdef object _U16_NONE = 0xFFFF          # the "none" sentinels, one object each
cdef object _U32_NONE = 0xFFFFFFFF


cdef inline object row_int(uint64_t v):
    # (C constants on purpose: Cython takes a literal above a C long's range,
    # 0xFFFFFFFF, for a Python int, and compared v as one: an int made and
    # freed for every row's two "none" indexes)
    if v < NO_AXIS:
        return PyLong_FromUnsignedLongLong(v)
    if v == NO_AXIS:
        return _U16_NONE
    if v == NO_INDEX:
        return _U32_NONE
    return PyLong_FromUnsignedLongLong(v)


# Tables of one layout repeat their dims, offsets, lengths and names from one
# decode to the next: a small direct-mapped cache of the int and bytes objects
# made for them (immutable, so sharing one is invisible).  GIL builds only.
DEF NCACHE = 256
cdef PyObject *_int_cache[NCACHE]     # owned
cdef PyObject *_name_cache[NCACHE]    # owned bytes
cdef PyObject *_name_str[NCACHE]      # owned str decoded from _name_cache (strict), or NULL


cdef inline object cached_int(uint64_t v, bint use):
    cdef PyObject *o
    cdef size_t k
    if v < 256 or not use or KILN_FREE_THREADED:
        return PyLong_FromUnsignedLongLong(v)
    k = <size_t>((v * <uint64_t>0x9E3779B97F4A7C15) >> 56)
    o = _int_cache[k]
    if o != NULL and PyLong_AsUnsignedLongLong(o) == v:
        return <object>o
    r = PyLong_FromUnsignedLongLong(v)
    Py_XDECREF(o)
    Py_INCREF(r)
    _int_cache[k] = <PyObject *>r
    return r


cdef inline size_t name_slot(const char *p, Py_ssize_t n) noexcept:
    cdef uint64_t h = <uint64_t>n * <uint64_t>0x100000001B3
    cdef Py_ssize_t i
    for i in range(n if n < 16 else 16):
        h = (h ^ <uint8_t>p[i]) * <uint64_t>0x100000001B3
    return <size_t>(h >> 56)


cdef object cached_name(const char *p, Py_ssize_t n, bint use):
    cdef PyObject *o
    cdef size_t k
    if not use or KILN_FREE_THREADED or n > 64:
        return PyBytes_FromStringAndSize(p, n)
    k = name_slot(p, n)
    o = _name_cache[k]
    if o != NULL and PyBytes_GET_SIZE(o) == n and memcmp(PyBytes_AS_STRING(o), p, n) == 0:
        return <object>o
    r = PyBytes_FromStringAndSize(p, n)
    Py_XDECREF(o)
    Py_XDECREF(_name_str[k])
    _name_str[k] = NULL
    Py_INCREF(r)
    _name_cache[k] = <PyObject *>r
    return r


cdef object cached_name_str(object b):
    """The str of a name bytes object that cached_name made (strict UTF-8,
    which the directory check has proved), else None."""
    cdef size_t k
    cdef PyObject *s
    if KILN_FREE_THREADED or PyBytes_GET_SIZE(<PyObject *>b) > 64:
        return None
    k = name_slot(PyBytes_AS_STRING(<PyObject *>b), PyBytes_GET_SIZE(<PyObject *>b))
    if _name_cache[k] != <PyObject *>b:
        return None
    s = _name_str[k]
    if s == NULL:
        try:   # (a trusted decode does not check names: they may not be UTF-8)
            u = PyUnicode_DecodeUTF8(PyBytes_AS_STRING(<PyObject *>b),
                                     PyBytes_GET_SIZE(<PyObject *>b), "strict")
        except UnicodeDecodeError:
            return None
        Py_INCREF(u)
        _name_str[k] = <PyObject *>u
        return u
    return <object>s


cdef object make_table(Dir *st):
    """One row per descriptor, in the layout the kernel interface documents."""
    cdef uint64_t i, rank, llen
    cdef Py_ssize_t k
    cdef const uint8_t *dp
    cdef const uint8_t *prev = NULL
    cdef bint small = st.count <= 64   # the caches pay off for small, repeated layouts
    table = PyList_New(<Py_ssize_t>st.count)
    shape = None
    for i in range(st.count):
        dp = desc(st, i)
        rank = dp[D_RANK]
        # tensors of one shape share one (immutable) shape tuple
        if prev == NULL or prev[D_RANK] != rank or \
                memcmp(prev + D_SHAPE, dp + D_SHAPE, 8 * rank) != 0:
            shape = PyTuple_New(<Py_ssize_t>rank)
            for k in range(<Py_ssize_t>rank):
                dv = cached_int(kiln_ld_u64(dp + D_SHAPE + 8 * k), small)
                Py_INCREF(dv)
                PyTuple_SET_ITEM(shape, k, <PyObject *>dv)
            PyObject_GC_UnTrack(shape)   # ints only: no cycle can go through it
        prev = dp
        nm = cached_name(<const char *>st.heap + name_off(st, dp),
                         <Py_ssize_t>name_len(st, dp), small) if st.named else None
        llen = layout_len(st, dp)
        lay = PyBytes_FromStringAndSize(<const char *>st.heap + layout_off(st, dp),
                                        <Py_ssize_t>llen) if llen else None
        row = (kiln_ld_u16(dp + D_DTYPE), shape, nm, lay, kiln_ld_u32(dp + D_BLOCK_SIZE),
               kiln_ld_u16(dp + D_QUANT_SCHEME), row_int(kiln_ld_u16(dp + D_QUANT_AXIS)),
               kiln_ld_u32(dp + D_GROUP_SIZE), row_int(kiln_ld_u32(dp + D_SCALE_INDEX)),
               row_int(kiln_ld_u32(dp + D_OUTER_INDEX)),
               cached_int(kiln_ld_u64(dp + D_BYTE_OFFSET), small),
               cached_int(kiln_ld_u64(dp + D_BYTE_LENGTH), small))
        PyObject_GC_UnTrack(row)   # ints, bytes, None and the shape: no cycle either
        Py_INCREF(row)
        PyList_SET_ITEM(table, i, <PyObject *>row)
    return table


cdef object raw_names(Dir *st):
    """Every descriptor's name as bytes (None when the directory is unnamed)."""
    cdef uint64_t i
    cdef const uint8_t *dp
    names = PyList_New(<Py_ssize_t>st.count)
    for i in range(st.count):
        dp = desc(st, i)
        nm = PyBytes_FromStringAndSize(<const char *>st.heap + name_off(st, dp),
                                       <Py_ssize_t>name_len(st, dp)) if st.named else None
        Py_INCREF(nm)
        PyList_SET_ITEM(names, i, <PyObject *>nm)
    return names


cdef object vdir(const uint8_t *b, Py_ssize_t n, Py_ssize_t s, bint standalone, bint trusted,
                 uint64_t max_count, uint64_t max_bytes, uint64_t max_copy, int want_table,
                 Py_ssize_t *endp, uint64_t *basep, Py_ssize_t length=-1, bint stable=False,
                 bint wide_ok=False):
    """Run the steps in order over the directory at ``s``; the table when wanted.

    Nothing is allocated before step 5 bounds the descriptor count by the
    buffer, and no Python object is built per descriptor before every check
    has passed.
    """
    cdef Dir st
    st.b = b
    st.have = n
    st.n = n if length < 0 else length   # length: b holds only the head of that many bytes
    st.s = s
    st.standalone = standalone
    st.trusted = trusted
    st.max_copy = max_copy
    st.max_count = max_count
    st.max_bytes = max_bytes
    st.priv = NULL
    st.counts = NULL
    st.contents = want_table != 2   # the checked copy: a lazy open (check_payload later)
    st.wide_ok = wide_ok
    st.flags = 0
    name_fields(&st)
    try:
        step1_magic(&st)
        step2_envelope(&st)
        step3_caps(&st)
        step4_arithmetic(&st)
        step5_fits(&st)
        step6_block(&st)
        step7_padding(&st)
        read_table(&st, stable)
        step8a_reserved(&st)
        step8b_heap(&st)
        step8c_utf8(&st)
        step8d_duplicates(&st)
        step9_descriptors(&st)
        step9_overlaps(&st)
        step10_placement(&st)
        step11a_payload_bytes(&st)
        step11b_quantization(&st)
        endp[0] = step12_trailing(&st)
        basep[0] = st.base
        if want_table == 2:   # the checked copy itself: rows are built when asked for
            return (st.count, bool(st.named),
                    PyBytes_FromStringAndSize(<const char *>st.tab, <Py_ssize_t>st.want),
                    raw_names(&st))
        return make_table(&st) if want_table else None
    finally:
        PyMem_Free(st.priv)
        PyMem_Free(st.counts)


def validate_directory(buf, start, standalone, trusted, max_count, max_bytes, max_copy=None,
                       wide=False):
    """Check the tensor directory at ``start`` of ``buf``; returns (end, payload_base, table).

    ``max_copy``: when not None, a payload longer than this is LIMIT."""
    cdef Py_buffer view
    cdef Py_ssize_t end = 0
    cdef uint64_t base = 0
    if start < 0 or max_count < 0 or max_bytes < 0 or (max_copy is not None and max_copy < 0):
        raise ValueError("start, max_count, max_bytes and max_copy must be non-negative")
    get_view(buf, &view)
    try:
        table = vdir(<const uint8_t *>view.buf, view.len, start, bool(standalone),
                     bool(trusted), _cap(max_count), _cap(max_bytes),
                     U64_MAX if max_copy is None else _cap(max_copy), True,
                     &end, &base, -1, False, bool(wide))
    finally:
        PyBuffer_Release(&view)
    return end, base, table


def validate_directory_copy(buf, start, standalone, trusted, max_count, max_bytes,
                            length=None, wide=False):
    """Check the tensor directory at ``start`` of ``buf`` as validate_directory
    does; returns (end, payload_base, count, named, table_bytes, names): the
    checked private copy of the descriptors and the name heap, from which rows
    are built on demand (kiln._rows.LazyRows) instead of all at once, and
    every name as bytes (None when unnamed).

    ``length``: the bounds are checked against a buffer of this many bytes,
    of which ``buf`` holds only the head (at least through the payload base;
    ``EOF`` if not).  No payload byte is read here, so a writer checks a file
    it wrote without mapping or reading its payloads."""
    cdef Py_buffer view
    cdef Py_ssize_t end = 0
    cdef uint64_t base = 0
    cdef Py_ssize_t whole = -1
    if start < 0 or max_count < 0 or max_bytes < 0:
        raise ValueError("start, max_count and max_bytes must be non-negative")
    get_view(buf, &view)
    try:
        if length is not None:
            if not view.len <= length <= PY_SSIZE_T_MAX:
                raise ValueError("length must be at least len(buf) and at most 2**63-1")
            whole = length
        count, named, blob, names = vdir(<const uint8_t *>view.buf, view.len, start,
                                         bool(standalone), bool(trusted), _cap(max_count),
                                         _cap(max_bytes), U64_MAX, 2, &end, &base, whole,
                                         False, bool(wide))
    finally:
        PyBuffer_Release(&view)
    return end, base, count, named, blob, names


def check_header(buf, start, max_count, max_bytes, length=None, wide=False):
    """Steps 1 to 6 only, from the header at ``start`` and the length of
    ``buf`` (or ``length``, when ``buf`` holds only the header): returns the
    payload base (from ``start``), so a reader that fetches the table knows,
    before it asks, that the table is within the caps and the buffer."""
    cdef Py_buffer view
    cdef Dir st
    if start < 0 or max_count < 0 or max_bytes < 0:
        raise ValueError("start, max_count and max_bytes must be non-negative")
    get_view(buf, &view)
    try:
        st.b = <const uint8_t *>view.buf
        st.n = view.len
        st.have = view.len
        if length is not None:
            if not view.len <= length <= PY_SSIZE_T_MAX:
                raise ValueError("length must be at least len(buf) and at most 2**63-1")
            st.n = length
            if view.len - start >= HEADER_SIZE:   # only the header is read
                st.have = length
        st.s = start
        st.standalone = True
        st.trusted = False
        st.max_copy = U64_MAX
        st.max_count = _cap(max_count)
        st.max_bytes = _cap(max_bytes)
        st.priv = NULL
        st.counts = NULL
        st.contents = False
        st.wide_ok = bool(wide)
        step1_magic(&st)
        step2_envelope(&st)
        step3_caps(&st)
        step4_arithmetic(&st)
        step5_fits(&st)
        step6_block(&st)
    finally:
        PyBuffer_Release(&view)
    return st.base


def check_payload(buf, at, code, count, nbytes, origin):
    """Check the bytes of ``buf``: positions ``at .. at + len(buf)`` of one
    tensor's payload (dtype ``code``, ``count`` elements, ``nbytes`` bytes)
    followed by its alignment gap, as steps 10 and 11a would: each bool byte
    0 or 1, an odd 4-bit tail's high nibble 0 (when ``buf`` holds the last
    payload byte), every gap byte 0.  ``TYPE`` at ``origin`` + the position
    of the first bad byte; returns None."""
    cdef Py_buffer view
    if at < 0 or count < 0 or nbytes < 0 or origin < 0:
        raise ValueError("at, count, nbytes and origin must be non-negative")
    get_view(buf, &view)
    try:
        if origin + at + view.len + nbytes >= 0x7FFFFFFFFFFFFFFF or code > 0xFFFF:
            raise ValueError("offsets past 2**63 or a dtype code past u16")
        payload_contents(<const uint8_t *>view.buf, view.len, at, code, _cap(count), nbytes,
                         origin)
    finally:
        PyBuffer_Release(&view)
    return None


cdef int check_written(const uint8_t *b, Py_ssize_t n, Py_ssize_t start) except -1:
    """Validate a block the encoder just wrote, so encode never emits bytes decode rejects."""
    cdef Py_ssize_t end = 0
    cdef uint64_t base = 0
    try:
        vdir(b, n, start, False, False, U32_MAX, U32_MAX, U64_MAX, False, &end, &base)
    except EncodeError:
        raise
    except KilnError as e:
        err = EncodeError(e.code, e.offset, "tensors break a directory rule: " + e.reason)
    else:
        return 0
    raise err
