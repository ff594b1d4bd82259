"""A ``tensors`` value to encode as write records: the kernels' write layout
(``kiln._wire.RECORD_SIZE`` items: the row's first ten, then the payload; see
``kiln._kernels_py.write_directory``)."""

import sys
from collections.abc import Mapping

import numpy as np

from .. import _wire as W
from .._errors import EncodeError
from .._wire import R_BLOCK_SIZE, R_CODE, R_GROUP_SIZE, R_NAME, R_OUTER_INDEX, R_PAYLOAD, \
    R_QUANT_AXIS, R_QUANT_SCHEME, R_SCALE_INDEX, R_SHAPE, U32_MAX
from .directory import TensorDirectory
from .dtypes import _dtype_code_of_numpy
from .foreign import torch_parts
from .tensor import Tensor

_LE_ORDERS = ("<", "|") + (("=",) if sys.byteorder == "little" else ())


def _utf8(text, i):
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise EncodeError("UTF8", 0, "tensor %d: name has no UTF-8 form" % i) from None


def _array_record(x, name):
    """The write record of a plain little-endian C-contiguous array or a torch
    tensor, else None."""
    if type(x) is not np.ndarray:
        return _torch_record(x, name)
    if not x.flags.c_contiguous or \
            x.dtype.byteorder not in _LE_ORDERS or x.ndim > 8:
        return None   # (rank above 8: Tensor refuses it with the reason)
    try:
        data = memoryview(x).cast("B")
    except (TypeError, ValueError, NotImplementedError):
        return None
    return (_dtype_code_of_numpy(x.dtype), x.shape, name, None, 0, 0, W.NO_AXIS, 0, U32_MAX,
            U32_MAX, data)


def _torch_record(x, name):
    """The write record of a torch tensor from its raw bytes (``torch_parts``),
    with no :class:`Tensor` made; None for anything else, and for what a
    Tensor checks or refuses with its reason (bool and 4-bit payloads, whose
    bytes have rules; rank above 8; a dtype or device kiln cannot store)."""
    if "torch" not in sys.modules:
        return None
    try:
        parts = torch_parts(x)
    except (TypeError, ValueError):
        return None
    if parts is None or parts[0] == W.DTYPE_BOOL or parts[0] in W.PACKED or \
            len(parts[1]) > W.MAX_RANK:
        return None
    return (parts[0], parts[1], name, None, 0, 0, W.NO_AXIS, 0, U32_MAX, U32_MAX,
            parts[2])   # a 1-D uint8 array: a buffer, and (unlike a memoryview) not
    # an object the cyclic collector tracks: a save of many tensors stays cheap to collect


def normalize_tensors(value):
    """Turn a tensors value into write records (raises EncodeError on bad input).

    A record is the kernels' write layout (see kiln._kernels_py.write_directory).
    """
    try:
        if isinstance(value, TensorDirectory):
            pairs = [(None if t.name is None else _utf8(t.name, i), t)
                     for i, t in enumerate(value.values())]
        elif isinstance(value, Mapping):
            # one snapshot of the items (a dict: copied in one step), so a
            # key's code or another thread changing the mapping cannot break the loop
            try:
                snap = dict.copy(value).items() if type(value) is dict else list(value.items())
            except RuntimeError as e:
                raise EncodeError("TYPE", 0, "the tensors mapping changed while it was read "
                                  "(%s)" % e) from None
            keys, xs = [], []
            for i, (k, x) in enumerate(snap):
                if not isinstance(k, str):
                    raise EncodeError("TYPE", 0, "tensor mapping key %r is not a str" % (k,))
                keys.append(_utf8(k, i))
                xs.append(x)
            # sorted by name through an order of ints: no (name, value) pair
            # kept per tensor for the collector to walk while records are built
            pairs = ((keys[j], xs[j]) for j in sorted(range(len(keys)), key=keys.__getitem__))
        elif isinstance(value, (list, tuple)):
            pairs = [(None, x) for x in value]
        else:
            raise EncodeError("TYPE", 0, "expected tensors (a TensorDirectory, a sequence or a "
                              "mapping), got %s" % type(value).__name__)
        records = []
        app = records.append
        linked = False
        for i, (name, x) in enumerate(pairs):
            if name == b"":
                raise EncodeError("TYPE", 0, "tensor %d: an empty name is not allowed" % i)
            rec = _array_record(x, name)
            if rec is not None:
                app(rec)
                continue
            try:
                t = x if isinstance(x, Tensor) else Tensor.from_numpy(x)
            except (TypeError, ValueError) as e:
                raise EncodeError("TYPE", 0, str(e), "[%r]" % name.decode("utf-8", "replace")
                                  if name is not None else "[%d]" % i) from None
            row = t._row
            if name is None and t.name is not None:
                name = _utf8(t.name, i)
                if not name:
                    raise EncodeError("TYPE", 0, "tensor %d: an empty name is not allowed" % i)
            axis, group, block, scheme = row[R_QUANT_AXIS], row[R_GROUP_SIZE], \
                row[R_BLOCK_SIZE], row[R_QUANT_SCHEME]
            if not (0 <= axis <= W.U16_MAX and 0 <= group <= U32_MAX
                    and 0 <= block <= U32_MAX and 0 <= scheme <= W.U16_MAX):
                raise EncodeError("TYPE", 0, "tensor %d: a quantization field is out of range" % i)
            scale, outer = row[R_SCALE_INDEX], row[R_OUTER_INDEX]
            if scale != U32_MAX or outer != U32_MAX:
                linked = True
            app((row[R_CODE], row[R_SHAPE], name, None if t.layout is None else
                 _utf8(t.layout, i), block, scheme, axis, group, scale, outer, t.data))
    except (TypeError, ValueError) as e:
        if isinstance(e, EncodeError):
            raise
        raise EncodeError("TYPE", 0, str(e)) from None
    if linked:
        index = {}
        for i, rec in enumerate(records):
            if rec[R_NAME] is not None:
                index.setdefault(rec[R_NAME].decode("utf-8"), i)
        for i, rec in enumerate(records):
            scale, outer = rec[R_SCALE_INDEX], rec[R_OUTER_INDEX]
            if scale != U32_MAX or outer != U32_MAX:
                scale = scale if scale == U32_MAX else _resolve(scale, index, i)
                outer = outer if outer == U32_MAX else _resolve(outer, index, i)
                records[i] = rec[:R_SCALE_INDEX] + (scale, outer, rec[R_PAYLOAD])
    return records


def _resolve(ref, index, i):
    if ref is None:
        return U32_MAX
    if isinstance(ref, str):
        if ref not in index:
            raise EncodeError("TYPE", 0, "tensor %d refers to unknown tensor %r" % (i, ref))
        return index[ref]
    ref = int(ref)
    if not 0 <= ref <= U32_MAX:
        raise EncodeError("TYPE", 0, "tensor %d: index %d out of range" % (i, ref))
    return ref
