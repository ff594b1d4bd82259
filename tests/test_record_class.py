"""kiln.Record: construction, equality, repr, pickling, collector tracking,
and the wire binding of a dataclass of the same fields, in both kernels.

The record base is chosen per kernel too: the compiled kernels run with
``kiln.Record`` on the compiled base (``kiln._kernels_c.RecordBase``), the
pure kernels with ``kiln._record.PyRecord`` (the pure base, what
``KILN_PUREPYTHON=1`` gives as ``kiln.Record``); ``test_mixed_bases`` crosses
them.  Expected values are written out by hand or come from the dataclass of
the same fields, never from the Record path under test.
"""

import dataclasses
import gc
import os
import pickle
import subprocess
import sys
import typing

import pytest

import kiln

from _util import mypy_path
from kiln import _record

HERE = os.path.dirname(os.path.abspath(__file__))


def base_for(impl):
    if impl.name == "python":
        return _record.PyRecord
    assert kiln.IMPLEMENTATION == "cython"
    return kiln.Record


def classes(base):
    class Point(base):
        x: int
        y: float = 0.0

    class Row(base):
        id: int
        name: str
        score: float
        tags: list[int]

    class Point3(Point):
        z: float = 1.5

    return Point, Row, Point3


@dataclasses.dataclass
class RowDC:
    id: int
    name: str
    score: float
    tags: list[int]


def test_construction_and_defaults(impl):
    Point, Row, Point3 = classes(base_for(impl))
    p = Point(1, 2.5)
    assert (p.x, p.y) == (1, 2.5)
    assert (Point(3).x, Point(3).y) == (3, 0.0)
    assert Point(y=4.0, x=2).y == 4.0
    r = Point3(1, z=9.0)
    assert (r.x, r.y, r.z) == (1, 0.0, 9.0)
    assert Point.__kiln_fields__ == ("x", "y") and Point3.__match_args__ == ("x", "y", "z")
    assert not hasattr(p, "__dict__")
    with pytest.raises(AttributeError):
        p.w = 1
    # the messages a dataclass of the same fields gives (its name for ours)
    @dataclasses.dataclass
    class PointDC:
        x: int
        y: float = 0.0

    for cls, ref, cases in (
            (Point, PointDC, [((), {}), ((1, 2.0, 3), {}), ((1,), {"w": 2}), ((1,), {"x": 2}),
                              ((), {"y": 1.0})]),
            (Row, RowDC, [((), {"score": 1.0, "tags": []}), ((), {}), ((1, 2, 3, 4, 5), {})])):
        for args, kw in cases:
            with pytest.raises(TypeError) as want:
                ref(*args, **kw)
            with pytest.raises(TypeError) as got:
                cls(*args, **kw)
            assert str(got.value) == str(want.value).replace(ref.__qualname__, cls.__qualname__)


def test_class_errors_like_a_dataclass(impl):
    base = base_for(impl)
    with pytest.raises(TypeError, match="non-default argument 'b' follows default argument"):
        class Bad(base):
            a: int = 0
            b: int
    with pytest.raises(ValueError, match="mutable default list"):
        class Bad2(base):
            a: list[int] = []


def test_eq_repr_hash(impl):
    Point, Row, Point3 = classes(base_for(impl))
    assert Point(1, 2.0) == Point(1, 2.0)
    assert Point(1, 2.0) != Point(1, 3.0)
    assert Point(1, 0.0) != Point3(1, 0.0, 1.5)   # another class: not equal
    assert (Point(1, 2.0) == (1, 2.0)) is False
    q = Point.__qualname__   # as a dataclass's repr: "classes.<locals>.Point"
    assert q.endswith("<locals>.Point")
    assert repr(Point(1, 2.5)) == q + "(x=1, y=2.5)"
    assert repr(Row(1, "a", 0.5, [2])) == q[:-5] + "Row(id=1, name='a', score=0.5, tags=[2])"
    with pytest.raises(TypeError, match="unhashable"):
        hash(Point(1))

    class Box(base_for(impl)):
        inner: object

    b = Box(None)
    b.inner = b
    assert repr(b) == Box.__qualname__ + "(inner=...)"


