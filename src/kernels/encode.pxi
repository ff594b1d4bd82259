# Frozen encode: the Node tree walked over a Python value into a private
# bytes buffer.  The twin of kiln/_kernels_py/encode.py, in parts:
# this file (the writer, the dispatch and the program), encode_scalars.pxi
# (numbers, strings, byte runs), encode_pods.pxi (lists of fixed-width
# numbers), encode_lists.pxi (lists and dicts) and encode_structs.pxi
# (structs: field reads and the per-field fast path).

cdef struct Seg:
    int kind            # 0: list index, 1: dict key (owned), 2: struct field name (borrowed)
    Py_ssize_t index
    PyObject *obj


cdef struct Writer:
    PyObject *obj       # a bytes object the writer owns and grows until it is handed out
    char *data
    Py_ssize_t pos
    Py_ssize_t cap
    int depth
    bint round_floats   # float arrays may round to a narrower element
    Py_ssize_t first_dir  # the first tensor directory with payload bytes, or -1
    Seg segs[MAXSEG]


cdef int w_grow(Writer *w, Py_ssize_t extra) except -1:
    cdef Py_ssize_t need, newcap
    if extra > PY_SSIZE_T_MAX - w.pos:
        raise MemoryError()
    need = w.pos + extra
    if w.cap < PY_SSIZE_T_MAX // 2:
        newcap = w.cap * 2
    else:
        newcap = PY_SSIZE_T_MAX
    if newcap < need:
        newcap = need
    if newcap < 256:
        newcap = 256
    _PyBytes_Resize(&w.obj, newcap)   # on failure w.obj is NULL (released)
    w.data = PyBytes_AS_STRING(w.obj)
    w.cap = newcap
    return 0


cdef inline int w_reserve(Writer *w, Py_ssize_t extra) except -1:
    """Make room for ``extra`` bytes at w.pos."""
    if KILN_UNLIKELY(extra > w.cap - w.pos):
        return w_grow(w, extra)
    return 0


cdef inline int w_bytes(Writer *w, const void *p, Py_ssize_t n) except -1:
    w_reserve(w, n)
    if n:
        memcpy(w.data + w.pos, p, n)
    w.pos += n
    return 0


cdef inline void seg_pop(Writer *w) noexcept:
    cdef Seg *s
    w.depth -= 1
    if w.depth < MAXSEG:
        s = &w.segs[w.depth]
        if s.kind == 1:
            Py_XDECREF(s.obj)
            s.obj = NULL


cdef int fix_path(Writer *w, object e) except -1:
    """On an error: prepend the recorded path to an EncodeError; drop owned refs."""
    cdef int i, top = w.depth if w.depth < MAXSEG else MAXSEG
    cdef Seg *s
    parts = []
    for i in range(top):
        s = &w.segs[i]
        if s.kind == 0:
            parts.append("[%d]" % s.index)
        elif s.kind == 1:
            parts.append("[%r]" % (<object>s.obj,))
        else:
            parts.append("." + <object>s.obj)
    for i in range(top):
        s = &w.segs[i]
        if s.kind == 1:
            Py_XDECREF(s.obj)
            s.obj = NULL
    w.depth = 0
    w.first_dir = -1
    if parts and isinstance(e, EncodeError):
        e.add_path("".join(parts))
    return 0


cdef int enc(Node nd, Writer *w, object v) except -1:
    cdef int op = nd.op
    if op == OP_BOOL:
        return enc_bool(w, v)
    if op <= OP_U64:
        return enc_int(nd, w, v)
    if op <= LAST_SCALAR:
        return enc_float(nd, w, v)
    if op == OP_STR:
        return enc_str(w, v)
    if op == OP_STRUCT:
        return enc_struct(nd, w, v)
    if op == OP_PODLIST:
        return enc_pod(nd, w, v)
    if op == OP_LIST:
        return enc_list(nd, w, v)
    if op == OP_OPT:
        if v is None:
            w_reserve(w, 1)
            w.data[w.pos] = 0
            w.pos += 1
            return 0
        w_reserve(w, 1)
        w.data[w.pos] = 1
        w.pos += 1
        if type(v) is _Some:
            return enc(nd.elem, w, (<object>v).value)
        return enc(nd.elem, w, v)
    if op == OP_BYTES:
        return enc_bytes(w, v)
    if op == OP_DICT:
        return enc_dict(nd, w, v)
    if op == OP_TENSORS:
        return enc_tensors(nd, w, v)
    if op == OP_CONV:
        return enc_conv(nd, w, v)
    raise AssertionError("unknown op %r" % op)



