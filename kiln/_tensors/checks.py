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
  suitable tensors with the right element counts).  These run the bound
  kernel's ``check_links`` (its directory step functions 8b, 9 and 11b) over
  the canonical head of the tensors' table (``kiln._dirhead.block_head``), so
  the rule set is the wire check's, and the compiled path imports nothing of
  the pure kernel.

Both checks run on the kernels ``kiln/_tensors/bind.py`` bound (``_bind``).

Faults are :class:`kiln.EncodeError` (a ``KilnError`` and a ``ValueError``):
code ``TYPE``/``UTF8``/``LIMIT``; the offset is the byte of the payload for a
payload fault, else 0, and the path names the tensor (``[2]`` or ``['w']``).
"""

from .. import _wire as W
from .._dirhead import block_head
from .._errors import EncodeError, KilnError
from .._wire import R_BLOCK_SIZE, R_BYTE_LENGTH, R_CODE, R_GROUP_SIZE, R_OUTER_INDEX, \
    R_QUANT_AXIS, R_QUANT_SCHEME, R_SCALE_INDEX, R_SHAPE

_kernels = None   # the bound kernels (_bind): check_payload and check_links


def _bind(kernels):
    """Run the checks on ``kernels`` (kiln/_tensors/bind.py calls this, and only it)."""
    global _kernels
    _kernels = kernels


def _fail(code, offset, reason, where):
    return EncodeError(code, offset, reason, where)


def check_tensor(code, shape, name, layout, row, mv):
    """Raise EncodeError if the wire would refuse this tensor on its own."""
    where = "" if name is None else "[%r]" % (name,)
    block, scheme, axis, group = row[R_BLOCK_SIZE], row[R_QUANT_SCHEME], row[R_QUANT_AXIS], \
        row[R_GROUP_SIZE]
    scale, outer = row[R_SCALE_INDEX], row[R_OUTER_INDEX]
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
        # the payload rules of the wire check (step 11a), by the bound kernel:
        # the same function a lazy open runs when a tensor is read
        count = 1
        for d in shape:
            count *= d
        try:
            _kernels.check_payload(mv, 0, code, count, n, 0)
        except KilnError as e:
            raise _fail(e.code, e.offset, e.reason, where) from None


def check_directory(tensors):
    """Raise EncodeError if the wire would refuse a directory of these tensors
    (each already passed :func:`check_tensor`)."""
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
        metas.append((row[R_CODE], row[R_SHAPE], name, None if t.layout is None else
                      _utf8(t.layout, "layout name", i), row[R_BLOCK_SIZE],
                      row[R_QUANT_SCHEME], row[R_QUANT_AXIS], row[R_GROUP_SIZE],
                      row[R_SCALE_INDEX], row[R_OUTER_INDEX], row[R_BYTE_LENGTH]))
    linked = False
    for i, m in enumerate(metas):   # (block_head's layout: a row without its byte offset)
        scale, outer = m[R_SCALE_INDEX], m[R_OUTER_INDEX]
        if scale != W.NO_INDEX or outer != W.NO_INDEX:
            linked = True
            metas[i] = m[:R_SCALE_INDEX] + (_link(scale, index, i), _link(outer, index, i),
                                            m[R_OUTER_INDEX + 1])
    if not linked:
        return   # every other table rule is one tensor's, and check_tensor ran it
    try:
        head, _, _ = block_head(metas, 0, True)   # (links only: any name widths)
        _kernels.check_links(head)
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
    if len(b) > W.U32_MAX:   # (a tensor file's wide fields hold it; a Frozen value's
        # directory refuses past 65535 bytes when it is encoded)
        raise _fail("LIMIT", 0, "tensor %d: the %s is longer than 2**32-1 bytes" % (i, what),
                    "[%d]" % i)
    return b
