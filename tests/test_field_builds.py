"""Decoding a class-bound struct builds what calling the class builds, whatever
the class does.  The compiled kernel builds plain dataclasses and NamedTuples
without calling Python code (``kiln._plan.direct_build`` says when it may), so
this compares it with the pure kernel, which always calls: the same type, the
same attributes in the same order, the same side effects, the same errors;
and classes changed after the decoder was built are called again."""

import abc
import dataclasses
import typing
from typing import Optional

import pytest

import kiln
from kiln import _kernels_py
from kiln._plan import direct_build
from _oracle import ref_outcome


def state(obj):
    """Everything observable about a decoded instance (shallow)."""
    out = [type(obj)]
    if isinstance(obj, tuple):
        out.append(tuple(obj))
    if hasattr(obj, "__dict__"):
        out.append(list(vars(obj).items()))   # the order __init__ stored them in
    for cls in type(obj).__mro__:
        for name in getattr(cls, "__slots__", ()):
            out.append((name, getattr(obj, name, "<empty>")))
    return out


def outcome(fn):
    try:
        return state(fn())
    except Exception as e:  # the exception type and message are part of the behaviour
        return (type(e).__name__, str(e))


def check(impl, cls, value, *, buf=None):
    """Decode ``value``'s bytes as ``cls`` in the kernel under test and in the
    pure kernel (which calls the class); both must give the same."""
    if buf is None:
        buf = kiln.Encoder(cls, kernels=_kernels_py).encode(value)
    want = outcome(lambda: kiln.Decoder(cls, kernels=_kernels_py).decode(buf))
    got = outcome(lambda: impl.decode(buf, cls))
    assert got == want
    return got


def names_of(cls):
    return tuple(cls._fields) if hasattr(cls, "_fields") else \
        tuple(f.name for f in dataclasses.fields(cls))


# --- classes the kernel may build itself ------------------------------------------

@dataclasses.dataclass
class Plain:
    id: int
    name: str
    tags: list[kiln.i32]


@dataclasses.dataclass(slots=True)
class Slotted:
    id: int
    name: str


@dataclasses.dataclass(frozen=True)
class Frozen:
    id: int
    name: str = "x"


@dataclasses.dataclass(frozen=True, slots=True)
class FrozenSlots:
    id: int
    name: str


@dataclasses.dataclass(kw_only=True)
class KwOnly:
    id: int
    name: str


@dataclasses.dataclass
class Factory:
    id: int
    tags: list[kiln.i32] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class WithClassVar:
    id: int
    kind: typing.ClassVar[str] = "k"


@dataclasses.dataclass
class SelfField:
    self: int
    other: str


@dataclasses.dataclass
class Wide:
    a: int
    b: str
    c: float
    d: list[kiln.i32]
    e: bool
    f: Optional[str] = None


class Sub(Plain):
    """Not decorated: Plain's fields and Plain's generated __init__."""


@dataclasses.dataclass
class Abstract(abc.ABC):
    id: int


class NT(typing.NamedTuple):
    id: int
    name: str


@dataclasses.dataclass
class Outer:
    inner: Slotted
    many: list[Frozen]
    pair: NT


DIRECT = [
    (Plain, Plain(1, "a", [1, 2]), "object"),
    (Slotted, Slotted(2, "b"), "object"),
    (Frozen, Frozen(3, "c"), "object"),
    (FrozenSlots, FrozenSlots(4, "d"), "object"),
    (KwOnly, KwOnly(id=5, name="e"), "object"),
    (Factory, Factory(6, [7]), "object"),
    (WithClassVar, WithClassVar(8), "object"),
    (SelfField, SelfField(9, "f"), "object"),
    (Sub, Sub(10, "g", []), "object"),
    (Wide, Wide(1, "w", 0.5, [1, 2], True), "object"),
    (Abstract, Abstract(11), "object"),
    (NT, NT(12, "h"), "tuple"),
    (Outer, Outer(Slotted(1, "i"), [Frozen(2), Frozen(3, "j")], NT(4, "k")), "object"),
]


