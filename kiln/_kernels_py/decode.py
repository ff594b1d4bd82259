"""Frozen decode: a plan becomes a tree of closures ``dec(d, p) -> (value, p)``.

The twin of ``src/kernels/decode.pxi``.  Each builder below makes the
decoder of one op; ``build`` picks the builder.
"""

import operator
import struct as _struct

import numpy as np

from .. import _wire as W
from .._convert import as_bytes_view
from .._errors import KilnError, frame_hint
from .._plan import FORM_ARRAY, FORM_LIST, ConvError, Some
from .reader import (U32, budget, check_count, check_frame, eof, err, has_zero_lists,
                     read_length, zero_budget_error)
from .directory import validate_directory


class Opts:
    """The decode options every builder reads."""

    __slots__ = ("trusted", "max_count", "max_bytes", "copy", "max_copy", "errors")

    def __init__(self, trusted, max_count, max_bytes, copy, max_copy):
        self.trusted = trusted
        self.max_count = max_count
        self.max_bytes = max_bytes
        self.copy = copy
        self.max_copy = max_copy if copy else None
        self.errors = "surrogateescape" if trusted else "strict"


def build(plan, o):
    if plan.op in W.SCALAR_FORMAT:
        return _scalar(plan, o)
    return _BUILDERS[plan.op](plan, o)


def _scalar(plan, o):
    op = plan.op
    if op == W.OP_BOOL:
        def dec_bool(d, p):
            if p >= len(d):
                raise eof(p, 1, len(d))
            b = d[p]
            if b > 1:
                raise err("TYPE", p, "bool byte is %d, not 0 or 1" % b)
            return b == 1, p + 1
        return dec_bool
    fmt, w = W.SCALAR_FORMAT[op]
    unpack = _struct.Struct("<" + fmt).unpack_from

    def dec_scalar(d, p):
        if p + w > len(d):
            raise eof(p, w, len(d))
        return unpack(d, p)[0], p + w
    return dec_scalar


def _text(raw, q, errors, what=""):
    """Decode ``raw``, the body that starts at input offset ``q``.

    ``raw`` is bytes: a string is decoded from a private copy (a slice of
    bytes input, which nobody can change, or ``bytes()`` of a view), because
    CPython's decoder reads its input more than once and the caller's buffer
    may change meanwhile (another thread, another process's mmap)."""
    try:
        return str(raw, "utf-8", errors)
    except UnicodeDecodeError as ex:
        raise err("UTF8", q + ex.start, "invalid UTF-8%s (%s)" % (what, ex.reason)) from None


def _str(plan, o):
    max_bytes, errors = o.max_bytes, o.errors

    def dec_str(d, p):
        q, e = read_length(d, p, max_bytes, "string")
        raw = d[q:e]   # bytes when the input is bytes: nobody can change it
        return _text(raw if type(raw) is bytes else bytes(raw), q, errors), e   # (see _text)
    return dec_str


def _bytes(plan, o):
    cap = o.max_bytes   # a list<u8> run is bytes: max_bytes alone bounds it
    form = plan.form

    def dec_bytes(d, p):
        c = check_count(d, p, cap, 1, "max_bytes")
        q = p + 4
        raw = bytes(d[q:q + c])
        if form == FORM_ARRAY:
            return np.frombuffer(raw, np.uint8).copy(), q + c
        if form == FORM_LIST:
            return list(raw), q + c
        return raw, q + c
    return dec_bytes


def _podlist(plan, o):
    le = np.dtype(W.NUMPY_LE[plan.elem.op])
    nat = le.newbyteorder("=")
    w = le.itemsize
    is_bool = plan.elem.op == W.OP_BOOL
    max_count = o.max_count
    if plan.form == FORM_LIST:
        def dec_pod_list(d, p):
            arr, e = dec_pod(d, p)
            return arr.tolist(), e   # Python ints, floats or bools
        dec = dec_pod_list
    else:
        dec = None

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
                raise err("TYPE", q + i, "bool byte is %d, not 0 or 1" % u[i])
        return arr, q + c * w
    return dec or dec_pod


def _opt(plan, o):
    inner = build(plan.elem, o)
    nested = plan.elem.op == W.OP_OPT

    def dec_opt(d, p):
        if p >= len(d):
            raise eof(p, 1, len(d))
        b = d[p]
        if b == 0:
            return None, p + 1
        if b != 1:
            raise err("TYPE", p, "optional presence byte is %d, not 0 or 1" % b)
        v, p = inner(d, p + 1)
        if nested and (v is None or type(v) is Some):
            v = Some(v)  # present, and the inner optional is empty: keep the level
        return v, p
    return dec_opt


