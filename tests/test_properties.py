"""Property tests: round trips over generated types and values, and agreement with
the reference decoder on every prefix, extension and single-byte flip."""

from hypothesis import HealthCheck, given, settings, strategies as st

import kiln
from _oracle import kiln_form, kiln_outcome, ref_outcome
from _util import kiln_ref
from strategies import tensors_values, type_texts, values_of

SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.function_scoped_fixture])


def outcome_kiln(impl, buf, text, framed=False):
    """("ok", value form) or ("err", code, offset): see tests/_oracle.py."""
    return kiln_outcome(impl.decoder(kiln.parse_type(text), frame=framed).decode, buf, text)


@SETTINGS
@given(data=st.data(), text=type_texts(), framed=st.booleans())
def test_round_trip_is_byte_identical(impl, data, text, framed):
    t = kiln.parse_type(text)
    value = data.draw(values_of(text))
    buf = impl.encode(value, t, frame=framed)
    want = ref_outcome(buf, text, framed)
    assert want[0] == "ok"
    # the decoded value: the reference's, and the value encoded (type, dtype, every bit)
    assert outcome_kiln(impl, buf, text, framed) == want
    assert kiln_form(kiln_ref.parse_type(text), value, given=True) == want[1]
    out = impl.decode(buf, t, frame=framed)
    assert impl.encode(out, t, frame=framed) == buf


@SETTINGS
@given(data=st.data(), text=type_texts(max_leaves=5))
def test_prefix_suffix_and_flips_agree_with_reference(impl, data, text):
    t = kiln.parse_type(text)
    buf = impl.encode(data.draw(values_of(text)), t)
    for cut in sorted(set([0, len(buf) // 2, len(buf) - 1]) & set(range(len(buf)))):
        got = outcome_kiln(impl, buf[:cut], text)
        assert got[:2] == ("err", "EOF")
        assert got == ref_outcome(buf[:cut], text)
    got = outcome_kiln(impl, buf + b"\0", text)
    assert got == ("err", "TRAILING", len(buf))
    assert got == ref_outcome(buf + b"\0", text)
    if buf:
        i = data.draw(st.integers(0, len(buf) - 1))
        flip = bytearray(buf)
        flip[i] ^= data.draw(st.integers(1, 255))
        flip = bytes(flip)
        got = outcome_kiln(impl, flip, text)
        assert got == ref_outcome(flip, text)
        if got[0] == "ok":
            assert impl.encode(impl.decode(flip, t), t) == flip


@SETTINGS
@given(ts=tensors_values())
def test_random_directories(impl, ts):
    buf = impl.encode_tensors(ts)
    want = ref_outcome(buf, "tensors")
    assert want[0] == "ok"
    assert outcome_kiln(impl, buf, "tensors") == want
    assert kiln_outcome(lambda b: impl.decode_tensors(b, copy=True), buf, "tensors") == want
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
    got = outcome_kiln(impl, flip, "tensors")
    assert got == ref_outcome(flip, "tensors")
    if got[0] == "ok":
        assert impl.encode_tensors(impl.decode_tensors(flip)) == flip
