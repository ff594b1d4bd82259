"""Hostile source files for the converters (tests/test_convert_bounds.py and
tools/convert_memory.py): each maker writes one file and returns its path.

Every file is small on disk and claims, or expands to, far more."""

import io
import json
import struct
import zipfile

import numpy as np


def _gguf_string(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def gguf(kv=b"", n_kv=0, infos=(), data=b"", align=32):
    """A GGUF v3 file: ``kv`` the metadata bytes (``n_kv`` entries), ``infos``
    (name, dims, ggml type, offset) tuples, ``data`` the data section."""
    head = b"GGUF" + struct.pack("<IQQ", 3, len(infos), n_kv) + kv
    for name, dims, gtype, offset in infos:
        head += _gguf_string(name) + struct.pack("<I", len(dims))
        head += b"".join(struct.pack("<Q", d) for d in dims) + struct.pack("<IQ", gtype, offset)
    head += bytes(-len(head) % align)
    return head + data


def gguf_overlapping(path, n=2048, size=32 << 10):
    """``n`` f32 tensors, every one on the same ``size``-byte range."""
    infos = [("t%d" % i, (size // 4,), 0, 0) for i in range(n)]
    path.write_bytes(gguf(infos=infos, data=bytes(size)))
    return path


def gguf_bool_array(path, n=1 << 20):
    """One metadata key holding an array of ``n`` bools (``n`` bytes)."""
    kv = _gguf_string("flags") + struct.pack("<IIQ", 9, 7, n) + bytes(n)
    path.write_bytes(gguf(kv=kv, n_kv=1))
    return path


def gguf_outside(path):
    """A tensor whose range runs past the data section."""
    path.write_bytes(gguf(infos=[("a", (64,), 0, 0)], data=bytes(128)))
    return path


def npz_zeros(path, nbytes=512 << 20):
    """A deflated npz member holding ``nbytes`` of zeros (u8), written a MiB at a time."""
    member = io.BytesIO()
    np.lib.format.write_array_header_1_0(member, {"descr": "|u1", "fortran_order": False,
                                                   "shape": (nbytes,)})
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as zf:
        with zf.open("z.npy", "w", force_zip64=True) as f:
            f.write(member.getvalue())
            block = bytes(1 << 20)
            for _ in range(nbytes >> 20):
                f.write(block)
            f.write(bytes(nbytes & ((1 << 20) - 1)))
    return path


def npz_zeros_2d(path, rows=2, nbytes=64 << 20):
    """As npz_zeros, shape (rows, nbytes // rows): rows above the writer's chunk."""
    member = io.BytesIO()
    np.lib.format.write_array_header_1_0(member, {"descr": "|u1", "fortran_order": False,
                                                   "shape": (rows, nbytes // rows)})
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as zf:
        with zf.open("z.npy", "w", force_zip64=True) as f:
            f.write(member.getvalue())
            block = bytes(1 << 20)
            for _ in range(nbytes >> 20):
                f.write(block)
    return path


def safetensors_values(path, n=1 << 21):
    """A safetensors header whose one tensor carries an extra field of ``n``
    empty objects (the safetensors library ignores unknown fields): 3 bytes
    of header, a dict when parsed."""
    pad = ",".join(["{}"] * n)
    h = ('{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"pad":[%s]}}' % pad).encode()
    path.write_bytes(struct.pack("<Q", len(h)) + h + b"\0")
    return path


def st(entries, data=b"", raw=False):
    """safetensors bytes from a header (a dict, or raw bytes with ``raw``)."""
    h = entries if raw else json.dumps(entries).encode()
    return struct.pack("<Q", len(h)) + h + data


A2 = {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]}

# files the safetensors library refuses (issue 27, point 12, and its rule set):
# name -> bytes
SAFETENSORS_REFUSED = {
    "duplicate tensor name": st(b'{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},'
                                b'"a":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}}',
                                b"abcd", raw=True),
    "duplicate field": st(b'{"a":{"dtype":"U8","dtype":"U8","shape":[2],'
                          b'"data_offsets":[0,2]}}', b"ab", raw=True),
    "duplicate __metadata__": st(b'{"__metadata__":{"k":"v"},"__metadata__":{"k":"w"},'
                                 b'"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}',
                                 b"ab", raw=True),
    "boolean data_offsets": st({"a": {"dtype": "U8", "shape": [1],
                                      "data_offsets": [False, True]}}, b"x"),
    "boolean shape": st({"a": {"dtype": "U8", "shape": [True], "data_offsets": [0, 1]}}, b"x"),
    "float data_offsets": st({"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1.0]}},
                             b"x"),
    "three data_offsets": st({"a": {"dtype": "U8", "shape": [2],
                                    "data_offsets": [0, 2, 2]}}, b"ab"),
    "bytes after the data": st({"a": A2}, b"abc"),
    "data cut short": st({"a": A2}, b"a"),
    "UTF-8 BOM": st(b"\xef\xbb\xbf" + json.dumps({"a": A2}).encode(), b"ab", raw=True),
    "NUL after the JSON": st(json.dumps({"a": A2}).encode() + b"\0", b"ab", raw=True),
    "NaN": st(b'{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":NaN}', b"ab",
              raw=True),
    "lone surrogate": st(b'{"\\ud800":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}',
                         b"ab", raw=True),
    "not UTF-8": st(b'{"a\xff":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}', b"ab",
                    raw=True),
    "gap before the data": st({"a": {"dtype": "U8", "shape": [2], "data_offsets": [1, 3]}},
                              b"abc"),
    "overlap": st({"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]},
                   "b": {"dtype": "U8", "shape": [2], "data_offsets": [1, 3]}}, b"abc"),
    "size differs from shape": st({"a": {"dtype": "U16", "shape": [2],
                                         "data_offsets": [0, 2]}}, b"ab"),
    "negative dimension": st({"a": {"dtype": "U8", "shape": [-2], "data_offsets": [0, 2]}},
                             b"ab"),
    "dimension past u64": st({"a": {"dtype": "U8", "shape": [2 ** 64],
                                    "data_offsets": [0, 2]}}, b"ab"),
    "size overflows": st({"a": {"dtype": "U16", "shape": [2 ** 63], "data_offsets": [0, 0]}}),
    "__metadata__ of an int": st({"__metadata__": {"k": 1}, "a": A2}, b"ab"),
    "not an object": st([1]),
    "unknown dtype": st({"a": {"dtype": "X", "shape": [2], "data_offsets": [0, 2]}}, b"ab"),
    "no data_offsets": st({"a": {"dtype": "U8", "shape": [2]}}, b"ab"),
    "null tensor": st({"a": None}),
    "header too large": struct.pack("<Q", 100_000_001) + b"{}",
    "header past the file": struct.pack("<Q", 64) + b"{}",
    "too short": b"\x02\0\0",
}
