"""Decoding while the input changes underneath (issue 11, part 2): the harness.

Used by tests/test_shared_mutation.py (under a second per field) and by
tools/mutation-stress.py (minutes per field).  One *run* targets one field of
a valid input:

``fork`` mode
    The input sits in an anonymous ``MAP_SHARED`` mmap made before ``fork()``.
    The forked child flips the field between its valid value and hostile
    values in a tight loop while the parent decodes the mmap again and again.
``thread`` mode
    The input is a ``bytearray``; a second thread does the flipping.  Only
    meaningful on a free-threaded build with the GIL off.

A directory is decoded alternately as views of the input and with
``copy=True``.  Every decode must end in a result or a ``kiln.KilnError``.
A result must be exactly what was written: the tensor names are among the
names written (a
name with a byte from outside the buffer is reported as such), every payload
view has the length its dtype and shape call for and lies inside the input,
and metadata, payload bytes and record values equal the originals.  (No
hostile value below, nor any byte-wise mix of it with the valid value, makes
a valid input, so a result can only come from a consistent read of the valid
bytes.)

Each run happens in a *worker* subprocess (``run_worker``) so that a SIGSEGV
or SIGBUS fails the run instead of killing the caller.  The worker kills and
reaps its child in a ``finally`` block; the child also dies with its parent
(PR_SET_PDEATHSIG on Linux, a parent-pid check elsewhere) and stops by itself
after a deadline, and ``run_worker`` kills any child still alive after the
worker ended.
"""

import collections
import gc
import json
import mmap
import os
import signal
import struct
import subprocess
import sys
import threading
import time
import uuid
import warnings

import numpy as np

import kiln

HERE = os.path.dirname(os.path.abspath(__file__))

_prctl = None
if sys.platform.startswith("linux"):
    try:  # looked up here: the forked child calls it and imports nothing
        import ctypes
        _prctl = ctypes.CDLL(None).prctl
    except Exception:  # noqa: BLE001 - the child's parent-pid check still applies
        _prctl = None

# ---------------------------------------------------------------------------
# the inputs

HEADER = 64
DESC = 128
# descriptor field offsets (spec/kiln-v2.md 6.3)
D_DTYPE, D_RANK, D_NAME_OFF, D_NAME_LEN = 0, 2, 4, 6
D_SCALE, D_OFFSET, D_LENGTH, D_SHAPE = 24, 32, 40, 48

WIDTH = {"f64": 8, "f32": 4, "f16": 2, "bf16": 2, "f8e4m3": 1, "f8e5m2": 1, "bool": 1,
         "i8": 1, "u8": 1, "i16": 2, "u16": 2, "i32": 4, "u32": 4, "i64": 8, "u64": 8,
         "i4": 0, "u4": 0, "e2m1": 0, "e8m0": 1}


def payload_length(dtype, shape):
    """The payload byte length a closed dtype and a shape call for."""
    n = 1
    for d in shape:
        n *= d
    w = WIDTH[dtype]
    return (n + 1) // 2 if w == 0 else n * w


def directory_tensors():
    """Fourteen named tensors: mixed dtypes, packed nibbles, bool, both quantization schemes.

    Only ``h.w.scale`` has two elements, so no other tensor can stand in as
    the scale of ``h.w`` (index 6).  The bool tensor is last: its payload ends
    at the end of the buffer and its name at the end of the heap.
    """
    T = kiln.Tensor
    return [
        T.from_numpy(np.arange(15, dtype=np.float32).reshape(3, 5) + 0.5, "a.f32"),
        T(kiln.pack_nibbles([1, 2, 3, 4, 5]), dtype="u4", shape=[5], name="c.u4"),
        T(kiln.pack_nibbles([-1, 7, -8, 0, 3, -2]), dtype="i4", shape=[6], name="d.i4"),
        T.from_numpy(np.array([[1, -2], [3, -4]], np.int64), "e.i64"),
        T.from_numpy(np.array([1.0, 2.0, -0.5, 65504.0], np.float16), "f.f16"),
        T.from_numpy(np.arange(10, dtype=np.uint8) * 3, "g.u8"),
        T(bytes(range(7, 39)), dtype="e2m1", shape=[2, 32], name="h.w", quant_scheme=1,
          quant_axis=1, group_size=32, scale_index="h.w.scale"),
        T(b"\x7f\x80", dtype="e8m0", shape=[2], name="h.w.scale"),
        T(bytes(range(32)), dtype="i8", shape=[4, 8], name="i.q", quant_scheme=2, quant_axis=1,
          group_size=4, scale_index="i.q.scale", outer_index="i.q.outer"),
        T.from_numpy(np.linspace(0.5, 4.0, 8).astype(np.float16), "i.q.scale"),
        T.from_numpy(np.array([0.25], np.float32), "i.q.outer"),
        T(b"\x80\x3f\x00\x40\x40\xc0", dtype="bf16", shape=[3], name="j.bf16"),
        T.from_numpy(np.arange(6, dtype=np.uint16).reshape(2, 3) * 1000, "k.ünï"),
        T.from_numpy(np.array([1, 0, 1, 1, 0, 0, 1], bool), "z.bool-énd"),
    ]


