"""Pure-Python kernels.

The kernel interface
--------------------
A kernel module (this one, or the compiled ``kiln._kernels_c``) provides
exactly these names, with the same signatures, results, error codes and
offsets:

``compile_decoder(plan, frame_hash, trusted, max_count, max_bytes, copy)``
    Compile a :class:`kiln._plan.Plan` into a decode program.  ``frame_hash``
    is the schema hash a frame must carry, or ``None`` for a bare value.  The
    program's ``decode(buf)`` takes any contiguous buffer and returns the
    Python value, or raises :class:`kiln.KilnError`.

``compile_encoder(plan, frame_hash)``
    Compile a plan into an encode program with ``encode(value) -> bytes`` and
    ``encode_into(value, buffer, offset) -> end`` (``buffer`` is a bytearray,
    resized so that it ends at ``end``).

``validate_directory(buf, start, standalone, trusted, max_count, max_bytes, copy)``
    Check one tensor directory block starting at ``start`` of the byte
    buffer ``buf`` (a memoryview of format ``B``) in the spec's check order.
    Returns ``(end, payload_base, table)`` where ``table`` is a list of
    descriptor tuples ``(code, shape, name, layout, block_size, quant_scheme,
    quant_axis, group_size, scale_index, outer_index, byte_offset,
    byte_length)``; ``name``/``layout`` are raw bytes or None.  Nothing is
    built per descriptor before the directory is known to fit.

``write_directory(records, out)``
    Append the canonical block for normalized tensor records to the bytearray
    ``out``.  A record is ``(code, shape, name, layout, block_size,
    quant_scheme, quant_axis, group_size, scale_index, outer_index, payload)``
    where ``payload`` is a contiguous byte buffer of little-endian bits.

``check_count(buf, pos, cap, min_size, capname="max_count")``
    The allocation rule for one u32 count word at ``pos``; returns the count.
    A LIMIT message names ``capname``, the parameter that raises the cap.

``BIG_ENDIAN_TEST_HOOK``: None here (the compiled module lets tests force its
byte-swapping path).

The Python layer (``kiln._types``, ``kiln._api``, ``kiln._tensor``) builds
plans and objects; loops over elements, fields and descriptors live here.
"""

import operator
import struct as _struct
import sys
import threading

import numpy as np

from ._errors import KilnError, EncodeError
from . import _plan as P

_U8 = _struct.Struct("<B")
_U16 = _struct.Struct("<H")
_U32 = _struct.Struct("<I")
_U64 = _struct.Struct("<Q")
_HEADER = _struct.Struct("<4sBBHIIQQ32s")
_DESC = _struct.Struct("<HBBHHHHIHHIIIQQ8Q16s")
_FRAME = _struct.Struct("<4sBBHQ")

U32_MAX = 0xFFFFFFFF
U64_MAX = 0xFFFFFFFFFFFFFFFF
LITTLE = sys.byteorder == "little"
BIG_ENDIAN_TEST_HOOK = None

# dtype code -> (name, width in bytes; 0 for packed nibbles)
DTYPES = {
    1: ("f64", 8), 2: ("f32", 4), 3: ("f16", 2), 4: ("bf16", 2),
    5: ("f8e4m3", 1), 6: ("f8e5m2", 1), 7: ("bool", 1), 8: ("i8", 1),
    9: ("u8", 1), 10: ("i16", 2), 11: ("u16", 2), 12: ("i32", 4),
    13: ("u32", 4), 14: ("i64", 8), 15: ("u64", 8), 16: ("i4", 0),
    17: ("u4", 0), 18: ("e2m1", 0), 19: ("e8m0", 1),
}
PACKED = (16, 17, 18)
OPAQUE_MIN = 4096
OPAQUE_MAX = 32767


def _err(code, offset, reason):
    return KilnError(code, offset, reason)


# --- the allocation rule --------------------------------------------------

def check_count(buf, pos, cap, min_size, capname="max_count"):
    """Read the u32 count at ``pos`` and apply the five-step allocation rule."""
    n = len(buf)
    if pos + 4 > n:
        raise _err("EOF", pos, "count word needs 4 bytes, %d remain" % max(n - pos, 0))
    c = _U32.unpack_from(buf, pos)[0]
    if c > cap:
        raise _err("LIMIT", pos, "count %d is above the cap %s=%d" % (c, capname, cap))
    need = c * min_size
    if need > U64_MAX:
        raise _err("LIMIT", pos, "count %d times %d bytes overflows u64" % (c, min_size))
    if need > n - pos - 4:
        raise _err("EOF", pos, "count %d needs at least %d bytes, %d remain"
                   % (c, need, n - pos - 4))
    return c


def _zero_budget_error(pos, c, left, cap):
    return _err("LIMIT", pos, "count %d of zero-size elements is above what is left (%d) of "
                "the max_count budget %d that all such elements of one value share"
                % (c, left, cap))


# what is left of the zero-size element budget of the decode running in this thread
_budget = threading.local()


def _has_zero_lists(plan, seen=None):
    """Does the plan hold a list whose elements have minimum size 0?"""
    if plan.op == P.OP_LIST and plan.elem.min_size == 0:
        return True
    if plan.elem is not None and _has_zero_lists(plan.elem):
        return True
    return any(_has_zero_lists(f) for f in plan.fields)


def _eof(pos, size, n):
    return _err("EOF", pos, "%d-byte value needs more bytes, %d remain" % (size, max(n - pos, 0)))


def _as_bytes_view(buf):
    """A flat read-only-agnostic memoryview of format 'B' over ``buf``."""
    mv = buf if type(buf) is memoryview else memoryview(buf)
    if mv.nbytes == 0:
        # an empty buffer is contiguous whatever its shape and strides say
        return memoryview(b"")
    if mv.format != "B" or mv.ndim != 1 or mv.itemsize != 1:
        if not mv.c_contiguous:
            raise TypeError("kiln needs a contiguous buffer")
        mv = mv.cast("B")
    elif not mv.c_contiguous:
        raise TypeError("kiln needs a contiguous buffer")
    return mv


# --- decoding ---------------------------------------------------------------

def _native(le):
    return np.dtype(le).newbyteorder("=")


