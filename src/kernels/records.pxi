# The record container's record loop (spec/records.md): each record's head,
# length, padding and CRC checked and its framed value decoded, for a range of
# a file's index (decode_records) or for the complete records at the front of a
# stream's buffer (decode_stream).  The twin of kiln/_kernels_py/records.py:
# the same checks in the same order, with the codes, offsets and messages of
# kiln/records/_format.py's parse_head and check_body.

cdef extern from "kiln_crc32.h":
    void kiln_crc32_init() noexcept nogil
    uint32_t kiln_crc32(uint32_t crc, const uint8_t *p, size_t n) noexcept nogil
    int kiln_crc32_use_simd(int on) noexcept nogil

kiln_crc32_init()


def set_crc_simd(flag):
    """Test hook: compute CRC-32 with the CPU's carry-less multiplication
    where it has one (True, the default) or with the table alone (False).
    Returns whether the carry-less path is in use."""
    return bool(kiln_crc32_use_simd(1 if flag else 0))

cdef enum:
    REC_HEAD = 16
    REC_HEAD_CHECKED = 12
    REC_OVERHEAD = 20       # the head and the record CRC
    REC_MIN_VALUE = 16      # a framed value is at least its frame
    REC_MAX_PAD = 63
    REC_KIND_INDEX = 1
    REC_SLACK = 256         # rec_take: unused bytes a record's object may keep


# From this many bytes on, crc32 lets other threads run while it computes (a
# file's reader overlaps it with the read: kiln/_files/checksum.Overlapped).
DEF CRC_NOGIL = 1 << 16


def crc32(data, uint32_t value=0):
    """zlib's CRC-32 of ``data`` (any contiguous buffer), continued from ``value``."""
    cdef Py_buffer view
    cdef const uint8_t *p
    cdef size_t n
    get_view(data, &view)
    try:
        p = <const uint8_t *>view.buf
        n = <size_t>view.len
        if n < CRC_NOGIL:
            return kiln_crc32(value, p, n)
        with nogil:   # the view holds the buffer: it cannot move or shrink meanwhile
            value = kiln_crc32(value, p, n)
        return value
    finally:
        PyBuffer_Release(&view)


cdef struct RecHead:
    uint64_t length
    int kind
    int pad


cdef int rec_head(const uint8_t *src, uint64_t pos, Py_ssize_t number, RecHead *h) except -1:
    """Check the 16-byte head at ``src`` (container offset ``pos``), read once
    into a copy: its CRC first, so that no length is believed before it."""
    cdef uint8_t b[16]
    memcpy(b, src, 16)
    if kiln_crc32(0, b, REC_HEAD_CHECKED) != kiln_ld_u32(b + REC_HEAD_CHECKED):
        raise KilnError("CHECKSUM", pos + REC_HEAD_CHECKED, "record %d: head checksum mismatch "
                        "(a torn or corrupted record head)" % number)
    h.length = kiln_ld_u64(b)
    h.kind = b[8]
    h.pad = b[9]
    if h.kind > REC_KIND_INDEX:
        raise KilnError("FRAME", pos + 8, "record %d: kind %d is neither record (0) nor "
                        "index (1)" % (number, h.kind))
    if h.pad > REC_MAX_PAD:
        raise KilnError("FRAME", pos + 9, "record %d: padding %d is above 63" % (number, h.pad))
    if kiln_ld_u16(b + 10):
        raise KilnError("FRAME", pos + 10, "record %d: head reserved bytes are not 0" % number)
    if h.length < REC_MIN_VALUE:
        raise KilnError("FRAME", pos, "record %d: value length %d is shorter than a frame"
                        % (number, h.length))
    return 0


