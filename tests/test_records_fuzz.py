"""The record container's fuzz oracle (fuzz/records_oracle.py) over its corpus
and over random mutations of it: both kernels, the file reader and the stream
decoder in several chunkings agree, and only KilnError escapes."""

import os
import random
import sys

import pytest

from _util import ROOT

sys.path.insert(0, os.path.join(ROOT, "fuzz"))
import records_oracle  # noqa: E402

CORPUS = os.path.join(ROOT, "fuzz", "corpus", "records")
FILES = sorted(os.listdir(CORPUS))


@pytest.fixture(autouse=True)
def _need_compiled(pytestconfig):
    from conftest import _want_c
    if _want_c(pytestconfig):
        assert records_oracle._kernels_c is not None, "the compiled kernels are expected"


@pytest.mark.parametrize("name", FILES)
def test_replay(name):
    with open(os.path.join(CORPUS, name), "rb") as f:
        records_oracle.check_records_input(f.read())


def test_mutations():
    rng = random.Random(33)
    seeds = [open(os.path.join(CORPUS, n), "rb").read() for n in FILES]
    for _ in range(300):
        data = bytearray(rng.choice(seeds))
        for _ in range(rng.randint(1, 3)):
            at = rng.randrange(1, len(data)) if len(data) > 1 else 0
            op = rng.randrange(3)
            if op == 0:
                data[at] = rng.randrange(256)
            elif op == 1:
                del data[at:at + rng.randint(1, 8)]
            else:
                data[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        data[0] = rng.randrange(32)
        records_oracle.check_records_input(bytes(data))


@pytest.mark.parametrize("target", ["file", "stream"])
def test_the_differential_harness_finds_nothing_in_a_short_run(target, pytestconfig):
    """fuzz/records_diff_oracle.py (structural mutations that keep every CRC right,
    the index rebuilt to agree) for a few hundred inputs: the kernels agree,
    and the stream's count is the records handed out in every chunking."""
    import records_diff_oracle as records_diff
    from conftest import _want_c
    if not _want_c(pytestconfig):
        pytest.skip("a differential run needs the compiled kernels beside the pure ones")
    runs, findings = records_diff.run(target, cases=300, seed=38, report=None)
    assert runs == 300
    assert not findings, [f[:2] for f in findings]