RECORD_TYPE = kiln.parse_type(
    "struct{id:i64,vals:list<i32>,tags:list<str>,attrs:dict<str,i64>,note:str,}")
RECORD_VALUE = {
    "id": -7,
    "vals": [3, -1, 4, 1, -5, 9, 2],
    "tags": ["alpha", "", "γάμμα", "delta"],
    "attrs": {"depth": 12, "width": -3, "ü": 1},
    "note": "the last field ends the buffer",
}


class Inputs:
    """The encoded inputs and what a correct decode of them returns."""

    def __init__(self):
        ts = directory_tensors()
        self.directory = kiln.encode_tensors(ts)
        # links by name are indexes once encoded: take the metadata from a decode
        from kiln import _kernels_py
        ref = kiln.Decoder(kiln.tensors, kernels=_kernels_py).decode(self.directory)
        self.meta = [(t.name, t.dtype, t.shape, t.scale_index, t.outer_index) for t in ref.values()]
        assert [m[0] for m in self.meta] == [t.name for t in ts]
        del ref
        self.names = frozenset(t.name for t in ts)
        self.payloads = [bytes(t.data) for t in ts]
        self.index = {t.name: i for i, t in enumerate(ts)}
        self.record = kiln.encode(RECORD_VALUE, RECORD_TYPE, frame=True)
        if len(self.record) >= 256:  # a torn count has a nonzero high byte: >= 256 items
            raise AssertionError("the record must stay under 256 bytes")
        # absolute offsets of the record's length words
        p = 16 + 8
        self.rec_vals = p
        p += len(kiln.encode(RECORD_VALUE["vals"], "list<i32>"))
        self.rec_tags = p
        p += len(kiln.encode(RECORD_VALUE["tags"], "list<str>"))
        self.rec_attrs = p
        p += len(kiln.encode(RECORD_VALUE["attrs"], "dict<str,i64>"))
        self.rec_note = p
        assert p + 4 + len(RECORD_VALUE["note"].encode()) == len(self.record)

    def desc(self, name):
        return HEADER + DESC * self.index[name]


Field = collections.namedtuple("Field", "name target offset fmt hostile doc")


def _keep_low_byte(v, highs):
    """Hostile u32 values that share the valid value's low byte: any byte-wise
    mix of them with the valid value is either valid or at least 256."""
    return [(v & 0xFF) | h for h in highs]


