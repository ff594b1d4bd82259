"""The fuzzing oracle of the record container (kiln.records).

Byte 0 of an input picks the record type (bits 0-1), ``recover=True`` (bit
2), ``verify=False`` (bit 3) and a tiny ``max_record_bytes`` for the stream
(bit 4); the rest is the container.  For every input: the file reader and the
stream decoder, on both kernels, give the same records or the same error
code and offset; the stream gives the same result for every chunking tried;
nothing but ``kiln.KilnError`` escapes.
"""

import io

import numpy as np

import kiln
from kiln import _kernels_py

try:
    from kiln import _kernels_c
except ImportError:  # pragma: no cover - a pure-Python tree
    _kernels_c = None

TYPES = ["struct{id:i64,name:str,}", "struct{id:i64,name:str,img:tensors,}", "list<u8>",
         "struct{a:i32,b:bool,tags:list<str>,}"]
KERNELS = [k for k in (_kernels_py, _kernels_c) if k is not None]


def summary(v):
    """A comparable form of a decoded value."""
    if isinstance(v, np.ndarray):
        return ("array", str(v.dtype), v.shape, v.tobytes())
    if isinstance(v, kiln.TensorDirectory):
        return ("tensors", [(k, t.dtype, tuple(t.shape), t.numpy().tobytes())
                            for k, t in v.items()])
    if isinstance(v, dict):
        return {k: summary(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [summary(x) for x in v]
    return v


def _err(e):
    assert isinstance(e, kiln.KilnError), repr(e)
    assert 0 <= e.offset, e
    return ("error", e.code, e.offset)


def read_file(body, t, k, recover, verify):
    try:
        with kiln.RecordFile(io.BytesIO(body), t, recover=recover, verify=verify,
                             kernels=k) as rf:
            out = [summary(v) for v in rf]
            rec = None if rf.recovery is None else (rf.recovery.offset,
                                                     _err(rf.recovery.error))
            return ("ok", out, rec)
    except kiln.KilnError as e:
        return _err(e)


def read_stream(body, t, k, verify, cap, cuts):
    d = kiln.StreamDecoder(t, verify=verify, max_record_bytes=cap, kernels=k)
    out = []
    try:
        for a, b in zip([0] + cuts, cuts + [len(body)]):
            out += [summary(v) for v in d.feed(body[a:b])]
        d.eof()
        return ("ok", out)
    except kiln.KilnError as e:
        return _err(e) + (len(out),)


def check_records_input(data):
    if not data:
        return
    t = TYPES[data[0] & 3]
    recover, verify = bool(data[0] & 4), not data[0] & 8
    cap = 64 if data[0] & 16 else 1 << 20
    body = bytes(data[1:])
    files = [read_file(body, t, k, recover, verify) for k in KERNELS]
    assert all(f == files[0] for f in files), files
    half = [len(body) // 2] if body else []
    streams = [read_stream(body, t, k, verify, cap, cuts) for k in KERNELS
               for cuts in ([], half, list(range(1, len(body), 7)))]
    assert all(s == streams[0] for s in streams), streams
    if files[0][0] == "ok" and files[0][2] is None and streams[0][0] == "ok" and cap > 64:
        assert files[0][1] == streams[0][1]      # a closed file: both read the same records
