"""Frozen encode: a plan becomes a tree of closures ``enc(value, out)``.

The twin of ``src/kernels/encode.pxi``.  Each builder makes the encoder of
one op; ``out`` is a private bytearray the closures append to.
"""

import operator
import struct as _struct

import numpy as np

from .. import _wire as W
from .._convert import (Inexact, as_byte_run, as_pod_array, count_lied, inexact_error,
                        mapping_changed, missing_field, pack_scalar, scalar_error, type_name,
                        unknown_fields)
from .._errors import EncodeError, KilnError
from .._plan import ConvError, Some
from .directory import validate_directory
from .dirwrite import write_directory

U32 = _struct.Struct("<I")

# what a list<T> refuses although it has a len(): no order, or not a list of T
NOT_LISTS = (str, bytes, bytearray, dict, set, frozenset)


def build(plan, round_floats=False):
    """The encoder of ``plan``; ``round_floats`` lets a value round to a float
    field or element that cannot hold it exactly (else it is refused: the rule
    of kiln._convert)."""
    if plan.op == W.OP_BOOL:
        return _bool(plan, round_floats)
    if plan.op in W.SCALAR_FORMAT:
        return _scalar(plan, round_floats)
    return _BUILDERS[plan.op](plan, round_floats)


def _bool(plan, rf):
    np_bool = np.bool_

    def enc_bool(v, out):
        if v is True:
            out.append(1)
        elif v is False:
            out.append(0)
        elif type(v) is np_bool:
            out.append(1 if v else 0)
        else:
            raise scalar_error(v, W.OP_BOOL, "bool", len(out))
    return enc_bool


def _scalar(plan, rf):
    op, text = plan.op, plan.text
    pack = pack_scalar(op, rf)

    def enc_scalar(v, out):
        try:
            out += pack(v)
        except Inexact:
            raise inexact_error(v, op, len(out)) from None
        except (_struct.error, TypeError, OverflowError, ValueError):
            raise scalar_error(v, op, text, len(out)) from None
    return enc_scalar


def _str(plan, rf):
    def enc_str(v, out):
        if type(v) is not str and not isinstance(v, str):
            raise EncodeError("TYPE", len(out), "expected str, got %s" % type_name(v))
        try:
            b = v.encode("utf-8")
        except UnicodeEncodeError as ex:
            raise EncodeError("UTF8", len(out), "string has no UTF-8 form (%s)"
                              % ex.reason) from None
        if len(b) > W.U32_MAX:
            raise EncodeError("LIMIT", len(out), "string of %d bytes exceeds u32" % len(b))
        out += U32.pack(len(b))
        out += b
    return enc_str


def _bytes(plan, rf):
    def enc_bytes(v, out):
        b = as_byte_run(v, len(out))
        if len(b) > W.U32_MAX:
            raise EncodeError("LIMIT", len(out), "byte run of %d exceeds u32" % len(b))
        out += U32.pack(len(b))
        out += b
    return enc_bytes


def _podlist(plan, rf):
    eop = plan.elem.op
    fmt = W.SCALAR_FORMAT[eop][0]
    packers = {}
    # (struct rounds floats: f32 items, and f64 items other than floats, go
    # the checked way unless round_floats)
    short = eop != W.OP_BOOL and (rf or eop != W.OP_F32)
    floats_only = not rf and eop == W.OP_F64

    def enc_pod(v, out):
        if short and type(v) is list and len(v) <= 64:
            # a speed path only: struct packs short lists faster than numpy
            # converts them, and it takes exactly the items a scalar field takes
            # (as as_pod_array does), so on any failure as_pod_array says why
            n = len(v)
            pk = packers.get(n)
            if pk is None:
                pk = packers[n] = _struct.Struct("<I%d%s" % (n, fmt)).pack
            try:
                b = pk(n, *v)
                if not floats_only or all(type(x) is float for x in v):
                    out += b
                    return
            except (_struct.error, TypeError, OverflowError, ValueError):
                pass
        arr = as_pod_array(v, eop, len(out), rf)
        c = arr.shape[0]
        if c > W.U32_MAX:
            raise EncodeError("LIMIT", len(out), "list of %d exceeds u32" % c)
        out += U32.pack(c)
        out += memoryview(arr).cast("B")
    return enc_pod


def _opt(plan, rf):
    inner = build(plan.elem, rf)

    def enc_opt(v, out):
        if v is None:
            out.append(0)
        else:
            out.append(1)
            inner(v.value if type(v) is Some else v, out)
    return enc_opt