cdef int rec_body(const uint8_t *q, uint64_t pos, RecHead *h, Py_ssize_t number,
                  bint verify) except -1:
    """The padding and (with ``verify``) the record CRC of the record whose
    head is at ``q`` (container offset ``pos``); all its bytes are in the buffer."""
    cdef int j
    cdef size_t body = REC_HEAD + h.pad + <size_t>h.length
    for j in range(h.pad):
        if q[REC_HEAD + j]:
            raise KilnError("FRAME", pos + REC_HEAD, "record %d: padding byte is not 0" % number)
    if verify and kiln_crc32(0, q, body) != kiln_ld_u32(q + body):
        raise KilnError("CHECKSUM", pos + body, "record %d: value checksum mismatch (a torn or "
                        "corrupted record)" % number)
    return 0


cdef object rec_decode(DecodeProgram p, DCtx *t, const uint8_t *d, Py_ssize_t n, object owner,
                       object mv, bint shared):
    """``p.decode`` of the ``n`` bytes at ``d``: ``owner`` holds them, ``mv``
    is a flat memoryview of exactly them (for tensor views) or None."""
    cdef DCtx c = t[0]
    c.d = d
    c.n = n
    c.buf = <PyObject *>owner
    c.shared = shared
    c.mv = NULL
    if mv is not None:
        Py_INCREF(mv)
        c.mv = <PyObject *>mv
    try:
        return ctx_run(p, &c)
    finally:
        t.zbudget = c.zbudget   # one zero-size budget for every record of the read
        Py_XDECREF(c.mv)


cdef int budget_take(DCtx *t, list budget) except -1:
    """Start from what is left of a read's zero-size budget (``[left]``, an
    int no larger than the program's max_count), or from the whole budget."""
    if budget is None:
        return 0
    if len(budget) != 1 or not 0 <= budget[0] <= t.zbudget:
        raise ValueError("budget: a list of one int between 0 and max_count")
    t.zbudget = <uint64_t>budget[0]
    return 0


cdef object rec_rewrap(object e, uint64_t at, Py_ssize_t number):
    """A decode error of record ``number``'s value (at container offset ``at``)
    with its offset made absolute (as kiln.records._format.rewrap)."""
    if e.reason.startswith("record "):
        return e
    return KilnError(e.code, at + e.offset, "record %d: %s" % (number, e.reason))


def decode_records(program, buf, origin, offsets, Py_ssize_t first, Py_ssize_t last, verify,
                   list out, list budget=None):
    """Append the values of records ``first..last`` to ``out`` (see
    kiln/_kernels_py/records.py); ``budget``: ``[left]``, the zero-size
    budget the records share, updated."""
    cdef DecodeProgram p = program if isinstance(program, DecodeProgram) else None
    cdef Py_buffer bv, ov
    cdef DCtx t
    cdef RecHead h
    cdef Py_ssize_t k, nent
    cdef uint64_t org = origin
    cdef uint64_t lo, hi, v, n
    cdef const uint8_t *d
    cdef const uint8_t *q
    cdef const char *offs
    cdef bint check = bool(verify)
    if p is not None:
        ctx_start(p, &t)
        budget_take(&t, budget)
    get_view(buf, &bv)
    try:
        get_view(offsets, &ov)
        try:
            if ov.itemsize != 8:
                raise TypeError("decode_records: offsets must be 8-byte unsigned integers")
            nent = ov.len // 8
            if first < 0 or last < first or last >= nent:
                raise IndexError("decode_records: records %d..%d of an index of %d entries"
                                 % (first, last, nent - 1))
            d = <const uint8_t *>bv.buf
            n = <uint64_t>bv.len
            offs = <const char *>ov.buf
            # a compiled program without tensors needs no memoryview; any other
            # program (an object with ``decode``) takes a slice of one
            whole = as_bytes_view(buf) if p is None or p.root.has_tensors else None
            for k in range(first, last):
                memcpy(&lo, offs + 8 * k, 8)
                memcpy(&hi, offs + 8 * k + 8, 8)
                if lo < org or hi < lo or hi - lo < REC_OVERHEAD + REC_MIN_VALUE or \
                        hi - org > n:
                    raise KilnError("FRAME", lo, "record %d: bytes %d..%d named by the index "
                                    "are not a record within bytes %d..%d"
                                    % (k, lo, hi, org, org + n))
                q = d + (lo - org)
                rec_head(q, lo, k, &h)
                if h.kind != 0:
                    raise KilnError("FRAME", lo + 8, "record %d: the index points at the index"
                                    % k)
                if hi - lo - REC_OVERHEAD < <uint64_t>h.pad or \
                        h.length != hi - lo - REC_OVERHEAD - h.pad:
                    raise KilnError("FRAME", lo, "record %d: its length %d does not match the "
                                    "index (the next entry is at byte %d)" % (k, h.length, hi))
                rec_body(q, lo, &h, k, check)
                v = lo + REC_HEAD + h.pad
                mv = None if whole is None else whole[v - org:v - org + h.length]
                try:
                    if p is None:
                        value = program.decode(mv)
                    else:
                        value = rec_decode(p, &t, d + (v - org), <Py_ssize_t>h.length, buf, mv,
                                           True)
                except KilnError as e:
                    raise rec_rewrap(e, v, k)
                out.append(value)
        finally:
            PyBuffer_Release(&ov)
    finally:
        PyBuffer_Release(&bv)
        if p is not None and budget is not None:
            budget[0] = t.zbudget


