"""Encoding a class-bound struct reads each field as getattr would, whatever
the class does: slots, NamedTuples, instance dicts, class defaults,
properties, __getattr__, subclasses, and classes changed after the encoder
was built (the compiled kernel reads fields from C and must notice)."""

import dataclasses
import typing

import pytest

import kiln
from kiln import _kernels_py


def outcome(fn):
    try:
        return fn()
    except Exception as e:  # the exception type and message are part of the behaviour
        return (type(e).__name__, str(e))


def check(impl, value, t):
    want = outcome(lambda: kiln.Encoder(t, kernels=_kernels_py).encode(value))
    got = outcome(lambda: impl.encode(value, t))
    assert got == want
    return got


@dataclasses.dataclass
class WithDefault:
    id: int
    name: str = "d"


@dataclasses.dataclass(slots=True)
class Slotted:
    id: int
    name: str


class Pair(typing.NamedTuple):
    id: int
    name: str


def test_slots_namedtuples_and_dicts(impl):
    assert check(impl, WithDefault(1, "a"), WithDefault) == bytes.fromhex("01000000000000000100000061")
    assert check(impl, Slotted(1, "a"), Slotted) == bytes.fromhex("01000000000000000100000061")
    assert check(impl, Pair(1, "a"), Pair) == bytes.fromhex("01000000000000000100000061")


def test_missing_attributes_fail_as_getattr_does(impl):
    s = Slotted(1, "a")
    del s.name
    assert check(impl, s, Slotted)[0] == "AttributeError"
    r = WithDefault(1, "a")
    del r.name            # the class default shows through
    assert check(impl, r, WithDefault) == bytes.fromhex("01000000000000000100000064")
    r = WithDefault(1, "a")
    del r.id
    assert check(impl, r, WithDefault)[0] == "AttributeError"
    assert check(impl, tuple.__new__(Pair, (1,)), Pair)[0] == "IndexError"


def test_getattr_hooks_and_subclasses(impl):
    @dataclasses.dataclass
    class Hooked:
        a: int

        def __getattr__(self, name):
            return 5

    h = Hooked(1)
    del h.a
    assert check(impl, h, Hooked) == bytes.fromhex("0500000000000000")

    class Sub(WithDefault):
        @property
        def name(self):
            return "zz"

        @name.setter
        def name(self, v):
            pass

    assert check(impl, Sub(1, "a"), WithDefault) == bytes.fromhex("0100000000000000020000007a7a")


def test_a_class_changed_after_the_encoder_was_built(impl):
    @dataclasses.dataclass
    class Late:
        id: int
        name: str

    enc = impl.encoder(Late)
    assert enc.encode(Late(1, "a")) == bytes.fromhex("01000000000000000100000061")
    Late.name = property(lambda self: "yy", lambda self, v: None)
    assert enc.encode(Late(1, "a")) == bytes.fromhex("0100000000000000020000007979")
    assert check(impl, Late(1, "a"), Late) == bytes.fromhex("0100000000000000020000007979")


@pytest.mark.parametrize("bad", [None, 9])
def test_many_fields_and_a_bad_one(impl, bad):
    Big = dataclasses.make_dataclass("Big", [("f%d" % i, int) for i in range(20)])
    b = Big(*range(20))
    assert check(impl, b, Big) == b"".join(i.to_bytes(8, "little") for i in range(20))
    if bad is not None:
        setattr(b, "f%d" % bad, "x")
        assert check(impl, b, Big)[0] == "EncodeError"


def test_dicts_for_the_same_struct(impl):
    check(impl, {"id": 1, "name": "a"}, WithDefault)
    assert check(impl, {"id": 1}, WithDefault)[0] == "EncodeError"
    assert check(impl, {"id": 1, "name": "a", "z": 1}, WithDefault)[0] == "EncodeError"
    assert check(impl, [1, "a"], WithDefault)[0] == "EncodeError"


def test_instance_dicts_in_another_order_or_with_more_keys(impl):
    r = WithDefault(1, "a")
    del r.id
    r.id = 7              # the dict now holds name, then id
    assert check(impl, r, WithDefault) == bytes.fromhex("07000000000000000100000061")
    r = WithDefault(1, "a")
    r.extra = [1]         # one more key after the fields
    assert check(impl, r, WithDefault) == bytes.fromhex("01000000000000000100000061")
    r = WithDefault(1, "a")
    r.__dict__.clear()
    r.__dict__.update(zz=1, name="b", id=2)
    assert check(impl, r, WithDefault) == bytes.fromhex("02000000000000000100000062")


class _KeyEq(str):
    """A dict key equal to its text whose __eq__ runs ``hook`` (a dict lookup
    of the exact str calls it)."""
    __hash__ = str.__hash__
    hook = None

    def __eq__(self, other):
        if self.hook is not None:
            self.hook()
        return str.__eq__(self, other)


def test_code_a_read_runs_changes_the_fields_read_after_it(impl):
    """Issue 38 item 7, one rule in both kernels (docs/records.md): each field
    is read once, in field order, as getattr gives it at that moment, all
    before anything is written.  A read that runs code (a property, an
    instance dict key's __eq__) which changes the class, the instance's class
    or its dict is seen by the fields read after it; the compiled kernel had
    kept reading the rest by what it had decided from the class before.
    Expected bytes by hand: struct{a:i64,b:i64,} is two little-endian i64."""
    import struct
    t = "struct{a:i64,b:i64,}"

    def want(a, b):
        return struct.pack("<qq", a, b)

    def klass(getter):
        ns = {"__annotations__": {"a": int, "b": int}, "a": property(getter)}
        return dataclasses.dataclass(init=False)(type("C", (), ns))

    def to_property(obj):   # the class now answers b with a property
        type(obj).b = property(lambda s: 999)
        return 1

    C = klass(to_property)
    o = C.__new__(C)
    o.__dict__["b"] = 2
    assert impl.encoder(C).encode(o) == want(1, 999)

    def new_dict(obj):      # the instance's dict replaced
        obj.__dict__ = {"b": 42}
        return 1
    C = klass(new_dict)
    o = C.__new__(C)
    o.__dict__["b"] = 3
    assert impl.encoder(C).encode(o) == want(1, 42)

    C = klass(lambda obj: 1)
    Other = type("Other", (C,), {"b": property(lambda s: 7)})

    def new_class(obj):     # the instance moved to a subclass with a property b
        obj.__class__ = Other
        return 5
    C.a = property(new_class)
    enc = impl.encoder(C)
    o = C.__new__(C)
    o.__dict__["b"] = 4
    assert enc.encode(o) == want(5, 7)

    @dataclasses.dataclass
    class D:
        a: int
        b: int
    d = D(1, 2)
    key = _KeyEq("a")
    d.__dict__.clear()
    d.__dict__[key] = 1
    d.__dict__["b"] = 2
    key.hook = lambda: setattr(D, "b", property(lambda s: 999))
    enc = impl.encoder(D)
    assert enc.encode(d) == want(1, 999)
    # the same object again: the property stays, every kernel reads it
    assert enc.encode(d) == want(1, 999)
    # code that writing runs (an __index__) changes nothing read before
    s = Slotted(0, "x")

    class Ix:
        def __index__(self):
            s.name = "changed"
            return 3
    s.id = Ix()
    assert impl.encoder(Slotted).encode(s) == struct.pack("<qI", 3, 1) + b"x"
