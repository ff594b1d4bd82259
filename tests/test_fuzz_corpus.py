"""Replay the committed fuzz corpus (golden cases plus minimized findings)
through the fuzzing oracle: both implementations agree, accepted inputs
re-encode exactly, and nothing but KilnError is raised.  The converter
corpora (safetensors, gguf, npz) go through kiln convert: only KilnError,
and every output passes kiln.load_tensors."""

import os
import sys

import pytest

from _util import ROOT

sys.path.insert(0, os.path.join(ROOT, "fuzz"))
import oracle  # noqa: E402

CORPUS = os.path.join(ROOT, "fuzz", "corpus")
FILES = [(kind, name) for kind in ("frozen", "directory") + oracle.CONVERT_KINDS
         for name in sorted(os.listdir(os.path.join(CORPUS, kind)))]


def test_corpus_is_there():
    assert len(FILES) > 200


@pytest.fixture(autouse=True)
def _need_compiled(pytestconfig):
    from conftest import _want_c
    if _want_c(pytestconfig):
        assert oracle._kernels_c is not None, "the compiled kernels are expected"


@pytest.mark.parametrize("kind,name", FILES, ids=["%s/%s" % f for f in FILES])
def test_replay(kind, name):
    with open(os.path.join(CORPUS, kind, name), "rb") as f:
        data = f.read()
    if kind == "frozen":
        oracle.check_frozen_input(data)
    elif kind == "directory":
        oracle.check_directory_input(data)
    else:
        oracle.check_convert_input(kind, data)


@pytest.mark.parametrize("kind", oracle.CONVERT_KINDS)
def test_each_converter_has_accepted_and_refused_seeds(kind):
    outcomes = set()
    for name in sorted(os.listdir(os.path.join(CORPUS, kind))):
        with open(os.path.join(CORPUS, kind, name), "rb") as f:
            outcomes.add(oracle.check_convert_input(kind, f.read())[0])
    assert outcomes == {"ok", "err"}