def test_pickle(impl):
    Point, Row, Point3 = classes(base_for(impl))
    global PicklePoint   # pickle finds classes by module and name
    PicklePoint = Point
    Point.__qualname__ = "PicklePoint"
    try:
        for proto in range(pickle.HIGHEST_PROTOCOL + 1):
            p = pickle.loads(pickle.dumps(Point(7, 1.25), protocol=proto))
            assert type(p) is Point and (p.x, p.y) == (7, 1.25)
    finally:
        del PicklePoint


def test_gc_tracking(impl):
    """Compiled base: untracked while every field is atomic, tracked again
    when a container is stored (as msgspec's Struct).  The pure base cannot
    untrack: its instances are always tracked."""
    base = base_for(impl)
    Point, Row, Point3 = classes(base)
    compiled = base is not _record.PyRecord
    atomic = Point(1, 2.0)
    assert gc.is_tracked(atomic) is (not compiled)
    with_list = Row(1, "a", 0.5, [1])
    assert gc.is_tracked(with_list)
    atomic.y = [atomic]            # a container: a cycle is possible now
    assert gc.is_tracked(atomic)
    del atomic.y
    # decoded records: the same rule, whichever kernel decodes them
    buf = kiln.encode([Point(1, 2.0)], list[Point])
    (d,) = impl.decoder(list[Point]).decode(buf)
    assert d == Point(1, 2.0) and gc.is_tracked(d) is (not compiled)
    rbuf = kiln.encode([Row(1, "a", 0.5, [1, 2])], list[Row])
    (r,) = impl.decoder(list[Row]).decode(rbuf)
    assert gc.is_tracked(r) and r.tags == [1, 2]
    # a cycle through a record that got a container is collected
    import weakref

    class Probe:
        pass
    box = Point(1, 2.0)
    holder = Probe()
    holder.box = box
    box.y = holder
    probe = weakref.ref(holder)
    del box, holder
    gc.collect()
    assert probe() is None


_DEL_SCRIPT = r"""
import gc, sys
import kiln

class R(kiln.Record):
    a: int
    b: str = ""

    def __del__(self):
        self.__init__(1, "again")      # issue 38 item 1: SIGSEGV on the compiled base

kept = []

class Back(kiln.Record):
    a: int

    def __del__(self):
        self.__init__(2)
        kept.append(self)              # resurrected, then freed at exit

class Drop(kiln.Record):
    a: int

    def __del__(self):
        del type(self).__del__         # no finalizer left when __init__ runs
        self.__init__(3)

class Cyc(kiln.Record):
    a: int
    other: list[int]

    def __del__(self):
        self.__init__(4, [])           # inside a collection of its cycle

for i in range(200):
    r = R(i, "x")
    del r
    (d,) = kiln.decode(kiln.encode([R(i)], list[R]), list[R])
    del d
    Back(i)
    Drop(i)
    c = Cyc(i, [])
    c.other.append(c)
    del c
    gc.collect()
print("ok", len(kept))
"""


def test_a_del_that_calls_init_does_not_crash(impl, tmp_path):
    """Issue 38 item 1: __init__ called from __del__ (on a constructed or a
    decoded record, resurrecting it, after the class lost its __del__, or
    inside a collection) must not untrack the instance subtype_dealloc has
    tracked around the finalizer.  In a child process: a crash is its exit
    status, not this run's."""
    env = dict(os.environ)
    if impl.name == "python":
        env["KILN_PUREPYTHON"] = "1"
    else:
        env.pop("KILN_PUREPYTHON", None)
    script = tmp_path / "del_init.py"
    script.write_text(_DEL_SCRIPT)
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         env=env, timeout=120, cwd=str(tmp_path))
    assert run.returncode == 0, (run.returncode, run.stderr[-2000:])
    assert run.stdout.split() == ["ok", "200"]