def fields(inp):
    """Every target field: name -> Field (hostile is a function of the valid value)."""
    a = inp.desc("a.f32")
    hw = inp.desc("h.w")
    last = inp.desc("z.bool-énd")
    big_u32 = (0xFFFFFF00, 0x01000000, 0x00100000, 0x80000000)
    out = [
        Field("header.count", "dir", 8, "<I",
              lambda v: [v + 1, v - 1, 0, 0xFFFFFFFF, (1 << 24) + 1], "tensor_count (hdr+8)"),
        Field("header.name_bytes", "dir", 12, "<I",
              lambda v: [v + 1, v - 1, 0, 0xFFFFFFFF, (1 << 24) + 1], "name_bytes (hdr+12)"),
        Field("desc.dtype", "dir", a + D_DTYPE, "<H",
              lambda v: [0, 1, 7, 16, 20, 4096, 0xFFFF], "dtype of a.f32 (d+0)"),
        Field("desc.rank", "dir", a + D_RANK, "<B",
              lambda v: [0, 1, 3, 8, 9, 255], "rank of a.f32 (d+2)"),
        Field("desc.shape", "dir", a + D_SHAPE + 8, "<Q",
              lambda v: [0, v + 1, 1 << 62, 0xFFFFFFFFFFFFFFFF], "shape[1] of a.f32 (d+56)"),
        Field("desc.name_off", "dir", last + D_NAME_OFF, "<H",
              lambda v: [v + 1, v - 1, 0, 0xFFFE, 0xFFFF], "name_off of the last tensor (d+4)"),
        Field("desc.name_len", "dir", last + D_NAME_LEN, "<H",
              lambda v: [v + 1, v - 1, 0, 0x7FFF, 0xFFFF], "name_len of the last tensor (d+6)"),
        Field("desc.byte_offset", "dir", last + D_OFFSET, "<Q",
              lambda v: [v + 1, v + 64, 0, 1 << 40, 0xFFFFFFFFFFFFFFC0],
              "byte_offset of the last (bool) tensor (d+32)"),
        Field("desc.byte_length", "dir", last + D_LENGTH, "<Q",
              lambda v: [v + 1, v - 1, 0, 1 << 40, 0xFFFFFFFFFFFFFFFF],
              "byte_length of the last (bool) tensor (d+40)"),
        Field("desc.scale_index", "dir", hw + D_SCALE, "<I",
              lambda v: [inp.index["h.w"], len(inp.meta), 0, 0xFFFFFFFE, 0xFFFFFFFF],
              "scale_index of h.w (d+24)"),
        Field("record.list_count", "rec", inp.rec_vals, "<I",
              lambda v: _keep_low_byte(v, big_u32), "count of a list<i32>"),
        Field("record.strlist_count", "rec", inp.rec_tags, "<I",
              lambda v: _keep_low_byte(v, big_u32), "count of a list<str>"),
        Field("record.dict_count", "rec", inp.rec_attrs, "<I",
              lambda v: _keep_low_byte(v, big_u32), "count of a dict<str,i64>"),
        Field("record.str_len", "rec", inp.rec_note, "<I",
              lambda v: _keep_low_byte(v, big_u32), "length of the last str"),
    ]
    return {f.name: f for f in out}


_INPUTS = Inputs()
FIELDS = fields(_INPUTS)
FIELD_NAMES = list(FIELDS)

# ---------------------------------------------------------------------------
# checking one outcome



def _view_of(t):
    """The array that views a tensor's payload: ``numpy()``, or for a 4-bit
    tensor (whose ``numpy()`` is an unpacked copy) its packed ``bits()``."""
    return t.bits() if t.dtype in ("i4", "u4", "e2m1") else t.numpy()

