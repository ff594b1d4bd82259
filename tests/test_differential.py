"""Both implementations give the same outcome on thousands of mutated inputs:
the same value, or the same error code and offset."""

import random
import struct

import numpy as np
import pytest

import kiln
from conftest import both_kernels
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


def outcome(kernels, buf, t, **kw):
    try:
        v = kiln.Decoder(t, kernels=kernels, **kw).decode(buf)
    except kiln.KilnError as e:
        return ("err", e.code, e.offset)
    if "frame" in kw:
        return ("ok", None)
    try:
        return ("ok", kiln.Encoder(t, kernels=kernels).encode(v))
    except kiln.EncodeError as e:
        # a trusted decode lets invalid UTF-8 (and bad scale counts) through;
        # the encoder checks everything, so it cannot write them back
        assert kw.get("trusted") and e.code in ("UTF8", "TYPE"), e
        return ("ok-unencodable", e.code)


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
            a = outcome(py, m, t)
            b = outcome(c, m, t)
            assert a == b, (m.hex(), a, b)
            a = outcome(py, m, t, trusted=True, max_count=3, max_bytes=5)
            b = outcome(c, m, t, trusted=True, max_count=3, max_bytes=5)
            assert a == b, (m.hex(), a, b)
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
            a = outcome(py, m, t, frame=case["framed"])
            b = outcome(c, m, t, frame=case["framed"])
            assert a == b, (case["name"], m.hex(), a, b)
