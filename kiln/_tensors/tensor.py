"""kiln.Tensor: one tensor, a dtype, a shape and little-endian payload bytes."""

import functools
import pickle
import sys
from typing import Any, Optional, Sequence, Union

import numpy as np

from .. import _wire as W
from .._wire import PACKED, TENSOR_SLOTS, U32_MAX, U64_MAX, R_BLOCK_SIZE, R_BYTE_LENGTH, \
    R_CODE, R_GROUP_SIZE, R_OUTER_INDEX, R_QUANT_AXIS, R_QUANT_SCHEME, R_SCALE_INDEX, R_SHAPE
from . import dlpack as _dlpack
from .arrays import as_array, bits, numpy_py, owner
from .foreign import torch_parts
from .checks import check_tensor
from .dtypes import DTYPE_NAMES, WIDTH, _code_of, _dtype_code_of_numpy, element_count
from .nibbles import pack_ml

_NO_AXIS = W.NO_AXIS


def _or_none(value, sentinel):
    """A descriptor field, with the wire's "none" sentinel as None."""
    return None if value == sentinel else value


class Tensor:
    """One tensor: a dtype, a shape and little-endian payload bytes.

    Tensors are immutable; those of a decoded directory view its buffer.
    Use :meth:`from_numpy` to build one from an array.

    Args:
        data: the payload in wire order: any contiguous buffer (a numpy
            array is taken as its little-endian bytes).
        dtype: a dtype name (``"f32"``, ``"i4"``, ...) or code, or an opaque
            code 4096..32767.
        shape: the dimensions (at most 8).
        name: the tensor's name in a directory.
        layout: the layout name of an opaque dtype (``"ggml.Q4_K"``).
        block_size: the block size in bytes of an opaque dtype.
        quant_scheme: 0 (no link), 1 (``scale_index`` names the scales) or 2
            (also ``outer_index``, one f32 outer scale).
        quant_axis: the axis the scale groups run along.
        group_size: elements per scale group along ``quant_axis``.
        scale_index, outer_index: another tensor of the directory, by
            position or by name (names are resolved when encoding).

    Raises:
        ValueError: an unknown dtype name or code, a rank above 8, a bad
            dimension, or ``data`` of the wrong length for dtype and shape.
        EncodeError: (a ``ValueError``) what the wire's directory check
            would refuse in this tensor: a bool byte other than 0 or 1, an
            odd 4-bit tail with its high nibble set, an opaque dtype without
            a layout or block size, a quantization field out of its range.
        TypeError: a non-str name or layout.

    The links between tensors are checked when they are put in a
    :class:`TensorDirectory` or encoded (see :doc:`tensors`); unpickling
    and kiln's Dask deserializer build through this constructor, so a
    hostile pickle or frame is refused where it arrives.

    Example:
        >>> t = kiln.Tensor(bytes(range(6)), dtype="u8", shape=(2, 3), name="a")
        >>> t
        <kiln.Tensor 'a' u8[2, 3], 6 bytes>
        >>> t.numpy().tolist()
        [[0, 1, 2], [3, 4, 5]]
    """

    # _row has the kernels' table layout (kiln._wire.ROW_FIELDS, read by the R_*
    # names) with 0xFFFF / 0xFFFFFFFF meaning "none"; the slots (name, layout,
    # _row, _buf, _off, _own) are named once, in kiln._wire, for the compiled
    # tensor part too
    __slots__ = TENSOR_SLOTS

    def __init__(self, data: Any, *, dtype: Any, shape: Sequence[int],
                 name: Optional[str] = None, layout: Optional[str] = None,
                 block_size: int = 0, quant_scheme: int = 0, quant_axis: Optional[int] = None,
                 group_size: int = 0, scale_index: Union[int, str, None] = None,
                 outer_index: Union[int, str, None] = None) -> None:
        code = _code_of(dtype)
        shape = tuple(int(d) for d in shape)
        if len(shape) > 8:
            raise ValueError("rank %d is above 8" % len(shape))
        if any(d < 0 or d > U64_MAX for d in shape):
            raise ValueError("shape %s has a dimension outside 0..2**64-1" % (shape,))
        if name is not None and not isinstance(name, str):
            raise TypeError("tensor name must be a str")
        if layout is not None and not isinstance(layout, str):
            raise TypeError("layout name must be a str")
        if isinstance(data, np.ndarray):
            if not data.flags.c_contiguous:
                data = data.copy(order="C")
            if data.dtype.byteorder == ">" or (data.dtype.byteorder == "=" and sys.byteorder == "big"):
                data = data.astype(data.dtype.newbyteorder("<"))
            data = data.reshape(-1).view(np.uint8)
        mv = memoryview(data)
        if not mv.c_contiguous:
            raise ValueError("tensor data must be contiguous")
        if mv.format != "B" or mv.ndim != 1:
            mv = mv.cast("B")
        if code < W.OPAQUE_MIN:
            w = WIDTH[code]
            n = element_count(shape)
            need = (n + 1) // 2 if w == 0 else n * w
            if len(mv) != need:
                raise ValueError("%s tensor of shape %s needs %d bytes, data has %d"
                                 % (DTYPE_NAMES[code], shape, need, len(mv)))
        row = (code, shape, None, None, int(block_size), int(quant_scheme),
               _NO_AXIS if quant_axis is None else int(quant_axis), int(group_size),
               U32_MAX if scale_index is None else _link(scale_index),
               U32_MAX if outer_index is None else _link(outer_index), 0, len(mv))
        check_tensor(code, shape, name, layout, row, mv)   # what the wire check would refuse
        self.name = name
        self.layout = layout
        self._row = row
        self._buf = owner(mv.toreadonly())
        self._off = 0
        self._own = None

    @classmethod
    def from_numpy(cls, array: Any, name: Optional[str] = None) -> "Tensor":
        """A tensor holding a copy-free (when possible) little-endian image of ``array``.

        Args:
            array: a numpy array of any byte order, a torch tensor (read
                by its raw bytes: bf16 and the float8 kinds need no
                ml_dtypes), an object with ``__dlpack__`` (a jax array), or
                an object with the buffer protocol.  A non-contiguous or
                big-endian array is copied once.
            name: the tensor's name.

        Returns:
            Tensor: its dtype is the Kiln twin of the array's dtype (the
            ml_dtypes types map to bf16 and the float8 types).

        Raises:
            TypeError: an object of none of those kinds, a dtype with no
                Kiln twin (complex, object, datetime), a DLPack export numpy
                cannot read, or a torch tensor kiln cannot store (quantized,
                sparse, not on the CPU; see ``kiln._tensors.foreign``).

        Example:
            >>> kiln.Tensor.from_numpy(np.zeros((2, 3), np.float16), name="x")
            <kiln.Tensor 'x' f16[2, 3], 12 bytes>
        """
        parts = torch_parts(array)   # a torch tensor: its raw bytes (bf16, float8...)
        if parts is not None:
            return cls(parts[2], dtype=parts[0], shape=parts[1], name=name)
        arr = as_array(array)
        code = _dtype_code_of_numpy(arr.dtype)
        if code in PACKED:   # ml_dtypes' int4/uint4/float4_e2m1fn: one element per byte
            return cls(pack_ml(arr), dtype=code, shape=arr.shape, name=name)
        return cls(arr, dtype=code, shape=arr.shape, name=name)

    code = property(lambda self: self._row[R_CODE], doc="The dtype code (1..19, or opaque).")
    shape = property(lambda self: self._row[R_SHAPE], doc="The shape, a tuple of ints.")
    block_size = property(lambda self: self._row[R_BLOCK_SIZE],
                          doc="Block size in bytes of an opaque dtype (0 otherwise).")
    quant_scheme = property(lambda self: self._row[R_QUANT_SCHEME],
                            doc="Quantization scheme: 0 none, 1 scales, 2 scales and outer.")
    group_size = property(lambda self: self._row[R_GROUP_SIZE],
                          doc="Elements per scale group along :attr:`quant_axis` (0: none).")

    quant_axis = property(lambda self: _or_none(self._row[R_QUANT_AXIS], _NO_AXIS),
                          doc="The axis the scale groups run along, or None.")
    scale_index = property(lambda self: _or_none(self._row[R_SCALE_INDEX], U32_MAX),
                           doc="Position of the scale tensor in the directory, or None.")
    outer_index = property(lambda self: _or_none(self._row[R_OUTER_INDEX], U32_MAX),
                           doc="Position of the one-element f32 outer scale, or None.")

    @property
    def dtype(self) -> Union[str, int]:
        """The dtype name (``"f32"``), or the int code of an opaque dtype."""
        c = self._row[R_CODE]
        return DTYPE_NAMES.get(c, c)

    @property
    def rank(self) -> int:
        """The number of dimensions."""
        return len(self._row[R_SHAPE])

    @property
    def nbytes(self) -> int:
        """The payload's length in bytes."""
        return self._row[R_BYTE_LENGTH]

    @property
    def data(self) -> memoryview:
        """A read-only memoryview of the payload bytes (its own buffer export)."""
        off = self._off
        v = self._buf[off:off + self._row[R_BYTE_LENGTH]]
        return v if type(v) is memoryview else v.data   # a view of a private slice

    def copy_into(self, target: Any) -> None:
        """Write the payload once into ``target``, an array the caller owns.

        ``target`` is a writable numpy array, an object with the buffer
        protocol, or one with ``__dlpack__`` (read through
        ``numpy.from_dlpack``), of this tensor's shape and numpy dtype (the
        ``ml_dtypes`` type for bf16 and float8; a ``uint8`` vector of
        ``nbytes`` for the packed 4-bit and opaque dtypes).  It is checked
        before anything is written; no array of the payload's size is made.

        Raises:
            TypeError: a target of another dtype or kind.
            ValueError: a target of another shape, or a read-only one.

        Example:
            >>> t = kiln.Tensor.from_numpy(np.arange(3, dtype=np.int16))
            >>> out = np.zeros(3, np.int16)
            >>> t.copy_into(out)
            >>> out.tolist()
            [0, 1, 2]
        """
        from .._into import copy_one
        copy_one(self, target)

    def numpy(self) -> np.ndarray:
        """An array over the payload (no copy), shaped, with a little-endian dtype.

        The array is read-only and keeps the payload's buffer alive.  The
        dtype follows :func:`kiln.numpy_dtype`; opaque payloads come back as
        1-D ``uint8`` bytes.  A 4-bit tensor (i4, u4, e2m1) is the one
        exception to "no copy": numpy has no dtype of two elements per byte,
        so its array is a new, writable one of ml_dtypes' ``int4``,
        ``uint4`` or ``float4_e2m1fn`` (one element per byte), shaped;
        :meth:`bits` gives the packed bytes themselves.

        Raises:
            ImportError: a bf16, float8 or 4-bit tensor when ml_dtypes is
                not installed (``pip install 'kiln-wire[ml]'``); :meth:`bits`
                gives its raw bit patterns.

        Example:
            >>> t = kiln.Tensor.from_numpy(np.arange(6, dtype=np.int32).reshape(2, 3))
            >>> a = t.numpy()
            >>> a.dtype, a.shape, a.flags.writeable
            (dtype('int32'), (2, 3), False)
        """
        return numpy_py(self)   # (bind() puts the bound kernel's tensor part here)

    def bits(self) -> np.ndarray:
        """The payload's raw bit patterns as an array (no copy), read-only.

        The explicit way to the bits of a dtype numpy has no type for, with
        or without ml_dtypes: bf16 as ``uint16`` and the float8 types as
        ``uint8``, shaped; the packed 4-bit payloads (two elements per byte,
        low nibble first; see :func:`unpack_nibbles`) and opaque payloads as
        1-D ``uint8`` bytes; every other dtype as its :meth:`numpy` array.

        Example:
            >>> t = kiln.Tensor(b"\\x80\\x3f", dtype="bf16", shape=(1,))
            >>> t.bits().dtype, hex(t.bits()[0])
            (dtype('uint16'), '0x3f80')
        """
        return bits(self)

    def __repr__(self):
        nm = "" if self.name is None else " %r" % self.name
        return "<kiln.Tensor%s %s%s, %d bytes>" % (nm, dtype_label(self.dtype, self.layout),
                                                   list(self.shape), self.nbytes)

    # --- the array ecosystem ---------------------------------------------

    def __array__(self, dtype=None, copy=None):
        """``np.asarray(t)``: the :meth:`numpy` view (numpy 2's ``copy=`` honoured)."""
        if copy is False and self._row[R_CODE] in PACKED:
            raise ValueError("kiln.Tensor: a %s tensor's array is an unpacked copy, and "
                             "copy=False was asked (Tensor.bits() views the packed bytes)"
                             % self.dtype)
        arr = self.numpy()
        if dtype is not None and np.dtype(dtype) != arr.dtype:
            if copy is False:
                raise ValueError("kiln.Tensor: converting %s to %s needs a copy, and copy=False "
                                 "was asked" % (arr.dtype, np.dtype(dtype)))
            return arr.astype(dtype)
        return arr.copy() if copy else arr

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        """A DLPack capsule over the payload (see ``kiln._tensors.dlpack``).

        A view of a read-only buffer goes out as a DLPack 1.0 capsule flagged
        read-only; a consumer that cannot take that form gets a ``BufferError``
        unless it asks for ``copy=True``.
        """
        if stream is not None:
            raise BufferError("kiln.Tensor lives in CPU memory: stream must be None")
        if dl_device is not None and tuple(dl_device) != (_dlpack.KDL_CPU, 0):
            raise BufferError("kiln.Tensor lives in CPU memory, not on device %r" % (dl_device,))
        code = self._row[R_CODE]
        if _dlpack.dlpack_code(code) is None:
            raise BufferError("DLPack has no type for kiln dtype %s: use .numpy() or .data"
                              % self.dtype)
        # the bits, C-contiguous (a 0-d view stays 0-d): bf16 and the float8 kinds
        # need no ml_dtypes (DLPack carries the type code, not numpy's dtype)
        arr = self.bits()
        if code in PACKED:   # e2m1: pairs along the last axis, as torch's float4_e2m1fn_x2
            shape = self._row[R_SHAPE]
            if not shape or shape[-1] % 2:
                raise BufferError("an e2m1 tensor of shape %s has no DLPack form: DLPack's "
                                  "float4 packs two elements a byte along the last axis, "
                                  "which needs an even length there" % list(shape))
            arr = arr.reshape(shape[:-1] + (shape[-1] // 2,))
        read_only = not arr.flags.writeable
        if copy:
            arr = arr.copy()
            read_only = False
        versioned = max_version is not None and tuple(max_version) >= (1, 0)
        if read_only and not versioned:
            raise BufferError("this tensor views a read-only buffer, and an unversioned DLPack "
                              "capsule cannot say read-only: ask for max_version=(1, 0) or "
                              "copy=True")
        return _dlpack.export(arr, code, read_only, bool(copy), versioned)

    def __dlpack_device__(self):
        return (_dlpack.KDL_CPU, 0)

    # --- pickle: the payload goes out of band with protocol 5 ------------------

    def __reduce_ex__(self, protocol):
        row = self._row
        data = self.data
        payload = pickle.PickleBuffer(data) if protocol >= 5 else bytes(data)
        return (_rebuild_tensor, (payload, row[R_CODE], row[R_SHAPE], self.name, self.layout,
                                  row[R_BLOCK_SIZE], row[R_QUANT_SCHEME], self.quant_axis,
                                  row[R_GROUP_SIZE], self.scale_index, self.outer_index))

    def __copy__(self):
        return self  # immutable: the payload is read-only, the fields are the row

    def __deepcopy__(self, memo):
        t = _rebuild_tensor(bytes(self.data), *self.__reduce_ex__(2)[1][1:])
        return t

    def _meta(self):
        return (self.name, self.code, self.shape, self.layout, self.block_size,
                self.quant_scheme, self.quant_axis, self.group_size, self.scale_index,
                self.outer_index)

    def __eq__(self, other):
        if not isinstance(other, Tensor):
            return NotImplemented
        return self._meta() == other._meta() and self.data == other.data

    __hash__ = None


_PY_NUMPY = Tensor.numpy   # the Python method: its name, docstring and signature


def _bind(part):
    """Tensor.numpy becomes ``part.tensor_numpy_method`` (kiln/_tensors/bind.py
    calls this, and only it): a compiled function binds to its instance as a
    Python function does, so the compiled one runs with no Python frame."""
    Tensor.numpy = functools.update_wrapper(part.tensor_numpy_method, _PY_NUMPY)


_new_tensor = Tensor.__new__


def _link(ref):
    """A scale or outer link as given: a name (str) or a position (int)."""
    return ref if isinstance(ref, str) else int(ref)


def _rebuild_tensor(payload, code, shape, name, layout, block_size, quant_scheme, quant_axis,
                    group_size, scale_index, outer_index):
    return Tensor(payload, dtype=code, shape=shape, name=name, layout=layout,
                  block_size=block_size, quant_scheme=quant_scheme, quant_axis=quant_axis,
                  group_size=group_size, scale_index=scale_index, outer_index=outer_index)


def dtype_label(dtype, layout):
    """A dtype as people name it: the Kiln name, or for an opaque code the
    block type its layout names (``Q8_0`` for code 4104 with layout
    ``ggml.Q8_0``), else the code."""
    if isinstance(dtype, int) and isinstance(layout, str) and layout.startswith("ggml."):
        return layout[5:]
    return str(dtype)