class Checker:
    """Checks a decoded result against the input, inside [lo, hi) of memory
    (``lo`` None: the result owns copies, which lie anywhere)."""

    def __init__(self, inp, target, lo, hi):
        self.inp, self.target, self.lo, self.hi = inp, target, lo, hi
        self.name_list = [m[0] for m in inp.meta]
        # per tensor: metadata, payload bytes, and payload length
        self.expect = [(m, p, len(p)) for m, p in zip(inp.meta, inp.payloads)]

    @staticmethod
    def _addr(view):
        return np.frombuffer(view, np.uint8).__array_interface__["data"][0]

    def _inside(self, view, what):
        if len(view) == 0 or self.lo is None:
            return None
        addr = self._addr(view)
        if not (self.lo <= addr and addr + len(view) <= self.hi):
            return "out-of-buffer: %s at 0x%x+%d lies outside the input [0x%x, 0x%x)" % (
                what, addr, len(view), self.lo, self.hi)
        return None

    def problem(self, res):
        """None for a correct result, else what is wrong with it."""
        if self.target != "dir":
            return self._rec(res)
        if self._dir_fast(res):
            return None
        return self._dir(res) or "mismatch: the result differs from what was written"

    def _dir_fast(self, d):
        """True when ``d`` is exactly what was written, in views inside [lo, hi):
        every check of ``_dir`` (which says what is wrong), done quickly."""
        if type(d) is not kiln.TensorDirectory or d.names != self.name_list:
            return False
        lo, hi = self.lo, self.hi
        frombuffer, may_share = np.frombuffer, np.may_share_memory
        for t, (meta, payload, n) in zip(d.values(), self.expect):
            data = t.data
            if len(data) != n or data != payload or \
                    (t.name, t.dtype, t.shape, t.scale_index, t.outer_index) != meta:
                return False
            arr = _view_of(t)
            if arr.nbytes != n:
                return False
            if n and lo is not None:
                # the array exactly; .data: same length and bytes, over the array
                a = arr.__array_interface__["data"][0]
                if not (lo <= a and a + n <= hi) or \
                        not may_share(frombuffer(data, np.uint8), arr):
                    return False
        return len(d) == len(self.expect)

    def _dir(self, d):
        inp = self.inp
        if not isinstance(d, kiln.TensorDirectory):
            return "mismatch: a %s, not a TensorDirectory" % type(d).__name__
        names = d.names
        for nm in names:
            if nm not in inp.names:
                return "out-of-buffer: tensor name %r was never written" % (nm,)
        if len(d) != len(inp.meta):
            return "mismatch: %d tensors, %d written" % (len(d), len(inp.meta))
        for i, t in enumerate(d.values()):
            data = t.data
            what = "tensor %d (%r)" % (i, t.name)
            if isinstance(t.dtype, str):
                need = payload_length(t.dtype, t.shape)
                if len(data) != need:
                    return "out-of-buffer: %s %s%s has %d payload bytes, needs %d" % (
                        what, t.dtype, list(t.shape), len(data), need)
            bad = self._inside(data, what + " .data")
            if bad:
                return bad
            arr = _view_of(t)
            if arr.nbytes != len(data):
                return "out-of-buffer: %s .numpy() spans %d bytes, .data %d" % (
                    what, arr.nbytes, len(data))
            if arr.nbytes:
                bad = self._inside(arr.reshape(-1).view(np.uint8), what + " .numpy()")
                if bad:
                    return bad
            meta = (t.name, t.dtype, t.shape, t.scale_index, t.outer_index)
            if meta != inp.meta[i]:
                return "mismatch: %s is %r, %r was written" % (what, meta, inp.meta[i])
            if bytes(data) != inp.payloads[i]:
                return "mismatch: %s payload differs from what was written" % what
        return None

    def _rec(self, r):
        want = RECORD_VALUE
        try:
            got = dict(r)
            got["vals"] = [int(x) for x in r["vals"]]
            strings = [got["note"]] + list(got["tags"]) + list(got["attrs"])
        except Exception as e:  # noqa: BLE001 - any shape problem is a mismatch
            return "mismatch: %r (%s)" % (r, e)
        for v in strings:
            if not isinstance(v, str) or v.encode("utf-8", "surrogateescape") not in \
                    self.inp.record:
                return "out-of-buffer: the string %r is nowhere in the input" % (v,)
        for k in want:
            if got.get(k) != want[k]:
                return "mismatch: field %s is %r, %r was written" % (k, got.get(k), want[k])
        if got != want:
            return "mismatch: %r" % (got,)
        return None


# ---------------------------------------------------------------------------
# the worker (runs in its own process)


def load_kernels(impl_name):
    if impl_name == "python":
        from kiln import _kernels_py
        return _kernels_py
    import importlib
    return importlib.import_module("kiln._kernels_c")


def make_decoders(target, kernels, inp, lo, hi):
    """(decoder, checker) pairs: a directory is decoded as views and as copies."""
    if target == "dir":
        return [(kiln.Decoder(kiln.tensors, kernels=kernels), Checker(inp, target, lo, hi)),
                (kiln.Decoder(kiln.tensors, kernels=kernels, copy=True),
                 Checker(inp, target, None, None))]
    return [(kiln.Decoder(RECORD_TYPE, frame=True, kernels=kernels),
             Checker(inp, target, lo, hi))]


