"""The fuzzing oracle, shared by the atheris harnesses and the corpus replay test.

For one input: the compiled and pure kernels give the same value or the same
error code and offset; an accepted input re-encodes to exactly the same bytes;
nothing but KilnError is ever raised; and no decode allocates more than the
amplification bound (:func:`allocation_bound`) allows.
"""

import tracemalloc

import kiln
from kiln import _kernels_py

try:
    from kiln import _kernels_c
except ImportError:  # pragma: no cover - the replay test requires it under CI
    _kernels_c = None

# fixed types for the Frozen harness; the first input byte picks one
FROZEN_TYPES = [
    "struct{id:i64,name:str,score:f64,tags:list<i32>,}",
    "list<struct{a:opt<str>,b:dict<str,list<f32>>,c:bool,}>",
    "struct{id:i64,batch:tensors,text:str,}",
    "list<opt<tensors>>",
    "dict<str,list<u8>>",
    "list<list<i16>>",
    "opt<dict<str,struct{x:u8,y:list<bool>,}>>",
    "struct{}",
]
_PLANS = {}

# --- the amplification bound (issue 11) ------------------------------------
# The peak memory tracemalloc sees during one decode of n input bytes is at most
#
#     (AMPLIFICATION_FACTOR + ZERO_NODE_BYTES * Z) * n      the bytes' objects
#   + ZERO_NODE_BYTES * Z * max_count                       the zero-size budget
#   + ALLOCATION_SLACK                                      one call's fixed cost
#
# where Z is the number of zero-size structs written in the type (struct{} and
# structs made only of such fields), and the budget term applies only to a
# type with a list of zero-size elements.
#
# - A type without zero-size structs builds at most AMPLIFICATION_FACTOR bytes
#   per input byte: the worst measured is list<struct{a:bool,}> decoded to
#   dicts, a 1-key dict and its list slot per byte, 193x on CPython 3.11-3.13
#   and 241x on 3.10 (python -m benchmarks.amplification).
# - A zero-size struct takes no byte, so one byte of a non-zero-size parent (a
#   struct field, an opt payload) can build one object per zero-size struct
#   in the type, each at most ZERO_NODE_BYTES (the worst is a 1-key dict whose
#   field is another zero-size struct: 240 bytes with its slot on 3.10, 192
#   on 3.11-3.13); list<struct{a:bool,b..i:struct{},}> measures 792x (880x on
#   3.10) against a bound of 2304x.
# - The elements of lists of zero-size elements draw on one max_count budget
#   per decode; each is at most Z such objects.
# - ALLOCATION_SLACK: first-use caches and an error's traceback (a fault 64
#   containers deep costs up to 47 KB in the compiled kernel).
#
# tests/test_amplification.py checks this bound is never tighter than its own
# per-shape bounds.  tracemalloc sees Python objects and numpy buffers, not a
# C extension's plain malloc.  Tracing only around the decode costs about
# 3.5 microseconds per call, so every input is checked.
AMPLIFICATION_FACTOR = 256
ZERO_NODE_BYTES = 256
ALLOCATION_SLACK = 128 * 1024


def zero_size_shape(t):
    """``(Z, charged)`` of a Type: its number of zero-size structs, and whether
    it has a list of zero-size elements (whose counts draw on the budget)."""
    z = 0
    charged = False
    stack = [t]
    while stack:
        x = stack.pop()
        fields = getattr(x, "fields", None)
        if fields is not None:            # a struct
            z += x.min_size == 0
            stack.extend(ft for _, ft in fields)
            continue
        inner = getattr(x, "elem", None) or getattr(x, "value", None)
        if inner is not None:             # list, opt, dict
            if x.text.startswith("list<") and inner.min_size == 0:
                charged = True
            stack.append(inner)
    return z, charged


def allocation_bound(t, n, max_count=kiln.DEFAULT_MAX_COUNT, shape=None):
    """The most tracemalloc may see allocated while one ``n``-byte input of ``t`` decodes
    (``shape``: ``zero_size_shape(t)`` if already known)."""
    z, charged = shape or zero_size_shape(kiln.as_type(t))
    budget = ZERO_NODE_BYTES * z * max_count if charged else 0
    return (AMPLIFICATION_FACTOR + ZERO_NODE_BYTES * z) * n + budget + ALLOCATION_SLACK


def traced_call(fn, *args):
    """``(value, error, peak)``: ``fn(*args)`` with tracemalloc on around the
    call only (a few microseconds per call); ``peak`` is the traced bytes above
    what was live when the call started.  A KilnError is returned, not raised.
    If tracemalloc is already tracing, it is left on."""
    fresh = not tracemalloc.is_tracing()
    if fresh:
        tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        v = err = None
        try:
            v = fn(*args)
        except kiln.KilnError as e:
            err = e
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        if fresh:
            tracemalloc.stop()
    return v, err, peak


def traced_decode(decode, buf):
    """:func:`traced_call` of one decode."""
    return traced_call(decode, buf)


