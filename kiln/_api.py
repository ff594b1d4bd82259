"""The public encode/decode API."""

import threading
import types as _pytypes
import typing as _typing
from typing import (TYPE_CHECKING, Any, Callable, Dict, Generic, Mapping, Optional, Sequence,
                    TypeVar, Union, overload)
from typing import Type as _ClassOf

from ._errors import KilnError
from ._types import Type, as_type, tensors as _tensors_type
from . import _compat
from . import _wire as W

T = TypeVar("T")

if TYPE_CHECKING:
    import mmap
    import sys

    import numpy as np

    from ._tensors import TensorDirectory

    # what decode takes: any C-contiguous object with the buffer protocol
    if sys.version_info >= (3, 12):
        from collections.abc import Buffer
    else:
        Buffer = Union[bytes, bytearray, memoryview, mmap.mmap, np.ndarray]
else:
    Buffer = Any
# what a type checker sees for an annotation written as a value (``Optional[S]``,
# ``Union[...]``, ``S | None``, ``list[S]``): these decode to ``Any`` statically
Annotation = Union[_typing._SpecialForm, _pytypes.UnionType, _pytypes.GenericAlias]
# a Kiln type: a Type, type text, a dataclass / NamedTuple bound to a struct, or
# an annotation of those
TypeLike = Union[Type, str, type, Annotation]
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

    An encoder holds no per-call state: one object may be shared by threads.

    Args:
        type: a :class:`kiln.Type`, type text (``"list<i32>"``) or a dataclass /
            NamedTuple bound to a struct.
        frame: prefix every encoding with the 16-byte frame that carries the
            type's schema hash.
        round_floats: let a value a float field or element cannot hold
            exactly round to the nearest (see :func:`kiln.encode`).

    The compiled program has two methods:

    * ``encode(value) -> bytes``.
    * ``encode_into(value, buffer, offset=0) -> int`` writes into a
      ``bytearray`` from ``offset``, resizes it to end where the encoding
      ends and returns that end (the bytes before ``offset`` are kept;
      ``offset=-1`` appends).  On error the bytes after ``offset`` are
      unspecified.

    Raises:
        KilnError: ``TYPE`` for malformed type text, ``DEPTH`` for a type
            nesting more than 64 containers.
        TypeError: for an annotation with no Kiln wire form (a union other
            than ``T | None``), naming the field.
        EncodeError: from ``encode``/``encode_into``, as :func:`kiln.encode`.

    Example:
        >>> enc = kiln.Encoder("list<i32>")
        >>> enc.encode([1, 2])
        b'\\x02\\x00\\x00\\x00\\x01\\x00\\x00\\x00\\x02\\x00\\x00\\x00'
        >>> out = bytearray()
        >>> enc.encode_into([7], out), enc.encode_into([8, 9], out, -1)
        (8, 20)
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
    def __init__(self: "Encoder[Any]", type: Union[Type, str, Annotation], frame: bool = ..., *,
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

    ``Decoder(t, ...).decode(buf)`` gives the same value or error as
    ``kiln.decode(buf, t, ...)``.  A decoder holds no per-call state: one
    object may be shared by threads.

    Args:
        type: a :class:`kiln.Type`, type text, or a dataclass / NamedTuple
            (then ``decode`` returns instances of it).
        frame: a 16-byte frame carrying the schema hash must precede the value.
        trusted: skip the UTF-8 checks of strings, keys and tensor names and
            the quantization-shape checks of tensors; every count, length and
            offset is still checked against the buffer (see :doc:`security`).
        max_count: the cap on every list (but ``list<u8>``), dict and directory count, and the
            budget of zero-size elements of one value (default 16,777,216).
        max_bytes: the cap on one string, one ``list<u8>`` run and one name
            heap (default 16,777,216).
        copy: tensor payloads are copied into storage the result owns instead
            of viewing the buffer (the copy is not capped: it lies inside the
            buffer already).
        max_copy_bytes: a cap on one copied payload, when you want one.

    The compiled program's method is ``decode(buf)``: ``buf`` is any
    C-contiguous object with the buffer protocol (``bytes``, ``bytearray``,
    ``memoryview``, ``mmap``, a numpy array); the value must fill all of it.

    Raises:
        ValueError: a negative or non-int cap (when the decoder is built).
        KilnError: from ``decode``, with the codes listed at
            :func:`kiln.decode`; ``TYPE``/``DEPTH`` for a bad type when built.

    Example:
        >>> dec = kiln.Decoder("struct{id:i64,name:str,}", max_count=1000)
        >>> dec.decode(kiln.encode({"id": 1, "name": "a"}, dec.type))
        {'id': 1, 'name': 'a'}
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
    def __init__(self: "Decoder[Any]", type: Union[Type, str, Annotation], frame: bool = ..., *,
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


def _zero_size_lists(plan: Any) -> bool:
    """Does the plan hold a list of elements of minimum wire size 0?"""
    if plan.op == W.OP_LIST and plan.elem.min_size == 0:
        return True
    return any(_zero_size_lists(p) for p in ((plan.elem,) if plan.elem is not None else ())
               + tuple(plan.fields))


def _file_caps(size: int, type: TypeLike, options: Dict[str, Any]) -> Dict[str, Any]:
    """The decode options for a local file of ``size`` bytes (kiln.load).

    A count or length of elements of at least one byte can never exceed the
    bytes of the file, so a cap the caller did not set grows to the file's
    size (rounded up to a power of two, so few decoders are cached): what
    kiln.save wrote, kiln.load reads.  ``max_count`` stays at its default
    for a type with zero-size elements, whose shared budget it is (those
    elements cost no bytes, so the file's size does not bound them).
    """
    if size <= min(DEFAULT_MAX_BYTES, DEFAULT_MAX_COUNT):
        return options
    cap = 1 << (size - 1).bit_length()
    out = dict(options)
    if "max_bytes" not in out:
        out["max_bytes"] = max(cap, DEFAULT_MAX_BYTES)
    if "max_count" not in out and not _zero_size_lists(as_type(type).plan()):
        out["max_count"] = max(min(cap, U32_MAX), DEFAULT_MAX_COUNT)
    return out


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
    """Encode ``value`` as ``type``.

    The encoder for each type and option set is compiled once and cached.

    Args:
        value: the Python value (see :doc:`records` for what each type takes).
        type: a :class:`kiln.Type`, type text, or a dataclass / NamedTuple
            bound to a struct.
        frame: prefix the 16-byte frame carrying the type's schema hash.
        round_floats: let a value an ``f32`` or ``f64`` field or element
            cannot hold exactly (0.1 as ``f32``, from a float, an int, a numpy
            scalar, a list or an array) round to the nearest; by default a
            value that would change is an :class:`~kiln.EncodeError`.

    Returns:
        bytes: the encoding; ``kiln.decode`` of it gives the value back.

    Raises:
        EncodeError: ``TYPE`` for a value of the wrong kind or out of range, a
            missing or unknown struct field, or a container whose length
            changes while it is encoded; ``UTF8`` for a string or key with no
            UTF-8 form; ``LIMIT`` for a count or length above the wire's u32
            (or a tensor name heap above u16 offsets). ``.path`` names the
            place in the value.
        KilnError: ``TYPE`` for malformed type text, ``DEPTH`` for a type
            nesting more than 64 containers.

    Example:
        >>> kiln.encode(7, "i32")
        b'\\x07\\x00\\x00\\x00'
        >>> kiln.encode(300, "u8")
        Traceback (most recent call last):
        kiln.EncodeError: TYPE at byte 0 ($): 300 does not fit u8 (0..255)
    """
    key = (_key_type(type), bool(frame), bool(round_floats), _compat.IMPLEMENTATION)
    enc = _cached(_enc_cache, key, lambda: Encoder(type, frame, round_floats=round_floats))
    return enc.encode(value)


def cached_encoder(type: TypeLike, frame: bool, round_floats: bool) -> "Encoder[Any]":
    """The :class:`Encoder` :func:`encode` uses for these options (compiled once,
    cached): for the file writers that need its program (``kiln.save``)."""
    key = (_key_type(type), bool(frame), bool(round_floats), _compat.IMPLEMENTATION)
    return _cached(_enc_cache, key, lambda: Encoder(type, frame, round_floats=round_floats))


@overload
def decode(buf: Buffer, type: _ClassOf[T], *, frame: bool = ..., trusted: bool = ...,
           max_count: int = ..., max_bytes: int = ..., copy: bool = ...,
           max_copy_bytes: Optional[int] = ...) -> T: ...


@overload
def decode(buf: Buffer, type: Union[Type, str, Annotation], *, frame: bool = ...,
           trusted: bool = ..., max_count: int = ..., max_bytes: int = ..., copy: bool = ...,
           max_copy_bytes: Optional[int] = ...) -> Any: ...


def decode(buf: Buffer, type: TypeLike, *, frame: bool = False, trusted: bool = False,
           max_count: int = DEFAULT_MAX_COUNT, max_bytes: int = DEFAULT_MAX_BYTES,
           copy: bool = False, max_copy_bytes: Optional[int] = None) -> Any:
    """Decode one value of ``type`` that fills the whole of ``buf``.

    Every count and length is checked against the bytes that remain before
    anything is allocated.  The decoder for each type and option set is
    compiled once and cached.

    Args:
        buf: any C-contiguous object with the buffer protocol (``bytes``,
            ``bytearray``, ``memoryview``, ``mmap``, a numpy array).
        type: a :class:`kiln.Type`, type text, or a dataclass / NamedTuple;
            with a class the result is an instance of it (and type checkers
            know it).
        frame, trusted, max_count, max_bytes, copy, max_copy_bytes: as for
            :class:`kiln.Decoder`.

    Returns:
        The value: ``int``, ``float``, ``bool``, ``str``, ``bytes``, numpy
        arrays, lists, dicts, instances of the bound class,
        :class:`kiln.TensorDirectory` (the table at :doc:`records`).

    Raises:
        KilnError: ``EOF`` (a count or length past the end of ``buf``),
            ``LIMIT`` (a count above ``max_count``/``max_bytes``/
            ``max_copy_bytes``, or one that overflows), ``TYPE`` (a bad bool
            or opt byte, unsorted dict keys, a bad directory entry), ``UTF8``,
            ``TRAILING`` (bytes after the value), ``FRAME`` and ``SCHEMA``
            (with ``frame=True``: a bad frame, a hash of another type),
            ``DEPTH``; ``.offset`` is where the fault was found.
        ValueError: a negative or non-int cap.

    Example:
        >>> t = kiln.parse_type("struct{id:i64,tags:list<str>,}")
        >>> kiln.decode(kiln.encode({"id": 3, "tags": ["a"]}, t), t)
        {'id': 3, 'tags': ['a']}
        >>> kiln.decode(b"\\x01\\x00", "i32")
        Traceback (most recent call last):
        kiln.KilnError: EOF at byte 0: 4-byte value needs more bytes, 2 remain
    """
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
    """Encode a standalone tensor directory (the ``tensors`` type).

    Args:
        tensors: a :class:`kiln.TensorDirectory`; a sequence of
            :class:`kiln.Tensor` or arrays (order kept, unnamed unless the
            tensors carry names); or a mapping of name to tensor or array
            (sorted by the names' UTF-8 bytes).  Arrays are numpy arrays, or
            objects with ``__dlpack__`` or the buffer protocol.

    Returns:
        bytes: the directory block; every payload 64-byte aligned.

    Raises:
        EncodeError: ``TYPE`` for a value that is not tensors, a dtype with no
            Kiln twin (complex, object), an empty or non-str name, a mix of
            named and unnamed tensors, a bad quantization link; ``UTF8`` for a
            name with no UTF-8 form; ``LIMIT`` for names longer than the u16
            heap allows.

    Example:
        >>> buf = kiln.encode_tensors({"w": np.zeros((2, 3), np.float32)})
        >>> kiln.decode_tensors(buf)["w"].shape
        (2, 3)
    """
    return encode(tensors, _tensors_type)


def decode_tensors(buf: Buffer, *, copy: bool = False, trusted: bool = False,
                   max_count: int = DEFAULT_MAX_COUNT, max_bytes: int = DEFAULT_MAX_BYTES,
                   max_copy_bytes: Optional[int] = None) -> "TensorDirectory":
    """Decode a standalone tensor directory into a :class:`kiln.TensorDirectory`.

    The bytes of a tensor file are one: a file whose names take the wide name
    fields (spec/kiln-v2.md 12.3) is read too, as :func:`kiln.open` reads it
    (inside a Frozen value those fields are ``FRAME``).

    Args:
        buf: the directory block (any object with the buffer protocol).
        copy: copy the payloads once into storage the directory owns; by
            default the tensors are read-only views of ``buf``.
        trusted, max_count, max_bytes, max_copy_bytes: as for
            :class:`kiln.Decoder`.

    Returns:
        TensorDirectory: a mapping of name (or position) to
        :class:`kiln.Tensor`.

    Raises:
        KilnError: ``FRAME`` (bad magic, version, flags or reserved bytes),
            ``EOF`` (a table or payload past the end), ``LIMIT`` (a count or
            name heap above the caps), ``TYPE`` (a dtype, shape, range, name,
            quantization or placement fault), ``UTF8`` (a name),
            ``TRAILING``.

    Example:
        >>> d = kiln.decode_tensors(kiln.encode_tensors([np.arange(3, dtype=np.int16)]))
        >>> d[0].numpy().tolist(), d[0].dtype
        ([0, 1, 2], 'i16')
    """
    try:
        d: "TensorDirectory" = decode(buf, _tensors_type, copy=copy, trusted=trusted,
                                      max_count=max_count, max_bytes=max_bytes,
                                      max_copy_bytes=max_copy_bytes)
    except KilnError as e:
        if e.code == "FRAME" and e.offset == W.H_FLAGS and _wide_flags(buf):
            return _decode_wide(buf, copy, trusted, max_count, max_bytes, max_copy_bytes)
        # the bytes of a safetensors, GGUF or npz file: say so, as kiln.open
        if e.offset == 0 and e.code in ("FRAME", "EOF"):
            from ._files.paths import FOREIGN_HEAD, foreign_hint
            try:
                hint = foreign_hint(bytes(memoryview(buf).cast("B")[:FOREIGN_HEAD]))
            except (TypeError, ValueError):
                hint = None
            if hint is not None:
                e.reason += " (%s)" % hint
        raise
    return d


def _wide_flags(buf: Any) -> bool:
    """Are the flags of the directory at the start of ``buf`` a tensor file's
    wide ones (bit 2 the only bit past the known two, spec 12.3)?"""
    try:
        flags = memoryview(buf).cast("B")[W.H_FLAGS]
    except (TypeError, ValueError, IndexError):
        return False
    return flags & ~(W.FLAG_NAMED | W.FLAG_LITTLE) == W.FLAG_WIDE


def _decode_wide(buf: Any, copy: bool, trusted: bool, max_count: int, max_bytes: int,
                 max_copy_bytes: Optional[int]) -> "TensorDirectory":
    """decode_tensors of a tensor file's bytes whose names take the wide
    fields: the same checks as the decode, with the directory kernel told
    that it reads a tensor file."""
    from ._tensors import HOOKS
    _check_caps(max_count, max_bytes)
    mv = memoryview(buf)
    if mv.ndim != 1 or mv.format != "B":
        mv = mv.cast("B")
    _, base, table = _compat.kernels.validate_directory(
        mv, 0, True, trusted, max_count, max_bytes, max_copy_bytes if copy else None, True)
    d: "TensorDirectory" = HOOKS.build(mv, 0, base, table, copy, trusted)
    return d


__all__ = ["Encoder", "Decoder", "encode", "decode", "encode_tensors", "decode_tensors",
           "KilnError"]
