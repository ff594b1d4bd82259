"""Replay the committed fuzz corpus (golden cases plus minimized findings)
through the fuzzing oracle: both implementations agree, accepted inputs
re-encode exactly, and nothing but KilnError is raised."""

import os
import sys

import pytest

from _util import ROOT

sys.path.insert(0, os.path.join(ROOT, "fuzz"))
import oracle  # noqa: E402

CORPUS = os.path.join(ROOT, "fuzz", "corpus")
FILES = [(kind, name) for kind in ("frozen", "directory")
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
    else:
        oracle.check_directory_input(data)
