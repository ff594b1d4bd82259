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
i4 u4      ``ml_dtypes.int4`` ``ml_dtypes.uint4`` (needs ml_dtypes; an unpacked copy)
e2m1       ``ml_dtypes.float4_e2m1fn`` (needs ml_dtypes; an unpacked copy)
opaque     the raw payload bytes as a 1-D ``|u1`` array
=========  ==============================================================

Without ml_dtypes, ``numpy()`` of a bf16, float8 or 4-bit tensor raises
``ImportError`` (an array of unsigned integers would look like numbers and
be wrong); :meth:`Tensor.bits` gives the raw bit patterns (the packed bytes
of a 4-bit tensor) on request.

The ml_dtypes types are in host byte order; on a big-endian host ``numpy()``
returns a byte-swapped copy for bf16 (one-byte types need no swap).

The package, one job per module: ``tensor`` (:class:`Tensor`), ``directory``
(:class:`TensorDirectory`), ``arrays`` (the arrays ``numpy()`` makes and the
one owner of a payload's buffer), ``dlpack`` (DLPack capsules), ``foreign``
(a torch tensor by its raw bytes), ``dtypes``
(dtype names, codes and numpy dtypes), ``nibbles`` (4-bit packing),
``checks`` (what the wire check would refuse, at construction), ``records``
(a ``tensors`` value as write records), ``hooks`` (what the kernels call),
``bind`` (the one place the objects meet a kernel's tensor part).
"""

from .. import _compat
from .bind import BOUND, bind
from .directory import TensorDirectory
from .dtypes import numpy_dtype
from .hooks import HOOKS
from .nibbles import pack_nibbles, unpack_nibbles
from .records import normalize_tensors
from .tensor import Tensor

bind(_compat.kernels)   # the one place, at import: the kernels import kiln picked

__all__ = ["Tensor", "TensorDirectory", "unpack_nibbles", "pack_nibbles", "numpy_dtype",
           "HOOKS", "BOUND", "bind", "normalize_tensors"]