def _build_decoder(plan, opts):
    trusted, max_count, max_bytes, copy = opts
    op = plan.op
    if op in P.SCALAR_FORMAT:
        fmt, w = P.SCALAR_FORMAT[op]
        if op == P.OP_BOOL:
            def dec_bool(d, p):
                if p >= len(d):
                    raise _eof(p, 1, len(d))
                b = d[p]
                if b > 1:
                    raise _err("TYPE", p, "bool byte is %d, not 0 or 1" % b)
                return b == 1, p + 1
            return dec_bool
        unpack = _struct.Struct("<" + fmt).unpack_from

        def dec_scalar(d, p):
            if p + w > len(d):
                raise _eof(p, w, len(d))
            return unpack(d, p)[0], p + w
        return dec_scalar

    if op == P.OP_STR:
        errors = "surrogateescape" if trusted else "strict"

        def dec_str(d, p):
            n = len(d)
            if p + 4 > n:
                raise _err("EOF", p, "string length needs 4 bytes, %d remain" % max(n - p, 0))
            ln = _U32.unpack_from(d, p)[0]
            if ln > max_bytes:
                raise _err("LIMIT", p, "string length %d is above the cap max_bytes=%d"
                           % (ln, max_bytes))
            q = p + 4
            if ln > n - q:
                raise _err("EOF", p, "string length %d, %d bytes remain" % (ln, n - q))
            e = q + ln
            try:
                return str(d[q:e], "utf-8", errors), e
            except UnicodeDecodeError as ex:
                raise _err("UTF8", q + ex.start, "invalid UTF-8 (%s)" % ex.reason) from None
        return dec_str

    if op == P.OP_BYTES:
        cap = min(max_count, max_bytes)
        capname = "max_bytes" if max_bytes < max_count else "max_count"

        def dec_bytes(d, p):
            c = check_count(d, p, cap, 1, capname)
            q = p + 4
            return bytes(d[q:q + c]), q + c
        return dec_bytes

    if op == P.OP_PODLIST:
        eop = plan.elem.op
        le = np.dtype(P.NUMPY_LE[eop])
        nat = _native(le)
        w = le.itemsize
        is_bool = eop == P.OP_BOOL

        def dec_pod(d, p):
            c = check_count(d, p, max_count, w)
            q = p + 4
            if c == 0:
                return np.empty(0, nat), q
            arr = np.frombuffer(d, dtype=le, count=c, offset=q).astype(nat)
            if is_bool:
                # checked in the copy, so the bytes checked are the bytes returned
                u = arr.view(np.uint8)
                bad = u > 1
                if bad.any():
                    i = int(np.argmax(bad))
                    raise _err("TYPE", q + i, "bool byte is %d, not 0 or 1" % u[i])
            return arr, q + c * w
        return dec_pod

    if op == P.OP_OPT:
        inner = _build_decoder(plan.elem, opts)
        nested = plan.elem.op == P.OP_OPT
        Some = P.Some

        def dec_opt(d, p):
            if p >= len(d):
                raise _eof(p, 1, len(d))
            b = d[p]
            if b == 0:
                return None, p + 1
            if b != 1:
                raise _err("TYPE", p, "optional presence byte is %d, not 0 or 1" % b)
            v, p = inner(d, p + 1)
            if nested and (v is None or type(v) is Some):
                v = Some(v)  # present, and the inner optional is empty: keep the level
            return v, p
        return dec_opt

    if op == P.OP_LIST:
        elem = plan.elem
        m = elem.min_size
        if elem.op == P.OP_STRUCT and m > 0 and all(
                f.op in P.SCALAR_FORMAT and f.op != P.OP_BOOL for f in elem.fields):
            # every element is one fixed record: unpack them in bulk
            rec = _struct.Struct("<" + "".join(P.SCALAR_FORMAT[f.op][0] for f in elem.fields))
            names = elem.names
            make = elem.make

            def dec_fixed_list(d, p):
                c = check_count(d, p, max_count, m)
                q = p + 4
                e = q + c * m
                it = rec.iter_unpack(d[q:e])
                if make is None:
                    out = [dict(zip(names, t)) for t in it]
                else:
                    out = [make(*t) for t in it]
                return out, e
            return dec_fixed_list
        inner = _build_decoder(elem, opts)
        if m == 0:
            def dec_zero_list(d, p):
                # the input's bytes do not bound these elements: one budget for the value
                c = check_count(d, p, max_count, 0)
                left = _budget.left
                if c > left:
                    raise _zero_budget_error(p, c, left, max_count)
                _budget.left = left - c
                p += 4
                out = []
                app = out.append
                for _ in range(c):
                    v, p = inner(d, p)
                    app(v)
                return out, p
            return dec_zero_list

        def dec_list(d, p):
            c = check_count(d, p, max_count, m)
            p += 4
            out = []
            app = out.append
            for _ in range(c):
                v, p = inner(d, p)
                app(v)
            return out, p
        return dec_list

    if op == P.OP_DICT:
        inner = _build_decoder(plan.elem, opts)
        m = 4 + plan.elem.min_size
        errors = "surrogateescape" if trusted else "strict"

        def dec_dict(d, p):
            c = check_count(d, p, max_count, m)
            p += 4
            n = len(d)
            out = {}
            prev = None
            for _ in range(c):
                if p + 4 > n:
                    raise _err("EOF", p, "key length needs 4 bytes, %d remain" % max(n - p, 0))
                ln = _U32.unpack_from(d, p)[0]
                if ln > max_bytes:
                    raise _err("LIMIT", p, "key length %d is above the cap max_bytes=%d"
                           % (ln, max_bytes))
                q = p + 4
                if ln > n - q:
                    raise _err("EOF", p, "key length %d, %d bytes remain" % (ln, n - q))
                e = q + ln
                raw = bytes(d[q:e])
                try:
                    key = str(raw, "utf-8", errors)
                except UnicodeDecodeError as ex:
                    raise _err("UTF8", q + ex.start, "invalid UTF-8 in key (%s)" % ex.reason) from None
                if prev is not None and raw <= prev:
                    raise _err("TYPE", p, "dict key %r is not after the previous key" % key)
                prev = raw
                out[key], p = inner(d, e)
            return out, p
        return dec_dict

    if op == P.OP_STRUCT:
        return _build_struct_decoder(plan, opts)

    if op == P.OP_TENSORS:
        hooks = plan.tensors

        def dec_tensors(d, p):
            mv = d if type(d) is memoryview else memoryview(d)
            end, base, table = validate_directory(mv, p, False, trusted, max_count,
                                                  max_bytes, copy)
            return hooks.build(mv, p, base, table, copy, trusted), end
        return dec_tensors

    raise AssertionError("unknown op %r" % op)  # pragma: no cover