def _list(plan, o):
    elem = plan.elem
    m = elem.min_size
    max_count = o.max_count
    if elem.op == W.OP_STRUCT and m > 0 and all(
            f.op in W.SCALAR_FORMAT and f.op != W.OP_BOOL for f in elem.fields):
        return _fixed_list(plan, o)
    if elem.op == W.OP_STRUCT and m > 0:
        return _struct_list(plan, o)
    inner = build(elem, o)
    if m == 0:
        def dec_zero_list(d, p):
            # the input's bytes do not bound these elements: one budget for the value
            c = check_count(d, p, max_count, 0)
            left = budget.left
            if c > left:
                raise zero_budget_error(p, c, left, max_count)
            budget.left = left - c
            return _items(inner, c, d, p + 4)
        return dec_zero_list

    def dec_list(d, p):
        return _items(inner, check_count(d, p, max_count, m), d, p + 4)
    return dec_list


def _items(inner, c, d, p):
    out = []
    app = out.append
    for _ in range(c):
        v, p = inner(d, p)
        app(v)
    return out, p


def _fixed_list(plan, o):
    """Every element is one fixed record of non-bool scalars: unpack them in bulk."""
    elem = plan.elem
    m = elem.min_size
    rec = _struct.Struct("<" + "".join(W.SCALAR_FORMAT[f.op][0] for f in elem.fields))
    names = elem.names
    make = elem.make
    max_count = o.max_count

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


def _dict(plan, o):
    inner = build(plan.elem, o)
    m = 4 + plan.elem.min_size
    max_count, max_bytes, errors = o.max_count, o.max_bytes, o.errors

    def dec_dict(d, p):
        c = check_count(d, p, max_count, m)
        p += 4
        out = {}
        prev = None
        for _ in range(c):
            q, e = read_length(d, p, max_bytes, "key")
            raw = bytes(d[q:e])  # one copy: decoded and ordered from the same bytes
            key = _text(raw, q, errors, " in key")
            if prev is not None and raw <= prev:
                raise err("TYPE", p, "dict key %r is not after the previous key" % key)
            prev = raw
            out[key], p = inner(d, e)
        return out, p
    return dec_dict


def _conv(plan, o):
    inner = build(plan.elem, o)
    from_wire = plan.make
    if from_wire is None:
        return inner

    def dec_conv(d, p):
        v, e = inner(d, p)
        try:
            return from_wire(v), e
        except ConvError as ex:
            raise err("TYPE", p, str(ex)) from None
    return dec_conv


def _tensors(plan, o):
    hooks = plan.tensors

    def dec_tensors(d, p):
        mv = d if type(d) is memoryview else memoryview(d)
        end, base, table = validate_directory(mv, p, False, o.trusted, o.max_count,
                                              o.max_bytes, o.max_copy)
        return hooks.build(mv, p, base, table, o.copy, o.trusted), end
    return dec_tensors


def _struct_dec(plan, o):
    """One straight-line function for the struct (see _struct_body)."""
    ns = {}
    lines = ["def dec_struct(d, p):", "    n = len(d)"]
    value = _struct_body(plan, o, ns, lines, "    ")
    lines.append("    return %s, p" % value)
    return _compiled(plan, ns, lines, "dec_struct")


def _struct_list(plan, o):
    """list<struct>: the loop and the struct's straight-line body in one function."""
    elem = plan.elem
    ns = {"check_count": check_count}
    lines = ["def dec_struct_list(d, p):",
             "    c = check_count(d, p, %d, %d)" % (o.max_count, elem.min_size),
             "    p += 4", "    n = len(d)", "    out = [None] * c", "    for k in range(c):"]
    value = _struct_body(elem, o, ns, lines, "        ")
    lines.append("        out[k] = %s" % value)
    lines.append("    return out, p")
    return _compiled(elem, ns, lines, "dec_struct_list")


def _compiled(plan, ns, lines, name):
    exec(compile("\n".join(lines), "<kiln struct %s>" % plan.text[:60], "exec"), ns)
    return ns[name]