cdef class EncodeProgram:
    """A plan compiled for encoding."""
    cdef readonly object plan
    cdef readonly object frame_hash
    cdef readonly bint round_floats
    cdef Node root
    cdef bytes prefix
    cdef Py_ssize_t hint

    def __init__(self, plan, frame_hash, round_floats=False):
        self.plan = plan
        self.frame_hash = frame_hash
        self.round_floats = bool(round_floats)
        self.root = compile_node(plan)
        self.prefix = None if frame_hash is None else _W.FRAME.pack(_W.FRAME_MAGIC, 0, 0, 0,
                                                                    frame_hash)
        self.hint = 256

    cdef object run(self, object value, bint trim, Py_ssize_t *end):
        """Encode ``value`` into a private bytes object; ``end`` gets its length.

        With ``trim`` the object is cut to that length, else it may be longer.
        The output is private until it is returned, so nothing the value's own
        code does while it is encoded (an ``__index__``, an ``items()``) can
        reach the bytes already written."""
        cdef Writer w
        cdef Py_ssize_t cap0 = self.hint
        w.obj = PyBytes_FromStringAndSize_raw(NULL, cap0)
        if w.obj == NULL:
            raise MemoryError()
        w.data = PyBytes_AS_STRING(w.obj)
        w.cap = cap0
        w.pos = 0
        w.depth = 0
        w.first_dir = -1
        w.round_floats = self.round_floats
        try:
            if self.prefix is not None:
                w_bytes(&w, PyBytes_AS_STRING(<PyObject *>self.prefix), 16)
            enc(self.root, &w, value)
        except BaseException as e:
            fix_path(&w, e)
            Py_XDECREF(w.obj)
            w.obj = NULL
            raise
        # start the next encode at this size: values of one type are often alike.  Not
        # more: a block just above the one freed would make malloc map fresh pages.
        self.hint = 256 if w.pos < 192 else (w.pos + 64 if w.pos < (1 << 26) else (1 << 26))
        end[0] = w.pos
        if trim:
            _PyBytes_Resize(&w.obj, w.pos)  # on failure w.obj is NULL (released)
        return _take(w.obj)

    def encode(self, value):
        """Encode ``value``; returns bytes."""
        cdef Py_ssize_t n = 0
        return self.run(value, True, &n)

    def encode_into(self, value, buffer, offset=0):
        """Write ``value`` into the bytearray ``buffer`` at ``offset`` (-1 appends);
        the buffer is resized to end where the encoding ends; returns that end.

        The value is encoded into private memory first and then copied, so
        the bytes before ``offset`` are kept and nothing is written on error
        (the buffer then ends at ``offset``).

        Each of the two steps on ``buffer`` (size, resize, fill; size check,
        resize, copy) holds the bytearray's critical section on a
        free-threaded build (nothing with the GIL), so no other thread's
        resize can come between a size read and the write it allows (see
        docs/threads.md)."""
        cdef Py_ssize_t off, want, n = 0
        if type(buffer) is not bytearray:
            raise TypeError("encode_into needs a bytearray, not %s" % type(buffer).__name__)
        want = offset   # (an __index__ runs here, outside the critical section)
        with cython.critical_section(buffer):
            off = into_start(buffer, want)
        try:
            out = self.run(value, False, &n)
        except EncodeError as e:
            e.offset += off  # offsets count from the start of ``buffer``
            raise
        with cython.critical_section(buffer):
            into_finish(buffer, off, out, n)
        return off + n


cdef Py_ssize_t into_start(object buffer, Py_ssize_t offset) except -1:
    """encode_into's first step (under the bytearray's critical section):
    the buffer made to end at ``offset`` (negative: its end); returns that
    offset.  No Python code runs here."""
    cdef Py_ssize_t size = PyByteArray_GET_SIZE(<PyObject *>buffer)
    cdef Py_ssize_t off = size if offset < 0 else offset
    if off > size:
        PyByteArray_Resize(<PyObject *>buffer, off)
        memset(PyByteArray_AS_STRING(<PyObject *>buffer) + size, 0, off - size)
    elif off < size:
        PyByteArray_Resize(<PyObject *>buffer, off)  # BufferError if it has exports
    return off


cdef int into_finish(object buffer, Py_ssize_t off, object out, Py_ssize_t n) except -1:
    """encode_into's last step (under the bytearray's critical section): the
    size checked, the buffer grown and the encoding copied in, with no other
    thread's resize in between."""
    if PyByteArray_GET_SIZE(<PyObject *>buffer) != off:
        raise RuntimeError("the bytearray changed size while encode_into was writing it")
    PyByteArray_Resize(<PyObject *>buffer, off + n)
    memcpy(PyByteArray_AS_STRING(<PyObject *>buffer) + off,
           PyBytes_AS_STRING(<PyObject *>out), n)
    return 0


def compile_encoder(plan, frame_hash, round_floats=False):
    """Compile ``plan`` into an encode program (see kiln._kernels_py)."""
    return EncodeProgram(plan, frame_hash, round_floats)


include "encode_scalars.pxi"
include "encode_pods.pxi"
include "encode_lists.pxi"
include "encode_structs.pxi"
