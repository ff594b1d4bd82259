"""Tensors and tensor directories (the ``tensors`` Frozen type).

A :class:`Tensor` is a dtype, a shape and a payload of little-endian bits.
Decoding a directory returns a :class:`TensorDirectory` whose tensors view the
caller's buffer (``copy=False``) or own one copy of their payload
(``copy=True``).

numpy mapping of ``Tensor.numpy()``:

=========  ==============================================================
dtype      numpy dtype
=========  ==============================================================
f64 f32    ``<f8`` ``<f4``; f16 is ``<f2``
i8..u64    ``|i1`` ``|u1`` ``<i2`` ``<u2`` ``<i4`` ``<u4`` ``<i8`` ``<u8``
bool       ``|b1``
bf16       ``ml_dtypes.bfloat16`` (needs ml_dtypes, the extra ``kiln-wire[ml]``)
f8e4m3     ``ml_dtypes.float8_e4m3fn`` (needs ml_dtypes)
f8e5m2     ``ml_dtypes.float8_e5m2`` (needs ml_dtypes)
e8m0       ``ml_dtypes.float8_e8m0fnu`` (needs ml_dtypes)
i4 u4 e2m1 the packed bytes as a 1-D ``|u1`` array (use :func:`unpack_nibbles`)
opaque     the raw payload bytes as a 1-D ``|u1`` array
=========  ==============================================================

Without ml_dtypes, ``numpy()`` of a bf16 or float8 tensor raises
``ImportError`` (an array of unsigned integers would look like numbers and
be wrong); :meth:`Tensor.bits` gives the raw bit patterns on request.

The ml_dtypes types are in host byte order; on a big-endian host ``numpy()``
returns a byte-swapped copy for bf16 (one-byte types need no swap).
"""

import functools
import pickle
import sys
from collections.abc import Mapping
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import numpy as np

from . import _compat, _dlpack
from ._construct import check_directory, check_tensor
from ._errors import EncodeError

# ml_dtypes (optional extra kiln[ml]) is imported the first time a tensor of
# one of its dtypes becomes an array (_ml_dtypes); an array of its dtypes to
# encode means something imported it already (sys.modules).
_ml: Any = None   # the module once imported, False when it is not installed


def _ml_dtypes() -> Any:
    """ml_dtypes, imported now if need be, or None when it is not installed."""
    global _ml
    if _ml is None:
        try:
            import ml_dtypes
        except ImportError:  # pragma: no cover - depends on the environment
            ml_dtypes = False
        _ml = ml_dtypes
        _SHAPED.update(_shaped_dtypes())
        if _fill is not None:   # the compiled Tensor.numpy: hand it the new dtypes
            _tk.tensor_setup(Tensor, _SHAPED, _numpy_py)
    return _ml or None

from . import _wire as W
from ._wire import U32_MAX, U64_MAX, PACKED

from ._dtypes import DTYPE_NAMES, _ML_NAMES, _code_of, _dtype_code_of_numpy  # noqa: F401

WIDTH = {c: d[1] for c, d in W.DTYPES.items()}


def numpy_dtype(code: Any) -> np.dtype:
    """The numpy dtype :meth:`Tensor.numpy` uses for a dtype code.

    Args:
        code: a Kiln dtype code (1..19, or an opaque code 4096..32767), or a
            dtype as :class:`Tensor` takes it (``"bf16"``, ``"float32"``).

    Returns:
        numpy.dtype: little-endian for the plain numbers; an ``ml_dtypes``
        type for bf16 and the float8 types; ``uint8`` for the packed and
        opaque dtypes (the raw bytes).

    Raises:
        ImportError: a bf16 or float8 code when ml_dtypes is not installed
            (``pip install kiln-wire[ml]``; :meth:`Tensor.bits` reads the raw bits).

    Example:
        >>> kiln.numpy_dtype(2), kiln.numpy_dtype(16)
        (dtype('float32'), dtype('uint8'))
    """
    if not isinstance(code, int) or isinstance(code, bool):
        code = _code_of(code)
    if code in _ML_NAMES:
        ml = _ml_dtypes()
        if ml is None or not hasattr(ml, _ML_NAMES[code]):
            raise _no_ml(code)
        return np.dtype(getattr(ml, _ML_NAMES[code]))
    return _bits_dtype(code)


