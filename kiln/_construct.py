"""The wire's checks, applied where a Tensor or TensorDirectory is built.

A tensor that reaches kiln without passing the directory check (built by
``kiln.Tensor(...)``, unpickled, or received as a Dask frame) is checked
here, once, when it is built, so that everything holding a Tensor holds one
the wire would accept:

* :func:`check_tensor` (every ``Tensor``): the descriptor rules of one
  tensor (an opaque dtype's layout and block size, no layout or block size
  on other dtypes, quantization fields in their ranges) and its payload bytes
  (each bool byte 0 or 1; an odd 4-bit tail's high nibble 0);
* :func:`check_directory` (every ``TensorDirectory`` built from tensors):
  the table rules that need the whole directory (names all present or all
  absent, non-empty, UTF-8, distinct; scale and outer links to existing,
  suitable tensors with the right element counts).  These run the directory
  kernel's own step functions (``kiln._kernels_py.directory``) over the
  canonical head of the tensors' table, so the rule set is the wire check's.

Faults are :class:`kiln.EncodeError` (a ``KilnError`` and a ``ValueError``):
code ``TYPE``/``UTF8``/``LIMIT``; the offset is the byte of the payload for a
payload fault, else 0, and the path names the tensor (``[2]`` or ``['w']``).
"""

from . import _compat
from . import _wire as W
from ._errors import EncodeError, KilnError


def _fail(code, offset, reason, where):
    return EncodeError(code, offset, reason, where)


def check_tensor(code, shape, name, layout, row, mv):
    """Raise EncodeError if the wire would refuse this tensor on its own."""
    where = "" if name is None else "[%r]" % (name,)
    block, scheme, axis, group, scale, outer = row[4], row[5], row[6], row[7], row[8], row[9]
    n = len(mv)
    if code >= W.OPAQUE_MIN:
        if not layout:
            raise _fail("TYPE", 0, "opaque dtype %d needs a layout name" % code, where)
        if not 0 < block <= W.U32_MAX:
            raise _fail("TYPE", 0, "opaque dtype %d needs a block size in 1..2**32-1, not %d"
                        % (code, block), where)
        if n % block:
            raise _fail("TYPE", 0, "byte length %d is not a multiple of block size %d"
                        % (n, block), where)
    else:
        if block:
            raise _fail("TYPE", 0, "block size %d on a non-opaque dtype" % block, where)
        if layout:
            raise _fail("TYPE", 0, "layout name on a non-opaque dtype", where)
    if not 0 <= scheme <= W.QUANT_SCHEMES:
        raise _fail("TYPE", 0, "quant scheme %d is not 0, 1 or 2" % scheme, where)
    if scheme == 0:
        if axis != W.NO_AXIS or group or scale != W.NO_INDEX or outer != W.NO_INDEX:
            raise _fail("TYPE", 0, "a quantization field is set without a scheme", where)
    else:
        if not 0 <= axis < len(shape):
            raise _fail("TYPE", 0, "quant axis %d is not below rank %d" % (axis, len(shape)),
                        where)
        if not 0 < group <= W.U32_MAX:
            raise _fail("TYPE", 0, "group size %d is not in 1..2**32-1" % group, where)
        if scale == W.NO_INDEX or (scheme == 1) != (outer == W.NO_INDEX):
            raise _fail("TYPE", 0, "quant scheme %d needs a scale index%s" % (
                scheme, " and no outer index" if scheme == 1 else " and an outer index"), where)
        for ref in (scale, outer):
            if not isinstance(ref, str) and not 0 <= ref <= W.U32_MAX:
                raise _fail("TYPE", 0, "index %d is out of range" % ref, where)
    if code == W.DTYPE_BOOL or code in W.PACKED:
        # the payload rules of the wire check (step 11a), by the kernel kiln
        # picked: the same function a lazy open runs when a tensor is read
        count = 1
        for d in shape:
            count *= d
        try:
            _compat.kernels.check_payload(mv, 0, code, count, n, 0)
        except KilnError as e:
            raise _fail(e.code, e.offset, e.reason, where) from None


def check_directory(tensors):
    """Raise EncodeError if the wire would refuse a directory of these tensors
    (each already passed :func:`check_tensor`)."""
    from ._kernels_py import directory as K
    from ._kernels_py.dirwrite import block_head
    named = [t.name is not None for t in tensors]
    if any(named) and not all(named):
        i = named.index(not named[0])
        raise _fail("TYPE", 0, "tensor %d: when one tensor is named, all must be" % i,
                    "[%d]" % i)
    metas = []
    index = {}
    for i, t in enumerate(tensors):
        name = None if t.name is None else _utf8(t.name, "tensor name", i)
        if name == b"":
            raise _fail("TYPE", 0, "tensor %d: an empty name is not allowed" % i, "[%d]" % i)
        if name is not None and t.name in index:
            raise _fail("TYPE", 0, "tensor name %r repeats (tensors %d and %d)"
                        % (t.name, index[t.name], i), "[%r]" % t.name)
        if name is not None:
            index[t.name] = i
        row = t._row
        metas.append((row[0], row[1], name, None if t.layout is None else
                      _utf8(t.layout, "layout name", i), row[4], row[5], row[6], row[7],
                      row[8], row[9], row[11]))
    linked = False
    for i, m in enumerate(metas):
        if m[8] != W.NO_INDEX or m[9] != W.NO_INDEX:
            linked = True
            metas[i] = m[:8] + (_link(m[8], index, i), _link(m[9], index, i), m[10])
    if not linked:
        return   # every other table rule is one tensor's, and check_tensor ran it
    try:
        head, _, _ = block_head(metas, 0)
        st = K.Dir(head, 0, False, False, W.U32_MAX, W.U32_MAX, None)
        h = W.HEADER.unpack_from(head, 0)
        st.flags, st.count, st.name_bytes, st.payload_bytes = h[2], h[4], h[5], h[6]
        st.heap0 = W.HEADER_SIZE + W.DESC_SIZE * st.count
        K.read_table(st)
        K.step8b_heap(st)
        st.counts = [K._descriptor(st, i, dsc) for i, dsc in enumerate(st.descs)]
        K.step11b_quantization(st)
    except KilnError as e:
        i = max(e.offset - W.HEADER_SIZE, 0) // W.DESC_SIZE
        where = "[%d]" % i if tensors[i].name is None else "[%r]" % tensors[i].name
        raise _fail(e.code, 0, "tensor %d: %s" % (i, e.reason), where) from None


def _link(ref, index, i):
    if ref == W.NO_INDEX or not isinstance(ref, str):
        return ref
    if ref not in index:
        raise _fail("TYPE", 0, "tensor %d refers to unknown tensor %r" % (i, ref), "[%d]" % i)
    return index[ref]


def _utf8(text, what, i):
    try:
        b = text.encode("utf-8")
    except UnicodeEncodeError:
        raise _fail("UTF8", 0, "tensor %d: the %s has no UTF-8 form" % (i, what),
                    "[%d]" % i) from None
    if len(b) > W.U16_MAX:
        raise _fail("LIMIT", 0, "tensor %d: the %s is longer than 65535 bytes" % (i, what),
                    "[%d]" % i)
    return b
