"""Two 4-bit elements per byte, low nibble first: the i4, u4 and e2m1 payloads."""

from typing import Any

import numpy as np


def unpack_nibbles(packed: Any, count: int, signed: bool = False) -> np.ndarray:
    """Unpack a packed i4/u4/e2m1 payload into one uint8 (or int8) per element.

    The low nibble of each byte is the earlier element.

    Args:
        packed: the payload (``Tensor.bits()`` or ``Tensor.data`` of a
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
    return _pack(v)


def _pack(v):
    u = (v.astype(np.int16) & 0x0F).astype(np.uint8)
    if u.size & 1:
        u = np.concatenate([u, np.zeros(1, np.uint8)])
    return (u[0::2] | (u[1::2] << 4)).astype(np.uint8).tobytes()


def pack_ml(arr: np.ndarray) -> bytes:
    """The packed payload of an ml_dtypes int4/uint4/float4_e2m1fn array (one
    element per byte, its value in the low nibble), C order."""
    return _pack(np.ascontiguousarray(arr).reshape(-1).view(np.uint8))
