"""Decoded values against the reference decoder (spec/reference/kiln_ref.py).

The reference returns plain Python values (see its module doc).  kiln returns
richer ones: numpy arrays for lists of scalars, ``bytes`` for ``list<u8>``,
``kiln.Some`` for a present optional holding ``None``, a ``TensorDirectory``
for ``tensors``.  :func:`kiln_form` maps a kiln value onto one canonical form
using the reference's own parse of the type text (never kiln's type model),
checking on the way the exact Python type and numpy dtype kiln must return;
:func:`ref_form` maps the reference's value onto the same form.  Floats become
their bit patterns (so NaN payloads and -0.0 count), arrays their dtype and
bytes, dict and struct values their items in order.  (An f32 is compared as the
f64 that ``struct.unpack("<f")`` makes of it, which is all the reference holds:
every bit, except that a signalling NaN's quiet bit is set on the way.)

``ref_outcome`` and ``kiln_outcome`` give ``("ok", form)`` or
``("err", code, offset)``, so one ``==`` compares the value or the error with
its offset.
"""

import struct
import sys

import numpy as np

import kiln
from _util import kiln_ref

# element name -> (numpy dtype kiln returns for list<elem>, struct format of one wire element)
POD = {"bool": ("|b1", "<?"), "i8": ("|i1", "<b"), "u8": ("|u1", "<B"),
       "i16": ("=i2", "<h"), "u16": ("=u2", "<H"), "i32": ("=i4", "<i"), "u32": ("=u4", "<I"),
       "i64": ("=i8", "<q"), "u64": ("=u8", "<Q"), "int": ("=i8", "<q"), "uint": ("=u8", "<Q"),
       "f32": ("=f4", "<f"), "f64": ("=f8", "<d")}
INTS = {"i8", "u8", "i16", "u16", "i32", "u32", "i64", "u64", "int", "uint"}

# tensor dtype code -> the numpy dtype Tensor.numpy() returns (docstring of kiln._tensors)
try:
    import ml_dtypes as _ml
except ImportError:  # .numpy() refuses these dtypes, naming ml_dtypes; .bits() gives the bits
    _ml = None
_ML = {4: ("bfloat16", "<u2"), 5: ("float8_e4m3fn", "|u1"), 6: ("float8_e5m2", "|u1"),
       19: ("float8_e8m0fnu", "|u1")}


def _tensor_dtype(code):
    """What ``.numpy()`` returns; without ml_dtypes, for its dtypes, what ``.bits()`` does."""
    if code in _ML:
        name, fallback = _ML[code]
        return np.dtype(getattr(_ml, name)) if _ml is not None else np.dtype(fallback)
    plain = {1: "<f8", 2: "<f4", 3: "<f2", 7: "|b1", 8: "|i1", 9: "|u1", 10: "<i2", 11: "<u2",
             12: "<i4", 13: "<u4", 14: "<i8", 15: "<u8"}
    if code in FOUR_BIT:   # the unpacked values, one per byte (without ml_dtypes: refused)
        return np.dtype(getattr(_ml, FOUR_BIT[code])) if _ml is not None else None
    return np.dtype(plain.get(code, "|u1"))   # opaque: the raw bytes


FOUR_BIT = {16: "int4", 17: "uint4", 18: "float4_e2m1fn"}


