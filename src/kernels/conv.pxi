# OP_CONV: a Python type carried by a wire type (kiln._pyconv), the plan's
# post-step after decode and pre-step before encode.  The twins are _conv in
# kiln/_kernels_py/decode.py and kiln/_kernels_py/encode.py.


cdef object dec_conv(Node nd, DCtx *c):
    """The wire value, then the plan's post-step (kiln._pyconv); a value it
    refuses is TYPE at the value's first byte."""
    cdef Py_ssize_t p = c.pos
    r = dec(nd.elem, c)
    if nd.make is None:
        return r
    why = None
    try:
        return nd.make(r)
    except _ConvError as e:
        why = str(e)
    kfail("TYPE", p, why)


cdef int enc_conv(Node nd, Writer *w, object v) except -1:
    """The plan's pre-step (kiln._pyconv), then the wire value; a value it
    refuses is TYPE where the value would start."""
    if nd.get is None:
        return enc(nd.elem, w, v)
    why = None
    try:
        wv = nd.get(v)
    except _ConvError as e:
        why = str(e)
    if why is not None:
        efail("TYPE", w.pos, why)
    return enc(nd.elem, w, wv)