def _build_struct_decoder(plan, opts):
    """Generate one straight-line function for the struct: consecutive non-bool
    fixed scalars are read by one struct.Struct, other fields call their decoder."""
    ns = {"run_eof": _run_eof, "make": plan.make}
    lines = ["def dec_struct(d, p):", "    n = len(d)"]
    k = 0
    run = []

    def flush():
        if not run:
            return
        j = len(ns)
        fmt = "<" + "".join(P.SCALAR_FORMAT[f.op][0] for _, f in run)
        st = _struct.Struct(fmt)
        ns["s%d" % j] = st.unpack_from
        ns["z%d" % j] = tuple(P.SCALAR_FORMAT[f.op][1] for _, f in run)
        targets = ", ".join("v%d" % i for i, _ in run)
        lines.append("    if p + %d > n: raise run_eof(p, z%d, n)" % (st.size, j))
        if len(run) == 1:
            lines.append("    %s = s%d(d, p)[0]" % (targets, j))
        else:
            lines.append("    %s = s%d(d, p)" % (targets, j))
        lines.append("    p += %d" % st.size)
        del run[:]

    for i, f in enumerate(plan.fields):
        if f.op in P.SCALAR_FORMAT and f.op != P.OP_BOOL:
            run.append((i, f))
            continue
        flush()
        ns["f%d" % i] = _build_decoder(f, opts)
        lines.append("    v%d, p = f%d(d, p)" % (i, i))
        k += 1
    flush()
    vals = ", ".join("v%d" % i for i in range(len(plan.fields)))
    if plan.make is None:
        body = ", ".join("%r: v%d" % (nm, i) for i, nm in enumerate(plan.names))
        lines.append("    return {%s}, p" % body)
    else:
        lines.append("    return make(%s), p" % vals)
    exec(compile("\n".join(lines), "<kiln struct %s>" % plan.text[:60], "exec"), ns)
    return ns["dec_struct"]


def _run_eof(p, sizes, n):
    for size in sizes:
        if p + size > n:
            return _eof(p, size, n)
        p += size
    return _eof(p, 0, n)  # pragma: no cover


class DecodeProgram:
    """A plan compiled for decoding with fixed options."""

    __slots__ = ("plan", "frame_hash", "trusted", "max_count", "max_bytes", "copy", "_dec",
                 "_top_tensors", "_zero")

    def __init__(self, plan, frame_hash, trusted, max_count, max_bytes, copy):
        self.plan = plan
        self.frame_hash = frame_hash
        self.trusted = bool(trusted)
        self.max_count = int(max_count)
        self.max_bytes = int(max_bytes)
        self.copy = bool(copy)
        self._top_tensors = plan.op == P.OP_TENSORS
        self._dec = _build_decoder(plan, (self.trusted, self.max_count, self.max_bytes,
                                          self.copy))
        self._zero = _has_zero_lists(plan)

    def decode(self, buf):
        mv = _as_bytes_view(buf)
        d = buf if type(buf) is bytes else mv
        n = len(mv)
        p = 0
        if self.frame_hash is not None:
            p = check_frame(mv, self.frame_hash)
        if self._top_tensors:
            end, base, table = validate_directory(mv, p, True, self.trusted, self.max_count,
                                                  self.max_bytes, self.copy)
            return self.plan.tensors.build(mv, p, base, table, self.copy, self.trusted)
        if self._zero:
            v, p = self._dec_budgeted(d, p)
        else:
            v, p = self._dec(d, p)
        if p != n:
            raise _err("TRAILING", p, "%d bytes follow the value" % (n - p))
        return v

    def _dec_budgeted(self, d, p):
        saved = getattr(_budget, "left", None)  # a decode run from inside a decode
        _budget.left = self.max_count
        try:
            return self._dec(d, p)
        finally:
            _budget.left = saved


def check_frame(mv, expected_hash):
    n = len(mv)
    if n < 4:
        raise _err("EOF", 0, "a frame needs 16 bytes, the buffer has %d" % n)
    if bytes(mv[0:4]) != b"KLN0":
        raise _err("FRAME", 0, "frame magic is %r, not b'KLN0'" % bytes(mv[0:4]))
    if n < 16:
        raise _err("EOF", 0, "a frame needs 16 bytes, the buffer has %d" % n)
    if mv[4] != 0:
        raise _err("FRAME", 4, "frame profile is %d, not 0 (Frozen)" % mv[4])
    if mv[5] != 0:
        raise _err("FRAME", 5, "frame flags are %d, not 0" % mv[5])
    for i in (6, 7):
        if mv[i] != 0:
            raise _err("FRAME", i, "reserved frame byte is %d, not 0" % mv[i])
    h = _U64.unpack_from(mv, 8)[0]
    if h != expected_hash:
        raise _err("SCHEMA", 8, "frame schema hash %#018x does not match the type's %#018x"
                   % (h, expected_hash))
    return 16


def compile_decoder(plan, frame_hash, trusted, max_count, max_bytes, copy):
    return DecodeProgram(plan, frame_hash, trusted, max_count, max_bytes, copy)


# --- encoding ---------------------------------------------------------------

def _type_name(v):
    return type(v).__name__


