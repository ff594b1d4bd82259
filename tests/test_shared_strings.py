"""Strings, dict keys and names decoded from a buffer someone else rewrites
(issue 26, point 1).

CPython's UTF-8 decoder reads its input more than once; both kernels decode
every string from a private copy of its bytes.  The harness is
tests/_text_mutation.py (2 s with the mmap, 1 s with the bytearray, per
kernel; KILN_TEXT_MUTATION_SECONDS changes it, tools/text-mutation-stress.py
runs it for longer).
"""

import mmap
import os

import pytest

import kiln
import _text_mutation as tm

SECONDS = float(os.environ.get("KILN_TEXT_MUTATION_SECONDS", "2"))


def test_the_harness_knows_the_layout(impl):
    data, where = tm.layout()
    assert impl.decode(data, tm.TYPE) == tm.value()
    assert len(where) == 5 * tm.RECORDS
    assert where[0][0] % 8 != 0 and where[1][0] % 8 != 0   # the long strings: not aligned
    # every mix of the variants that decodes is a whole variant's bytes or a
    # valid mix, and each valid variant decodes to itself
    for j in range(4):
        buf = bytearray(data)
        for off, slot in where:
            v = tm.VALID[slot][j % len(tm.VALID[slot])].encode()
            buf[off:off + len(v)] = v
        assert impl.decode(buf, tm.TYPE) == tm.value(j)


def test_the_checker_catches_invalid_and_foreign_strings():
    loose, exact = tm.Checker(False), tm.Checker(True)
    assert loose.string("long", "a" * 300) is None and exact.string("long", "é" * 150) is None
    mix = "a" * 100 + "é" * 100
    assert loose.string("long", mix) is None      # a torn read: each byte was written there
    assert "never written" in exact.string("long", mix)
    assert "never written there" in loose.string("long", "b" * 300)
    assert "written" in loose.string("mixed", "m" * 89)
    assert loose.string("one", "\x00").startswith("byte 0")


@pytest.mark.skipif(not hasattr(os, "fork") or not hasattr(mmap, "MAP_SHARED"),
                    reason="needs os.fork() and an anonymous MAP_SHARED mmap (POSIX)")
def test_strings_of_an_mmap_another_process_rewrites(impl):
    rc, stats, out = tm.run_worker("fork", SECONDS, impl.name)
    assert rc == 0 and stats is not None, out[-3000:]
    assert stats["failures"] == [], out[-3000:]
    assert stats["final"] is None
    assert stats["ok"] + stats["kiln_error"] == stats["decodes"] > 0


def test_strings_of_a_bytearray_another_thread_rewrites(impl):
    # with the GIL the writer runs between the decoder's bytecodes only; a
    # free-threaded build runs both at once
    rc, stats, out = tm.run_worker("thread", SECONDS / 2, impl.name)
    assert rc == 0 and stats is not None, out[-3000:]
    assert stats["failures"] == [], out[-3000:]
    assert stats["final"] is None
    assert stats["ok"] > 0


def test_one_byte_and_long_strings_of_a_bytearray(impl):
    # the copy is what is decoded: the same values as from bytes
    data, _ = tm.layout()
    assert impl.decode(bytearray(data), tm.TYPE) == impl.decode(bytes(data), tm.TYPE)
    big = "€" * 5000 + "x"    # beyond the stack buffer: a heap copy
    for t in ("str", "list<str>"):
        v = big if t == "str" else [big, "é", "q", ""]
        buf = kiln.encode(v, t)
        assert impl.decode(bytearray(buf), t) == v
        assert impl.decode(memoryview(buf), t) == v
    with pytest.raises(kiln.KilnError) as e:
        impl.decode(bytearray(kiln.encode("é" * 3000, "str")[:-1]) + b"!", "str")
    assert e.value.code == "UTF8" and e.value.offset == 4 + 5998