def _progs(kernels, text, **kw):
    key = (kernels.__name__, text, tuple(sorted(kw.items())))
    p = _PLANS.get(key)
    if p is None:
        t = kiln.parse_type(text)
        p = _PLANS[key] = (kiln.Decoder(t, kernels=kernels, **kw),
                           kiln.Encoder(t, kernels=kernels), t, zero_size_shape(t))
    return p


def outcome(kernels, text, buf, **kw):
    dec, enc, t, shape = _progs(kernels, text, **kw)
    v, err, peak = traced_decode(dec.decode, buf)
    bound = allocation_bound(t, len(buf), kw.get("max_count", kiln.DEFAULT_MAX_COUNT), shape)
    if peak > bound:
        raise AssertionError("decoding %d bytes of %s under %s allocated %d bytes, above the "
                             "bound %d (%s)" % (len(buf), text, kernels.__name__, peak, bound,
                                                "error %s" % err if err else "accepted"))
    if err is not None:
        return ("err", err.code, err.offset)
    try:
        again = enc.encode(v)
    except kiln.EncodeError as e:
        # a trusted decode skips the UTF-8 and quantization-shape checks; the
        # encoder runs every check, so such a value cannot be written back
        if kw.get("trusted") and e.code in ("UTF8", "TYPE"):
            return ("ok-unencodable", e.code)
        raise
    if again != buf:
        raise AssertionError("accepted input re-encodes differently under %s: %s"
                             % (kernels.__name__, text))
    return ("ok", again)


def check(text, buf, **kw):
    """Run the oracle on one input; raises AssertionError on a disagreement."""
    a = outcome(_kernels_py, text, buf, **kw)
    if _kernels_c is None:
        return a
    b = outcome(_kernels_c, text, buf, **kw)
    if a != b:
        raise AssertionError("implementations disagree on %s %s: python %r, cython %r"
                             % (text, buf.hex(), a[:3], b[:3]))
    return a


def check_frozen_input(data):
    """Harness entry for raw fuzz bytes: byte 0 picks the type and options."""
    if not data:
        return
    sel = data[0]
    text = FROZEN_TYPES[sel % len(FROZEN_TYPES)]
    kw = {}
    if sel & 0x80:
        kw = dict(trusted=True, max_count=7, max_bytes=9)
    check(text, bytes(data[1:]), **kw)


def check_directory_input(data):
    """Byte 0: bit 0 ``copy``, bit 1 ``trusted``, bit 2 small caps; bit 3 reads
    the rest as a tensor file (:func:`check_tensor_file`: the wide name fields
    of spec 12.3 allowed), else as a ``tensors`` value (where they are not)."""
    if not data:
        return
    sel = data[0]
    kw = {}
    if sel & 1:
        kw["copy"] = True
    if sel & 2:
        kw["trusted"] = True
    if sel & 4:
        kw.update(max_count=3, max_bytes=40)
    if sel & 8:
        kw.pop("copy", None)
        return check_tensor_file(bytes(data[1:]), **kw)
    return check("tensors", bytes(data[1:]), **kw)


# --- tensor files (spec section 12, the wide name fields of 12.3) -------------
# A tensor file is checked by both kernels' validate_directory and
# validate_directory_copy with wide=True and by the reference decoder's
# read_tensor_file: all four give the same error code and offset, or the same
# tensors; an accepted file is rebuilt byte for byte from its rows by the
# writers' block_head (so a wide file is canonical: wide only when needed).

def _ref():
    import os
    import sys
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "spec", "reference")
    if here not in sys.path:
        sys.path.insert(0, here)
    import kiln_ref
    return kiln_ref


def _file_outcome(kernels, buf, trusted, max_count, max_bytes):
    try:
        end, base, table = kernels.validate_directory(buf, 0, True, trusted, max_count,
                                                      max_bytes, None, True)
    except kiln.KilnError as e:
        err = ("err", e.code, e.offset)
        try:
            kernels.validate_directory_copy(buf, 0, True, trusted, max_count, max_bytes,
                                            None, True)
        except kiln.KilnError as e2:
            if ("err", e2.code, e2.offset) != err and not (e.code == "TYPE" and e2.code == "TYPE"):
                # (the copy leaves payload contents to check_payload: it may pass a
                # bool or gap fault, never report another)
                raise AssertionError("%s: validate_directory %r, the copy %r"
                                     % (kernels.__name__, err, (e2.code, e2.offset)))
        return err
    end2, base2, count, named, blob, names = kernels.validate_directory_copy(
        buf, 0, True, trusted, max_count, max_bytes, None, True)
    if (end2, base2, count) != (end, base, len(table)) or \
            names != [r[2] for r in table]:
        raise AssertionError("%s: the copy's table differs" % kernels.__name__)
    return ("ok", base, [tuple(r) for r in table])


