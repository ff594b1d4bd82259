"""What a tensor file writer may commit: each declaration checked as a reader
would check its descriptor, and the decoder's own directory check over the
file before it replaces anything (``TensorWriter``, ``save_tensors``).
Every refusal is an :class:`kiln.EncodeError` with the code and the byte
offset the reader would report in that file."""

import operator
import os
from typing import Any

from .. import _compat, _meta
from .. import _wire as W
from .._errors import EncodeError, KilnError
from .atomic import AtomicFile
from .base import read_table_head
from .local import check_spans, rules_from
from .tables import code_of, element_count


def _desc_at(i: int, field: int) -> int:
    """The file offset of field ``field`` of descriptor ``i``."""
    return W.HEADER_SIZE + W.DESC_SIZE * i + field


def _utf8_name(text: Any, i: int, field: int, what: str) -> bytes:
    if not isinstance(text, str):
        raise EncodeError("TYPE", _desc_at(i, field), "%s %r is not a str" % (what, text))
    try:
        raw = text.encode("utf-8")
    except UnicodeEncodeError:
        raise EncodeError("UTF8", _desc_at(i, field), "%s %r has no UTF-8 form"
                          % (what, text)) from None
    if not raw or len(raw) > W.U32_MAX:   # (past 65535: the wide name fields, spec 12.3)
        raise EncodeError("TYPE", _desc_at(i, field), "%s is empty or longer than %d bytes"
                          % (what, W.U32_MAX))
    return raw


def _declaration(i: int, name: Any, dtype: Any, shape: Any, layout: Any, nbytes: Any,
                 block_size: Any) -> tuple:
    """TensorWriter.add's write record (payload length last), or the EncodeError a
    reader would raise for it, at the offset it would have in the file."""
    raw = _utf8_name(name, i, W.D_NAME_OFF, "tensor name")
    if name == _meta.META_NAME:
        raise EncodeError("TYPE", _desc_at(i, W.D_NAME_OFF), "tensor name %r is reserved for "
                          "metadata" % (name,))
    try:
        code = code_of(dtype)
        dims = tuple(operator.index(d) for d in shape)
    except (TypeError, ValueError) as e:
        raise EncodeError("TYPE", _desc_at(i, W.D_DTYPE), str(e)) from None
    lay = None if layout is None else _utf8_name(layout, i, W.D_LAYOUT_OFF, "layout name")
    if isinstance(block_size, bool) or not isinstance(block_size, int) or \
            not 0 <= block_size <= W.U32_MAX:
        raise EncodeError("TYPE", _desc_at(i, W.D_BLOCK_SIZE), "block size %r is not an int "
                          "in 0..2**32-1" % (block_size,))
    if code < W.OPAQUE_MIN:
        if lay is not None or block_size:
            raise EncodeError("TYPE", _desc_at(i, W.D_LAYOUT_OFF if lay else W.D_BLOCK_SIZE),
                              "a layout name or block size on the non-opaque dtype %s"
                              % W.DTYPES[code][0])
        w = W.DTYPES[code][1]
        n = element_count(dims)
        need = (n + 1) // 2 if w == 0 else n * w
        if nbytes is not None and nbytes != need:
            raise EncodeError("TYPE", _desc_at(i, W.D_BYTE_LENGTH), "nbytes %r, but %d "
                              "elements of %s need %d" % (nbytes, n, W.DTYPES[code][0], need))
    else:
        if nbytes is None or lay is None or block_size == 0:
            raise EncodeError("TYPE", _desc_at(i, W.D_BYTE_LENGTH if nbytes is None else
                                               W.D_LAYOUT_OFF if lay is None else
                                               W.D_BLOCK_SIZE),
                              "opaque dtype %d needs nbytes, a layout name and a block size"
                              % code)
        need = nbytes
        if isinstance(need, bool) or not isinstance(need, int) or need % block_size:
            raise EncodeError("TYPE", _desc_at(i, W.D_BYTE_LENGTH), "nbytes %r is not a "
                              "multiple of block size %d" % (need, block_size))
    # a write record (kiln._wire.R_*) with the payload's length as its R_PAYLOAD
    rec = (code, dims, raw, lay, block_size, 0, W.NO_AXIS, 0, W.NO_INDEX, W.NO_INDEX, need)
    _check_meta(rec, i)
    return rec


def _check_meta(m: tuple, i: int) -> None:
    """What the table's fixed-width fields can hold, checked before they are
    packed (a reader's words, at the field's offset in the file)."""
    shape = m[W.R_SHAPE]
    if len(shape) > W.MAX_RANK:
        raise EncodeError("TYPE", _desc_at(i, W.D_RANK), "rank %d is above 8" % len(shape))
    for k, d in enumerate(shape):
        if not 0 <= d <= W.U64_MAX:
            raise EncodeError("TYPE", _desc_at(i, W.D_SHAPE + 8 * k), "dimension %d is %d, "
                              "outside 0..2**64-1" % (k, d))
    if element_count(shape) > W.U64_MAX:
        raise EncodeError("LIMIT", _desc_at(i, W.D_SHAPE), "element count overflows u64")
    if not 0 <= m[W.R_PAYLOAD] <= W.U64_MAX:
        raise EncodeError("LIMIT", _desc_at(i, W.D_BYTE_LENGTH), "byte length %d is outside "
                          "0..2**64-1" % m[W.R_PAYLOAD])


def _check_file(out: AtomicFile, payloads: bool = True) -> None:
    """The decoder's directory check over the file about to be committed (so a
    file kiln would refuse is never committed); a refusal is an EncodeError at
    the fault's offset in the file.

    Only what is checked is read, with ``pread``, never a mapping of the file:
    the head (header, table, name heap, padding) is checked against the file's
    length, then the payloads whose bytes have rules (bool, 4-bit) in chunks of
    1 MiB, and every alignment gap.  So a writer needs no address space for
    the file it writes (RLIMIT_AS), whatever the size of its tensors.
    ``payloads=False``: the head alone (a file whose payloads are all still
    zero bytes, which every rule accepts)."""
    out.f.flush()
    fd, path = out.fd, str(out.tmp)
    size = os.fstat(fd).st_size
    try:
        head = read_table_head(fd, size, W.U32_MAX, W.U32_MAX, path)   # as kiln.open reads it
        _, base, count, _, blob, _ = _compat.kernels.validate_directory_copy(
            head, 0, True, False, W.U32_MAX, W.U32_MAX, size, True)
        if payloads:
            _check_payloads(fd, path, base, size, blob, count)
    except KilnError as e:
        raise EncodeError(e.code, e.offset, "the file would be refused: %s" % e.reason) \
            from None


def _check_payloads(fd: int, path: str, base: int, size: int, blob: bytes, count: int) -> None:
    """Each payload with rules for its bytes, and each gap after a payload,
    read with pread (``check_payload``'s words and offsets; :func:`check_spans`
    reads the spans that lie within one 1 MiB window together)."""
    spans = []   # (file offset of the span, payload offset, lo, end, code, count, nbytes)
    for i in range(count):
        d = W.DESC.unpack_from(blob, W.DESC_SIZE * i)
        code, nbytes = d[W.I_DTYPE], d[W.I_BYTE_LENGTH]
        at = base + d[W.I_BYTE_OFFSET]
        end = min(W.dir_align(at + nbytes), size)   # the gap's end (the offsets are absolute)
        lo = rules_from(code, nbytes)
        if at + lo < end:
            spans.append((at + lo, at, lo, end, code,
                          element_count(d[W.I_SHAPE:W.I_SHAPE + d[W.I_RANK]]), nbytes))
    check_spans(fd, path, spans)
