# How a decode program runs (DecodeProgram of decode.pxi): the context of one
# decode (ctx_start, ctx_run: a whole value, which must fill its bytes), and a
# long list decoded a window and a run of items at a time (list_head and
# decode_items; kiln._meta reads a file's metadata this way): the list's frame
# and count checked as decode checks them, then runs of items back to back,
# each fault at its offset in the buffer.


cdef int ctx_start(DecodeProgram p, DCtx *c) except -1:
    """The context of one decode by ``p`` before its bytes are set: position 0,
    the program's caps and budgets, no memoryview yet (the record loop of
    records.pxi starts every record from one of these)."""
    c.pos = 0
    c.max_count = p.cmax_count
    c.max_bytes = p.cmax_bytes
    c.bytes_cap = p.cmax_bytes   # a list<u8> run: max_bytes alone bounds it
    c.zbudget = p.cmax_count
    c.trusted = p.trusted
    c.copy = p.copy
    c.max_copy = U64_MAX if (p.max_copy is None or not p.copy) else _cap(p.max_copy)
    c.mv = NULL
    return 0


cdef object ctx_run(DecodeProgram p, DCtx *c):
    """``p``'s value from the ``c.n`` bytes at ``c.d``: the frame, then the
    value, which must fill them (the caller releases ``c.mv``)."""
    if p.framed:
        c.pos = frame_check(c.d, c.n, p.hash_ok, p.hash)
    if p.top_tensors:
        return dec_tensors(p.root, c, True)
    v = dec(p.root, c)
    if c.pos != c.n:
        kfail("TRAILING", c.pos, "%d bytes follow the value" % (c.n - c.pos))
    return v


cdef object program_list_head(DecodeProgram self, object buf, object length):
    """The head of a list value in ``buf``, checked as ``decode`` checks
    it: the frame (a framed program), then the u32 count by the
    allocation rule; returns ``(count, where its first item starts)``.
    ``length``: the value's bytes are this many, of which ``buf`` holds
    the first (at least the frame and the count word when there are
    that many).  With ``decode_items`` of a program of the item type, a
    long list is decoded a run of items at a time from windows of its
    bytes (never all of its items, or all of its bytes, at once)."""
    cdef Py_buffer view
    cdef DCtx c
    cdef uint32_t cnt = 0
    cdef int st
    cdef Py_ssize_t whole
    if self.root.op != OP_LIST:
        raise ValueError("list_head needs a program of a list type")
    get_view(buf, &view)
    ctx_start(self, &c)
    c.d = <const uint8_t *>view.buf
    c.n = view.len
    whole = view.len
    try:
        if length is not None:
            if not view.len <= length <= PY_SSIZE_T_MAX or (
                    view.len < length and view.len < (FRAME_SIZE if self.framed else 0) + 4):
                raise ValueError("length must be at least len(buf), and buf must hold "
                                 "the frame and the count word")
            whole = length
        if self.framed:
            c.pos = frame_check(c.d, c.n, self.hash_ok, self.hash)
        st = count_rule(c.d, whole, c.pos, c.max_count, self.root.elem_min, &cnt)
        if st != 0:
            count_fail(st, WHAT_COUNT, c.pos, cnt, c.max_count, self.root.elem_min, whole)
        if self.root.elem_min == 0 and cnt > c.zbudget:
            zero_budget_fail(c.pos, cnt, c.zbudget, c.max_count)
        return cnt, c.pos + 4
    finally:
        PyBuffer_Release(&view)

cdef object program_decode_items(DecodeProgram self, object buf, object at, object count,
                                 object out):
    """``count`` values of this program's type stored back to back from
    byte ``at`` of ``buf`` (no frame; bytes may follow them), appended to
    the list ``out``; returns where the last one ends.  Faults are at
    their offsets in ``buf``; the zero-size budget is this call's."""
    cdef Py_buffer view
    cdef DCtx c
    cdef Py_ssize_t i, k
    if type(out) is not list:
        raise TypeError("out must be a list")
    if self.top_tensors:
        raise ValueError("decode_items does not decode standalone directories")
    get_view(buf, &view)
    ctx_start(self, &c)
    c.d = <const uint8_t *>view.buf
    c.n = view.len
    c.buf = <PyObject *>buf
    c.shared = not PyBytes_CheckExact(buf)
    try:
        if not 0 <= at <= c.n or not 0 <= count <= PY_SSIZE_T_MAX:
            raise ValueError("at must be within buf and count in 0..2**63-1")
        c.pos = at
        k = count
        for i in range(k):
            out.append(dec(self.root, &c))
        return c.pos
    finally:
        Py_XDECREF(c.mv)
        PyBuffer_Release(&view)