@pytest.mark.parametrize("cls,value,kind", DIRECT, ids=[c.__name__ for c, _, _ in DIRECT])
def test_built_directly_is_what_calling_builds(impl, cls, value, kind):
    assert direct_build(cls, names_of(cls)) == kind
    got = check(impl, cls, value)
    assert got[0] is cls
    assert impl.decode(impl.encode(value, cls), cls) == value


def test_slots_built_directly_have_no_dict(impl):
    out = impl.decode(impl.encode(Slotted(1, "a"), Slotted), Slotted)
    assert not hasattr(out, "__dict__") and (out.id, out.name) == (1, "a")
    with pytest.raises(dataclasses.FrozenInstanceError):
        impl.decode(impl.encode(FrozenSlots(1, "a"), FrozenSlots), FrozenSlots).id = 2


def test_a_truncated_record_is_an_error_not_half_an_object(impl):
    buf = impl.encode([Plain(1, "abc", [1, 2, 3])] * 3, kiln.list_(Plain))
    for cut in range(len(buf)):
        with pytest.raises(kiln.KilnError) as e:
            impl.decode(buf[:cut], kiln.list_(Plain))
        assert e.value.code == "EOF"


# --- classes the kernel must call ----------------------------------------------------

CALLS = []


@dataclasses.dataclass
class PostInit:
    id: int

    def __post_init__(self):
        CALLS.append(("post_init", self.id))
        self.twice = self.id * 2


@dataclasses.dataclass
class OwnInit:
    id: int

    def __init__(self, id):
        CALLS.append(("init", id))
        self.id = id * 3


@dataclasses.dataclass
class OwnSetattr:
    id: int

    def __setattr__(self, name, value):
        CALLS.append(("setattr", name, value))
        object.__setattr__(self, name, value + 1)


@dataclasses.dataclass
class OwnNew:
    id: int

    def __new__(cls, *args, **kw):
        CALLS.append(("new", args))
        return object.__new__(cls)


@dataclasses.dataclass
class WithInitVar:
    id: int
    scale: dataclasses.InitVar[int] = 2

    def __post_init__(self, scale):
        self.id *= scale


class CountingMeta(type):
    def __call__(cls, *args, **kw):
        CALLS.append(("meta", args))
        return super().__call__(*args, **kw)


@dataclasses.dataclass
class MetaCalled(metaclass=CountingMeta):
    id: int


class Clamp:
    """A data descriptor: stores a clamped value in the instance dict."""

    def __set_name__(self, owner, name):
        self.name = name

    def __get__(self, obj, owner=None):
        return self if obj is None else obj.__dict__["_" + self.name]

    def __set__(self, obj, value):
        obj.__dict__["_" + self.name] = min(value, 10)


@dataclasses.dataclass
class Described:
    id: int = Clamp()
    name: str = "n"


@dataclasses.dataclass
class AbstractMethod(abc.ABC):
    id: int

    @abc.abstractmethod
    def run(self): ...


CALLED = [
    (PostInit, PostInit(1), [("post_init", 1)]),
    (OwnInit, OwnInit(1), [("init", 3)]),          # OwnInit(1) stores 3
    (OwnSetattr, OwnSetattr(1), [("setattr", "id", 2)]),   # OwnSetattr(1) stores 2
    (OwnNew, OwnNew(1), [("new", (1,))]),
    (WithInitVar, WithInitVar(1), []),
    (MetaCalled, MetaCalled(1), [("meta", (1,))]),
]


@pytest.mark.parametrize("cls,value,calls", CALLED, ids=[c[0].__name__ for c in CALLED])
def test_classes_with_their_own_code_are_called(impl, cls, value, calls):
    buf = kiln.Encoder(cls, kernels=_kernels_py).encode(value)
    del CALLS[:]
    want = outcome(lambda: kiln.Decoder(cls, kernels=_kernels_py).decode(buf))
    pure_calls = list(CALLS)
    del CALLS[:]
    got = outcome(lambda: impl.decode(buf, cls))
    assert got == want
    assert CALLS == pure_calls
    assert CALLS == calls
    assert direct_build(cls, names_of(cls)) is None