def decode_stream(program, buf, Py_ssize_t at, origin, Py_ssize_t number, verify, cap,
                  uint32_t ocrc, list out, list budget=None):
    """Append the records complete at ``buf[at:]`` to ``out``; returns ``(at,
    number, ocrc)`` after them (see kiln/_kernels_py/records.py)."""
    cdef DecodeProgram p = program if isinstance(program, DecodeProgram) else None
    cdef Py_buffer bv
    cdef DCtx t
    cdef RecHead h
    cdef uint64_t org = origin
    cdef uint64_t ccap = _cap(cap)
    cdef uint64_t pos, left
    cdef size_t body
    cdef const uint8_t *d
    cdef uint8_t le[8]
    cdef bint check = bool(verify)
    if p is not None:
        ctx_start(p, &t)
        budget_take(&t, budget)
    get_view(buf, &bv)
    try:
        d = <const uint8_t *>bv.buf
        if at < 0 or at > bv.len:
            raise IndexError("decode_stream: position %d of %d bytes" % (at, bv.len))
        while bv.len - at >= REC_HEAD:
            pos = org + <uint64_t>at
            left = <uint64_t>(bv.len - at)
            rec_head(d + at, pos, number, &h)
            # the index, a record above the cap, a record not all here: the caller's
            if h.kind == REC_KIND_INDEX or h.length > ccap or h.length > left or \
                    REC_OVERHEAD + h.pad + h.length > left:
                break
            rec_body(d + at, pos, &h, number, check)
            body = REC_HEAD + h.pad + <size_t>h.length
            raw = PyBytes_FromStringAndSize(<const char *>d + at + REC_HEAD + h.pad,
                                            <Py_ssize_t>h.length)
            try:
                if p is None:
                    value = program.decode(raw)
                else:
                    value = rec_decode(p, &t,
                                       <const uint8_t *>PyBytes_AS_STRING(<PyObject *>raw),
                                       <Py_ssize_t>h.length, raw, None, False)
            except KilnError as e:
                raise rec_rewrap(e, pos + REC_HEAD + h.pad, number)
            out.append(value)
            kiln_st_u64(le, pos)
            ocrc = kiln_crc32(ocrc, le, 8)
            number += 1
            at += <Py_ssize_t>body + 4
        return at, number, ocrc
    finally:
        PyBuffer_Release(&bv)
        if p is not None and budget is not None:
            budget[0] = t.zbudget


# --- the writer's record loop: head, framed value and record CRC in one buffer ----

