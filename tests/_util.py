import json
import os
import struct
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CASES_PATH = os.path.join(ROOT, "spec", "kiln-v2-cases.json")
sys.path.insert(0, os.path.join(ROOT, "spec", "reference"))
import kiln_ref  # noqa: E402  (the executable spec; standard library only)

with open(CASES_PATH) as _f:
    CASES = json.load(_f)["cases"]
CASE_BY_NAME = {c["name"]: c for c in CASES}


def f32_bits(x):
    return struct.pack("<f", x)


def f64_bits(x):
    return struct.pack("<d", x)