def test_a_data_descriptor_field_runs_its_setter(impl):
    got = check(impl, Described, None, buf=kiln.Encoder(
        kiln.struct({"id": kiln.i64, "name": kiln.str_})).encode({"id": 99, "name": "z"}))
    assert got[0] is Described
    out = impl.decode(impl.encode(Described(3, "a"), Described), Described)
    assert (out.id, out._id, out.name) == (3, 3, "a")
    out = impl.decode(impl.encode({"id": 99, "name": "z"},
                                  kiln.struct({"id": kiln.i64, "name": kiln.str_})), Described)
    assert out.id == 10


def test_an_abstract_class_is_refused_as_calling_refuses(impl):
    buf = kiln.encode({"id": 1}, kiln.struct({"id": kiln.i64}))
    got = check(impl, AbstractMethod, None, buf=buf)
    assert got[0] == "TypeError" and "abstract" in got[1]


# --- classes changed after the decoder was built ---------------------------------------

def fresh_class():
    @dataclasses.dataclass
    class Late:
        id: int
        name: str
    return Late


def test_a_post_init_added_later_runs(impl):
    Late = fresh_class()
    dec = impl.decoder(Late)
    buf = impl.encode(Late(1, "a"), Late)
    assert vars(dec.decode(buf)) == {"id": 1, "name": "a"}
    Late.__post_init__ = lambda self: setattr(self, "seen", True)
    Late.__init__ = dataclasses.dataclass(type("Tmp", (), {"__annotations__": {
        "id": int, "name": str}, "__post_init__": Late.__post_init__})).__init__
    assert dec.decode(buf).seen is True


def test_an_init_replaced_later_runs(impl):
    Late = fresh_class()
    dec = impl.decoder(Late)
    buf = impl.encode(Late(1, "a"), Late)

    def init(self, id, name):
        self.id, self.name, self.extra = id, name.upper(), "yes"
    Late.__init__ = init
    out = dec.decode(buf)
    assert (out.id, out.name, out.extra) == (1, "A", "yes")


def test_a_setattr_added_later_runs(impl):
    Late = fresh_class()
    dec = impl.decoder(Late)
    buf = impl.encode(Late(1, "a"), Late)

    def setattr_(self, name, value):
        object.__setattr__(self, name, value * 2)
    Late.__setattr__ = setattr_
    assert vars(dec.decode(buf)) == {"id": 2, "name": "aa"}


def test_a_base_changed_later_is_seen(impl):
    Late = fresh_class()

    class Child(Late):
        pass
    dec = impl.decoder(Child)
    buf = impl.encode(Child(1, "a"), Child)
    assert type(dec.decode(buf)) is Child
    Late.__post_init__ = lambda self: setattr(self, "seen", True)

    def init(self, id, name):
        self.id, self.name = id, name
        self.__post_init__()
    Late.__init__ = init
    assert dec.decode(buf).seen is True


PAIR = kiln.struct({"x": kiln.i64, "y": kiln.i64})


def test_an_init_written_by_hand_and_execd_from_a_string_is_called(impl):
    """Code exec'd from a string (or run by ``python -c``) is "<string>" too:
    only the body dataclasses writes may be skipped."""
    ns = {"dataclasses": dataclasses}
    exec("@dataclasses.dataclass\n"
         "class Clamped:\n"
         "    x: int\n"
         "    y: int\n"
         "    def __init__(self, x, y):\n"
         "        self.x = x if x >= 0 else 0\n"
         "        self.y = y\n", ns)
    Clamped = ns["Clamped"]
    assert direct_build(Clamped, ("x", "y")) is None
    got = check(impl, Clamped, None, buf=kiln.Encoder(PAIR).encode({"x": -5, "y": 2}))
    assert got[1] == [("x", 0), ("y", 2)]


def test_a_dataclass_decorated_twice_is_called(impl):
    """The second @dataclass(frozen=True) keeps the first (non-frozen) __init__,
    whose ``self.x = x`` the frozen __setattr__ refuses."""
    Twice = type("Twice", (), {"__annotations__": {"x": int, "y": int}})
    Twice = dataclasses.dataclass(frozen=True)(dataclasses.dataclass(Twice))
    assert direct_build(Twice, ("x", "y")) is None
    got = check(impl, Twice, None, buf=kiln.Encoder(PAIR).encode({"x": 1, "y": 2}))
    assert got[0] == "FrozenInstanceError"