cdef int rec_seal(char *q, Py_ssize_t n, Py_ssize_t pad, bint crc=True) noexcept:
    """Fill the head before the ``pad`` zero bytes and the ``n``-byte framed
    value at ``q + 16 + pad`` (kind 0) and put the record CRC after it (the 4
    bytes are reserved; 0 when not ``crc``)."""
    cdef uint8_t *b = <uint8_t *>q
    kiln_st_u64(b, <uint64_t>n)
    kiln_st_u32(b + 8, <uint32_t>pad << 8)
    kiln_st_u32(b + REC_HEAD_CHECKED, kiln_crc32(0, b, REC_HEAD_CHECKED))
    kiln_st_u32(b + REC_HEAD + pad + n,
                kiln_crc32(0, b, REC_HEAD + <size_t>(pad + n)) if crc else 0)
    return 0


cdef int rec_put(EncodeProgram p, Writer *w, object value, Py_ssize_t base,
                 bint crc=True) except -1:
    """Append one whole record of ``value`` at ``w.pos``; on an error ``w.pos``
    is back where it was and the EncodeError's offset counts from the value's
    frame (as kiln.encode(value, frame=True) reports it).

    ``base`` >= 0: byte 0 of the writer's buffer is container offset ``base``,
    and the record is padded so that the value's first tensor directory with
    payload bytes starts on a 64-byte boundary of the container (then every
    payload in it is 64-aligned); -1: no pad."""
    cdef Py_ssize_t start = w.pos
    cdef Py_ssize_t n, pad = 0
    cdef char *v
    try:
        w_reserve(w, REC_HEAD)
        w.pos += REC_HEAD
        w_bytes(w, PyBytes_AS_STRING(<PyObject *>p.prefix), 16)
        w.first_dir = -1
        enc(p.root, w, value)
        if base >= 0 and start + REC_HEAD < w.first_dir < w.pos:
            pad = <Py_ssize_t>(<size_t>(-(base + w.first_dir)) & <size_t>REC_MAX_PAD)
        w_reserve(w, pad + 4)
    except BaseException as e:
        fix_path(w, e)
        w.pos = start
        if isinstance(e, EncodeError):
            e.offset -= start + REC_HEAD
        raise
    n = w.pos - start - REC_HEAD
    if pad:
        v = w.data + start + REC_HEAD
        memmove(v + pad, v, <size_t>n)
        memset(v, 0, <size_t>pad)
    rec_seal(w.data + start, n, pad, crc)
    w.pos += pad + 4
    return 0


cdef int rec_writer(EncodeProgram p, Writer *w, Py_ssize_t cap0) except -1:
    if p.prefix is None:
        raise ValueError("encode_records: the program must frame its values (frame=True)")
    w.obj = PyBytes_FromStringAndSize_raw(NULL, cap0)
    if w.obj == NULL:
        raise MemoryError()
    w.data = PyBytes_AS_STRING(w.obj)
    w.cap = cap0
    w.pos = 0
    w.depth = 0
    w.first_dir = -1
    w.round_floats = p.round_floats
    return 0


cdef object rec_take(Writer *w):
    if w.cap - w.pos <= REC_SLACK:
        # a few bytes too many: the object keeps them (no realloc, which cost
        # about 330 instructions a record of 2 KB); its size is what was written
        Py_SET_SIZE(w.obj, w.pos)
        w.data[w.pos] = 0
    else:
        _PyBytes_Resize(&w.obj, w.pos)  # on failure w.obj is NULL (released)
    return _take(w.obj)


_ALIGN_OTHER = "encode_records: padded records need an encode program of this kernel"