def _struct_body(plan, o, ns, lines, ind):
    """Append the statements that decode ``plan``'s fields at p into v0, v1, ...
    (advancing p); return the expression that makes the value.

    Consecutive non-bool fixed scalars are read by one struct.Struct; strings
    and lists of numbers are read inline when their length word and bytes are
    in bounds (else their own decoder runs, and raises the error); any other
    field calls its decoder."""
    ns.update(run_eof=_run_eof, make=plan.make, u32=U32.unpack_from, fromb=np.frombuffer,
              empty=np.empty, UnicodeDecodeError=UnicodeDecodeError)
    run = []

    def emit(*text):
        lines.extend(ind + t for t in text)

    def flush():
        if not run:
            return
        j = len(ns)
        st = _struct.Struct("<" + "".join(W.SCALAR_FORMAT[f.op][0] for _, f in run))
        ns["s%d" % j] = st.unpack_from
        ns["z%d" % j] = tuple(W.SCALAR_FORMAT[f.op][1] for _, f in run)
        targets = ", ".join("v%d" % i for i, _ in run)
        emit("if p + %d > n: raise run_eof(p, z%d, n)" % (st.size, j),
             "%s = s%d(d, p)%s" % (targets, j, "[0]" if len(run) == 1 else ""),
             "p += %d" % st.size)
        del run[:]

    for i, f in enumerate(plan.fields):
        if f.op in W.SCALAR_FORMAT and f.op != W.OP_BOOL:
            run.append((i, f))
            continue
        flush()
        ns["f%d" % i] = build(f, o)
        if f.op == W.OP_STR:
            ns["errors"] = o.errors
            emit("if p + 4 <= n and (ln := u32(d, p)[0]) <= %d and (e := p + 4 + ln) <= n:"
                 % o.max_bytes,
                 "    try:",
                 "        v%d = d[p + 4:e]" % i,   # bytes of bytes input, else copied (see _text)
                 "        v%d = str(v%d if type(v%d) is bytes else bytes(v%d), 'utf-8', errors)"
                 % (i, i, i, i),
                 "    except UnicodeDecodeError:",
                 "        v%d, e = f%d(d, p)" % (i, i),
                 "    p = e",
                 "else:",
                 "    v%d, p = f%d(d, p)" % (i, i))
        elif f.op == W.OP_PODLIST and f.elem.op != W.OP_BOOL:
            le = np.dtype(W.NUMPY_LE[f.elem.op])
            ns["le%d" % i], ns["nat%d" % i] = le, le.newbyteorder("=")
            if f.form == FORM_LIST:
                make = "fromb(d, le%d, cn, p + 4).tolist() if cn else []" % i
            else:
                make = "fromb(d, le%d, cn, p + 4).astype(nat%d) if cn else empty(0, nat%d)" \
                    % (i, i, i)
            emit("if p + 4 <= n and (cn := u32(d, p)[0]) <= %d and (e := p + 4 + cn * %d) <= n:"
                 % (o.max_count, le.itemsize),
                 "    v%d = %s" % (i, make),
                 "    p = e",
                 "else:",
                 "    v%d, p = f%d(d, p)" % (i, i))
        else:
            emit("v%d, p = f%d(d, p)" % (i, i))
    flush()
    if plan.make is None:
        return "{%s}" % ", ".join("%r: v%d" % (nm, i) for i, nm in enumerate(plan.names))
    values = ", ".join("v%d" % i for i in range(len(plan.fields)))
    if getattr(plan.make, "tuple_new_of", None) is plan.cls is not None:
        # a NamedTuple: what its make does, tuple.__new__(cls, values), without
        # the call of make
        ns.update(tnew=tuple.__new__, tcls=plan.cls)
        return "tnew(tcls, (%s%s))" % (values, "," if len(plan.fields) == 1 else "")
    return "make(%s)" % values


def _run_eof(p, sizes, n):
    for size in sizes:
        if p + size > n:
            return eof(p, size, n)
        p += size
    return eof(p, 0, n)  # pragma: no cover


_BUILDERS = {
    W.OP_STR: _str, W.OP_BYTES: _bytes, W.OP_PODLIST: _podlist, W.OP_OPT: _opt,
    W.OP_LIST: _list, W.OP_DICT: _dict, W.OP_STRUCT: _struct_dec, W.OP_TENSORS: _tensors,
    W.OP_CONV: _conv,
}