def _build_encoder(plan):
    op = plan.op
    text = plan.text
    if op == P.OP_BOOL:
        np_bool = np.bool_

        def enc_bool(v, out):
            if v is True:
                out.append(1)
            elif v is False:
                out.append(0)
            elif type(v) is np_bool:
                out.append(1 if v else 0)
            else:
                raise EncodeError("TYPE", len(out), "expected bool, got %s" % _type_name(v))
        return enc_bool
    if op in P.SCALAR_FORMAT:
        fmt, w = P.SCALAR_FORMAT[op]
        pack = _struct.Struct("<" + fmt).pack

        def enc_scalar(v, out):
            try:
                out += pack(v)
            except (_struct.error, TypeError, OverflowError, ValueError):
                raise _scalar_error(v, op, text, len(out)) from None
        return enc_scalar
    if op == P.OP_STR:
        def enc_str(v, out):
            if type(v) is not str:
                if not isinstance(v, str):
                    raise EncodeError("TYPE", len(out), "expected str, got %s" % _type_name(v))
            try:
                b = v.encode("utf-8")
            except UnicodeEncodeError as ex:
                raise EncodeError("UTF8", len(out), "string has no UTF-8 form (%s)"
                                  % ex.reason) from None
            if len(b) > U32_MAX:
                raise EncodeError("LIMIT", len(out), "string of %d bytes exceeds u32" % len(b))
            out += _U32.pack(len(b))
            out += b
        return enc_str
    if op == P.OP_BYTES:
        def enc_bytes(v, out):
            b = _as_byte_run(v, len(out))
            if len(b) > U32_MAX:
                raise EncodeError("LIMIT", len(out), "byte run of %d exceeds u32" % len(b))
            out += _U32.pack(len(b))
            out += b
        return enc_bytes
    if op == P.OP_PODLIST:
        eop = plan.elem.op
        fmt = P.SCALAR_FORMAT[eop][0]
        packers = {}
        small = eop != P.OP_BOOL

        def enc_pod(v, out):
            if small and type(v) is list and len(v) <= 64:
                # short Python lists: struct packs them faster than numpy converts them;
                # struct's checks (integers only, ranges, f32 overflow) match as_pod_array's
                n = len(v)
                pk = packers.get(n)
                if pk is None:
                    pk = packers[n] = _struct.Struct("<I%d%s" % (n, fmt)).pack
                try:
                    out += pk(n, *v)
                    return
                except (_struct.error, TypeError, OverflowError, ValueError):
                    pass  # as_pod_array below says what is wrong
            arr = as_pod_array(v, eop, len(out))
            c = arr.shape[0]
            if c > U32_MAX:
                raise EncodeError("LIMIT", len(out), "list of %d exceeds u32" % c)
            out += _U32.pack(c)
            out += memoryview(arr).cast("B")
        return enc_pod
    if op == P.OP_OPT:
        inner = _build_encoder(plan.elem)

        Some = P.Some

        def enc_opt(v, out):
            if v is None:
                out.append(0)
            else:
                out.append(1)
                inner(v.value if type(v) is Some else v, out)
        return enc_opt
    if op == P.OP_LIST:
        inner = _build_encoder(plan.elem)

        def enc_list(v, out):
            if isinstance(v, (str, bytes, bytearray, dict)) or not hasattr(v, "__len__"):
                raise EncodeError("TYPE", len(out), "expected a sequence for %s, got %s"
                                  % (text, _type_name(v)))
            c = len(v)
            if c > U32_MAX:
                raise EncodeError("LIMIT", len(out), "list of %d exceeds u32" % c)
            out += _U32.pack(c)
            done = 0
            try:
                for x in v:
                    if done == c:
                        raise _count_lied(len(out), c, "more")
                    inner(x, out)
                    done += 1
            except EncodeError as e:
                if done < c:
                    e.add_path("[%d]" % done)
                raise
            if done != c:
                raise _count_lied(len(out), c, done)
        return enc_list
    if op == P.OP_DICT:
        inner = _build_encoder(plan.elem)

        def enc_dict(v, out):
            items = getattr(v, "items", None)
            if items is None:
                raise EncodeError("TYPE", len(out), "expected a mapping for %s, got %s"
                                  % (text, _type_name(v)))
            pairs = []
            # a dict is copied in one step (under its lock on free-threaded
            # builds), so another thread changing it cannot break the loop
            for k, x in (dict.copy(v).items() if type(v) is dict else items()):
                if type(k) is not str and not isinstance(k, str):
                    raise EncodeError("TYPE", len(out), "dict key %r is not a str" % (k,))
                try:
                    kb = k.encode("utf-8")
                except UnicodeEncodeError as ex:
                    raise EncodeError("UTF8", len(out), "key has no UTF-8 form (%s)"
                                      % ex.reason) from None
                pairs.append((kb, k, x))
            pairs.sort(key=_first)
            if len(pairs) > U32_MAX:
                raise EncodeError("LIMIT", len(out), "dict of %d exceeds u32" % len(pairs))
            out += _U32.pack(len(pairs))
            prev = None
            for kb, k, x in pairs:
                if kb == prev:
                    raise EncodeError("TYPE", len(out), "the mapping gave the key %r twice" % k)
                prev = kb
                out += _U32.pack(len(kb))
                out += kb
                try:
                    inner(x, out)
                except EncodeError as e:
                    e.add_path("[%r]" % k)
                    raise
        return enc_dict
    if op == P.OP_STRUCT:
        return _build_struct_encoder(plan)
    if op == P.OP_TENSORS:
        hooks = plan.tensors

        def enc_tensors(v, out):
            start = len(out)
            try:
                records = hooks.normalize(v)
            except EncodeError as e:
                e.offset = start
                raise
            write_directory(records, out)
            check_written_directory(out, start)
        return enc_tensors
    raise AssertionError("unknown op %r" % op)  # pragma: no cover


def check_written_directory(out, start):
    """Validate a block the encoder just wrote, so encode never emits bytes decode rejects."""
    err = None
    with memoryview(out) as mv:
        try:
            validate_directory(mv, start, False, False, U32_MAX, U32_MAX, False)
        except KilnError as e:
            err = EncodeError(e.code, e.offset, "tensors break a directory rule: " + e.reason)
    if err is not None:
        raise err


def _first(t):
    return t[0]


def _count_lied(offset, c, gave):
    # the count word says c: the items written must be exactly c
    return EncodeError("TYPE", offset, "len() said %d items but the sequence gave %s (it "
                       "changed length while encoding, or its len() is wrong)" % (c, gave))