def _list(plan, rf):
    inner = build(plan.elem, rf)
    text = plan.text

    def enc_list(v, out):
        if isinstance(v, NOT_LISTS) or not hasattr(v, "__len__"):
            raise EncodeError("TYPE", len(out), "expected a sequence for %s, got %s"
                              % (text, type_name(v)))
        c = len(v)
        if c > W.U32_MAX:
            raise EncodeError("LIMIT", len(out), "list of %d exceeds u32" % c)
        out += U32.pack(c)
        done = 0
        try:
            for x in v:
                if done == c:
                    raise count_lied(len(out), c, "more")
                inner(x, out)
                done += 1
        except EncodeError as e:
            if done < c:
                e.add_path("[%d]" % done)
            raise
        if done != c:
            raise count_lied(len(out), c, done)
    return enc_list


def _dict(plan, rf):
    inner = build(plan.elem, rf)
    text = plan.text

    def enc_dict(v, out):
        items = getattr(v, "items", None)
        if items is None:
            raise EncodeError("TYPE", len(out), "expected a mapping for %s, got %s"
                              % (text, type_name(v)))
        pairs = []
        # one snapshot of the items (a dict: copied in one step, under its lock
        # on free-threaded builds), so code the loop runs (a key's encode) or
        # another thread changing the mapping cannot break the loop
        try:
            snap = dict.copy(v).items() if type(v) is dict else list(items())
        except RuntimeError as e:   # (changed size while its items were listed)
            raise mapping_changed(len(out), e) from None
        for k, x in snap:
            if type(k) is not str and not isinstance(k, str):
                raise EncodeError("TYPE", len(out), "dict key %r is not a str" % (k,))
            try:
                kb = k.encode("utf-8")
            except UnicodeEncodeError as ex:
                raise EncodeError("UTF8", len(out), "key has no UTF-8 form (%s)"
                                  % ex.reason) from None
            pairs.append((kb, k, x))
        pairs.sort(key=_first)
        if len(pairs) > W.U32_MAX:
            raise EncodeError("LIMIT", len(out), "dict of %d exceeds u32" % len(pairs))
        out += U32.pack(len(pairs))
        prev = None
        for kb, k, x in pairs:
            if kb == prev:
                raise EncodeError("TYPE", len(out), "the mapping gave the key %r twice" % k)
            prev = kb
            out += U32.pack(len(kb))
            out += kb
            try:
                inner(x, out)
            except EncodeError as e:
                e.add_path("[%r]" % k)
                raise
    return enc_dict


def _conv(plan, rf):
    inner = build(plan.elem, rf)
    to_wire = plan.get
    if to_wire is None:
        return inner

    def enc_conv(v, out):
        try:
            w = to_wire(v)
        except ConvError as e:
            raise EncodeError("TYPE", len(out), str(e)) from None
        inner(w, out)
    return enc_conv


def _first(t):
    return t[0]


def _tensors(plan, rf):
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
        # the first block with payload bytes, for a padded record (records.py)
        if type(out) is Marked and out.first_dir < 0 and _PAYLOAD_BYTES.unpack_from(out, start)[0]:
            out.first_dir = start
    return enc_tensors


_PAYLOAD_BYTES = _struct.Struct("<16xQ")   # a directory header's payload_bytes


class Marked(bytearray):
    """The output of an encode that notes where its first tensor directory
    with payload bytes starts (``first_dir``, -1 for none): the twin of the
    compiled Writer's ``first_dir``."""

    __slots__ = ("first_dir",)

    def __init__(self):
        super().__init__()
        self.first_dir = -1


def check_written_directory(out, start):
    """Validate a block the encoder just wrote, so encode never emits bytes decode rejects."""
    error = None
    with memoryview(out) as mv:
        try:
            validate_directory(mv, start, False, False, W.U32_MAX, W.U32_MAX)
        except KilnError as e:
            error = EncodeError(e.code, e.offset, "tensors break a directory rule: " + e.reason)
    if error is not None:
        raise error


