"""A bytearray resized by other code while kiln decodes it or encodes into
it (issue 28, point 5; docs/threads.md, "encode_into and shared bytearrays").

A decode holds one buffer export for its whole run, so code that runs during
the decode (here a class's __post_init__, run for every record) cannot
resize the buffer under it.  encode_into's steps on the buffer are critical
sections on a free-threaded build (not testable on a GIL build: there they
are nothing); with threads and the GIL every call still ends in a correct
buffer or an error, never a write past the end.
"""

import dataclasses
import sys
import sysconfig
import threading

import pytest

import kiln


@dataclasses.dataclass
class Rec:
    id: int
    name: str

    def __post_init__(self):
        try:
            Rec.buf.extend(b"x" * 4096)     # would move the buffer under the decode
            Rec.tried.append("resized")
        except BufferError:
            Rec.tried.append("BufferError")


def test_a_decode_holds_its_export_for_the_whole_run(impl):
    t = kiln.list_(kiln.struct({"id": kiln.i64, "name": kiln.str_}))
    dec = impl.decoder(kiln.list_(Rec))
    buf = bytearray(kiln.encode([{"id": i, "name": "n%d" % i * 20} for i in range(50)], t))
    Rec.buf, Rec.tried = buf, []
    out = dec.decode(buf)
    assert Rec.tried == ["BufferError"] * 50
    assert [(r.id, r.name) for r in out] == [(i, "n%d" % i * 20) for i in range(50)]
    buf.extend(b"!")      # no export left once the decode returned
    del Rec.buf


# CPython 3.13t's bytearray takes no locks (3.14 added them, python/cpython
# gh-129107): a resize beside any other bytearray write crashes CPython itself,
# with or without kiln, so this case is only meaningful on 3.14t and on GIL builds
_UNLOCKED_BYTEARRAY = bool(sysconfig.get_config_var("Py_GIL_DISABLED")) and \
    sys.version_info < (3, 14)


@pytest.mark.skipif(_UNLOCKED_BYTEARRAY, reason="free-threaded CPython 3.13's bytearray "
                    "has no locks (fixed in 3.14): resizing it beside a write crashes "
                    "CPython without kiln")
def test_encode_into_from_threads_with_one_resizer(impl):
    enc = impl.encoder("list<str>")
    value = ["abc" * 10] * 20
    want = kiln.encode(value, "list<str>")
    shared = bytearray(b"head")
    stop = threading.Event()
    bad = []

    def resize():
        while not stop.is_set():
            try:
                shared.extend(b"y" * 64)
                del shared[4:]
            except BufferError:
                pass

    def write():
        for _ in range(300):
            try:
                end = enc.encode_into(value, shared, 4)
            except RuntimeError as e:
                if "changed size" not in str(e):
                    bad.append(repr(e))
                continue
            except BufferError:
                continue
            if end != 4 + len(want):
                bad.append(end)

    r = threading.Thread(target=resize)
    ws = [threading.Thread(target=write) for _ in range(3)]
    r.start()
    for w in ws:
        w.start()
    for w in ws:
        w.join()
    stop.set()
    r.join()
    assert bad == []
    end = enc.encode_into(value, shared, 4)
    assert bytes(shared) == b"head" + want and end == len(shared)
