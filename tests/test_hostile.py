"""Hostile inputs: each named input gives its exact code in both implementations,
the reference decoder agrees, and rejecting it allocates at most 64 KiB
beyond the input whatever the claimed count."""

import tracemalloc

import pytest

import kiln
from _util import kiln_ref, run_in_threads
from hostile_table import TABLE

BUDGET = 64 * 1024


def _ref_code(h):
    try:
        kiln_ref.decode(h.buf, h.type, False, max_count=h.opts.get("max_count", 16777216),
                        max_bytes=h.opts.get("max_bytes", 16777216))
    except kiln_ref.RefError as e:
        return e.code
    return None


def test_table_size():
    assert len(TABLE) >= 150
    assert len({h.name for h in TABLE}) == len(TABLE)


@pytest.mark.parametrize("h", TABLE, ids=[h.name for h in TABLE])
def test_hostile(impl, h):
    if h.code == "DEPTH":
        with pytest.raises(kiln.KilnError) as ei:
            impl.decoder(kiln.parse_type(h.type))
        assert ei.value.code == "DEPTH"
        return
    assert _ref_code(h) == h.code, "the reference decoder disagrees with the table"
    dec = impl.decoder(kiln.parse_type(h.type), **h.opts)
    if h.code is None:
        dec.decode(h.buf)
        return
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        with pytest.raises(kiln.KilnError) as ei:
            dec.decode(h.buf)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert ei.value.code == h.code, str(ei.value)
    budget = BUDGET
    if h.name.endswith("-short"):
        # the elements really present before the fault are decoded into Python
        # objects (up to ~12x their wire size); the claimed count adds nothing
        budget += 12 * len(h.buf)
    assert peak <= budget, "rejecting %s allocated %d bytes" % (h.name, peak)


def test_concurrent_decoding_is_consistent(impl):
    import numpy as np
    t = kiln.parse_type("struct{id:i64,names:list<str>,batch:tensors,}")
    value = {"id": 5, "names": ["a", "bé"] * 50,
             "batch": {"w": np.arange(1000, dtype=np.float32), "b": np.ones(3, bool)}}
    buf = impl.encode(value, t)
    bad = buf[:-1]
    dec = impl.decoder(t)

    def work():
        for _ in range(200):
            out = dec.decode(buf)
            assert out["names"] == value["names"]
            assert out["batch"]["w"].numpy()[999] == 999
            try:
                dec.decode(bad)
            except kiln.KilnError as e:
                assert e.code == "EOF"
            else:
                raise AssertionError("accepted a short buffer")
    run_in_threads(work)