def _struct_enc(plan, rf):
    names, nf = plan.names, len(plan.names)
    encs = tuple(build(f, rf) for f in plan.fields)
    fast = _fused_runs(plan, rf)
    values_of = _values_getter(plan)
    exact = _EXACT

    def one(i, vals, out):
        try:
            encs[i](vals[i], out)
        except EncodeError as e:
            e.add_path("." + names[i])
            raise

    def enc_struct(v, out):
        vals = values_of(v, out)
        for pack, idx, checks in fast:
            if pack is None:
                one(idx[0], vals, out)
                continue
            # a run of fixed scalars in one struct.pack when every value is an
            # exact int, float or bool (converting them runs no code, so trying
            # twice changes nothing) and each float field's value is exactly
            # what its width holds (``checks``, unless round_floats); else, or
            # when it fails, field by field: each value converted once, as the
            # compiled kernel does (numpy scalars, values with __index__ or
            # __float__), with the precise error and its path
            run = [vals[i] for i in idx]
            for x in run:
                if type(x) not in exact:
                    break
            else:
                try:
                    for i, ck in checks:
                        ck(vals[i])
                    out += pack(*run)
                    continue
                except (_struct.error, OverflowError, TypeError, ValueError):
                    pass
            for i in idx:
                one(i, vals, out)
    return enc_struct


_EXACT = frozenset((int, float, bool))


def _fused_runs(plan, rf):
    """(packer, field indexes, checks) for runs of non-bool fixed scalars;
    (None, (i,), ()) otherwise.  Checks: (index, exact packer) of each float
    field of the run unless ``rf`` (struct's packer rounds them)."""
    fast = []
    run = []

    def flush():
        if run:
            fmt = "<" + "".join(W.SCALAR_FORMAT[f.op][0] for _, f in run)
            exact = () if rf else tuple((i, _exact_check(f.op)) for i, f in run
                                        if f.op in (W.OP_F32, W.OP_F64))
            fast.append((_struct.Struct(fmt).pack, tuple(i for i, _ in run), exact))
            del run[:]
    for i, f in enumerate(plan.fields):
        if f.op in W.SCALAR_FORMAT and f.op != W.OP_BOOL:
            run.append((i, f))
        else:
            flush()
            fast.append((None, (i,), ()))
    flush()
    return tuple(fast)


def _exact_check(op):
    pack = pack_scalar(op, False)
    if op == W.OP_F64:
        def check_f64(v):
            if type(v) is not float:
                pack(v)
        return check_f64
    return pack


def _values_getter(plan):
    """``values_of(v, out)``: the field values of an instance or a mapping, in order."""
    names, get, cls, nf = plan.names, plan.get, plan.cls, len(plan.names)
    key_set = frozenset(names)
    if nf == 1:
        one = operator.itemgetter(names[0])

        def item_get(v):
            return (one(v),)
    elif nf == 0:
        def item_get(v):
            return ()
    else:
        item_get = operator.itemgetter(*names)

    def values_of(v, out):
        if cls is not None and isinstance(v, cls):
            return get(v)
        if getattr(v, "keys", None) is None or not hasattr(v, "__getitem__"):
            want = cls.__qualname__ if cls is not None else "a mapping"
            raise EncodeError("TYPE", len(out), "expected %s for %s, got %s"
                              % (want, plan.text, type_name(v)))
        try:
            vals = item_get(v)
        except KeyError:
            raise missing_field(v, names, len(out)) from None
        if len(v) != nf:
            raise unknown_fields(v, key_set, plan.text, len(out))
        return vals
    return values_of


_BUILDERS = {
    W.OP_STR: _str, W.OP_BYTES: _bytes, W.OP_PODLIST: _podlist, W.OP_OPT: _opt,
    W.OP_LIST: _list, W.OP_DICT: _dict, W.OP_STRUCT: _struct_enc, W.OP_TENSORS: _tensors,
    W.OP_CONV: _conv,
}


class EncodeProgram:
    """A plan compiled for encoding."""

    __slots__ = ("plan", "frame_hash", "round_floats", "_enc", "_prefix")

    def __init__(self, plan, frame_hash, round_floats=False):
        self.plan = plan
        self.frame_hash = frame_hash
        self.round_floats = bool(round_floats)
        self._enc = build(plan, self.round_floats)
        self._prefix = None if frame_hash is None else W.FRAME.pack(W.FRAME_MAGIC, 0, 0, 0,
                                                                    frame_hash)

    def encode(self, value):
        out = bytearray()
        if self._prefix is not None:
            out += self._prefix
        self._enc(value, out)
        return bytes(out)

    def encode_marked(self, value):
        """``encode(value)`` and the offset in it of the first tensor
        directory with payload bytes (-1 for none)."""
        out = Marked()
        if self._prefix is not None:
            out += self._prefix
        self._enc(value, out)
        return bytes(out), out.first_dir

    def encode_into(self, value, buffer, offset=0):
        if type(buffer) is not bytearray:
            raise TypeError("encode_into needs a bytearray, not %s" % type_name(buffer))
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


def compile_encoder(plan, frame_hash, round_floats=False):
    return EncodeProgram(plan, frame_hash, round_floats)
