"""One rule for lists of fixed-width numbers: an item is accepted exactly when
a scalar field of the element type accepts it, whatever the list's length,
container or kernel (the pure kernel's struct path for short lists, numpy for
long ones, the compiled kernel's exact-scalar loop are speed paths only)."""

import decimal
import fractions

import numpy as np
import pytest

import kiln


class Idx:
    def __init__(self, v):
        self.v = v

    def __index__(self):
        return self.v


class Flt:
    def __init__(self, v):
        self.v = v

    def __float__(self):
        return self.v


ITEMS = {
    "int": 7, "neg": -3, "bool": True, "np.int8": np.int8(5), "np.uint64": np.uint64(9),
    "float": 1.5, "np.float32": np.float32(2.5), "np.float64": np.float64(0.25),
    "decimal": decimal.Decimal("1.5"), "fraction": fractions.Fraction(1, 4),
    "__index__": Idx(4), "__float__": Flt(0.5), "str": "1", "bytes": b"1", "none": None,
    "huge": 2 ** 70, "u64max": 2 ** 64 - 1, "f32-overflow": 1e300, "np.bool": np.bool_(True),
}
ELEMENTS = ["bool", "i8", "u8", "i32", "u32", "i64", "u64", "f32", "f64"]


def scalar_accepts(impl, elem, item):
    try:
        impl.encode(item, elem)
        return True
    except kiln.EncodeError:
        return False


@pytest.mark.parametrize("elem", ELEMENTS)
@pytest.mark.parametrize("name", sorted(ITEMS))
def test_an_item_is_accepted_exactly_when_a_scalar_field_accepts_it(impl, elem, name):
    item = ITEMS[name]
    want = scalar_accepts(impl, elem, item)
    text = "list<%s>" % elem
    for n in (1, 3, 64, 65, 300):
        for container in (list, tuple):
            # the odd item among ordinary ones, at the end
            filler = [True] if elem == "bool" else [1]
            v = container(filler * (n - 1) + [item])
            try:
                buf = impl.encode(v, text)
                got = True
            except kiln.EncodeError as e:
                got = False
                assert e.code == "TYPE"
                assert e.path == "" or e.path == "[%d]" % (n - 1), e.path
            assert got == want, (n, container.__name__)
            if got:
                scalar = impl.encode(item, elem)
                assert buf[4 + (n - 1) * len(scalar):] == scalar


@pytest.mark.parametrize("value", [{1, 2}, frozenset([1]), {"a": 1}, "12", b"12",
                                   (x for x in [1, 2])])
@pytest.mark.parametrize("text", ["list<i32>", "list<str>", "list<opt<i32>>"])
def test_unordered_or_non_sequences_are_refused(impl, value, text):
    with pytest.raises(kiln.EncodeError) as ei:
        impl.encode(value, text)
    assert ei.value.code == "TYPE"
    assert "expected a sequence" in str(ei.value)


def test_the_error_names_the_bad_item(impl):
    with pytest.raises(kiln.EncodeError) as ei:
        impl.encode([1.0] * 70 + ["x"], "list<f32>")
    assert ei.value.path == "[70]"
    assert "expected a float for f32, got str" in str(ei.value)
