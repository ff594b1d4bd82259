"""Dicts changed while they are encoded (issue 28, point 3).

A mapping encoded as a struct, a dict or a tensors value may run code while
it is read (its own ``__getitem__``, a key's ``__hash__`` or ``encode``) or be
changed by another thread.  Whatever it does, only a ``kiln.EncodeError``
(with the path to the value) may come out, in both kernels: no
``IndexError``, no ``RuntimeError: dictionary changed size during iteration``,
no ``unknown fields []``.
"""

import threading

import numpy as np
import pytest

import kiln

AB = "struct{a:i32,b:i32,}"


class Flicker(dict):
    """Loses its field "b" while it is read, and has it again right after."""

    def __getitem__(self, k):
        if k == "b" and not getattr(self, "done", False):
            self.done = True
            v = dict.pop(self, "b")
            try:
                return dict.__getitem__(self, "b")   # KeyError
            finally:
                dict.__setitem__(self, "b", v)
        return dict.__getitem__(self, k)


class Grower:
    """A key whose __hash__, once armed, adds keys to its dict."""

    def __init__(self, d):
        self.d, self.armed, self.n = d, False, 0

    def __hash__(self):
        if self.armed:
            self.n += 1
            self.d["grown%d" % self.n] = 0
        return 12345

    def __repr__(self):
        return "Grower()"


class SneakyKey(str):
    """A str key whose encode() adds a key to the mapping being encoded."""

    target = None

    def encode(self, *a, **k):
        if SneakyKey.target is not None:
            SneakyKey.target["zz-%d" % len(SneakyKey.target)] = np.zeros(1, np.float32)
        return str.encode(self, *a, **k)


def encode_error(impl, v, t):
    with pytest.raises(kiln.KilnError) as e:
        impl.encode(v, t)
    assert type(e.value) is kiln.EncodeError, repr(e.value)
    return e.value


def test_a_field_missing_then_back_is_an_encode_error(impl):
    e = encode_error(impl, Flicker(a=1, b=2), AB)
    assert (e.code, e.offset) == ("TYPE", 0)
    assert "changed" in e.reason
    e = encode_error(impl, {"r": Flicker(a=1, b=2)}, "struct{r:%s,}" % AB)
    assert e.path == ".r"


def test_a_key_that_grows_its_dict_while_unknown_fields_are_listed(impl):
    d = {"a": 1, "b": 2}
    g = Grower(d)
    d[g] = 3
    g.armed = True
    e = encode_error(impl, d, AB)
    assert (e.code, e.offset) == ("TYPE", 0)
    assert "unknown fields" in e.reason and "Grower()" in e.reason
    d2 = {"a": 1, "b": 2}
    g2 = Grower(d2)
    d2[g2] = 3
    g2.armed = True
    e = encode_error(impl, [{"a": 5, "b": 6}, d2], "list<%s>" % AB)
    assert e.path == "[1]" and e.offset == 4 + 8


def test_unknown_fields_of_mixed_types_are_listed(impl):
    e = encode_error(impl, {"a": 1, "b": 2, 3: 0, "c": 0}, AB)
    assert e.reason.startswith("unknown fields [") and "'c'" in e.reason and "3" in e.reason


def test_values_whose_encoding_grows_the_dict(impl):
    # every field is read before any is encoded: the value as it was
    d = {"b": 2}

    class Idx:
        def __index__(self):
            d["c"] = 0
            return 1
    d["a"] = Idx()
    assert impl.encode(d, AB) == b"\x01\x00\x00\x00\x02\x00\x00\x00"
    m = {"x": 7}

    class Flt:
        def __float__(self):
            m["y%d" % len(m)] = 1.0
            return 0.5
    m["w"] = Flt()
    assert impl.encode(m, "dict<str,f64>") == impl.encode({"w": 0.5, "x": 7.0}, "dict<str,f64>")


def test_a_dict_subclass_whose_key_encode_grows_it(impl):
    class D(dict):
        pass
    d = D()
    d[SneakyKey("k")] = 1
    d["j"] = 2
    SneakyKey.target = d
    try:
        got = impl.encode(d, "dict<str,i32>")
    except kiln.EncodeError:
        got = None
    finally:
        SneakyKey.target = None
    assert got in (None, impl.encode({"j": 2, "k": 1}, "dict<str,i32>"))


def test_a_tensors_dict_whose_key_encode_grows_it(impl):
    ts = {SneakyKey("a"): np.arange(3, dtype=np.float32), "b": np.ones(2, np.int8)}
    SneakyKey.target = ts
    try:
        got = impl.encode_tensors(ts)
    except kiln.EncodeError as e:
        got = e
    finally:
        SneakyKey.target = None
    if not isinstance(got, kiln.EncodeError):
        d = impl.decode_tensors(got)
        assert d.names == ["a", "b"]


def hammer(impl, value, t, mutate, seconds=0.5):
    """Encode ``value`` while a thread keeps changing it; the outcomes seen."""
    stop = threading.Event()
    enc = impl.encoder(t)

    def run():
        while not stop.is_set():
            mutate()
    th = threading.Thread(target=run, daemon=True)
    seen = set()
    import time
    th.start()
    try:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for _ in range(50):
                try:
                    enc.encode(value)
                    seen.add("ok")
                except kiln.EncodeError:
                    seen.add("EncodeError")
                except Exception as e:  # noqa: BLE001 - reported below
                    seen.add("%s: %s" % (type(e).__name__, e))
    finally:
        stop.set()
        th.join()
    return seen


def test_a_struct_dict_changed_by_another_thread(impl):
    d = Flicker(a=1, b=2)
    d.done = True   # (a plain dict subclass here)

    def mutate():
        d["c"] = 0
        del d["c"]
        d.pop("b", None)
        d["b"] = 2
    seen = hammer(impl, d, AB, mutate)
    assert seen <= {"ok", "EncodeError"}, seen


def test_a_tensors_dict_changed_by_another_thread(impl):
    ts = {"t%02d" % i: np.full(2, i, np.float32) for i in range(30)}

    def mutate():
        ts["zz"] = np.zeros(1, np.int8)
        del ts["zz"]
    seen = hammer(impl, ts, kiln.tensors, mutate)
    assert seen <= {"ok", "EncodeError"}, seen