def _scalar_error(v, op, text, offset):
    if op in P.INT_RANGE:
        lo, hi = P.INT_RANGE[op]
        try:
            import operator
            iv = operator.index(v)
        except TypeError:
            return EncodeError("TYPE", offset, "expected an integer for %s, got %s"
                               % (text, _type_name(v)))
        return EncodeError("TYPE", offset, "%s does not fit %s (%d..%d)"
                           % (_short_repr(iv), text, lo, hi))
    tp = type(v)
    if not (hasattr(tp, "__float__") or hasattr(tp, "__index__")):
        # a str such as "1.0" is not a number, whatever float() would make of it
        return EncodeError("TYPE", offset, "expected a float for %s, got %s"
                           % (text, _type_name(v)))
    return EncodeError("TYPE", offset, "%s does not fit %s" % (_short_repr(v), text))


def _short_repr(v):
    try:
        r = repr(v)
    except ValueError:  # an int past sys.get_int_max_str_digits()
        return "an integer of %d bits" % v.bit_length()
    return r if len(r) <= 40 else r[:18] + "..." + r[-18:]


def _as_byte_run(v, offset):
    t = type(v)
    if t is bytes or t is bytearray:
        return v
    if t is memoryview or isinstance(v, (bytes, bytearray, memoryview)):
        mv = memoryview(v)
        if not mv.c_contiguous:
            raise EncodeError("TYPE", offset, "memoryview is not contiguous")
        if mv.itemsize != 1:
            raise EncodeError("TYPE", offset, "memoryview items are not bytes")
        return mv.cast("B") if mv.format != "B" else mv
    if isinstance(v, np.ndarray):
        if v.ndim != 1 or v.dtype != np.uint8:
            raise EncodeError("TYPE", offset, "list<u8> takes a 1-D uint8 array, got %s %s"
                              % (v.dtype, v.shape))
        return memoryview(np.ascontiguousarray(v)).cast("B")
    if isinstance(v, (list, tuple)):
        try:
            return bytes(v)
        except (ValueError, TypeError) as ex:
            raise EncodeError("TYPE", offset, "list<u8>: %s" % ex) from None
    raise EncodeError("TYPE", offset, "expected bytes for list<u8>, got %s" % _type_name(v))


def as_pod_array(v, op, offset=0):
    """Return a contiguous little-endian 1-D array of the wire dtype of ``op``.

    Raises EncodeError for a wrong kind, a wrong shape or a value out of range;
    never wraps or truncates silently.
    """
    le = np.dtype(P.NUMPY_LE[op])
    if isinstance(v, np.ndarray):
        arr = v
    else:
        if isinstance(v, (str, bytes, bytearray, dict)):
            raise EncodeError("TYPE", offset, "expected a sequence of numbers, got %s"
                              % _type_name(v))
        try:
            arr = np.asarray(v)
        except (ValueError, TypeError, OverflowError) as ex:
            raise EncodeError("TYPE", offset, "cannot read numbers: %s" % ex) from None
        except RuntimeError as ex:
            # numpy saw the sequence change length while it read it (another
            # thread, on a free-threaded build)
            raise EncodeError("TYPE", offset, "sequence changed length while encoding (%s)"
                              % ex) from None
    if arr.ndim != 1:
        raise EncodeError("TYPE", offset, "expected a 1-D sequence, got shape %s" % (arr.shape,))
    if arr.dtype == le:
        return np.ascontiguousarray(arr)
    kind = arr.dtype.kind
    if arr.size == 0 and kind in "fiubO":
        return np.empty(0, le)
    if op == P.OP_BOOL:
        if kind != "b":
            raise EncodeError("TYPE", offset, "expected bools, got %s" % arr.dtype)
    elif op in P.INT_RANGE:
        if kind not in "iub":
            raise EncodeError("TYPE", offset, "expected integers for %s, got %s"
                              % (le.name, arr.dtype))
        if not np.can_cast(arr.dtype, le, "safe"):
            lo, hi = P.INT_RANGE[op]
            mn = int(arr.min())
            mx = int(arr.max())
            if mn < lo or mx > hi:
                bad = mn if mn < lo else mx
                raise EncodeError("TYPE", offset, "%d does not fit %s" % (bad, le.name))
    else:
        if kind not in "fiub":
            raise EncodeError("TYPE", offset, "expected floats, got %s" % arr.dtype)
        if kind == "f" and arr.dtype.itemsize > le.itemsize:
            with np.errstate(over="ignore", invalid="ignore"):
                out = arr.astype(le)
                if not np.array_equal(np.isfinite(out), np.isfinite(arr)):
                    raise EncodeError("TYPE", offset, "a value overflows %s" % le.name)
            return out
    return np.ascontiguousarray(arr, dtype=le)


def _build_struct_encoder(plan):
    names = plan.names
    get = plan.get
    cls = plan.cls
    nf = len(names)
    encs = tuple(_build_encoder(f) for f in plan.fields)
    fast = []
    run = []
    # fused packers for consecutive non-bool fixed scalars (errors re-diagnosed slowly)

    def flush():
        if run:
            idx = tuple(i for i, _ in run)
            fast.append((_struct.Struct("<" + "".join(P.SCALAR_FORMAT[f.op][0] for _, f in run)).pack,
                         idx))
            del run[:]
    for i, f in enumerate(plan.fields):
        if f.op in P.SCALAR_FORMAT and f.op != P.OP_BOOL:
            run.append((i, f))
        else:
            flush()
            fast.append((None, (i,)))
    flush()
    fast = tuple(fast)
    key_set = frozenset(names)
    if nf == 1:
        _ig = operator.itemgetter(names[0])

        def item_get(v):
            return (_ig(v),)
    elif nf == 0:
        def item_get(v):
            return ()
    else:
        item_get = operator.itemgetter(*names)

    def values_of(v, out):
        if cls is not None and isinstance(v, cls):
            vals = get(v)
            return vals
        items = getattr(v, "keys", None)
        if items is None or not hasattr(v, "__getitem__"):
            want = cls.__qualname__ if cls is not None else "a mapping"
            raise EncodeError("TYPE", len(out), "expected %s for %s, got %s"
                              % (want, plan.text, _type_name(v)))
        try:
            vals = item_get(v)
        except KeyError:
            missing = [nm for nm in names if nm not in v]
            raise EncodeError("TYPE", len(out), "missing field %r" % missing[0]) from None
        if len(v) != nf:
            extra = sorted(k for k in v.keys() if k not in key_set)
            raise EncodeError("TYPE", len(out), "unknown fields %s for %s" % (extra, plan.text))
        return vals

    def slow(vals, out, start):
        del out[start:]
        for i in range(nf):
            try:
                encs[i](vals[i], out)
            except EncodeError as e:
                e.add_path("." + names[i])
                raise

    def enc_struct(v, out):
        vals = values_of(v, out)
        start = len(out)
        try:
            for pack, idx in fast:
                if pack is None:
                    encs[idx[0]](vals[idx[0]], out)
                elif len(idx) == 1:
                    out += pack(vals[idx[0]])
                else:
                    out += pack(*[vals[i] for i in idx])
        except Exception:
            slow(vals, out, start)
            raise
    return enc_struct


