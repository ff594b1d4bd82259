"""Values that change while they are being encoded, from Python code the
encoder calls or from other threads.

The encoder never crashes or writes a torn length: it either raises a
TYPE error (a sequence whose length no longer matches the count it wrote) or
writes bytes that decode to one consistent snapshot.  On a free-threaded build
(``sys._is_gil_enabled()`` false) the thread tests run with real parallelism.
"""

import sys
import sysconfig
import threading

import pytest

import kiln


class Clears:
    """An integer whose conversion empties the list that holds it."""

    def __init__(self, owner, value):
        self.owner, self.value = owner, value

    def __index__(self):
        self.owner.clear()
        return self.value


class Grows:
    def __init__(self, owner, value):
        self.owner, self.value = owner, value

    def __index__(self):
        self.owner.append(7)
        return self.value


def test_list_emptied_mid_encode_is_a_type_error(impl):
    v = [1, 2, 3]
    v.insert(1, Clears(v, 9))
    with pytest.raises(kiln.EncodeError) as ei:
        impl.encode(v, "list<opt<i64>>")
    assert ei.value.code == "TYPE"
    assert "changed length" in str(ei.value)
    # the count (4), item 0 and item 1 were written before the list changed
    assert ei.value.offset == 4 + 9 + 9


def test_list_grown_mid_encode_is_a_type_error(impl):
    v = [1, 2]
    v.insert(0, Grows(v, 5))
    with pytest.raises(kiln.EncodeError) as ei:
        impl.encode(v, "list<opt<i64>>")
    assert ei.value.code == "TYPE"
    assert "changed length" in str(ei.value)


def test_short_pod_list_emptied_mid_encode_uses_the_snapshot(impl):
    # short pod lists convert like struct.pack(n, *v): the items as they were
    v = [1, 2, 3]
    v.append(Clears(v, 4))
    buf = impl.encode(v, "list<i32>")
    assert v == []
    assert impl.decode(buf, "list<i32>").tolist() == [1, 2, 3, 4]


@pytest.mark.parametrize("text", ["list<i32>", "list<f64>", "list<bool>", "list<u8>"])
def test_long_pod_list_emptied_mid_encode_stays_consistent(impl, text):
    # past the short-list path the conversion is numpy's or bytes(): it either
    # refuses the odd item or encodes the items it saw, and the count agrees
    v = list(range(100))
    v[50] = Clears(v, 1)
    try:
        buf = impl.encode(v, text)
    except kiln.EncodeError as e:
        assert e.code == "TYPE"
        return
    n = int.from_bytes(buf[:4], "little")
    assert len(buf) == 4 + n * kiln.parse_type(text).elem.min_size
    assert len(impl.decode(buf, text)) == n


def test_dict_changed_mid_encode_uses_the_snapshot(impl):
    d = {"a": 1, "c": 3}

    class AddsKey:
        def __index__(self):
            d["z"] = 26
            del d["a"]
            return 2

    d["b"] = AddsKey()
    buf = impl.encode(d, "dict<str,opt<i64>>")
    assert impl.decode(buf, "dict<str,opt<i64>>") == {"a": 1, "b": 2, "c": 3}
    assert d == {"b": d["b"], "c": 3, "z": 26}


def _race(impl, text, make, mutate, check, rounds=300):
    t = kiln.parse_type(text)
    enc = impl.encoder(t)
    dec = impl.decoder(t)
    shared = make()
    stop = threading.Event()
    errors = []
    outcomes = []  # one (ok, type errors) pair per thread: += is not atomic

    def mutator():
        i = 0
        while not stop.is_set():
            mutate(shared, i)
            i += 1

    def encoder():
        ok = bad = 0
        try:
            for _ in range(rounds):
                try:
                    buf = enc.encode(shared)
                except kiln.EncodeError as e:
                    assert e.code == "TYPE", e
                    bad += 1
                    continue
                check(dec.decode(buf))
                ok += 1
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)
        outcomes.append((ok, bad))

    threads = [threading.Thread(target=encoder) for _ in range(3)]
    m = threading.Thread(target=mutator)
    m.start()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    stop.set()
    m.join()
    assert errors == []
    assert [ok + bad for ok, bad in outcomes] == [rounds] * 3
    # a race the encoder lost every time would be a different bug
    assert sum(ok for ok, _ in outcomes) > 0


def test_lists_mutated_by_another_thread(impl):
    def make():
        return {"xs": list(range(100)), "names": ["n%d" % i for i in range(50)]}

    def mutate(v, i):
        if i % 2:
            v["xs"].append(i)
            v["names"].append("m")
        else:
            if v["xs"]:
                v["xs"].pop()
            if v["names"]:
                v["names"].pop(0)
        if len(v["xs"]) > 300:
            del v["xs"][100:]

    def check(out):
        assert all(isinstance(s, str) for s in out["names"])
        assert len(out["xs"]) <= 400

    _race(impl, "struct{xs:list<i64>,names:list<str>,}", make, mutate, check)


def test_dict_mutated_by_another_thread(impl):
    def make():
        return {"k%03d" % i: [i, i + 1] for i in range(64)}

    def mutate(d, i):
        k = "k%03d" % (i % 97)
        if k in d:
            del d[k]
        else:
            d[k] = [i]

    def check(out):
        assert list(out) == sorted(out, key=lambda s: s.encode())
        for k, xs in out.items():
            assert k.startswith("k")
            assert len(xs) in (1, 2)

    _race(impl, "dict<str,list<i32>>", make, mutate, check)


def test_struct_dict_mutated_by_another_thread(impl):
    def make():
        return {"a": 1, "b": "x", "c": [1.0]}

    def mutate(d, i):
        d["b"] = "y" * (i % 5)
        d["c"] = [float(i)] * (i % 3)

    def check(out):
        assert out["a"] == 1 and set(out["b"]) <= {"x", "y"}

    _race(impl, "struct{a:i64,b:str,c:list<f64>,}", make, mutate, check)


@pytest.mark.skipif(not sysconfig.get_config_var("Py_GIL_DISABLED"),
                    reason="only a free-threaded CPython can run without the GIL")
def test_compiled_kernels_keep_the_gil_off(request):
    # an extension not declared free-threading safe turns the GIL back on at
    # import (with a RuntimeWarning); ours must not
    import os
    import subprocess
    from conftest import compiled_kernels
    compiled_kernels(request.config)
    env = dict(os.environ)
    env.pop("PYTHON_GIL", None)
    r = subprocess.run([sys.executable, "-W", "error", "-c",
                        "import sys, kiln._kernels_c; print(sys._is_gil_enabled())"],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"
