# Reading the wire: errors, the buffer, the allocation rule, the zero-size
# budget and the frame.  The twin of kiln/_kernels_py/reader.py.


cdef inline object _take(PyObject *p):
    """Turn an owned reference into an object without a net refcount change."""
    cdef object r = <object>p
    Py_DECREF(r)
    return r


cdef int kfail(str code, Py_ssize_t off, str msg) except -1:
    raise KilnError(code, off, msg)


cdef int efail(str code, Py_ssize_t off, str msg) except -1:
    raise EncodeError(code, off, msg)


cdef inline uint64_t _cap(object x):
    """A non-negative Python int cap as u64 (caps above u64 act as u64 max)."""
    if x >= 0xFFFFFFFFFFFFFFFF:
        return U64_MAX
    if x <= 0:
        return 0
    return <uint64_t>x


cdef int get_view(object buf, Py_buffer *view) except -1:
    """Hold ``buf`` through the buffer protocol; it must be C-contiguous."""
    PyObject_GetBuffer(buf, view, PyBUF_STRIDES)
    if not PyBuffer_IsContiguous(view, b'C'):
        PyBuffer_Release(view)
        raise TypeError("kiln needs a contiguous buffer")
    return 0


cdef inline int count_rule(const uint8_t *d, Py_ssize_t n, Py_ssize_t pos, uint64_t cap,
                           uint64_t m, uint32_t *out) noexcept nogil:
    """The five-step rule for one u32 count/length word at ``pos``.

    1. the word needs 4 bytes (EOF), 2. read it, 3. it must not exceed the cap
    (LIMIT), 4. count * m must not overflow u64 (LIMIT), 5. count * m must not
    exceed the bytes after the word (EOF).  Returns 0 or the failing step.
    """
    cdef uint64_t c, need
    if n - pos < 4:
        return 1
    c = kiln_ld_u32(d + pos)
    out[0] = <uint32_t>c
    if c > cap:
        return 3
    if kiln_mul_u64(c, m, &need):
        return 4
    if need > <uint64_t>(n - pos - 4):
        return 5
    return 0


cdef int count_fail(int st, int what, Py_ssize_t pos, uint64_t c, uint64_t cap, uint64_t m,
                    Py_ssize_t n, str capname=None) except -1:
    cdef Py_ssize_t rem = n - pos - 4
    cdef str nm = "count" if what == WHAT_COUNT else (
        "string length" if what == WHAT_STR else "key length")
    if st == 1:
        if what == WHAT_COUNT:
            kfail("EOF", pos, "count word needs 4 bytes, %d remain" % max(n - pos, 0))
        kfail("EOF", pos, "%s needs 4 bytes, %d remain" % (nm, max(n - pos, 0)))
    if st == 3:
        if capname is None:
            capname = "max_count" if what == WHAT_COUNT else "max_bytes"
        kfail("LIMIT", pos, "%s %d is above the cap %s=%d" % (nm, c, capname, cap))
    if st == 4:
        kfail("LIMIT", pos, "count %d times %d bytes overflows u64" % (c, m))
    if what == WHAT_COUNT:
        kfail("EOF", pos, "count %d needs at least %d bytes, %d remain" % (c, c * m, rem))
    kfail("EOF", pos, "%s %d, %d bytes remain" % (nm, c, rem))
    return -1


cdef int zero_budget_fail(Py_ssize_t pos, uint64_t c, uint64_t left, uint64_t cap) except -1:
    kfail("LIMIT", pos, "count %d of zero-size elements is above what is left (%d) of the "
          "max_count budget %d that all such elements of one value (of one record container "
          "read) share" % (c, left, cap))
    return -1


cdef int eof_fail(Py_ssize_t pos, int size, Py_ssize_t n) except -1:
    kfail("EOF", pos, "%d-byte value needs more bytes, %d remain" % (size, max(n - pos, 0)))
    return -1


cdef Py_ssize_t frame_check(const uint8_t *b, Py_ssize_t n, bint hash_ok,
                            uint64_t want) except -1:
    cdef int i
    cdef uint64_t h
    if n < 4:
        kfail("EOF", 0, "a frame needs 16 bytes, the buffer has %d" % n)
    if memcmp(b, b"KLN0", 4) != 0:
        kfail("FRAME", 0, "frame magic is %r, not b'KLN0'" % ((<const char *>b)[:4],))
    if n < 16:
        kfail("EOF", 0, "a frame needs 16 bytes, the buffer has %d" % n)
    if b[4] != 0:
        kfail("FRAME", 4, "frame profile is %d, not 0 (Frozen)" % b[4])
    if b[5] != 0:
        kfail("FRAME", 5, "frame flags are %d, not 0" % b[5])
    for i in range(6, 8):
        if b[i] != 0:
            kfail("FRAME", i, "reserved frame byte is %d, not 0" % b[i])
    h = kiln_ld_u64(b + 8)
    if not hash_ok or h != want:
        kfail("SCHEMA", 8, "frame schema hash %#018x does not match the type's %#018x"
              % (h, want))
    return 16