class EncodeProgram:
    """A plan compiled for encoding."""

    __slots__ = ("plan", "frame_hash", "_enc", "_prefix")

    def __init__(self, plan, frame_hash):
        self.plan = plan
        self.frame_hash = frame_hash
        self._enc = _build_encoder(plan)
        self._prefix = None if frame_hash is None else _FRAME.pack(b"KLN0", 0, 0, 0, frame_hash)

    def encode(self, value):
        out = bytearray()
        if self._prefix is not None:
            out += self._prefix
        self._enc(value, out)
        return bytes(out)

    def encode_into(self, value, buffer, offset=0):
        if type(buffer) is not bytearray:
            raise TypeError("encode_into needs a bytearray, not %s" % _type_name(buffer))
        if offset < 0:
            offset = len(buffer)
        if offset > len(buffer):
            buffer.extend(bytes(offset - len(buffer)))
        else:
            del buffer[offset:]
        # encoded privately first: code the value runs while it is encoded
        # (an __index__, an items()) cannot reach the bytes already written
        out = bytearray()
        if self._prefix is not None:
            out += self._prefix
        try:
            self._enc(value, out)
        except EncodeError as e:
            e.offset += offset  # offsets count from the start of ``buffer``
            raise
        if len(buffer) != offset:
            raise RuntimeError("the bytearray changed size while encode_into was writing it")
        buffer += out
        return len(buffer)


def compile_encoder(plan, frame_hash):
    return EncodeProgram(plan, frame_hash)


# --- tensor directory -------------------------------------------------------

