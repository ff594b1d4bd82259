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
