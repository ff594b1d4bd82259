"""The public encode/decode API."""

import threading
from typing import (TYPE_CHECKING, Any, Callable, Dict, Generic, Mapping, Optional, Sequence,
                    TypeVar, Union, overload)
from typing import Type as _ClassOf

from ._errors import KilnError
from ._types import Type, as_type, tensors as _tensors_type
from . import _compat

T = TypeVar("T")

if TYPE_CHECKING:
    import mmap
    import sys

    import numpy as np

    from ._tensor import TensorDirectory

    # what decode takes: any C-contiguous object with the buffer protocol
    if sys.version_info >= (3, 12):
        from collections.abc import Buffer
    else:
        Buffer = Union[bytes, bytearray, memoryview, mmap.mmap, np.ndarray]
else:
    Buffer = Any
# a Kiln type: a Type, type text, or a dataclass / NamedTuple bound to a struct
TypeLike = Union[Type, str, type]
TensorsLike = Union["TensorDirectory", Sequence[Any], Mapping[str, Any]]

from ._wire import DEFAULT_MAX_COUNT, DEFAULT_MAX_BYTES, U32_MAX


def _check_caps(max_count: object, max_bytes: object) -> None:
    for nm, v in (("max_count", max_count), ("max_bytes", max_bytes)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError("%s must be a non-negative int" % nm)
    if max_count > U32_MAX:
        raise ValueError("max_count cannot exceed the wire maximum 4294967295")


class Encoder(Generic[T]):
    """Encode values of one type; the plan is compiled once.

    ``round_floats``: see :func:`encode`.

    ``encode(value) -> bytes``; ``encode_into(value, buffer, offset=0) -> end``
    writes into a bytearray starting at ``offset`` and resizes it to end where
    the encoding ends (the bytes before ``offset`` are kept; ``offset=-1``
    appends).  On error the bytes after ``offset`` are unspecified.
    """

    __slots__ = ("type", "frame", "round_floats", "_prog", "encode", "encode_into")
    type: Type
    frame: bool
    round_floats: bool
    encode: Callable[[T], bytes]
    encode_into: Callable[..., int]

    @overload
    def __init__(self: "Encoder[T]", type: _ClassOf[T], frame: bool = ..., *,
                 round_floats: bool = ..., kernels: Any = ...) -> None: ...

    @overload
    def __init__(self: "Encoder[Any]", type: Union[Type, str], frame: bool = ..., *,
                 round_floats: bool = ..., kernels: Any = ...) -> None: ...

    def __init__(self, type: TypeLike, frame: bool = False, *, round_floats: bool = False,
                 kernels: Any = None) -> None:
        self.type = as_type(type)
        self.frame = bool(frame)
        self.round_floats = bool(round_floats)
        k = kernels or _compat.kernels
        self._prog = k.compile_encoder(self.type.plan(),
                                       self.type.schema_hash if self.frame else None,
                                       self.round_floats)
        self.encode = self._prog.encode
        self.encode_into = self._prog.encode_into

    def __repr__(self) -> str:
        return "kiln.Encoder(%r, frame=%r)" % (self.type.text, self.frame)


class Decoder(Generic[T]):
    """Decode buffers of one type with fixed options; the plan is compiled once.

    Options: ``frame`` (a 16-byte frame must precede the value), ``trusted``
    (skip UTF-8 and quantization-shape checks; every length is still checked),
    ``max_count``/``max_bytes`` (the caps), ``copy`` (tensor payloads are
    copied into storage the result owns instead of viewing ``buf``; the copy
    is not capped, it lies inside ``buf`` already), ``max_copy_bytes`` (a cap
    on one copied payload when you want one).
    """

    __slots__ = ("type", "frame", "trusted", "max_count", "max_bytes", "copy", "max_copy_bytes",
                 "_prog", "decode")
    type: Type
    frame: bool
    trusted: bool
    max_count: int
    max_bytes: int
    copy: bool
    max_copy_bytes: Optional[int]
    decode: Callable[[Buffer], T]

    @overload
    def __init__(self: "Decoder[T]", type: _ClassOf[T], frame: bool = ..., *,
                 trusted: bool = ..., max_count: int = ..., max_bytes: int = ...,
                 copy: bool = ..., max_copy_bytes: Optional[int] = ...,
                 kernels: Any = ...) -> None: ...

    @overload
    def __init__(self: "Decoder[Any]", type: Union[Type, str], frame: bool = ..., *,
                 trusted: bool = ..., max_count: int = ..., max_bytes: int = ...,
                 copy: bool = ..., max_copy_bytes: Optional[int] = ...,
                 kernels: Any = ...) -> None: ...

    def __init__(self, type: TypeLike, frame: bool = False, *, trusted: bool = False,
                 max_count: int = DEFAULT_MAX_COUNT, max_bytes: int = DEFAULT_MAX_BYTES,
                 copy: bool = False, max_copy_bytes: Optional[int] = None,
                 kernels: Any = None) -> None:
        _check_caps(max_count, max_bytes)
        if max_copy_bytes is not None:
            _check_caps(0, max_copy_bytes)
        self.type = as_type(type)
        self.frame = bool(frame)
        self.trusted = bool(trusted)
        self.max_count = max_count
        self.max_bytes = max_bytes
        self.copy = bool(copy)
        self.max_copy_bytes = max_copy_bytes
        k = kernels or _compat.kernels
        self._prog = k.compile_decoder(self.type.plan(),
                                       self.type.schema_hash if self.frame else None,
                                       self.trusted, max_count, max_bytes, self.copy,
                                       max_copy_bytes)
        self.decode = self._prog.decode

    def __repr__(self) -> str:
        return "kiln.Decoder(%r, frame=%r)" % (self.type.text, self.frame)


_lock = threading.Lock()
_enc_cache: Dict[Any, Any] = {}
_dec_cache: Dict[Any, Any] = {}
_CACHE_MAX = 256


def _cached(cache: Dict[Any, Any], key: Any, factory: Callable[[], Any]) -> Any:
    prog = cache.get(key)
    if prog is None:
        prog = factory()
        with _lock:
            if len(cache) >= _CACHE_MAX:
                cache.clear()
            cache[key] = prog
    return prog


def _key_type(type: Any) -> Any:
    # Type objects hash by text and binding; strings are parsed (and cached) once
    return type if isinstance(type, Type) else (type if isinstance(type, str) else id(type), type)


def encode(value: Any, type: TypeLike, *, frame: bool = False,
           round_floats: bool = False) -> bytes:
    """Encode ``value`` as ``type`` (a Type, type text, or a bound class).

    ``round_floats=True`` lets a float array of a wider dtype (float64 for a
    ``list<f32>``) round to the element; by default a value that would change
    is an EncodeError.
    """
    key = (_key_type(type), bool(frame), bool(round_floats), _compat.IMPLEMENTATION)
    enc = _cached(_enc_cache, key, lambda: Encoder(type, frame, round_floats=round_floats))
    return enc.encode(value)


@overload
def decode(buf: Buffer, type: _ClassOf[T], *, frame: bool = ..., trusted: bool = ...,
           max_count: int = ..., max_bytes: int = ..., copy: bool = ...,
           max_copy_bytes: Optional[int] = ...) -> T: ...


@overload
def decode(buf: Buffer, type: Union[Type, str], *, frame: bool = ..., trusted: bool = ...,
           max_count: int = ..., max_bytes: int = ..., copy: bool = ...,
           max_copy_bytes: Optional[int] = ...) -> Any: ...


def decode(buf: Buffer, type: TypeLike, *, frame: bool = False, trusted: bool = False,
           max_count: int = DEFAULT_MAX_COUNT, max_bytes: int = DEFAULT_MAX_BYTES,
           copy: bool = False, max_copy_bytes: Optional[int] = None) -> Any:
    """Decode one value of ``type`` that fills the whole of ``buf``.

    With a dataclass or NamedTuple as ``type`` the result is an instance of it
    (and type checkers know it)."""
    if max_count.__class__ is not int or max_bytes.__class__ is not int:
        # 5.0 and True hash like 5 and 1: check before the cache can match them
        _check_caps(max_count, max_bytes)
    if max_copy_bytes is not None and max_copy_bytes.__class__ is not int:
        _check_caps(0, max_copy_bytes)
    key = (_key_type(type), bool(frame), bool(trusted), max_count, max_bytes, bool(copy),
           max_copy_bytes, _compat.IMPLEMENTATION)
    dec = _cached(_dec_cache, key, lambda: Decoder(type, frame, trusted=trusted,
                                                   max_count=max_count, max_bytes=max_bytes,
                                                   copy=copy, max_copy_bytes=max_copy_bytes))
    return dec.decode(buf)


def encode_tensors(tensors: TensorsLike) -> bytes:
    """Encode a standalone tensor directory.

    ``tensors`` is a TensorDirectory, a sequence of Tensor or arrays (order
    kept), or a mapping of name to Tensor or array (sorted by key bytes).
    """
    return encode(tensors, _tensors_type)


def decode_tensors(buf: Buffer, *, copy: bool = False, trusted: bool = False,
                   max_count: int = DEFAULT_MAX_COUNT, max_bytes: int = DEFAULT_MAX_BYTES,
                   max_copy_bytes: Optional[int] = None) -> "TensorDirectory":
    """Decode a standalone tensor directory into a :class:`kiln.TensorDirectory`."""
    d: "TensorDirectory" = decode(buf, _tensors_type, copy=copy, trusted=trusted,
                                  max_count=max_count, max_bytes=max_bytes,
                                  max_copy_bytes=max_copy_bytes)
    return d


__all__ = ["Encoder", "Decoder", "encode", "decode", "encode_tensors", "decode_tensors",
           "KilnError"]