class Stats:
    def __init__(self, field, impl_name, mode):
        self.field, self.impl, self.mode = field, impl_name, mode
        self.iterations = self.ok = self.kiln_error = 0
        self.codes = collections.Counter()
        self.failures = collections.Counter()  # kind -> count
        self.examples = []

    def fail(self, kind, msg):
        self.failures[kind] += 1
        if len(self.examples) < 10:
            self.examples.append(msg)
            print("FAIL %s" % msg, flush=True)  # visible even if a crash follows

    def as_dict(self):
        return {"field": self.field, "impl": self.impl, "mode": self.mode,
                "iterations": self.iterations, "ok": self.ok, "kiln_error": self.kiln_error,
                "codes": dict(self.codes), "failures": dict(self.failures),
                "examples": self.examples}


def _decode_once(dec, buf, check, stats):
    stats.iterations += 1
    try:
        res = dec.decode(buf)
    except kiln.KilnError as e:
        stats.kiln_error += 1
        stats.codes[e.code] += 1
        return
    except Exception as e:  # noqa: BLE001 - anything but KilnError is a failure
        stats.fail("other-exception", "%s: %s" % (type(e).__name__, e))
        return
    try:
        bad = check.problem(res)
    except Exception as e:  # noqa: BLE001
        bad = "other-exception: checking the result raised %s: %s" % (type(e).__name__, e)
    if bad is None:
        stats.ok += 1
    else:
        stats.fail(bad.split(":", 1)[0], bad)


# how long a run may go on past ``seconds`` to see both outcomes: a loaded
# machine may starve the writer for a while, which delays the run, never fails it
PATIENCE = 60.0


def _decode_loop(decs, buf, stats, seconds):
    """Decode until ``seconds`` passed and both outcomes were seen (at most
    PATIENCE seconds more).  Called once the writer has started writing."""
    start = time.monotonic()
    soft, hard = start + seconds, start + seconds + PATIENCE
    k = len(decs)
    while True:
        for i in range(16):
            dec, check = decs[i % k]
            _decode_once(dec, buf, check, stats)
        now = time.monotonic()
        if now >= hard or (now >= soft and stats.ok and stats.kiln_error):
            return


def _die_with_parent(parent):
    if _prctl is not None:
        _prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:
        os._exit(0)


def _flip(write, valid, hostile, stop, started):
    """Write hostile, valid, hostile, valid, ... until ``stop()``; ``started()``
    after the first round."""
    i = 0
    while True:
        for h in hostile:
            write(h)
            write(valid)
        if i == 0:
            started()
        i += 1
        if i & 255 == 0 and stop():
            return


def _field_bytes(f, data):
    size = struct.calcsize(f.fmt)
    valid_value = struct.unpack_from(f.fmt, data, f.offset)[0]
    valid = data[f.offset:f.offset + size]
    hostile = []
    for h in f.hostile(valid_value):
        hb = struct.pack(f.fmt, h)
        if hb == valid:
            raise AssertionError("%s: hostile value %d equals the valid one" % (f.name, h))
        hostile.append(hb)
    return valid, hostile


def _address(buf):
    a = np.frombuffer(buf, np.uint8)
    lo = a.ctypes.data
    del a
    return lo


def run_fork(field, seconds, impl_name):
    """Fork mode, in this process: returns a Stats."""
    inp = _INPUTS
    f = FIELDS[field]
    data = inp.directory if f.target == "dir" else inp.record
    stats = Stats(field, impl_name, "fork")
    m = mmap.mmap(-1, len(data), flags=mmap.MAP_SHARED)
    m[:] = data
    lo = _address(m)
    decs = make_decoders(f.target, load_kernels(impl_name), inp, lo, lo + len(data))
    valid, hostile = _field_bytes(f, data)
    a, b = f.offset, f.offset + len(valid)
    go = mmap.mmap(-1, 1, flags=mmap.MAP_SHARED)   # the child sets go[0] once it flips
    parent = os.getpid()
    child_deadline = time.monotonic() + seconds + PATIENCE + 60
    sys.stdout.flush()
    sys.stderr.flush()
    with warnings.catch_warnings():
        # 3.12+ warns about fork() in a process with (numpy's idle) threads; the
        # child takes no lock: it writes to the mmap and leaves with os._exit
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # the child: flip the field, never return into the caller
        try:
            _die_with_parent(parent)

            def write(x):
                m[a:b] = x

            def started():
                go[0] = 1

            _flip(write, valid, hostile,
                  lambda: time.monotonic() > child_deadline or os.getppid() != parent,
                  started)
        finally:
            os._exit(0)
    print("CHILD %d" % pid, flush=True)
    try:
        _wait_started(lambda: go[0] == 1, stats)
        _decode_loop(decs, m, stats, seconds)
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        go.close()
    print("CHILD-REAPED %d" % pid, flush=True)
    _final_checks(decs, m, stats, data)
    gc.collect()
    try:
        m.close()
    except BufferError as e:
        stats.fail("export-leak", "export-leak: the mmap cannot be closed after every "
                   "result is gone: %s" % e)
    return stats