def test_a_struct_bound_in_another_field_order_is_called(impl):
    """make passes the values by position: y's value goes to x, as calling does."""
    @dataclasses.dataclass
    class XY:
        x: int
        y: int
    t = kiln.struct({"y": kiln.i64, "x": kiln.i64}, cls=XY)
    assert direct_build(XY, ("y", "x")) is None
    buf = kiln.Encoder(kiln.struct({"y": kiln.i64, "x": kiln.i64})).encode({"y": 1, "x": 2})
    want = state(kiln.Decoder(t, kernels=_kernels_py).decode(buf))
    assert state(impl.decode(buf, t)) == want == [XY, [("x", 1), ("y", 2)]]


def test_a_slot_descriptor_of_another_class_is_not_stored_into(impl):
    """object.__setattr__ refuses a member descriptor of an unrelated class;
    its offset is another layout's (storing there wrote past the instance)."""
    class Other:
        __slots__ = ("p", "q", "r", "s", "u", "w", "x")

    @dataclasses.dataclass
    class Foreign:
        x: int
        x = Other.__dict__["x"]
    buf = kiln.Encoder(kiln.struct({"x": kiln.i64})).encode({"x": 7})
    for _ in range(100):
        got = check(impl, Foreign, None, buf=buf)
    assert got[0] == "TypeError"


def test_a_foreign_slot_descriptor_is_not_read_by_encode(impl):
    """The encoder's slot reads check the descriptor's class too."""
    class Other:
        __slots__ = ("p", "q", "r", "s", "u", "w", "x")

    class Foreign:
        x = Other.__dict__["x"]
    t = kiln.struct({"x": kiln.i64}, cls=Foreign)
    want = outcome(lambda: kiln.Encoder(t, kernels=_kernels_py).encode(Foreign()))
    for _ in range(100):
        got = outcome(lambda: impl.encode(Foreign(), t))
    assert got == want and got[0] == "TypeError"


DELETED = []


def error_of(call):
    """("err", code, offset) of the KilnError ``call()`` raises (its traceback, which
    holds the decode's frames, dropped at once); ("ok",) when it returns."""
    try:
        call()
    except kiln.KilnError as e:
        return ("err", e.code, e.offset)
    return ("ok",)


def finalise(self):
    DELETED.append((getattr(self, "id", None), getattr(self, "name", None)))


@dataclasses.dataclass(slots=True)
class Finalised:
    id: int
    name: str

    __del__ = finalise


@pytest.mark.parametrize("cls", [Finalised, dataclasses.dataclass(type(
    "FinalisedDict", (), {"__annotations__": {"id": int, "name": str}, "__del__": finalise}))])
def test_no_instance_exists_before_its_fields_decode(impl, cls):
    """As calling the class: the fields first, then the instance, so a record
    cut short never makes (and finalises) a half-built instance."""
    buf = impl.encode([cls(1, "abc"), cls(2, "de")], kiln.list_(cls))
    del DELETED[:]
    text = "list<struct{id:int,name:str,}>"
    for cut in range(len(buf)):
        got = error_of(lambda: kiln.Decoder(kiln.list_(cls), kernels=_kernels_py).decode(buf[:cut]))
        assert got == ref_outcome(buf[:cut], text)
    want = list(DELETED)
    del DELETED[:]
    for cut in range(len(buf)):
        got = error_of(lambda: impl.decode(buf[:cut], kiln.list_(cls)))
        assert got == ref_outcome(buf[:cut], text)
    assert DELETED == want
    assert want and set(want) == {(1, "abc")}   # whole first records only


NESTED_SEEN = []


@dataclasses.dataclass
class Patcher:
    n: int

    def __post_init__(self):
        # decoding this field changes the class that holds it
        def setattr_(obj, name, value):
            NESTED_SEEN.append(name)
            object.__setattr__(obj, name, value)
        Holder.__setattr__ = setattr_


@dataclasses.dataclass
class Holder:
    id: int
    inner: Patcher