class _Ring(list):   # a list that can be weakly referenced
    pass


def test_every_store_of_a_container_lets_the_cycle_be_collected(impl):
    """Issue 38 item 16: a record left untracked while its fields were atomic
    that is then given a container holding itself, by any path that stores,
    is collected with its cycle.  The compiled base's slot descriptors
    refuse to store themselves (their own __set__ would not track the
    instance again): a refused store leaves the field as it was."""
    import weakref
    base = base_for(impl)

    class P(base):
        x: int
        y: str = ""   # (holds whatever is stored: annotations are not checked)

    def fresh():
        return P(1, "atomic")

    def decoded():
        return impl.decoder(P, frame=True).decode(impl.encoder(P, frame=True).encode(
            P(1, "atomic")))

    def via_setattr(r, v):
        r.y = v

    def via_setattr_fn(r, v):
        setattr(r, "y", v)

    def via_descriptor(r, v):
        P.y.__set__(r, v)

    def via_reinit(r, v):
        r.__init__(1, v)

    def via_reinit_kw(r, v):
        P.__init__(r, x=2, y=v)

    stored = set()
    for make in (fresh, decoded):
        for store in (via_setattr, via_setattr_fn, via_descriptor, via_reinit, via_reinit_kw):
            r = make()
            ring = _Ring([r])
            try:
                store(r, ring)
            except AttributeError as e:
                assert base is kiln.Record and store is via_descriptor, (make, store)
                assert str(e) == "readonly attribute" and r.y == "atomic"
                continue
            assert r.y is ring
            stored.add(store.__name__)
            probe = weakref.ref(ring)
            del r, ring
            gc.collect()
            assert probe() is None, (make.__name__, store.__name__)
    assert len(stored) == (4 if base is kiln.Record else 5)
    # deleting a field: the slot's own message, and an empty slot stays refused
    r = fresh()
    del r.y
    with pytest.raises(AttributeError):
        r.y
    with pytest.raises(AttributeError) as e:
        del r.y
    assert e.value.args == ("y",)
    with pytest.raises(AttributeError, match="has no attribute 'w'"):
        r.w = [r]


def test_same_bytes_and_hash_as_the_dataclass(impl):
    Point, Row, Point3 = classes(base_for(impl))
    assert kiln.as_type(Row).text == kiln.as_type(RowDC).text == \
        "struct{id:i64,name:str,score:f64,tags:list<i64>,}"
    assert kiln.as_type(Row).schema_hash == kiln.as_type(RowDC).schema_hash
    rows = [(1, "ab", 0.5, [1, -2]), (-(1 << 62), "é", -1e300, []), (0, "", 0.0, [7] * 9)]
    want = impl.encoder(list[RowDC]).encode([RowDC(*r) for r in rows])
    got = impl.encoder(list[Row]).encode([Row(*r) for r in rows])
    assert got == want
    back = impl.decoder(list[Row]).decode(want)
    assert [type(b) for b in back] == [Row] * 3
    assert [(b.id, b.name, b.score, b.tags) for b in back] == [tuple(r) for r in rows]
    framed = impl.encoder(Row, frame=True).encode(Row(*rows[0]))
    assert framed == impl.encoder(RowDC, frame=True).encode(RowDC(*rows[0]))
    assert impl.decoder(Row, frame=True).decode(framed) == Row(*rows[0])


def test_encode_errors_as_the_dataclass(impl):
    Point, Row, Point3 = classes(base_for(impl))
    for bad in (Row(1 << 63, "a", 0.5, []), Row(1, 2, 0.5, []), Row(1, "a", "x", []),
                Row(1, "a", 0.5, [1 << 64])):
        ref = RowDC(bad.id, bad.name, bad.score, bad.tags)
        with pytest.raises(kiln.EncodeError) as want:
            impl.encoder(list[RowDC]).encode([ref])
        with pytest.raises(kiln.EncodeError) as got:
            impl.encoder(list[Row]).encode([bad])
        assert (got.value.code, got.value.offset) == (want.value.code, want.value.offset)
        assert str(got.value) == str(want.value)