class DecodeProgram:
    """A plan compiled for decoding with fixed options."""

    __slots__ = ("plan", "frame_hash", "trusted", "max_count", "max_bytes", "copy", "max_copy",
                 "_dec", "_top_tensors", "_zero")

    def __init__(self, plan, frame_hash, trusted, max_count, max_bytes, copy, max_copy=None):
        self.plan = plan
        self.frame_hash = frame_hash
        self.trusted = bool(trusted)
        self.max_count = int(max_count)
        self.max_bytes = int(max_bytes)
        self.copy = bool(copy)
        self.max_copy = None if max_copy is None else int(max_copy)
        self._top_tensors = plan.op == W.OP_TENSORS
        self._dec = build(plan, Opts(self.trusted, self.max_count, self.max_bytes, self.copy,
                                     self.max_copy))
        self._zero = has_zero_lists(plan)

    def decode(self, buf):
        mv = as_bytes_view(buf)
        try:
            return self._decode(buf, mv)
        except KilnError as e:
            if self.frame_hash is None and bytes(mv[:4]) == W.FRAME_MAGIC:
                frame_hint(e)
            raise

    def decode_shared(self, buf, box):
        """``decode(buf)`` spending the zero-size budget ``box[0]`` (what is
        left of it is put back): the record loop's one budget for a read."""
        mv = as_bytes_view(buf)
        return self._decode(buf, mv, box)

    def list_head(self, buf, length=None):
        """The head of a list value in ``buf``, checked as ``decode`` checks
        it: the frame (a framed program), then the u32 count by the
        allocation rule; returns ``(count, where its first item starts)``.
        ``length``: the value's bytes are this many, of which ``buf`` holds
        the first (at least the frame and the count word when there are
        that many).  With ``decode_items`` of a program of the item type, a
        long list is decoded a run of items at a time from windows of its
        bytes (never all of its items, or all of its bytes, at once)."""
        if self.plan.op != W.OP_LIST:
            raise ValueError("list_head needs a program of a list type")
        mv = as_bytes_view(buf)
        whole = len(mv)
        if length is not None:
            length = operator.index(length)   # (a float is a TypeError, as in the C kernel)
            if not len(mv) <= length <= 0x7FFFFFFFFFFFFFFF or (
                    len(mv) < length and
                    len(mv) < (W.FRAME_SIZE if self.frame_hash is not None else 0) + 4):
                raise ValueError("length must be at least len(buf), and buf must hold the "
                                 "frame and the count word")
            whole = length
        p = check_frame(mv, self.frame_hash) if self.frame_hash is not None else 0
        m = self.plan.elem.min_size
        c = check_count(mv, p, self.max_count, m, n=whole)
        if m == 0 and c > self.max_count:
            raise zero_budget_error(p, c, self.max_count, self.max_count)
        return c, p + 4

    def decode_items(self, buf, at, count, out):
        """``count`` values of this program's type stored back to back from
        byte ``at`` of ``buf`` (no frame; bytes may follow them), appended to
        the list ``out``; returns where the last one ends.  Faults are at
        their offsets in ``buf``; the zero-size budget is this call's."""
        if type(out) is not list:
            raise TypeError("out must be a list")
        if self._top_tensors:
            raise ValueError("decode_items does not decode standalone directories")
        mv = as_bytes_view(buf)
        if not 0 <= at <= len(mv) or not 0 <= count <= 0x7FFFFFFFFFFFFFFF:
            raise ValueError("at must be within buf and count in 0..2**63-1")
        d = buf if type(buf) is bytes else mv
        saved = getattr(budget, "left", None)
        budget.left = self.max_count
        try:
            p = at
            for _ in range(count):
                v, p = self._dec(d, p)
                out.append(v)
            return p
        finally:
            budget.left = saved

    def _decode(self, buf, mv, box=None):
        d = buf if type(buf) is bytes else mv
        n = len(mv)
        p = 0
        if self.frame_hash is not None:
            p = check_frame(mv, self.frame_hash)
        if self._top_tensors:
            end, base, table = validate_directory(mv, p, True, self.trusted, self.max_count,
                                                  self.max_bytes,
                                                  self.max_copy if self.copy else None)
            return self.plan.tensors.build(mv, p, base, table, self.copy, self.trusted)
        if self._zero:
            v, p = self._dec_budgeted(d, p, box)
        else:
            v, p = self._dec(d, p)
        if p != n:
            raise err("TRAILING", p, "%d bytes follow the value" % (n - p))
        return v

    def _dec_budgeted(self, d, p, box=None):
        saved = getattr(budget, "left", None)  # a decode run from inside a decode
        budget.left = self.max_count if box is None else box[0]
        try:
            return self._dec(d, p)
        finally:
            if box is not None:
                box[0] = budget.left
            budget.left = saved


def compile_decoder(plan, frame_hash, trusted, max_count, max_bytes, copy, max_copy=None):
    return DecodeProgram(plan, frame_hash, trusted, max_count, max_bytes, copy, max_copy)


__all__ = ["compile_decoder", "DecodeProgram"]
