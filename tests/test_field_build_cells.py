"""Direct builds notice a changed closure cell of the generated __init__
(issue 26, point 9).

A dataclass's generated ``__init__`` is a closure: a frozen class stores
through the object in its ``__dataclass_builtins_object__`` cell, a default
factory's field compares with the sentinel in ``_HAS_DEFAULT_FACTORY``.
Changing a cell changes what calling the class builds but no version tag;
decoding must build what calling builds, whether the cell changed before
the decoder was made or after.  Expectations are written by hand.
"""

import dataclasses
from typing import Optional

import pytest

from kiln._plan import direct_build


class Twice:
    """Stands in for ``object`` in a frozen __init__'s cell: stores doubled."""

    @staticmethod
    def __setattr__(obj, name, value):
        object.__setattr__(obj, name, value * 2)


def frozen_class():
    @dataclasses.dataclass(frozen=True)
    class F:
        id: int
        name: str
    return F


def cell(cls, name):
    init = cls.__init__
    return init.__closure__[init.__code__.co_freevars.index(name)]


def test_a_frozen_init_cell_changed_after_the_decoder_was_built(impl):
    F = frozen_class()
    dec = impl.decoder(F)
    buf = impl.encode(F(3, "ab"), F)
    assert (dec.decode(buf).id, dec.decode(buf).name) == (3, "ab")
    cell(F, "__dataclass_builtins_object__").cell_contents = Twice
    assert (F(3, "ab").id, F(3, "ab").name) == (6, "abab")   # what calling builds now
    out = dec.decode(buf)
    assert (out.id, out.name) == (6, "abab")
    cell(F, "__dataclass_builtins_object__").cell_contents = object   # back: direct again
    out = dec.decode(buf)
    assert (out.id, out.name) == (3, "ab")


def test_a_frozen_init_cell_changed_before_the_decoder_was_built(impl):
    F = frozen_class()
    cell(F, "__dataclass_builtins_object__").cell_contents = Twice
    assert direct_build(F, ("id", "name")) is None
    out = impl.decode(impl.encode({"id": 5, "name": "x"}, "struct{id:i64,name:str,}"), F)
    assert (out.id, out.name) == (10, "xx")


def test_a_default_factory_sentinel_cell_changed(impl):
    @dataclasses.dataclass
    class D:
        id: int
        note: Optional[str] = dataclasses.field(default_factory=lambda: "made")

    dec = impl.decoder(D)
    buf = impl.encode(D(1, None), D)
    assert vars(dec.decode(buf)) == {"id": 1, "note": None}
    # None is now the "no argument" sentinel: calling D(1, None) runs the factory
    cell(D, "_HAS_DEFAULT_FACTORY").cell_contents = None
    assert D(1, None).note == "made"
    assert vars(dec.decode(buf)) == {"id": 1, "note": "made"}
    assert direct_build(D, ("id", "note")) is None


def test_a_default_factory_cell_itself_does_not_matter(impl):
    # the factory runs only for the sentinel, which no decoded value is
    @dataclasses.dataclass
    class D:
        id: int
        tags: list[int] = dataclasses.field(default_factory=list)

    dec = impl.decoder(D)
    buf = impl.encode(D(1, [2]), D)
    cell(D, "_dflt_tags").cell_contents = lambda: ["never"]
    assert direct_build(D, ("id", "tags")) == "object"
    out = dec.decode(buf)
    assert (out.id, list(out.tags)) == (1, [2])


def test_defaults_changed_later_do_not_matter(impl):
    # every parameter is given a value: __defaults__ / __kwdefaults__ are unused
    @dataclasses.dataclass
    class K:
        id: int = 0
        name: str = dataclasses.field(default="d", kw_only=True)

    dec = impl.decoder(K)
    buf = impl.encode(K(4, name="n"), K)
    K.__init__.__defaults__ = (99,)
    K.__init__.__kwdefaults__ = {"name": "zz"}
    out = dec.decode(buf)
    assert (out.id, out.name) == (4, "n")


@pytest.mark.parametrize("frozen", [False, True])
def test_direct_build_still_says_object_for_untouched_classes(frozen):
    @dataclasses.dataclass(frozen=frozen)
    class U:
        id: int
        tags: list[int] = dataclasses.field(default_factory=list)
    assert direct_build(U, ("id", "tags")) == "object"