def run_thread(field, seconds, impl_name):
    """Thread mode, in this process: a second thread flips the field of a bytearray."""
    inp = _INPUTS
    f = FIELDS[field]
    data = inp.directory if f.target == "dir" else inp.record
    stats = Stats(field, impl_name, "thread")
    ba = bytearray(data)
    lo = _address(ba)
    decs = make_decoders(f.target, load_kernels(impl_name), inp, lo, lo + len(data))
    valid, hostile = _field_bytes(f, data)
    a, b = f.offset, f.offset + len(valid)
    done = threading.Event()

    def write(x):
        ba[a:b] = x  # same size: allowed while exported, never moves the buffer

    flipping = threading.Event()
    th = threading.Thread(target=_flip, args=(write, valid, hostile, done.is_set, flipping.set),
                          daemon=True)
    th.start()
    try:
        _wait_started(flipping.is_set, stats)
        _decode_loop(decs, ba, stats, seconds)
    finally:
        done.set()
        th.join()
    _final_checks(decs, ba, stats, data)
    gc.collect()
    try:
        ba.clear()
    except BufferError as e:
        stats.fail("export-leak", "export-leak: the bytearray cannot be resized after every "
                   "result is gone: %s" % e)
    return stats


def _wait_started(is_started, stats):
    """Wait (at most PATIENCE seconds) until the writer has written every value once,
    so the decode loop's time runs while the field changes."""
    deadline = time.monotonic() + PATIENCE
    while not is_started():
        if time.monotonic() > deadline:
            stats.fail("harness", "harness: the writer did not start in %d s" % PATIENCE)
            return
        time.sleep(0.001)


def _final_checks(decs, buf, stats, data):
    """With the writer gone and the valid bytes restored, the input decodes."""
    buf[:] = data
    for dec, check in decs:
        try:
            bad = check.problem(dec.decode(buf))
        except Exception as e:  # noqa: BLE001
            bad = "the restored input does not decode: %s: %s" % (type(e).__name__, e)
        if bad is not None:
            stats.fail("harness", "harness: " + bad)


def worker_main(argv):
    """python -c '...worker_main(sys.argv[1:])' MODE FIELD SECONDS IMPL KILN_DIR TOKEN"""
    mode, field, seconds, impl_name, kiln_dir = argv[:5]
    here = os.path.dirname(os.path.abspath(kiln.__file__))
    if os.path.realpath(here) != os.path.realpath(kiln_dir):
        raise SystemExit("worker imported kiln from %s, the caller from %s" % (here, kiln_dir))
    if kiln.IMPLEMENTATION != impl_name:
        raise SystemExit("worker: kiln.IMPLEMENTATION is %r, wanted %r"
                         % (kiln.IMPLEMENTATION, impl_name))
    gil = getattr(sys, "_is_gil_enabled", lambda: True)()
    if mode == "thread" and gil:
        print("NOTE the GIL is enabled: the writer thread runs between bytecodes only",
              flush=True)
    run = run_fork if mode == "fork" else run_thread
    stats = run(field, float(seconds), impl_name)
    result = stats.as_dict()
    result["gil_enabled"] = bool(gil)
    print("RESULT " + json.dumps(result), flush=True)


# ---------------------------------------------------------------------------
# the caller's side