def encode_record(program, value, Py_ssize_t base=-1, bint crc=True):
    """One whole record of kind 0, padded for ``base`` >= 0, its record CRC 0
    when not ``crc`` (see kiln/_kernels_py/records.py)."""
    cdef EncodeProgram p = program if isinstance(program, EncodeProgram) else None
    cdef Writer w
    if p is None:
        if getattr(program, "frame_hash", 0) is None:
            raise ValueError("encode_records: the program must frame its values (frame=True)")
        if base >= 0:
            raise ValueError(_ALIGN_OTHER)
        raw = program.encode(value)
        return rec_frame_bytes(raw, crc)
    rec_writer(p, &w, p.hint + REC_OVERHEAD + REC_MAX_PAD + 1)
    try:
        rec_put(p, &w, value, base, crc)
    except BaseException:
        Py_XDECREF(w.obj)
        w.obj = NULL
        raise
    # the next record starts at this size, as EncodeProgram.run does (a record
    # that grew from 256 bytes paid a copy for each doubling)
    p.hint = 256 if w.pos < 192 else (w.pos + 64 if w.pos < (1 << 26) else (1 << 26))
    return rec_take(&w)


cdef object rec_frame_bytes(object raw, bint crc=True):
    """A record around the framed value ``raw`` (a bytes object), for a program
    of another kernel."""
    cdef Py_ssize_t n = len(raw)
    if n < REC_MIN_VALUE:
        raise ValueError("encode_records: the program must frame its values (frame=True)")
    out = PyBytes_FromStringAndSize(NULL, n + REC_OVERHEAD)
    memcpy(PyBytes_AS_STRING(<PyObject *>out) + REC_HEAD, PyBytes_AS_STRING(<PyObject *>raw), n)
    rec_seal(PyBytes_AS_STRING(<PyObject *>out), n, 0, crc)
    return out


def encode_records(program, values, Py_ssize_t room, Py_ssize_t limit, offsets,
                   Py_ssize_t base=-1):
    """Records of the values taken from the iterator ``values``, in one bytes
    object, padded for ``base`` >= 0; returns ``(data, more, error)`` (see
    kiln/_kernels_py/records.py)."""
    cdef EncodeProgram p = program if isinstance(program, EncodeProgram) else None
    cdef Writer w
    cdef Py_ssize_t start
    cdef object error = None
    cdef bint more = False
    if p is None:
        if base >= 0 and getattr(program, "frame_hash", 0) is not None:
            raise ValueError(_ALIGN_OTHER)
        return rec_records_other(program, values, room, limit, offsets)
    rec_writer(p, &w, limit + 256 if limit < (1 << 26) else (1 << 26))
    try:
        if room <= 0:
            Py_XDECREF(w.obj)
            w.obj = NULL
            return b"", True, None
        for value in values:
            start = w.pos
            rec_put(p, &w, value, base)
            offsets.append(start)
            room -= 1
            if w.pos >= limit or room == 0:
                more = True
                break
    except Exception as e:
        # a value that does not encode, or the iterator's own error: the
        # records before it are handed back with it (unless memory ran out)
        if w.obj == NULL:
            raise
        error = e
    except BaseException:
        Py_XDECREF(w.obj)
        w.obj = NULL
        raise
    return rec_take(&w), more, error


cdef object rec_records_other(program, values, Py_ssize_t room, Py_ssize_t limit, offsets):
    """encode_records for a program of another kernel (its ``encode`` method)."""
    parts = []
    cdef Py_ssize_t size = 0
    if getattr(program, "frame_hash", 0) is None:
        raise ValueError("encode_records: the program must frame its values (frame=True)")
    if room <= 0:
        return b"", True, None
    it = iter(values)
    while True:
        try:
            value = next(it)
        except StopIteration:
            break
        except Exception as e:
            return b"".join(parts), False, e
        try:
            raw = program.encode(value)
        except Exception as e:
            return b"".join(parts), False, e
        rec = rec_frame_bytes(raw)
        offsets.append(size)
        parts.append(rec)
        size += len(rec)
        room -= 1
        if size >= limit or room == 0:
            return b"".join(parts), True, None
    return b"".join(parts), False, None