def check_tensor_file(buf, trusted=False, max_count=kiln.DEFAULT_MAX_COUNT,
                      max_bytes=kiln.DEFAULT_MAX_BYTES):
    """One tensor file through both kernels and the reference; see above."""
    from kiln._dirhead import block_head
    a = _file_outcome(_kernels_py, buf, trusted, max_count, max_bytes)
    if _kernels_c is not None:
        b = _file_outcome(_kernels_c, buf, trusted, max_count, max_bytes)
        if a != b:
            raise AssertionError("kernels disagree on a tensor file: python %r, cython %r"
                                 % (a[:3], b[:3]))
    ref = _ref()
    try:
        want = ref.read_tensor_file(buf, max_count, max_bytes, trusted)
    except ref.RefError as e:
        if a[0] != "err" or (a[1], a[2]) != (e.code, e.offset):
            raise AssertionError("the reference refuses a tensor file with %s at %d, kiln "
                                 "gives %r" % (e.code, e.offset, a[:3]))
        return a
    if a[0] != "ok":
        raise AssertionError("the reference reads a tensor file kiln refuses: %r" % (a,))
    base, rows = a[1], a[2]
    for r, t in zip(rows, want):
        nm = None if t["name"] is None else t["name"].encode("utf-8", "surrogateescape")
        lay = None if t["layout"] is None else t["layout"].encode("utf-8", "surrogateescape")
        got = (r[0], list(r[1]), r[2], r[3], r[4], r[5], r[7], r[10], r[11],
               bytes(buf[base + r[10]:base + r[10] + r[11]]))
        exp = (t["dtype"], t["shape"], nm, lay, t["block_size"], t["quant_scheme"],
               t["group_size"], t["byte_offset"], len(t["payload"]), t["payload"])
        if got != exp:
            raise AssertionError("a tensor file's tensor differs from the reference's: "
                                 "%r, %r" % (got[:8], exp[:8]))
    if len(rows) != len(want):
        raise AssertionError("kiln reads %d tensors, the reference %d" % (len(rows), len(want)))
    # canonical: the writers' head for these rows is the file's head
    d = _kernels_py.validate_directory(buf, 0, True, trusted, max_count, max_bytes, None, True)[2]
    metas = [r[:10] + (r[11],) for r in d]
    head, places, total = block_head(metas, 0, True)
    if bytes(buf[:len(head)]) != bytes(head) or base != len(head):
        raise AssertionError("an accepted tensor file is not what the writer makes of its rows")
    return a


# --- converters (issue 26 point 3) ---------------------------------------------
# One source file per input, converted to a Kiln file.  The converter may only
# raise KilnError (its ConvertError); when it succeeds the output must pass
# every check of kiln.load_tensors with the tensor count it returned; and what
# tracemalloc sees allocated stays under CONVERT_SLACK + CONVERT_FACTOR bytes
# per input byte (docs/security.md, "Converters": the JSON header's parse and
# GGUF metadata are the proportional parts; payloads stream a chunk at a time).
# With the safetensors package installed, a safetensors file kiln accepts must
# be one the package accepts too, holding the same tensors.
CONVERT_KINDS = ("safetensors", "gguf", "npz")
CONVERT_FACTOR = 512
CONVERT_SLACK = 48 << 20
def check_convert_input(kind, data):
    """One conversion of ``data`` in a folder of its own, removed after it."""
    import shutil
    import tempfile
    folder = tempfile.mkdtemp(prefix="kiln-fuzz-convert-")
    try:
        return _check_convert_in(folder, kind, data)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _check_convert_in(folder, kind, data):
    import os
    from kiln.convert import convert
    src = os.path.join(folder, "in." + kind)
    dst = os.path.join(folder, "out.kiln")
    with open(src, "wb") as f:
        f.write(data)
    n, _, peak = traced_call(convert, src, dst)   # n is None when it was refused
    bound = CONVERT_SLACK + CONVERT_FACTOR * len(data)
    if peak > bound:
        raise AssertionError("converting %d bytes of %s allocated %d bytes, above %d"
                             % (len(data), kind, peak, bound))
    if n is None:
        if os.path.exists(dst):
            raise AssertionError("a refused %s conversion left its output" % kind)
        return ("err",)
    got = kiln.load_tensors(dst)   # every check; a KilnError here is a finding
    if len(got) != n:
        raise AssertionError("%s: convert said %d tensors, the file holds %d" % (kind, n, len(got)))
    if kind == "safetensors":
        _same_as_safetensors(src, got)
    os.unlink(dst)
    return ("ok", n)


def _same_as_safetensors(src, got):
    try:
        from safetensors import safe_open
    except ImportError:  # pragma: no cover - the fuzzing venv has no safetensors
        return
    try:
        with safe_open(src, framework="np") as f:
            names = sorted(f.keys())
            raws = {k: f.get_slice(k) for k in names}
            shapes = {k: tuple(raws[k].get_shape()) for k in names}
    except Exception as e:
        raise AssertionError("kiln converted a safetensors file the library refuses: %s" % e)
    if names != sorted(got.keys()):
        raise AssertionError("tensor names differ from the safetensors library's")
    for k in names:
        if got[k].shape != shapes[k]:
            raise AssertionError("tensor %r: shape %s, the library says %s"
                                 % (k, got[k].shape, shapes[k]))

