"""Both implementations give the reference decoder's outcome on thousands of
mutated inputs: its value (type, dtype, every bit; tests/_oracle.py), or its
error code and offset; and the same outcome as each other."""

import random
import struct

import numpy as np
import pytest

import kiln
from conftest import both_kernels
from _oracle import kiln_outcome, ref_outcome
from _util import CASES

KERNELS = both_kernels()


@pytest.fixture(autouse=True)
def _need_both(pytestconfig):
    from conftest import compiled_kernels
    compiled_kernels(pytestconfig)

TYPES = [
    "struct{id:i64,name:str,score:f64,tags:list<i32>,}",
    "list<struct{a:opt<str>,b:dict<str,list<f32>>,c:bool,}>",
    "struct{id:i64,batch:tensors,text:str,}",
    "list<opt<tensors>>",
    "dict<str,list<u8>>",
    "tensors",
]


def _seed_values():
    return {
        TYPES[0]: [{"id": i, "name": "n%d" % i, "score": i / 3, "tags": [i, -i, 7]} for i in range(3)],
        TYPES[1]: [[{"a": None, "b": {"k": [1.5]}, "c": True},
                    {"a": "é", "b": {}, "c": False}]],
        TYPES[2]: [{"id": 1, "batch": {"x": np.arange(5, dtype=np.float32),
                                       "m": np.array([1, 0, 1], bool)}, "text": "t"}],
        TYPES[3]: [[None, [np.arange(3, dtype=np.int8)], {"q": np.zeros(3, np.uint8)}]],
        TYPES[4]: [{"a": b"xyz", "b": b""}],
        TYPES[5]: [[kiln.Tensor(kiln.pack_nibbles([1, 2, 3]), dtype="u4", shape=[3], name="u"),
                    kiln.Tensor(b"\x7f", dtype="e8m0", shape=[1], name="s")]],
    }


def outcome(kernels, buf, text, **kw):
    """("ok", value form) or ("err", code, offset) (tests/_oracle.py), and whether the
    value re-encodes to ``buf`` (an accepted value always should, but for a trusted
    decode's invalid UTF-8 and scale counts, which the encoder refuses)."""
    t = kiln.parse_type(text)
    frame = kw.pop("frame", False)
    dec = kiln.Decoder(t, frame, kernels=kernels, **kw)
    got = kiln_outcome(dec.decode, buf, text)
    if got[0] == "ok":
        try:
            again = kiln.Encoder(t, frame, kernels=kernels).encode(dec.decode(buf))
        except kiln.EncodeError as e:
            assert kw.get("trusted") and e.code in ("UTF8", "TYPE"), e
            return got, e.code
        assert again == buf, (buf.hex(), again.hex())
    return got, None


def agree(py, c, buf, text, **kw):
    """Each kernel's outcome is the reference decoder's; both re-encode alike."""
    ref_kw = {"framed": kw.get("frame", False)}
    for k in ("trusted", "max_count", "max_bytes"):
        if k in kw:
            ref_kw[k] = kw[k]
    want = ref_outcome(buf, text, **ref_kw)
    a = outcome(py, buf, text, **kw)
    b = outcome(c, buf, text, **kw)
    assert a[0] == want, (buf.hex(), "python", a[0], want)
    assert b[0] == want, (buf.hex(), "cython", b[0], want)
    assert a == b, (buf.hex(), a, b)


def mutations(buf, rng, n):
    out = []
    for _ in range(n):
        b = bytearray(buf)
        kind = rng.randrange(5)
        if kind == 0 and b:
            i = rng.randrange(len(b))
            b[i] ^= 1 << rng.randrange(8)
        elif kind == 1:
            del b[rng.randrange(len(b) + 1):]
        elif kind == 2 and len(b) >= 4:
            i = rng.randrange(len(b) - 3)
            b[i:i + 4] = struct.pack("<I", rng.choice([0, 1, 2, 0xFF, 0xFFFF, 2 ** 24, 2 ** 24 + 1,
                                                       2 ** 31, 2 ** 32 - 1]))
        elif kind == 3 and len(b) >= 8:
            i = rng.randrange(len(b) - 7)
            b[i:i + 8] = struct.pack("<Q", rng.choice([0, 64, 2 ** 63 - 1, 2 ** 64 - 1,
                                                       2 ** 64 - 64]))
        else:
            b += bytes([rng.randrange(256)])
        out.append(bytes(b))
    return out


@pytest.mark.parametrize("text", TYPES)
def test_mutants_agree(text):
    assert len(KERNELS) == 2, "the compiled kernels are needed for the differential test"
    py, c = KERNELS
    t = kiln.parse_type(text)
    rng = random.Random(text)
    total = 0
    for v in _seed_values()[text]:
        buf = kiln.Encoder(t, kernels=py).encode(v)
        assert kiln.Encoder(t, kernels=c).encode(v) == buf
        for m in mutations(buf, rng, 700):
            total += 1
            agree(py, c, m, text)
            agree(py, c, m, text, trusted=True, max_count=3, max_bytes=5)
    assert total >= 700


def test_golden_mutants_agree():
    assert len(KERNELS) == 2
    py, c = KERNELS
    rng = random.Random(2)
    for case in CASES:
        if case["error"] == "DEPTH":
            continue
        t = kiln.parse_type(case["type"])
        buf = bytes.fromhex(case["hex"])
        for m in mutations(buf, rng, 12):
            # a cap of 65536 elements: a mutant count word cannot make a list of
            # millions of empty structs for the reference to build (the default cap
            # is the golden cases' own)
            agree(py, c, m, case["type"], frame=case["framed"], max_count=1 << 16)