def _no_ml(code, name=None):
    what = "%s tensor%s" % (DTYPE_NAMES[code], "" if name is None else " %r" % (name,))
    return ImportError("%s: numpy has no %s dtype and ml_dtypes %s; install it with "
                       "pip install 'kiln-wire[ml]', or call Tensor.bits() for the raw "
                       "bit patterns as %s" % (
                           what, DTYPE_NAMES[code],
                           "is not installed" if _ml is False else "lacks it",
                           np.dtype(W.DTYPES[code][2]).name))


def _bits_dtype(code):
    """The unsigned integers (or raw bytes) holding a dtype's bit patterns."""
    if code in W.DTYPES:
        return np.dtype(W.DTYPES[code][2])
    return np.dtype("|u1")  # an opaque dtype: the raw bytes


def element_count(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def unpack_nibbles(packed: Any, count: int, signed: bool = False) -> np.ndarray:
    """Unpack a packed i4/u4/e2m1 payload into one uint8 (or int8) per element.

    The low nibble of each byte is the earlier element.

    Args:
        packed: the payload (``Tensor.numpy()`` or ``Tensor.data`` of a
            packed tensor, or any bytes-like object).
        count: the number of elements (the product of the tensor's shape).
        signed: sign-extend each nibble (for ``i4``); the result is int8.

    Returns:
        numpy.ndarray: a 1-D array of ``count`` elements (reshape it to the
        tensor's shape).

    Example:
        >>> kiln.unpack_nibbles(b"\\x21\\x03", 3).tolist()
        [1, 2, 3]
        >>> kiln.unpack_nibbles(kiln.pack_nibbles([-1, 7]), 2, signed=True).tolist()
        [-1, 7]
    """
    b = np.frombuffer(packed, dtype=np.uint8) if not isinstance(packed, np.ndarray) \
        else packed.view(np.uint8).reshape(-1)
    out = np.empty(b.shape[0] * 2, dtype=np.uint8)
    out[0::2] = b & 0x0F
    out[1::2] = b >> 4
    out = out[:count]
    if signed:
        s = out.astype(np.int8)
        s[s > 7] -= 16
        return s
    return out


def pack_nibbles(values: Any) -> bytes:
    """Pack small integers (0..15, or -8..7 for i4) two per byte, low nibble first.

    Args:
        values: integers, any shape (flattened in C order).

    Returns:
        bytes: ``ceil(n / 2)`` bytes; an odd count leaves the last high nibble 0.

    Raises:
        TypeError: the values are not integers.
        ValueError: a value outside -8..15.

    Example:
        >>> kiln.pack_nibbles([1, 2, 3])
        b'!\\x03'
    """
    v = np.asarray(values).reshape(-1)
    if v.dtype.kind not in "iu":
        raise TypeError("pack_nibbles takes integers")
    if v.size and (int(v.min()) < -8 or int(v.max()) > 15):
        raise ValueError("nibble values must lie in -8..15")
    u = (v.astype(np.int16) & 0x0F).astype(np.uint8)
    if u.size & 1:
        u = np.concatenate([u, np.zeros(1, np.uint8)])
    return (u[0::2] | (u[1::2] << 4)).astype(np.uint8).tobytes()


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

    # _row has the kernels' table layout: (code, shape, name bytes, layout bytes,
    # block_size, quant_scheme, quant_axis, group_size, scale_index, outer_index,
    # byte_offset, byte_length) with 0xFFFF / 0xFFFFFFFF meaning "none"
    __slots__ = ("name", "layout", "_row", "_buf", "_off", "_own")

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
        self._buf = _owner(mv.toreadonly())
        self._off = 0
        self._own = None

    @classmethod
    def from_numpy(cls, array: Any, name: Optional[str] = None) -> "Tensor":
        """A tensor holding a copy-free (when possible) little-endian image of ``array``.

        Args:
            array: a numpy array of any byte order, an object with
                ``__dlpack__`` (a torch tensor, a jax array), or an object
                with the buffer protocol.  A non-contiguous or big-endian
                array is copied once.
            name: the tensor's name.

        Returns:
            Tensor: its dtype is the Kiln twin of the array's dtype (the
            ml_dtypes types map to bf16 and the float8 types).

        Raises:
            TypeError: an object of none of those kinds, or a dtype with no
                Kiln twin (complex, object, datetime).

        Example:
            >>> kiln.Tensor.from_numpy(np.zeros((2, 3), np.float16), name="x")
            <kiln.Tensor 'x' f16[2, 3], 12 bytes>
        """
        arr = _as_array(array)
        return cls(arr, dtype=_dtype_code_of_numpy(arr.dtype), shape=arr.shape, name=name)

    code = property(lambda self: self._row[0], doc="The dtype code (1..19, or opaque).")
    shape = property(lambda self: self._row[1], doc="The shape, a tuple of ints.")
    block_size = property(lambda self: self._row[4],
                          doc="Block size in bytes of an opaque dtype (0 otherwise).")
    quant_scheme = property(lambda self: self._row[5],
                            doc="Quantization scheme: 0 none, 1 scales, 2 scales and outer.")
    group_size = property(lambda self: self._row[7],
                          doc="Elements per scale group along :attr:`quant_axis` (0: none).")

    quant_axis = property(lambda self: _or_none(self._row[6], _NO_AXIS),
                          doc="The axis the scale groups run along, or None.")
    scale_index = property(lambda self: _or_none(self._row[8], U32_MAX),
                           doc="Position of the scale tensor in the directory, or None.")
    outer_index = property(lambda self: _or_none(self._row[9], U32_MAX),
                           doc="Position of the one-element f32 outer scale, or None.")

    @property
    def dtype(self) -> Union[str, int]:
        """The dtype name (``"f32"``), or the int code of an opaque dtype."""
        c = self._row[0]
        return DTYPE_NAMES.get(c, c)

    @property
    def rank(self) -> int:
        """The number of dimensions."""
        return len(self._row[1])

    @property
    def nbytes(self) -> int:
        """The payload's length in bytes."""
        return self._row[11]

    @property
    def data(self) -> memoryview:
        """A read-only memoryview of the payload bytes (its own buffer export)."""
        off = self._off
        v = self._buf[off:off + self._row[11]]
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
        from ._into import copy_one
        copy_one(self, target)

    def numpy(self) -> np.ndarray:
        """An array over the payload (no copy), shaped, with a little-endian dtype.

        The array is read-only and keeps the payload's buffer alive.  The
        dtype follows :func:`kiln.numpy_dtype`; packed and opaque payloads
        come back as 1-D ``uint8`` bytes.

        Raises:
            ImportError: a bf16 or float8 tensor when ml_dtypes is not
                installed (``pip install 'kiln-wire[ml]'``); :meth:`bits`
                gives its raw bit patterns.

        Example:
            >>> t = kiln.Tensor.from_numpy(np.arange(6, dtype=np.int32).reshape(2, 3))
            >>> a = t.numpy()
            >>> a.dtype, a.shape, a.flags.writeable
            (dtype('int32'), (2, 3), False)
        """
        return _numpy_py(self)

    def bits(self) -> np.ndarray:
        """The payload's raw bit patterns as an array (no copy), read-only.

        The explicit way to the bits of a dtype numpy has no type for, with
        or without ml_dtypes: bf16 as ``uint16`` and the float8 types as
        ``uint8``, shaped; packed and opaque payloads as 1-D ``uint8`` bytes;
        every other dtype as its :meth:`numpy` array.

        Example:
            >>> t = kiln.Tensor(b"\\x80\\x3f", dtype="bf16", shape=(1,))
            >>> t.bits().dtype, hex(t.bits()[0])
            (dtype('uint16'), '0x3f80')
        """
        row = self._row
        if row[0] in _ML_NAMES:
            return self._numpy_slow(row, _bits_dtype(row[0]))
        return self.numpy()

    def _numpy_slow(self, row, dt=None):
        code = row[0]
        if dt is None:
            if code in _ML_NAMES and _ml_dtypes() is None:
                raise _no_ml(code, self.name)
            dt = numpy_dtype(code)
        n = row[11]
        if code in PACKED or code >= W.OPAQUE_MIN:
            return _view(self._buf, dt, n, self._off, (n,)) if n else np.empty(0, dt)
        if not n:
            return np.empty(row[1], dt)
        arr = _view(self._buf, dt, n // dt.itemsize, self._off, row[1])
        if sys.byteorder == "big" and dt.itemsize > 1 and dt.kind == "V":  # pragma: no cover
            # an ml_dtypes type is host-ordered: swap the little-endian bits
            arr = arr.view(dt.newbyteorder("<")).astype(dt)
        return arr

    def __repr__(self):
        nm = "" if self.name is None else " %r" % self.name
        return "<kiln.Tensor%s %s%s, %d bytes>" % (nm, self.dtype, list(self.shape), self.nbytes)

    # --- the array ecosystem ---------------------------------------------

    def __array__(self, dtype=None, copy=None):
        """``np.asarray(t)``: the :meth:`numpy` view (numpy 2's ``copy=`` honoured)."""
        arr = self.numpy()
        if dtype is not None and np.dtype(dtype) != arr.dtype:
            if copy is False:
                raise ValueError("kiln.Tensor: converting %s to %s needs a copy, and copy=False "
                                 "was asked" % (arr.dtype, np.dtype(dtype)))
            return arr.astype(dtype)
        return arr.copy() if copy else arr

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        """A DLPack capsule over the payload (see ``kiln._dlpack``).

        A view of a read-only buffer goes out as a DLPack 1.0 capsule flagged
        read-only; a consumer that cannot take that form gets a ``BufferError``
        unless it asks for ``copy=True``.
        """
        if stream is not None:
            raise BufferError("kiln.Tensor lives in CPU memory: stream must be None")
        if dl_device is not None and tuple(dl_device) != (_dlpack.KDL_CPU, 0):
            raise BufferError("kiln.Tensor lives in CPU memory, not on device %r" % (dl_device,))
        code = self._row[0]
        if _dlpack.dlpack_code(code) is None:
            raise BufferError("DLPack 1.0 has no type for kiln dtype %s: use .numpy() or .data"
                              % self.dtype)
        arr = self.numpy()   # C-contiguous (a 0-d view stays 0-d)
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
        return (_rebuild_tensor, (payload, row[0], row[1], self.name, self.layout, row[4],
                                  row[5], self.quant_axis, row[7], self.scale_index,
                                  self.outer_index))

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


_frombuffer = np.frombuffer
_ndarray = np.ndarray


def _numpy_py(t):
    """Tensor.numpy() in Python (the compiled kernel's tensor_numpy_method
    makes the arrays of decoded tensors itself, and calls this for the others)."""
    row = t._row
    dt = _SHAPED.get(row[0])
    if dt is not None and row[11]:
        # whole-element dtypes: one view of the payload (see _view), shaped
        return _view(t._buf, dt, row[11] // dt.itemsize, t._off, row[1])
    return t._numpy_slow(row)


def _view(buf, dt, count, off, shape):
    """An array over ``count`` items of ``buf`` from byte ``off``, shaped.

    ``buf`` is the payload's owner (see _owner): the array is a numpy view of
    it, so it holds the owner by reference, and through it the one buffer
    export of the caller's object (a bytearray cannot be resized nor an mmap
    unmapped under it) for its whole life; releasing the array releases
    nothing but its reference.  A memoryview ``buf`` (the compiled kernels'
    directories, with the GIL) goes through ``np.frombuffer``, whose base
    then holds an export of it.  Either way the array is read-only.
    """
    if type(buf) is np.ndarray:
        return _ndarray(shape, dt, buf, off)   # its base is the owner itself
    arr = _frombuffer(buf, dt, count, off)
    return arr if len(shape) == 1 else arr.reshape(shape)


def _owner(buf):
    """The one object that holds the buffer export of a directory's (or a
    hand-made tensor's) bytes: a read-only 1-D uint8 array over ``buf``.

    Every array, ``data`` view and DLPack export handed out is made from it
    by numpy slicing (a reference to the owner, which CPython counts
    atomically, free-threaded builds included), never by a new export of one
    memoryview shared between threads: CPython keeps a memoryview's export
    count without a lock on free-threaded builds, and numpy releases its
    arrays' exports outside kiln, so a shared view could lose an export (and
    the caller's buffer be resized under a live array).
    """
    if type(buf) is np.ndarray and buf.dtype == np.uint8 and buf.ndim == 1 and \
            not buf.flags.writeable:
        return buf
    arr = np.frombuffer(buf, np.uint8)
    if arr.flags.writeable:
        arr.flags.writeable = False
    return arr


def _shaped_dtypes():
    out = {}
    for code in W.DTYPES:
        if code in PACKED or (code in _ML_NAMES and not _ml):
            continue   # (ml_dtypes' codes: once _ml_dtypes has found it)
        dt = numpy_dtype(code)
        if code in _ML_NAMES and (dt.kind == "V" or sys.byteorder == "big") and dt.itemsize > 1:
            continue  # host-ordered ml_dtypes need the slow path on big-endian hosts
        out[code] = dt
    return out


_SHAPED = _shaped_dtypes()


def _as_array(array):
    arr = array
    if not isinstance(arr, np.ndarray):
        if hasattr(arr, "__dlpack__"):
            arr = np.from_dlpack(arr)
        else:
            try:
                mv = memoryview(arr)
            except TypeError:
                raise TypeError("expected a numpy array, a kiln.Tensor, or an object with "
                                "__dlpack__ or the buffer protocol, got %s"
                                % type(array).__name__) from None
            arr = np.asarray(mv)
    return arr


class TensorDirectory(Mapping):
    """The tensors of one directory: a mapping of name to :class:`Tensor`.

    ``d["w"]`` finds a tensor by name and ``d[0]`` by position (directory
    order).  As a :class:`collections.abc.Mapping` its keys are the names in
    directory order (the positions 0..n-1 for an unnamed directory), so
    ``dict(d)``, ``d.items()`` and ``d.values()`` work as for any mapping.

    A decoded directory builds each :class:`Tensor` object the first time it
    is reached; the checks all ran before.  Directories compare equal when
    their names and tensors do, and pickle (payloads out of band with
    protocol 5).

    Args:
        tensors: the :class:`Tensor` objects, in directory order.

    Raises:
        EncodeError: what the wire's directory check would refuse: names
            not all present or all absent, an empty or repeated name, a
            scale or outer link to a missing or unsuitable tensor.
        TypeError: an item that is not a :class:`Tensor`.

    Example:
        >>> d = kiln.TensorDirectory([kiln.Tensor.from_numpy(np.ones(2, np.float32), name="b")])
        >>> d.keys(), d["b"].shape, "b" in d, d.get("c")
        (['b'], (2,), True, None)
    """

    __slots__ = ("_tensors", "_rows", "_buf", "_pb", "_errors", "_index", "_names", "_own",
                 "__weakref__")

    def __init__(self, tensors: Iterable["Tensor"] = ()) -> None:
        ts = list(tensors)
        for i, t in enumerate(ts):
            if not isinstance(t, Tensor):
                raise TypeError("TensorDirectory item %d is %s, not a kiln.Tensor"
                                % (i, type(t).__name__))
        check_directory(ts)   # names and links, as the wire check would
        self._tensors = ts
        self._rows = None
        self._index = None
        self._names = None
        self._own = None

    @classmethod
    def _from_table(cls, rows, buf, pb, errors):
        d = cls.__new__(cls)
        d._rows = rows
        d._buf = buf = _owner(buf)
        d._pb = pb
        d._errors = errors
        d._tensors = [None] * len(rows)
        d._index = None
        d._names = None
        d._own = _hold(buf)   # the base of the arrays Tensor.numpy makes (compiled kernels)
        return d

    def _make(self, i):
        row = self._rows[i]
        t = _new_tensor(Tensor)
        nm = row[2]
        t.name = None if nm is None else nm.decode("utf-8", self._errors)
        lay = row[3]
        t.layout = None if lay is None else lay.decode("utf-8", self._errors)
        t._row = row
        t._buf = self._buf
        t._off = self._pb + row[10]
        t._own = self._own
        self._tensors[i] = t
        return t

    @property
    def names(self) -> List[Optional[str]]:
        """Tensor names in directory order (None for unnamed tensors)."""
        names = self._names
        if names is None:
            if self._rows is None:
                names = [t.name for t in self._tensors]
            else:
                err = self._errors
                names = [None if r is None else r.decode("utf-8", err)
                         for r in _raw_names(self._rows)]
            self._names = names
        return list(names)

    def __len__(self) -> int:
        return len(self._tensors)

    def _tensor(self, i):
        t = self._tensors[i]
        return t if t is not None else self._make(i)

    def __iter__(self):
        """The keys: names in directory order, or positions when unnamed."""
        names = self.names
        if names and names[0] is not None:
            return iter(names)
        return iter(range(len(names)))

    def values(self) -> List["Tensor"]:  # type: ignore[override]
        """The tensors in directory order (a list)."""
        if self._rows is not None and _fill is not None and _fill(self) is not None:
            return list(self._tensors)   # every Tensor made by the compiled kernels
        return [self._tensor(i) for i in range(len(self._tensors))]

    def items(self) -> List[Tuple[Any, "Tensor"]]:  # type: ignore[override]
        """(key, tensor) pairs in directory order (a list)."""
        return list(zip(self, self.values()))

    def keys(self) -> List[Any]:  # type: ignore[override]
        """The names in directory order, or the positions when unnamed (a list)."""
        return list(self)

    def __getitem__(self, key: Any) -> "Tensor":
        if isinstance(key, str):
            idx = self._index
            if idx is None:
                idx = self._index = self._name_index()
            if self._rows is None:
                return self._tensor(idx[key])
            try:   # a decoded directory is indexed by the raw name bytes: nothing decoded
                raw = key.encode("utf-8", self._errors)
            except UnicodeEncodeError:
                raise KeyError(key) from None
            i = idx.get(raw)
            if i is None:
                raise KeyError(key)
            return self._tensor(i)
        if isinstance(key, slice):
            return [self._tensor(i) for i in range(*key.indices(len(self)))]
        n = len(self._tensors)
        index = getattr(key, "__index__", None)
        if index is None or isinstance(key, bool):
            raise KeyError(key)   # neither a name nor a position
        i = index()
        if not -n <= i < n:
            raise IndexError("tensor index %d out of range for %d tensors" % (i, n))
        return self._tensor(i % n if n else i)

    def _name_index(self) -> Dict[Any, int]:
        if self._rows is None:
            return {n: i for i, n in enumerate(self.names) if n is not None}
        out: Dict[Any, int] = {}
        for i, r in enumerate(_raw_names(self._rows)):
            if r is not None:
                out.setdefault(r, i)
        return out

    def __contains__(self, key: object) -> bool:
        """Is ``key`` one of the keys: a name, or a position when the tensors are unnamed."""
        names = self.names
        if names and names[0] is not None:
            return isinstance(key, str) and key in names
        return isinstance(key, int) and not isinstance(key, bool) and 0 <= key < len(names)

    def __reduce_ex__(self, protocol):
        # the tensors pickle themselves (out of band with protocol 5)
        return (_rebuild_directory, (self.values(),))

    def get(self, key: Any, default: Any = None) -> Any:
        """``d[key]``, or ``default`` when there is no such name or position."""
        try:
            return self[key]
        except (KeyError, IndexError):
            return default

    def copy_into(self, targets: Any, *, strict: bool = True) -> None:
        """Write each tensor's payload once into the caller's array ``targets[name]``.

        Every name, dtype, shape and writability is checked first (see
        :meth:`Tensor.copy_into`): when one target is wrong, nothing is
        written to any of them.  Filling a model's existing weights this way
        makes no second copy and allocates nothing of the payloads' size.

        Args:
            targets: a mapping of tensor name (or position, for unnamed
                tensors) to a writable array.
            strict: every tensor needs a target (``KeyError`` naming those
                without); ``False`` fills only the names given.

        Raises:
            KeyError: a name the directory does not have, or (``strict``) a
                tensor without a target.
            TypeError, ValueError: as :meth:`Tensor.copy_into`; also two
                targets that share memory.

        Example:
            >>> d = kiln.decode_tensors(kiln.encode_tensors({"w": np.ones(2, np.float32)}))
            >>> w = np.zeros(2, np.float32)
            >>> d.copy_into({"w": w})
            >>> w.tolist()
            [1.0, 1.0]
        """
        from ._into import copy_many
        copy_many(self, targets, strict)

    def to_dict(self) -> Dict[Optional[str], np.ndarray]:
        """``{name: numpy array}`` for named tensors (views of the payloads).

        Example:
            >>> d = kiln.decode_tensors(kiln.encode_tensors({"w": np.ones(2, np.float32)}))
            >>> d.to_dict()["w"].tolist()
            [1.0, 1.0]
        """
        return {t.name: t.numpy() for t in self.values()}

    def __eq__(self, other):
        if isinstance(other, TensorDirectory):
            return self.names == other.names and self.values() == other.values()
        return NotImplemented

    __hash__ = None

    def __repr__(self):
        return "<kiln.TensorDirectory of %d tensors>" % len(self._tensors)


_new_tensor = Tensor.__new__


def _link(ref):
    """A scale or outer link as given: a name (str) or a position (int)."""
    return ref if isinstance(ref, str) else int(ref)


def _rebuild_tensor(payload, code, shape, name, layout, block_size, quant_scheme, quant_axis,
                    group_size, scale_index, outer_index):
    return Tensor(payload, dtype=code, shape=shape, name=name, layout=layout,
                  block_size=block_size, quant_scheme=quant_scheme, quant_axis=quant_axis,
                  group_size=group_size, scale_index=scale_index, outer_index=outer_index)


def _raw_names(rows):
    """The rows' raw names: a lazy table gives them without building its rows."""
    raw = getattr(rows, "raw_names", None)
    return raw() if raw is not None else [r[2] for r in rows]


def _rebuild_directory(tensors):
    return TensorDirectory(tensors)


class _Hooks:
    """What the kernels call for a ``tensors`` value (plan.tensors)."""

    @staticmethod
    def build(mv, start, base, table, copy, trusted):
        """Wrap a checked table: views of ``mv``, or one owned copy of the payloads."""
        errors = "surrogateescape" if trusted else "strict"
        pb = start + base
        if not copy:
            return TensorDirectory._from_table(table, mv.toreadonly(), pb, errors)
        end = 0
        for row in table:
            e = row[10] + row[11]
            if e > end:
                end = e
        # every payload written once, into storage the directory owns
        owned = np.empty(end, np.uint8)
        if end:
            owned[:] = mv[pb:pb + end]
        owned.flags.writeable = False
        return TensorDirectory._from_table(table, owned, 0, errors)

    @staticmethod
    def normalize(value):
        return normalize_tensors(value)

    @staticmethod
    def fast_code(dt):
        """(code, itemsize) when an array of numpy dtype ``dt`` that is C-contiguous
        would get a plain write record from normalize_tensors (_array_record),
        else None: the compiled kernels then describe such arrays themselves."""
        try:
            if not isinstance(dt, np.dtype) or dt.byteorder not in _LE_ORDERS or \
                    dt.itemsize == 0:
                return None
            memoryview(np.empty(1, dt)).cast("B")
            return _dtype_code_of_numpy(dt), dt.itemsize
        except (TypeError, ValueError, NotImplementedError):
            return None


HOOKS = _Hooks()


def _no_hold(buf):
    return None


# With the compiled kernels, Tensor.numpy(), TensorDirectory.values() and
# to_dict() of a decoded directory run in C (kiln._kernels_c:
# tensor_numpy_method, tensors_fill, tensors_dict_method): the same objects
# and arrays, without np.frombuffer's buffer round trip.  The two methods are
# the compiled functions themselves (no Python frame per call), wearing the
# Python methods' names, docstrings and signatures.
_fill, _hold = None, _no_hold
_tk = _compat.kernels   # the kernels the tensor layer was set up with (tests swap _compat.kernels)
if _compat.IMPLEMENTATION == "cython" and \
        _compat.kernels.tensor_setup(Tensor, _SHAPED, _numpy_py):
    Tensor.numpy = functools.update_wrapper(_compat.kernels.tensor_numpy_method, Tensor.numpy)
    _fill = _compat.kernels.tensors_fill
    _hold = _compat.kernels.hold_buffer
    _compat.kernels.directory_setup(TensorDirectory, HOOKS)
    TensorDirectory.to_dict = functools.update_wrapper(_compat.kernels.tensors_dict_method,
                                                       TensorDirectory.to_dict)


_LE_ORDERS = ("<", "|") + (("=",) if sys.byteorder == "little" else ())


def _utf8(text, i):
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise EncodeError("UTF8", 0, "tensor %d: name has no UTF-8 form" % i) from None


def _array_record(x, name):
    """The write record of a plain little-endian C-contiguous array, else None."""
    if type(x) is not np.ndarray or not x.flags.c_contiguous or \
            x.dtype.byteorder not in _LE_ORDERS or x.ndim > 8:
        return None   # (rank above 8: Tensor refuses it with the reason)
    try:
        data = memoryview(x).cast("B")
    except (TypeError, ValueError, NotImplementedError):
        return None
    return (_dtype_code_of_numpy(x.dtype), x.shape, name, None, 0, 0, _NO_AXIS, 0, U32_MAX,
            U32_MAX, data)


def normalize_tensors(value):
    """Turn a tensors value into write records (raises EncodeError on bad input).

    A record is the kernels' write layout (see kiln._kernels_py.write_directory).
    """
    try:
        if isinstance(value, TensorDirectory):
            pairs = [(None if t.name is None else _utf8(t.name, i), t)
                     for i, t in enumerate(value.values())]
        elif isinstance(value, Mapping):
            pairs = []
            # one snapshot of the items (a dict: copied in one step), so a
            # key's code or another thread changing the mapping cannot break the loop
            try:
                snap = dict.copy(value).items() if type(value) is dict else list(value.items())
            except RuntimeError as e:
                raise EncodeError("TYPE", 0, "the tensors mapping changed while it was read "
                                  "(%s)" % e) from None
            for i, (k, x) in enumerate(snap):
                if not isinstance(k, str):
                    raise EncodeError("TYPE", 0, "tensor mapping key %r is not a str" % (k,))
                pairs.append((_utf8(k, i), x))
            pairs.sort(key=_first)
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
            axis, group, block, scheme = row[6], row[7], row[4], row[5]
            if not (0 <= axis <= W.U16_MAX and 0 <= group <= U32_MAX
                    and 0 <= block <= U32_MAX and 0 <= scheme <= W.U16_MAX):
                raise EncodeError("TYPE", 0, "tensor %d: a quantization field is out of range" % i)
            if row[8] != U32_MAX or row[9] != U32_MAX:
                linked = True
            app((row[0], row[1], name, None if t.layout is None else _utf8(t.layout, i), block,
                 scheme, axis, group, row[8], row[9], t.data))
    except (TypeError, ValueError) as e:
        if isinstance(e, EncodeError):
            raise
        raise EncodeError("TYPE", 0, str(e)) from None
    if linked:
        index = {}
        for i, rec in enumerate(records):
            if rec[2] is not None:
                index.setdefault(rec[2].decode("utf-8"), i)
        for i, rec in enumerate(records):
            if rec[8] != U32_MAX or rec[9] != U32_MAX:
                scale = rec[8] if rec[8] == U32_MAX else _resolve(rec[8], index, i)
                outer = rec[9] if rec[9] == U32_MAX else _resolve(rec[9], index, i)
                records[i] = rec[:8] + (scale, outer, rec[10])
    return records


def _first(t):
    return t[0]


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


__all__ = ["Tensor", "TensorDirectory", "unpack_nibbles", "pack_nibbles", "numpy_dtype"]