def test_subclass_with_its_own_init_is_called(impl):
    base = base_for(impl)
    calls = []

    class Counted(base):
        a: int

        def __init__(self, a):
            calls.append(a)
            super().__init__(a)

    buf = kiln.encode([Counted(5)], list[Counted])
    calls.clear()
    out = impl.decoder(list[Counted]).decode(buf)
    assert calls == [5] and out == [Counted(5)]


def test_mixed_bases(impl):
    """Either kernel handles records of either base."""
    for base in {_record.PyRecord, kiln.Record}:
        Point, Row, Point3 = classes(base)
        v = [Point3(1, 2.0, 3.0)]
        buf = impl.encoder(list[Point3]).encode(v)
        assert buf == impl.encoder("list<struct{x:i64,y:f64,z:f64,}>").encode(
            [{"x": 1, "y": 2.0, "z": 3.0}])
        assert impl.decoder(list[Point3]).decode(buf) == v


def test_mypy_accepts_records_and_reports_mistakes(mypy_cache):
    parent = os.path.dirname(os.path.dirname(os.path.abspath(kiln.__file__)))
    env = dict(os.environ, MYPYPATH=mypy_path())

    def mypy(name):
        return subprocess.run([sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent",
                               "--cache-dir", str(mypy_cache), "--no-error-summary",
                               os.path.join(HERE, "typing", name)],
                              capture_output=True, text=True, env=env, timeout=300)
    ok = mypy("record_code.py")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    bad = mypy("record_mistakes.py")
    with open(os.path.join(HERE, "typing", "record_mistakes.py")) as f:
        marked = [i for i, line in enumerate(f, 1) if "  # E:" in line]
    reported = sorted({int(ln.split(":")[1]) for ln in bad.stdout.splitlines() if ": error:" in ln})
    assert reported == marked, bad.stdout
    run = subprocess.run([sys.executable, os.path.join(HERE, "typing", "record_code.py")],
                         capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=parent),
                         timeout=120)
    assert run.stdout.strip() == "ok", run.stderr


class NTRow(typing.NamedTuple):
    id: int
    name: str
    tags: list[int]


class NTFlat(typing.NamedTuple):
    id: int
    name: str


def test_namedtuples_decode_into_their_class_untracked_when_atomic(impl):
    """The compiled kernel builds a NamedTuple without the tuple of values
    tuple.__new__ copies, and leaves one of atomic values untracked by the
    collector; the pure kernel calls tuple.__new__ (tracked)."""
    flat = impl.decoder(list[NTFlat]).decode(kiln.encode([NTFlat(1, "a"), NTFlat(-2, "")],
                                                         list[NTFlat]))
    assert flat == [(1, "a"), (-2, "")] and [type(x) for x in flat] == [NTFlat, NTFlat]
    assert flat[0].name == "a" and flat[1]._replace(id=3) == (3, "")
    assert [gc.is_tracked(x) for x in flat] == [impl.name == "python"] * 2
    rows = impl.decoder(list[NTRow]).decode(kiln.encode([NTRow(1, "a", [5])], list[NTRow]))
    assert rows == [(1, "a", [5])] and type(rows[0]) is NTRow and gc.is_tracked(rows[0])
    with pytest.raises(kiln.KilnError) as e:   # a bad field after a good one: nothing leaks
        impl.decoder(NTFlat).decode(b"\x01" + b"\x00" * 7 + b"\x05\x00\x00\x00ab")
    assert (e.value.code, e.value.offset) == ("EOF", 8)


class NTFlatSub(NTFlat):   # no __slots__: its instances have a __dict__
    pass


