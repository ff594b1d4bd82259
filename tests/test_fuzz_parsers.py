"""Replay the committed corpus of the parsers' fuzz harness (fuzz/fuzz_parsers.py)
through its oracle: JSON Schema text, type text and metadata blocks raise only
kiln's errors, both kernels agree on metadata, accepted inputs round-trip."""

import os
import sys

import pytest

from _util import ROOT

sys.path.insert(0, os.path.join(ROOT, "fuzz"))
import parsers_oracle  # noqa: E402

CORPUS = os.path.join(ROOT, "fuzz", "corpus", "parsers")
FILES = sorted(os.listdir(CORPUS))


@pytest.fixture(autouse=True)
def _need_compiled(pytestconfig):
    from conftest import _want_c
    if _want_c(pytestconfig):
        assert parsers_oracle._kernels_c is not None, "the compiled kernels are expected"


@pytest.mark.parametrize("name", FILES)
def test_replay(name):
    with open(os.path.join(CORPUS, name), "rb") as f:
        data = f.read()
    got = parsers_oracle.check_parsers_input(data)
    if name.startswith("finding-"):
        assert got[0] == "err", got   # each finding is an input kiln must refuse
    else:
        assert got[0] == "ok", got
