"""Kiln values through a real Ray runtime (a local raylet and one worker process):
pickle protocol 5 carries payloads out of band, into Ray's shared object store."""

import numpy as np
import pytest

import kiln

ray = pytest.importorskip(
    "ray", reason="ray is not installed (the ray extra; it is empty where Ray has no wheel: "
                  "outside Linux x86_64/aarch64 or on Python 3.14+)")


@pytest.fixture(scope="module")
def ray_session():
    ray.init(num_cpus=1, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()


SAMPLE = kiln.parse_type("struct{id:i64,text:str,t:tensors,}")


def _sample():
    value = {"id": 7, "text": "seven",
             "t": {"w": np.arange(1 << 16, dtype=np.float32).reshape(256, 256),
                   "q": np.array([1, -2, 3], np.int8)}}
    return kiln.decode(kiln.encode(value, SAMPLE), SAMPLE)


def test_directories_and_records_travel_through_the_object_store(ray_session):
    rec = _sample()
    ref = ray.put(rec)
    a, b = ray.get(ref), ray.get(ref)
    assert a["id"] == 7 and a["text"] == "seven" and a["t"] == rec["t"]
    wa, wb = a["t"]["w"].numpy(), b["t"]["w"].numpy()
    # both reads view the one copy in the object store: no payload was copied out
    assert np.shares_memory(wa, wb) and not wa.flags.writeable

    @ray.remote
    def total(r):
        return float(r["t"]["w"].numpy().sum()) + int(r["t"]["q"].numpy().sum()) + r["id"]

    want = float(rec["t"]["w"].numpy().sum()) + 2 + 7
    assert ray.get(total.remote(ref)) == want

    @ray.remote
    def rebuild(r):
        return kiln.decode_tensors(kiln.encode_tensors(r["t"]))

    d = ray.get(rebuild.remote(ref))
    assert d == rec["t"] and d.names == rec["t"].names
