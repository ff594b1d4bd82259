"""Decoding an input that another process (or thread) rewrites meanwhile (issue 11, part 2).

A forked child flips one field of a valid tensor directory or framed record,
held in an anonymous ``MAP_SHARED`` mmap, between its valid value and hostile
ones, while the parent decodes it in a loop; every outcome must be a correct
result or a ``KilnError`` (see tests/_mutation.py for the fields, the hostile
values and the checks).  The parent loop runs in a worker subprocess, so a
SIGSEGV or SIGBUS fails the test instead of the run; the worker kills and
reaps its child in a ``finally`` block, and the test kills any child left
behind.

About 0.8 s per field and implementation (KILN_MUTATION_SECONDS changes
it), counted from when the writer has started; a loaded machine makes a run
longer (up to _mutation.PATIENCE more), not failed.  tools/mutation-stress.py
runs the same harness for minutes per field.

The directory holds bf16 and e8m0 tensors, whose ``.numpy()`` the checker
compares: without ml_dtypes the directory cases skip (naming it) and the
record cases still run.
"""

import importlib.util
import mmap
import os
import struct
import sys

import pytest

import kiln
import _mutation

SECONDS = float(os.environ.get("KILN_MUTATION_SECONDS", "0.8"))

needs_fork = pytest.mark.skipif(
    not hasattr(os, "fork") or not hasattr(mmap, "MAP_SHARED"),
    reason="needs os.fork() and an anonymous MAP_SHARED mmap (POSIX)")
needs_ml = pytest.mark.skipif(
    importlib.util.find_spec("ml_dtypes") is None,
    reason="ml_dtypes is not installed (pip install 'kiln-wire[ml]'): the directory's bf16 "
           "and e8m0 tensors have no numpy form to check without it")


def _fields():
    """The field names, the directory's marked as needing ml_dtypes."""
    return [pytest.param(f, marks=needs_ml) if _mutation.FIELDS[f].target == "dir" else f
            for f in _mutation.FIELD_NAMES]


def test_the_harness_knows_the_layout():
    # the targeted fields hold what spec/kiln-v2.md 6.2/6.3 say they hold
    inp = _mutation.Inputs()
    d = inp.directory
    assert d[:4] == b"KLNT" and d[4] == 2
    count, name_bytes = struct.unpack_from("<II", d, 8)
    assert count == len(inp.meta) == 14
    assert struct.unpack_from("<Q", d, 24)[0] == 128 * count + name_bytes
    last = inp.desc("z.bool-énd")
    heap = 64 + 128 * count
    off, ln = struct.unpack_from("<HH", d, last + 4)
    assert d[heap + off:heap + off + ln] == "z.bool-énd".encode()
    assert off + ln == name_bytes  # its name ends the heap
    base = (64 + 128 * count + name_bytes + 63) // 64 * 64
    boff, blen = struct.unpack_from("<QQ", d, last + 32)
    assert (blen, base + boff + blen) == (7, len(d))  # its payload ends the buffer
    a = inp.desc("a.f32")
    assert struct.unpack_from("<HB", d, a) == (2, 2)
    assert struct.unpack_from("<QQ", d, a + 48) == (3, 5)
    assert struct.unpack_from("<I", d, inp.desc("h.w") + 24)[0] == inp.index["h.w.scale"]
    r = inp.record
    assert struct.unpack_from("<I", r, inp.rec_vals)[0] == len(_mutation.RECORD_VALUE["vals"])
    assert struct.unpack_from("<I", r, inp.rec_tags)[0] == len(_mutation.RECORD_VALUE["tags"])
    assert struct.unpack_from("<I", r, inp.rec_attrs)[0] == len(_mutation.RECORD_VALUE["attrs"])
    assert struct.unpack_from("<I", r, inp.rec_note)[0] == \
        len(_mutation.RECORD_VALUE["note"].encode())


@needs_ml
def test_the_checker_catches_a_wrong_directory(impl):
    # a directory with a foreign name, or a view outside [lo, hi), is reported
    inp = _mutation.Inputs()
    d = impl.decode_tensors(inp.directory)
    lo = _mutation._address(inp.directory)
    ok = _mutation.Checker(inp, "dir", lo, lo + len(inp.directory))
    assert ok.problem(d) is None
    assert ok.problem(impl.decode_tensors(bytearray(inp.directory))).startswith("out-of-buffer")
    other = impl.encode_tensors({"q": kiln.Tensor(b"\0", dtype="u8", shape=[1])})
    assert "never written" in ok.problem(impl.decode_tensors(other))


def test_the_checker_catches_a_wrong_record(impl):
    inp = _mutation.Inputs()
    rec = _mutation.Checker(inp, "rec", 0, 0)
    v = impl.decode(inp.record, _mutation.RECORD_TYPE, frame=True)
    assert rec.problem(v) is None
    assert rec.problem(dict(v, note="x" * 40)).startswith("out-of-buffer")
    assert rec.problem(dict(v, note="the last")).startswith("mismatch")


@needs_fork
@pytest.mark.parametrize("field", _fields())
def test_decoding_while_another_process_rewrites_a_field(impl, field):
    r = _mutation.run_worker("fork", field, SECONDS, impl.name)
    assert not r.problems(), r.report()


FREE_THREADED = _mutation.free_threaded()


@pytest.mark.skipif(not FREE_THREADED,
                    reason="needs a free-threaded CPython with the GIL off "
                           "(sys._is_gil_enabled() is %s here): with the GIL a second "
                           "thread cannot write while the kernel runs"
                           % (sys._is_gil_enabled() if hasattr(sys, "_is_gil_enabled")
                              else "missing"))
@pytest.mark.parametrize("field", _fields())
def test_decoding_while_another_thread_rewrites_a_bytearray(impl, field):
    r = _mutation.run_worker("thread", field, SECONDS, impl.name)
    assert not r.problems(), r.report()
    assert r.stats["gil_enabled"] is False, "the worker ran with the GIL on:\n" + r.report()