class WorkerResult:
    def __init__(self, args, returncode, timed_out, stdout, stderr, leftover):
        self.args, self.returncode, self.timed_out = args, returncode, timed_out
        self.stdout, self.stderr, self.leftover = stdout, stderr, leftover
        self.stats = None
        for line in stdout.splitlines():
            if line.startswith("RESULT "):
                self.stats = json.loads(line[7:])

    def problems(self, require_both=True):
        """What went wrong (an empty list when the run passed)."""
        out = []
        if self.timed_out:
            out.append("the worker did not finish in time (killed)")
        if self.returncode is not None and self.returncode < 0:
            try:
                nm = signal.Signals(-self.returncode).name
            except ValueError:
                nm = str(-self.returncode)
            out.append("the decoding process died of %s" % nm)
        elif self.returncode:
            out.append("the worker exited with status %d" % self.returncode)
        if self.leftover:
            out.append("a mutating child was still alive after the worker ended: %s"
                       % self.leftover)
        s = self.stats
        if s is None:
            if not out:
                out.append("the worker printed no RESULT line")
            return out
        for kind, n in sorted(s["failures"].items()):
            out.append("%d x %s" % (n, kind))
        if require_both and not (s["ok"] and s["kiln_error"]):
            out.append("the mutation was not observed: %d results, %d KilnErrors"
                       % (s["ok"], s["kiln_error"]))
        return out

    def report(self):
        lines = ["worker: %s" % " ".join(self.args[3:]),
                 "returncode: %s" % self.returncode]
        lines += ["problem: " + p for p in self.problems()]
        if self.stats:
            lines.append("stats: %s" % json.dumps({k: v for k, v in self.stats.items()
                                                  if k != "examples"}))
            lines += ["example: " + e for e in self.stats["examples"]]
        tail = [ln for ln in self.stdout.splitlines() if not ln.startswith("RESULT ")]
        lines += ["stdout: " + ln for ln in tail[-20:]]
        lines += ["stderr: " + ln for ln in self.stderr.splitlines()[-30:]]
        return "\n".join(lines)


def _gone(pid, token):
    """True when ``pid`` is no longer a process started with ``token`` in its argv."""
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as fh:
            cmd = fh.read()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return True
    except OSError:
        return True
    return token.encode() not in cmd  # a zombie has an empty cmdline; a reused pid another


def _kill_leftover(pid, token):
    """Kill the worker's child if it outlived the worker; True if it had to."""
    if not os.path.isdir("/proc"):
        return False  # elsewhere the child exits when it sees its parent gone
    if _gone(pid, token):
        return False
    for _ in range(100):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return True
        time.sleep(0.02)
        if _gone(pid, token):
            return True
    return True


def kiln_env(impl_name, base=None):
    env = dict(os.environ if base is None else base)
    env["KILN_PUREPYTHON"] = "1" if impl_name == "python" else "0"
    return env


def run_worker(mode, field, seconds, impl_name, *, python=None, timeout=None):
    """Run one field in a fresh worker process; returns a WorkerResult."""
    token = "kiln-mutation-worker-" + uuid.uuid4().hex
    kiln_dir = os.path.dirname(os.path.abspath(kiln.__file__))
    code = ("import sys; sys.path.insert(0, %r); import _mutation; "
            "_mutation.worker_main(sys.argv[1:])" % HERE)
    args = [python or sys.executable, "-c", code, mode, field, repr(float(seconds)),
            impl_name, kiln_dir, token]
    if timeout is None:
        timeout = seconds + 2 * PATIENCE + 60
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=kiln_env(impl_name), cwd=HERE)
    timed_out = False
    out = err = ""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        proc.kill()
        out, err = proc.communicate()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        leftover = []
        for line in (out or "").splitlines():
            if line.startswith("CHILD "):
                pid = int(line.split()[1])
                if _kill_leftover(pid, token):
                    leftover.append(pid)
    return WorkerResult(args, proc.returncode, timed_out, out or "", err or "", leftover)


def free_threaded():
    """True on a free-threaded build running with the GIL off."""
    f = getattr(sys, "_is_gil_enabled", None)
    return f is not None and not f()