def test_a_class_changed_while_its_fields_decode_is_called(impl):
    enc = kiln.Encoder(kiln.struct({"id": kiln.i64, "inner": kiln.struct({"n": kiln.i64})}))
    buf = enc.encode({"id": 1, "inner": {"n": 2}})
    try:
        dec = impl.decoder(Holder)   # compiled while Holder has object's __setattr__
        del NESTED_SEEN[:]
        out = dec.decode(buf)
        assert (out.id, out.inner.n) == (1, 2)
        assert NESTED_SEEN == ["id", "inner"]   # Holder's new __setattr__ ran
    finally:
        if "__setattr__" in vars(Holder):
            del Holder.__setattr__


def test_an_init_whose_code_is_replaced_is_called(impl):
    """Assigning __init__.__code__ changes no version tag: the kernel checks
    the code object itself."""
    Late = fresh_class()
    dec = impl.decoder(Late)
    buf = impl.encode(Late(1, "a"), Late)

    def other(self, id, name):
        self.id, self.name, self.extra = id * 10, name, True
    Late.__init__.__code__ = other.__code__
    out = dec.decode(buf)
    assert (out.id, out.name, out.extra) == (10, "a", True)


@pytest.mark.parametrize("cls", [Plain, Slotted, Frozen, KwOnly, NT])
def test_direct_build_answers_from_the_class(cls):
    assert direct_build(cls, names_of(cls)) in ("object", "tuple")
    assert direct_build(cls, names_of(cls)[:-1]) in (None, "tuple")   # other names: call


def python_calls(fn):
    """The names of the Python functions that run while fn runs."""
    import sys
    seen = []

    def prof(frame, event, arg):
        if event == "call":
            seen.append(frame.f_code.co_name)
    sys.setprofile(prof)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return seen


def test_the_compiled_kernel_runs_no_python_per_record(impl):
    """Slots, frozen, keyword-only and small dataclasses and NamedTuples are
    built without Python code (NamedTuples in the pure kernel too); a
    dataclass of more than 4 fields runs its
    generated __init__ (called directly, which callgrind counts cheaper than
    object.__setattr__ from C for that many), once a record."""
    per_record = {"python": 1, "cython": 0}[impl.name]
    for cls, value, fn in [(Slotted, Slotted(1, "a"), "__init__"), (NT, NT(1, "a"), "make"),
                           (Frozen, Frozen(1, "a"), "__init__"),
                           (KwOnly, KwOnly(id=1, name="a"), "__init__"),
                           (Plain, Plain(1, "a", [1]), "__init__"),
                           (Wide, Wide(1, "w", 0.5, [1], False, "x"), "__init__")]:
        t = kiln.list_(cls)
        dec, buf = impl.decoder(t), impl.encode([value] * 50, t)
        assert dec.decode(buf) == [value] * 50
        calls = python_calls(lambda: dec.decode(buf)).count(fn)
        # (a NamedTuple's tuple.__new__ is inline in the pure kernel's struct code too)
        assert calls == (50 if cls is Wide else 0 if cls is NT else 50 * per_record)


def test_an_unrelated_class_attribute_set_later_keeps_the_direct_build(impl):
    """A class attribute set after the decoder was built (msgspec caches its
    own information on the classes it is given that way) changes the class's
    version tag but not how the class builds: the compiled kernel checks the
    decision again, once, and keeps building without Python code; a change
    that matters (a new __init__) still makes it call the class."""
    import dataclasses as dc

    @dc.dataclass(frozen=True)
    class Later:
        id: int
        name: str

    t = kiln.list_(Later)
    dec, buf = impl.decoder(t), impl.encode([Later(1, "a")] * 50, t)
    assert dec.decode(buf) == [Later(1, "a")] * 50
    Later.some_cache = object()          # the version tag changes
    calls = python_calls(lambda: dec.decode(buf)).count("__init__")
    assert calls == {"python": 50, "cython": 0}[impl.name]
    assert dec.decode(buf) == [Later(1, "a")] * 50
    seen = []
    old = Later.__init__

    def init(self, *a):
        seen.append(a)
        old(self, *a)
    want = [Later(1, "a")] * 50
    Later.__init__ = init                # a change that matters
    assert dec.decode(buf) == want and len(seen) == 50
