"""Property tests: round trips over generated types and values, and agreement with
the reference decoder on every prefix, extension and single-byte flip."""

import numpy as np
from hypothesis import HealthCheck, given, settings, strategies as st

import kiln
from _util import kiln_ref
from strategies import tensors_values, type_texts, values_of

SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.function_scoped_fixture])


def outcome_kiln(impl, buf, t, framed=False):
    try:
        v = impl.decode(buf, t, frame=framed)
    except kiln.KilnError as e:
        return ("reject", e.code, e.offset), None
    return ("accept",), v


def outcome_ref(buf, text, framed=False):
    try:
        kiln_ref.decode(buf, text, framed)
    except kiln_ref.RefError as e:
        return ("reject", e.code, e.offset)
    return ("accept",)


@SETTINGS
@given(data=st.data(), text=type_texts(), framed=st.booleans())
def test_round_trip_is_byte_identical(impl, data, text, framed):
    t = kiln.parse_type(text)
    value = data.draw(values_of(text))
    buf = impl.encode(value, t, frame=framed)
    assert outcome_ref(buf, text, framed) == ("accept",)
    out = impl.decode(buf, t, frame=framed)
    assert impl.encode(out, t, frame=framed) == buf   # floats compared as bits, via bytes


@SETTINGS
@given(data=st.data(), text=type_texts(max_leaves=5))
def test_prefix_suffix_and_flips_agree_with_reference(impl, data, text):
    t = kiln.parse_type(text)
    buf = impl.encode(data.draw(values_of(text)), t)
    for cut in sorted(set([0, len(buf) // 2, len(buf) - 1]) & set(range(len(buf)))):
        got, _ = outcome_kiln(impl, buf[:cut], t)
        assert got[:2] == ("reject", "EOF")
        assert got == outcome_ref(buf[:cut], text)
    got, _ = outcome_kiln(impl, buf + b"\0", t)
    assert got == ("reject", "TRAILING", len(buf))
    if buf:
        i = data.draw(st.integers(0, len(buf) - 1))
        flip = bytearray(buf)
        flip[i] ^= data.draw(st.integers(1, 255))
        flip = bytes(flip)
        got, v = outcome_kiln(impl, flip, t)
        assert got == outcome_ref(flip, text)
        if got == ("accept",):
            assert impl.encode(v, t) == flip


@SETTINGS
@given(ts=tensors_values())
def test_random_directories(impl, ts):
    buf = impl.encode_tensors(ts)
    assert outcome_ref(buf, "tensors") == ("accept",)
    d = impl.decode_tensors(buf)
    assert d.values() == ts
    assert impl.encode_tensors(d) == buf
    c = impl.decode_tensors(buf, copy=True)
    assert c.values() == ts


@SETTINGS
@given(ts=tensors_values(), data=st.data())
def test_directory_flips_agree_with_reference(impl, ts, data):
    buf = impl.encode_tensors(ts)
    i = data.draw(st.integers(0, len(buf) - 1))
    flip = bytearray(buf)
    flip[i] ^= data.draw(st.integers(1, 255))
    flip = bytes(flip)
    got, v = outcome_kiln(impl, flip, kiln.tensors)
    assert got == outcome_ref(flip, "tensors")
    if got == ("accept",):
        assert impl.encode_tensors(v) == flip