def validate_directory(buf, s, standalone, trusted, max_count, max_bytes, copy):
    """Check the directory at ``s`` in the 12-step order; see the module doc."""
    n = len(buf)
    avail = n - s
    # 1. magic and header size
    if avail < 4:
        raise _err("EOF", s, "a directory needs 4 bytes for its magic, %d remain" % max(avail, 0))
    magic = bytes(buf[s:s + 4])
    if magic != b"KLNT":
        raise _err("FRAME", s, "directory magic is %r, not b'KLNT'" % magic)
    if avail < 64:
        raise _err("EOF", s, "a directory header needs 64 bytes, %d remain" % avail)
    (_, version, flags, _r, count, name_bytes, payload_bytes,
     directory_bytes, _r32) = _HEADER.unpack_from(buf, s)
    # 2. envelope
    if version != 2:
        raise _err("FRAME", s + 4, "directory version is %d, not 2" % version)
    if flags & ~3:
        raise _err("FRAME", s + 5, "unknown directory flag bits %#x" % (flags & ~3))
    if not flags & 2:
        raise _err("FRAME", s + 5, "the little-endian flag is clear")
    for i in (6, 7):
        if buf[s + i]:
            raise _err("FRAME", s + i, "reserved header byte is not 0")
    if any(_r32):
        i = next(k for k, b in enumerate(_r32) if b)
        raise _err("FRAME", s + 32 + i, "reserved header byte is not 0")
    # 3. caps
    if count > max_count:
        raise _err("LIMIT", s + 8, "tensor count %d is above the cap max_count=%d"
                   % (count, max_count))
    if name_bytes > max_bytes:
        raise _err("LIMIT", s + 12, "name heap of %d bytes is above the cap max_bytes=%d"
                   % (name_bytes, max_bytes))
    # 4. directory arithmetic
    want = count * 128 + name_bytes
    if want > U64_MAX:
        raise _err("LIMIT", s + 8, "directory size overflows u64")  # pragma: no cover
    if directory_bytes != want:
        raise _err("TYPE", s + 24, "directory_bytes is %d, count and heap give %d"
                   % (directory_bytes, want))
    # 5. the directory fits
    if 64 + want > avail:
        raise _err("EOF", s + 8, "%d descriptors and %d heap bytes need %d bytes, %d remain"
                   % (count, name_bytes, 64 + want, avail))
    # 6. the block fits
    base = (64 + want + 63) & ~63
    block = base + payload_bytes
    if block > U64_MAX:
        raise _err("LIMIT", s + 16, "payload_base + payload_bytes overflows u64")
    if block > avail:
        raise _err("EOF", s + 16, "the block needs %d bytes, %d remain" % (block, avail))
    # 7. zero padding
    heap_end = s + 64 + want
    pb = s + base
    if heap_end < pb:
        pad = bytes(buf[heap_end:pb])
        if any(pad):
            i = next(k for k, b in enumerate(pad) if b)
            raise _err("TYPE", heap_end + i, "padding byte is not 0")
    # only now: one tuple per descriptor
    descs = [_DESC.unpack_from(buf, s + 64 + 128 * i) for i in range(count)]
    # 8a. descriptor reserved bytes
    for i, dsc in enumerate(descs):
        d = s + 64 + 128 * i
        if dsc[2]:
            raise _err("FRAME", d + 3, "reserved descriptor byte is not 0")
        if any(dsc[23]):
            k = next(k for k, b in enumerate(dsc[23]) if b)
            raise _err("FRAME", d + 112 + k, "reserved descriptor byte is not 0")
    # 8b. names and the heap
    named = bool(flags & 1)
    if named and count == 0:
        raise _err("TYPE", s + 5, "name flag set on an empty directory")
    cursor = 0
    heap0 = s + 64 + 128 * count
    for i, dsc in enumerate(descs):
        d = s + 64 + 128 * i
        noff, nlen = dsc[3], dsc[4]
        if not named:
            if nlen != 0 or noff != 0xFFFF:
                raise _err("TYPE", d + 4, "tensor has a name but the name flag is clear")
            continue
        if nlen == 0:
            raise _err("TYPE", d + 4, "tensor has no name but the name flag is set")
        if noff != cursor or cursor + nlen > name_bytes:
            raise _err("TYPE", d + 4, "name slice (%d, %d) is not the next %d heap bytes"
                       % (noff, nlen, nlen))
        cursor += nlen
    for i, dsc in enumerate(descs):
        d = s + 64 + 128 * i
        loff, llen = dsc[5], dsc[6]
        if llen == 0:
            if loff != 0xFFFF:
                raise _err("TYPE", d + 8, "empty layout name with offset %d" % loff)
            continue
        if loff != cursor or cursor + llen > name_bytes:
            raise _err("TYPE", d + 8, "layout slice (%d, %d) is not the next heap bytes"
                       % (loff, llen))
        cursor += llen
    if cursor != name_bytes:
        raise _err("TYPE", s + 12, "name heap has %d bytes, names use %d" % (name_bytes, cursor))
    heap = bytes(buf[heap0:heap0 + name_bytes])
    names = [None] * count
    layouts = [None] * count
    for i, dsc in enumerate(descs):
        if named:
            names[i] = heap[dsc[3]:dsc[3] + dsc[4]]
        if dsc[6]:
            layouts[i] = heap[dsc[5]:dsc[5] + dsc[6]]
    if not trusted:
        for which in (names, layouts):
            for i, nm in enumerate(which):
                if nm is None:
                    continue
                try:
                    nm.decode("utf-8")
                except UnicodeDecodeError as ex:
                    off = descs[i][3] if which is names else descs[i][5]
                    raise _err("UTF8", heap0 + off + ex.start, "invalid UTF-8 in a %s"
                               % ("tensor name" if which is names else "layout name")) from None
    if named:
        seen = set()
        for i, nm in enumerate(names):
            if nm in seen:
                raise _err("TYPE", s + 64 + 128 * i + 4, "tensor name %r repeats" % nm)
            seen.add(nm)
    # 9. dtype, rank, shape, lengths, ranges
    counts = [0] * count
    for i, dsc in enumerate(descs):
        d = s + 64 + 128 * i
        code, rank = dsc[0], dsc[1]
        opaque = OPAQUE_MIN <= code <= OPAQUE_MAX
        if not opaque and code not in DTYPES:
            raise _err("TYPE", d, "dtype code %d is not defined" % code)
        if rank > 8:
            raise _err("TYPE", d + 2, "rank %d is above 8" % rank)
        shape = dsc[15:23]
        for k in range(rank, 8):
            if shape[k]:
                raise _err("TYPE", d + 48 + 8 * k, "shape slot %d past rank %d is not 0" % (k, rank))
        ne = 1
        if 0 not in shape[:rank]:  # a zero dimension makes the exact product 0
            for k in range(rank):
                ne *= shape[k]
                if ne > U64_MAX:
                    raise _err("LIMIT", d + 48, "element count overflows u64")
        else:
            ne = 0
        counts[i] = ne
        block_size, blen = dsc[7], dsc[14]
        if opaque:
            if dsc[6] == 0:
                raise _err("TYPE", d + 8, "opaque dtype %d needs a layout name" % code)
            if block_size == 0:
                raise _err("TYPE", d + 12, "opaque dtype %d needs a block size" % code)
            if blen % block_size:
                raise _err("TYPE", d + 40, "byte length %d is not a multiple of block size %d"
                           % (blen, block_size))
        else:
            if block_size:
                raise _err("TYPE", d + 12, "block size %d on a non-opaque dtype" % block_size)
            if dsc[6]:
                raise _err("TYPE", d + 8, "layout name on a non-opaque dtype")
            w = DTYPES[code][1]
            if w == 0:
                need = (ne + 1) // 2
            else:
                need = ne * w
                if need > U64_MAX:
                    raise _err("LIMIT", d + 40, "byte length of %d elements overflows u64" % ne)
            if blen != need:
                raise _err("TYPE", d + 40, "byte length is %d, %d elements of %s need %d"
                           % (blen, ne, DTYPES[code][0], need))
        off = dsc[13]
        if off + blen > U64_MAX:
            raise _err("LIMIT", d + 32, "payload range end overflows u64")
        if off + blen > payload_bytes:
            raise _err("TYPE", d + 32, "payload range [%d, %d) is past payload_bytes %d"
                       % (off, off + blen, payload_bytes))
    ranges = sorted((dsc[13], i) for i, dsc in enumerate(descs) if dsc[14])
    top_end = -1
    top_i = -1
    for off, i in ranges:
        if off < top_end:
            j = max(i, top_i)
            raise _err("TYPE", s + 64 + 128 * j + 32, "payload ranges of tensors %d and %d overlap"
                       % (min(i, top_i), j))
        e = off + descs[i][14]
        if e > top_end:
            top_end, top_i = e, i
    # 10. canonical placement
    r = 0
    for i, dsc in enumerate(descs):
        want_off = (r + 63) & ~63
        if dsc[13] != want_off:
            raise _err("TYPE", s + 64 + 128 * i + 32, "byte_offset %d is not the canonical %d"
                       % (dsc[13], want_off))
        r = want_off + dsc[14]
    if payload_bytes != r:
        raise _err("TYPE", s + 16, "payload_bytes is %d, the canonical end is %d"
                   % (payload_bytes, r))
    r = 0
    for dsc in descs:
        if dsc[13] > r:
            gap = bytes(buf[pb + r:pb + dsc[13]])
            if any(gap):
                k = next(k for k, b in enumerate(gap) if b)
                raise _err("TYPE", pb + r + k, "alignment gap byte is not 0")
        r = dsc[13] + dsc[14]
    # 11a. bool bytes and packed tails
    for i, dsc in enumerate(descs):
        code = dsc[0]
        a = pb + dsc[13]
        if code == 7 and dsc[14]:
            k = _first_bad_bool(buf, a, dsc[14])
            if k >= 0:
                raise _err("TYPE", a + k, "bool byte is %d, not 0 or 1" % buf[a + k])
        elif code in PACKED and counts[i] & 1:
            last = buf[a + dsc[14] - 1]
            if last & 0xF0:
                raise _err("TYPE", a + dsc[14] - 1, "high nibble of an odd packed tail is not 0")
    # 11b. quantization links
    for i, dsc in enumerate(descs):
        d = s + 64 + 128 * i
        scheme, axis, group, scale, outer = dsc[8], dsc[9], dsc[10], dsc[11], dsc[12]
        if scheme > 2:
            raise _err("TYPE", d + 16, "quant scheme %d is not 0, 1 or 2" % scheme)
        if scheme == 0:
            if axis != 0xFFFF:
                raise _err("TYPE", d + 18, "quant axis set without a scheme")
            if group:
                raise _err("TYPE", d + 20, "group size set without a scheme")
            if scale != U32_MAX:
                raise _err("TYPE", d + 24, "scale index set without a scheme")
            if outer != U32_MAX:
                raise _err("TYPE", d + 28, "outer index set without a scheme")
            continue
        rank = dsc[1]
        if rank == 0 or axis >= rank:
            raise _err("TYPE", d + 18, "quant axis %d is not below rank %d" % (axis, rank))
        if group == 0:
            raise _err("TYPE", d + 20, "group size is 0")
        if scale >= count or scale == i:
            raise _err("TYPE", d + 24, "scale index %d does not name another tensor" % scale)
        if descs[scale][8] != 0:
            raise _err("TYPE", d + 24, "scale tensor %d is itself quantized (a chain)" % scale)
        if scheme == 1:
            if outer != U32_MAX:
                raise _err("TYPE", d + 28, "outer index set on scheme 1")
        else:
            if outer >= count or outer == i or outer == scale:
                raise _err("TYPE", d + 28, "outer index %d does not name a third tensor" % outer)
            od = descs[outer]
            if od[0] != 2 or od[8] != 0 or counts[outer] != 1:
                raise _err("TYPE", d + 28, "outer tensor %d is not one unquantized f32" % outer)
        if not trusted:
            shape = dsc[15:15 + rank]
            groups = -(-shape[axis] // group)
            for k in range(rank):
                if k != axis:
                    groups *= shape[k]
            if counts[scale] != groups:
                raise _err("TYPE", d + 24, "scale tensor has %d elements, %d groups need %d"
                           % (counts[scale], groups, groups))
    # 12. trailing bytes
    end = s + block
    if standalone and end != n:
        raise _err("TRAILING", end, "%d bytes follow the directory" % (n - end))
    if copy:
        for i, dsc in enumerate(descs):
            if dsc[14] > max_bytes:
                raise _err("LIMIT", s + 64 + 128 * i + 40, "payload of %d bytes is above the "
                           "copy cap max_bytes=%d" % (dsc[14], max_bytes))
    table = [(dsc[0], dsc[15:15 + dsc[1]], names[i], layouts[i], dsc[7], dsc[8], dsc[9],
              dsc[10], dsc[11], dsc[12], dsc[13], dsc[14]) for i, dsc in enumerate(descs)]
    return end, base, table


def _first_bad_bool(buf, a, n):
    # a helper frame, so no array exporting ``buf`` outlives the call
    raw = np.frombuffer(buf, np.uint8, n, a)
    bad = raw > 1
    if bad.any():
        return int(np.argmax(bad))
    return -1


def write_directory(records, out):
    """Append the canonical block of ``records`` to ``out`` (see module doc)."""
    count = len(records)
    if count > U32_MAX:
        raise EncodeError("LIMIT", len(out), "%d tensors exceed u32" % count)
    names = []
    layouts = []
    named = False
    for rec in records:
        if rec[2] is not None:
            named = True
    heap_n = 0
    offs = []
    for rec in records:
        if named:
            nm = rec[2]
            if not nm:
                raise EncodeError("TYPE", len(out), "when one tensor is named, all must be")
            offs.append(heap_n)
            heap_n += len(nm)
            names.append(nm)
        else:
            offs.append(0xFFFF)
    louts = []
    for rec in records:
        lay = rec[3]
        if lay:
            louts.append(heap_n)
            heap_n += len(lay)
            layouts.append(lay)
        else:
            louts.append(0xFFFF)
    if any(o > 0xFFFE for o in offs + louts if o != 0xFFFF) or heap_n > U32_MAX:
        raise EncodeError("LIMIT", len(out), "name heap of %d bytes does not fit u16 offsets"
                          % heap_n)
    for rec in records:
        if (rec[2] and len(rec[2]) > 0xFFFF) or (rec[3] and len(rec[3]) > 0xFFFF):
            raise EncodeError("LIMIT", len(out), "a name is longer than 65535 bytes")
    dir_bytes = count * 128 + heap_n
    base = (64 + dir_bytes + 63) & ~63
    places = []
    r = 0
    for rec in records:
        o = (r + 63) & ~63
        ln = len(rec[10])
        places.append((o, ln))
        r = o + ln
    start = len(out)
    out += _HEADER.pack(b"KLNT", 2, 2 | (1 if named else 0), 0, count, heap_n, r, dir_bytes,
                        bytes(32))
    for i, rec in enumerate(records):
        shape = tuple(rec[1]) + (0,) * (8 - len(rec[1]))
        out += _DESC.pack(rec[0], len(rec[1]), 0, offs[i], len(rec[2]) if named else 0,
                          louts[i], len(rec[3]) if rec[3] else 0, rec[4], rec[5], rec[6],
                          rec[7], rec[8], rec[9], places[i][0], places[i][1], *shape,
                          bytes(16))
    for nm in names:
        out += nm
    for lay in layouts:
        out += lay
    out += bytes(base - (64 + dir_bytes))
    pstart = len(out)
    for i, rec in enumerate(records):
        o = places[i][0]
        gap = pstart + o - len(out)
        if gap:
            out += bytes(gap)
        out += rec[10]
    return start