def test_a_namedtuple_subclass_with_a_dict_stays_tracked(impl):
    """A decoded instance of a NamedTuple subclass with an instance dict is
    left tracked: a cycle made later through its dict is collected."""
    import weakref
    (s,) = impl.decoder(list[NTFlatSub]).decode(kiln.encode([NTFlatSub(1, "a")],
                                                            list[NTFlatSub]))
    assert type(s) is NTFlatSub and s == (1, "a") and gc.is_tracked(s)
    ring = _Ring([s])
    s.extra = ring
    probe = weakref.ref(ring)
    del s, ring
    gc.collect()
    assert probe() is None


class NTI(typing.NamedTuple):
    a: kiln.I32
    b: str
    c: kiln.F32
    d: bool
    e: list[int]


@dataclasses.dataclass(slots=True)
class SlotsI:
    a: kiln.I32
    b: str
    c: kiln.F32
    d: bool
    e: list[int]


def _expect(a, b, c, d, e):
    """The bytes of struct{a:i32,b:str,c:f32,d:bool,e:list<i64>,}, by hand."""
    import struct
    raw = b.encode("utf-8")
    return (struct.pack("<iI", a, len(raw)) + raw + struct.pack("<f?I", c, d, len(e))
            + struct.pack("<%dq" % len(e), *e))


def test_encode_fast_paths_write_what_the_general_path_writes(impl):
    """Slots, NamedTuples, records and dicts of exact values are written
    from their borrowed fields by the compiled kernel; values it does not
    write there (numpy scalars, bools as ints, non-ASCII text, out-of-range
    numbers, keys out of order) take the general path: the same bytes and
    errors in both kernels, checked against bytes built by hand."""
    import numpy as np
    rec_cls = type("RecI", (base_for(impl),), {"__annotations__": dict(SlotsI.__annotations__)})
    t_text = "struct{a:i32,b:str,c:f32,d:bool,e:list<i64>,}"
    good = [(1, "ab", 0.5, True, [1, -2]), (-(1 << 31), "é€", -2.5, False, []),
            (np.int32(7), "x", np.float32(1.5), np.bool_(True), [np.int64(3), True]),
            (True, "", float(np.float32(1e38)), False, [(1 << 63) - 1])]   # (an exact f32)
    for vals in good:
        want = _expect(*[int(v) if i == 0 else v for i, v in enumerate(vals)])
        keys = ("a", "b", "c", "d", "e")
        for cls, value in ((NTI, NTI(*vals)), (SlotsI, SlotsI(*vals)), (rec_cls, rec_cls(*vals)),
                           (t_text, dict(zip(keys, vals))),
                           (t_text, dict(reversed(list(zip(keys, vals)))))):
            assert impl.encoder(cls).encode(value) == want, (cls, vals)
    bad = [((1 << 31), "a", 0.5, True, []), (1, "a", 1e39, True, []), (1, 5, 0.5, True, []),
           (1, "a", 0.5, 1, []), (1, "a", 0.5, True, [1 << 63]), (1, "\udc80", 0.5, True, [])]
    for vals in bad:
        ref = None
        for cls, value in ((NTI, NTI(*vals)), (SlotsI, SlotsI(*vals)), (rec_cls, rec_cls(*vals)),
                           (t_text, dict(zip(("a", "b", "c", "d", "e"), vals)))):
            with pytest.raises(kiln.EncodeError) as e:
                impl.encoder(cls).encode(value)
            got = (e.value.code, e.value.offset, str(e.value).split(": ", 1)[-1])
            assert ref is None or got[:2] == ref[:2], (cls, vals, got, ref)
            ref = got
    with pytest.raises(kiln.EncodeError):   # an extra key
        impl.encoder(t_text).encode({"a": 1, "b": "", "c": 0.0, "d": True, "e": [], "f": 1})
    with pytest.raises(kiln.EncodeError):   # a missing key, the right count
        impl.encoder(t_text).encode({"a": 1, "b": "", "c": 0.0, "d": True, "x": []})