def _nibbles(payload, count):
    """The 4-bit elements of a packed payload, low nibble first (by hand)."""
    return [(payload[i // 2] >> (4 * (i & 1))) & 0xF for i in range(count)]


class Mismatch(AssertionError):
    pass


def _need(ok, path, what, value):
    if not ok:
        raise Mismatch("%s: expected %s, kiln gave %r (%s)" % (path or "value", what, value,
                                                              type(value).__name__))


def _fbits(x):
    return ("f64bits", struct.pack("<d", x).hex())


# --- the reference's side --------------------------------------------------------------

def _exact_reader():
    class Exact(kiln_ref._Reader):
        """The reference's reader with one change of representation: a present
        optional is ("some", value), so opt<opt<T>> keeps which flag was 0."""

        def value(self, node):
            if node[0] == "opt":
                return ("some", self.value(node[1])) if self.flag() else None
            return super().value(node)

        def text(self):
            """kiln's trusted decode also skips the UTF-8 check of str values and dict
            keys (docs/security.md), where the reference skips only that of names."""
            if not self.trusted:
                return super().text()
            n = self.count([self.max_bytes], 1)
            raw = self.take(n)
            return raw, raw.decode("utf-8", "surrogateescape")
    return Exact


_Exact = _exact_reader()


def _has_nested_opt(node):
    kind, arg = node
    if kind == "opt":
        return True
    if kind in ("list", "dict"):
        return _has_nested_opt(arg)
    if kind == "struct":
        return any(_has_nested_opt(sub) for _, sub in arg)
    return False


def ref_outcome(buf, text, framed=False, trusted=False, max_count=kiln_ref.CAP,
                max_bytes=kiln_ref.CAP):
    """("ok", form) or ("err", code, offset), as the reference decodes ``buf``."""
    buf = bytes(buf)
    if trusted:
        return _ref_trusted(buf, text, framed, max_count, max_bytes)
    try:
        value = kiln_ref.decode(buf, text, framed, max_count, max_bytes, trusted)
    except kiln_ref.RefError as e:
        return ("err", e.code, e.offset)
    node = kiln_ref.parse_type(text)
    if _has_nested_opt(node):
        # accepted: read the value again keeping every presence flag (all checks ran above)
        r = _Exact(buf, max_count, max_bytes, trusted)
        r.pos = 16 if framed else 0
        value = r.value(node)
    return ("ok", ref_form(node, value))


def _ref_trusted(buf, text, framed, max_count, max_bytes):
    """kiln_ref.decode(..., trusted=True) with kiln's wider trust (see Exact.text)."""
    assert not framed, "a trusted framed decode is not modelled here"
    try:
        node = kiln_ref.parse_type(text)
        r = _Exact(buf, max_count, max_bytes, True)
        value = r.value(node)
        if r.pos != len(buf):
            raise kiln_ref.RefError("TRAILING", r.pos)
    except kiln_ref.RefError as e:
        return ("err", e.code, e.offset)
    return ("ok", ref_form(node, value))


def ref_form(node, v):
    kind, arg = node
    if kind in ("f32", "f64"):
        return _fbits(v)
    if kind in kiln_ref.SCALARS or kind == "str":
        return v
    if kind == "list":
        if arg[0] == "u8":
            return ("bytes", v)
        if arg[0] in POD:
            dt, fmt = POD[arg[0]]
            if arg[0] == "f32":   # compared as the f64 the reference's unpack gives
                return ("array", np.dtype(dt).str, [_fbits(x) for x in v])
            return ("array", np.dtype(dt).str, b"".join(struct.pack(fmt, x) for x in v).hex())
        return [ref_form(arg, x) for x in v]
    if kind == "opt":
        if v is None:
            return None
        if isinstance(v, tuple) and v[:1] == ("some",):
            return ("some", ref_form(arg, v[1]))
        return ("some", ref_form(arg, v))   # (only when no opt is nested)
    if kind == "dict":
        return [(k, ref_form(arg, x)) for k, x in v.items()]
    if kind == "struct":
        return [(name, ref_form(sub, v[name])) for name, sub in arg]
    if kind == "tensors":
        return [_ref_tensor(t) for t in v]
    raise AssertionError(kind)


def _ref_tensor(t):
    none16, none32 = kiln_ref.NO16, kiln_ref.NO32
    return {"code": t["dtype"], "shape": tuple(t["shape"]), "name": t["name"],
            "layout": t["layout"], "block_size": t["block_size"],
            "quant_scheme": t["quant_scheme"],
            "quant_axis": None if t["quant_axis"] == none16 else t["quant_axis"],
            "group_size": t["group_size"],
            "scale_index": None if t["scale_index"] == none32 else t["scale_index"],
            "outer_index": None if t["outer_index"] == none32 else t["outer_index"],
            "payload": t["payload"].hex()}


# --- kiln's side -----------------------------------------------------------------------

def kiln_form(node, v, path="", given=False):
    """kiln's decoded value ``v`` of the reference type node, in canonical form;
    Mismatch when its Python type or dtype is not what kiln must return.

    ``given=True`` maps a value given to the encoder instead (the strategies'
    values): ``Some(x)`` for any ``x``, a list of tensors for ``tensors``."""
    if given:
        return _given_form(node, v, path)
    kind, arg = node
    if kind == "bool":
        _need(type(v) is bool, path, "a bool", v)
        return v
    if kind in INTS:
        _need(type(v) is int, path, "an int", v)
        return v
    if kind in ("f32", "f64"):
        _need(type(v) is float, path, "a float", v)
        return _fbits(v)
    if kind == "str":
        _need(type(v) is str, path, "a str", v)
        return v
    if kind == "list":
        if arg[0] == "u8":
            _need(type(v) is bytes, path, "bytes", v)
            return ("bytes", v)
        if arg[0] in POD:
            return _kiln_array(arg[0], v, path)
        _need(type(v) is list, path, "a list", v)
        return [kiln_form(arg, x, "%s[%d]" % (path, i)) for i, x in enumerate(v)]
    if kind == "opt":
        if v is None:
            return None
        if type(v) is kiln.Some:
            _need(arg[0] == "opt" and (v.value is None or type(v.value) is kiln.Some), path,
                  "Some only around None or Some, under opt<opt<...>>", v)
            return ("some", kiln_form(arg, v.value, path + ".value"))
        return ("some", kiln_form(arg, v, path))
    if kind == "dict":
        _need(type(v) is dict, path, "a dict", v)
        return [(k, kiln_form(arg, x, "%s[%r]" % (path, k))) for k, x in v.items()]
    if kind == "struct":
        _need(type(v) is dict and list(v) == [n for n, _ in arg], path,
              "a dict of the fields in order", v)
        return [(n, kiln_form(sub, v[n], "%s.%s" % (path, n))) for n, sub in arg]
    if kind == "tensors":
        return _kiln_tensors(v, path)
    raise AssertionError(kind)


def _given_form(node, v, path):
    kind, arg = node
    if kind == "opt" and type(v) is kiln.Some:
        return ("some", _given_form(arg, v.value, path + ".value"))
    if kind == "opt" and v is not None:
        return ("some", _given_form(arg, v, path))
    if kind == "list" and type(v) is list:
        return [_given_form(arg, x, "%s[%d]" % (path, i)) for i, x in enumerate(v)]
    if kind == "dict" and type(v) is dict:   # written in the order of the keys' bytes
        return [(k, _given_form(arg, x, "%s[%r]" % (path, k)))
                for k, x in sorted(v.items(), key=lambda kx: kx[0].encode("utf-8"))]
    if kind == "struct":
        return [(n, _given_form(sub, v[n], "%s.%s" % (path, n))) for n, sub in arg]
    if kind == "tensors" and type(v) is list:
        return _kiln_tensors(kiln.TensorDirectory(v), path)
    return kiln_form(node, v, path)


def _kiln_array(elem, v, path):
    dt = np.dtype(POD[elem][0])
    _need(type(v) is np.ndarray, path, "a numpy array", v)
    _need(v.dtype == dt and v.dtype.str == dt.str, path, "dtype %s" % dt.str, v.dtype)
    _need(v.ndim == 1 and v.flags.c_contiguous, path, "a C-contiguous 1-D array", v)
    le = v.astype(dt.newbyteorder("<"))
    if elem == "f32":
        return ("array", dt.str, [_fbits(struct.unpack("<f", le[i:i + 1].tobytes())[0])
                                  for i in range(len(le))])
    return ("array", dt.str, le.tobytes().hex())


def _le_bytes(arr):
    if sys.byteorder == "big" and arr.dtype.itemsize > 1:  # pragma: no cover
        arr = arr.byteswap()
    return arr.tobytes()


def _kiln_tensors(d, path):
    _need(type(d) is kiln.TensorDirectory, path, "a kiln.TensorDirectory", d)
    ts = d.values()
    _need(type(ts) is list and len(ts) == len(d), path, "values() a list of len(d)", ts)
    out = []
    for i, t in enumerate(ts):
        p = "%s[%d]" % (path, i)
        _need(type(t) is kiln.Tensor and d[i] is t, p, "a kiln.Tensor, the same as d[i]", t)
        payload = bytes(t.data)
        if t.code in FOUR_BIT:
            _four_bit(t, payload, p)
            if t.name is not None:
                _need(d[t.name] is t, p, "d[name] is the tensor", t)
            out.append(_tensor_fields(t, payload))
            continue
        packed = t.code >= 4096
        if not packed and _numpy_cannot_shape(t.shape, _tensor_dtype(t.code)):
            # legal on the wire (a zero dimension elsewhere), beyond what numpy can shape
            try:
                t.numpy()
            except ValueError:
                pass
            else:
                raise Mismatch("%s.numpy(): shape %s has no numpy form, yet no ValueError"
                               % (p, t.shape))
            out.append(_tensor_fields(t, payload))
            continue
        if _ml is None and t.code in _ML:
            _need_no_ml(t.numpy, p + ".numpy()")
            arr = t.bits()
        else:
            arr = t.numpy()
        want = _tensor_dtype(t.code)
        _need(type(arr) is np.ndarray and arr.dtype == want, p + ".numpy()", want, arr)
        shape = (len(payload),) if packed else tuple(t.shape)
        _need(arr.shape == shape and (not arr.flags.writeable or not payload), p + ".numpy()",
              "shape %s, read-only (when not empty)" % (shape,), arr)
        _need(_le_bytes(arr) == payload, p + ".numpy()", "the payload bytes", arr)
        if t.name is not None:
            _need(d[t.name] is t, p, "d[name] is the tensor", t)
        out.append(_tensor_fields(t, payload))
    names = [t.name for t in ts]
    _need(d.names == names, path + ".names", names, d.names)
    if names and names[0] is not None and _ml is None and \
            any(t.code in _ML or t.code in FOUR_BIT for t in ts):
        _need_no_ml(d.to_dict, path + ".to_dict()")
    elif names and names[0] is not None and any(
            t.code not in FOUR_BIT and t.code < 4096 and
            _numpy_cannot_shape(t.shape, _tensor_dtype(t.code))
            for t in ts):
        # a tensor with no numpy form: to_dict() refuses as its numpy() does
        try:
            d.to_dict()
        except ValueError:
            pass
        else:
            raise Mismatch("%s.to_dict(): a tensor has no numpy form, yet no ValueError" % path)
    elif names and names[0] is not None:
        got = d.to_dict()
        _need(list(got) == names and all(type(a) is np.ndarray and a.dtype == b.dtype and
                                         _le_bytes(a) == _le_bytes(b)
                                         for a, b in zip(got.values(), (t.numpy() for t in ts))),
              path + ".to_dict()", "the arrays of numpy(), by name in order", got)
    return out


def _need_no_ml(call, path):
    """Without ml_dtypes, ``call()`` refuses with an ImportError that names it."""
    try:
        got = call()
    except ImportError as e:
        _need("ml_dtypes" in str(e) and "bits()" in str(e), path,
              "an ImportError naming ml_dtypes and Tensor.bits()", e)
        return
    raise Mismatch("%s: ml_dtypes is not installed, yet no ImportError (%r)" % (path, got))


def _four_bit(t, payload, p):
    """numpy() of an i4/u4/e2m1 tensor: its elements unpacked into ml_dtypes'
    type (a new array), or ImportError without ml_dtypes; bits() the payload."""
    bits = t.bits()
    _need(bits.dtype == np.uint8 and bits.tobytes() == payload, p + ".bits()",
          "the packed payload bytes", bits)
    want = _tensor_dtype(t.code)
    if want is None:
        try:
            t.numpy()
        except ImportError:
            return
        raise Mismatch("%s.numpy(): a 4-bit tensor without ml_dtypes, yet no ImportError" % p)
    n = _nonzero_product(t.shape) if all(t.shape) else 0
    if n > 1 << 24:
        return   # (legal on the wire; unpacking it here is not the point)
    arr = t.numpy()
    _need(type(arr) is np.ndarray and arr.dtype == want and arr.shape == tuple(t.shape),
          p + ".numpy()", "%s of shape %s" % (want, tuple(t.shape)), arr)
    _need(arr.reshape(-1).view(np.uint8).tolist() == _nibbles(payload, n), p + ".numpy()",
          "the payload's nibbles, low first", arr)


def _numpy_cannot_shape(shape, dt):
    """Has this shape no numpy array? Past numpy's size limit by the product of
    its nonzero dimensions, or, for a shape with a zero (an empty array, so no
    memory is asked for), refused by numpy itself: numpy is the judge of its
    own limit (it also refuses some empty shapes the product rule admits)."""
    if _nonzero_product(shape) * dt.itemsize > sys.maxsize:
        return True
    if 0 in tuple(shape):
        try:
            np.empty(tuple(shape), dt)
        except (ValueError, OverflowError):
            return True
    return False


def _nonzero_product(shape):
    n = 1
    for d in shape:
        n *= d or 1
    return n


def _tensor_fields(t, payload):
    return {"code": t.code, "shape": t.shape, "name": t.name, "layout": t.layout,
            "block_size": t.block_size, "quant_scheme": t.quant_scheme,
            "quant_axis": t.quant_axis, "group_size": t.group_size,
            "scale_index": t.scale_index, "outer_index": t.outer_index,
            "payload": payload.hex()}


def kiln_outcome(decode, buf, text):
    """("ok", form) or ("err", code, offset) of ``decode(buf)`` (a kiln decode of ``text``)."""
    try:
        v = decode(buf)
    except kiln.KilnError as e:
        return ("err", e.code, e.offset)
    return ("ok", kiln_form(kiln_ref.parse_type(text), v))


def check_decode(decode, buf, text, **ref_kw):
    """kiln's outcome of ``decode(buf)`` equals the reference's; returns it."""
    got = kiln_outcome(decode, buf, text)
    want = ref_outcome(buf, text, **ref_kw)
    assert got == want, (bytes(buf).hex(), text)
    return got
