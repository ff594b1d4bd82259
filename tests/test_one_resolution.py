"""One call, one resolution of its path (issue 52): ``kiln.open``,
``load_tensors`` (views, a copy, ``into=``), ``load_metadata`` and ``load``
resolve what they are given once into a ``kiln._files.paths.Source`` that the
layers below take as it is.  A profiler counts the calls that enter
``kiln/_files/paths.py`` from another module, and the calls of
``local_path`` and ``is_sharded`` (the ``file://`` decoding and the set's
stat), whoever makes them."""

import os
import sys
from pathlib import Path

import numpy as np
import pytest

import kiln
from kiln._files import paths as _paths
from kiln._files import sharded as _sharded

PATHS = os.path.abspath(_paths.__file__)


def _entries(call):
    """(calls entering paths.py from outside it, local_path calls, is_sharded calls)."""
    seen = {"enter": 0, "local_path": 0, "is_sharded": 0}

    def prof(frame, event, arg):
        if event != "call":
            return
        code = frame.f_code
        if code is _paths.local_path.__code__:
            seen["local_path"] += 1
        if code is _sharded.is_sharded.__code__:
            seen["is_sharded"] += 1
        if os.path.abspath(code.co_filename) == PATHS and frame.f_back is not None and \
                os.path.abspath(frame.f_back.f_code.co_filename) != PATHS:
            seen["enter"] += 1

    sys.setprofile(prof)
    try:
        out = call()
    finally:
        sys.setprofile(None)
    return out, seen


@pytest.fixture
def saved(tmp_path):
    p = tmp_path / "m.kiln"
    kiln.save_tensors(p, {"w": np.arange(4, dtype=np.float32)}, metadata={"k": 1},
                      checksum=True)
    return p


def _calls(p, value_path):
    out = np.zeros(4, np.float32)
    return {
        "open": lambda: kiln.open(p).close(),
        "load_tensors": lambda: kiln.load_tensors(p)["w"].numpy().tolist(),
        "load_tensors copy": lambda: kiln.load_tensors(p, copy=True)["w"].numpy().tolist(),
        "load_tensors into": lambda: kiln.load_tensors(p, into={"w": out}) and out.tolist(),
        "load_metadata": lambda: kiln.load_metadata(p),
        "load": lambda: kiln.load(value_path, "list<i64>").tolist(),
    }


@pytest.mark.parametrize("how", ["str", "Path", "file URL"])
@pytest.mark.parametrize("name", ["open", "load_tensors", "load_tensors copy",
                                  "load_tensors into", "load_metadata", "load"])
def test_each_call_resolves_its_path_once(saved, tmp_path, how, name):
    v = tmp_path / "v.kiln"
    kiln.save(v, [1, 2], "list<i64>")
    p, vp = {"str": (str(saved), str(v)), "Path": (saved, v),
             "file URL": (Path(saved).as_uri(), Path(v).as_uri())}[how]
    want = {"open": None, "load_tensors": [0.0, 1.0, 2.0, 3.0],
            "load_tensors copy": [0.0, 1.0, 2.0, 3.0],
            "load_tensors into": [0.0, 1.0, 2.0, 3.0], "load_metadata": {"k": 1},
            "load": [1, 2]}[name]
    got, seen = _entries(_calls(p, vp)[name])
    assert got == want
    assert seen == {"enter": 1, "local_path": 1, "is_sharded": 1}, seen


def test_a_file_object_and_a_set_resolve_once(saved, tmp_path):
    with open(saved, "rb") as fh:
        got, seen = _entries(lambda: kiln.load_tensors(fh, copy=True)["w"].numpy().tolist())
    assert got == [0.0, 1.0, 2.0, 3.0] and seen["enter"] == 1 and seen["local_path"] == 0
    kiln.save_sharded({"a": np.ones(2, np.float32)}, tmp_path / "set")
    got, seen = _entries(lambda: kiln.open(tmp_path / "set").close())
    assert seen["enter"] == 1 and seen["is_sharded"] == 1
    with pytest.raises(ValueError, match="sharded set"):
        kiln.load_tensors(tmp_path / "set")


def test_a_file_url_in_capitals_is_a_local_file(saved, tmp_path):
    # a URL's scheme is case-insensitive: FILE:// names a local file, as file:// does
    url = "FILE://" + Path(saved).as_uri()[len("file://"):]
    with kiln.open(url) as f:
        assert f.path == str(saved) and f.keys() == ["w"]
    v = tmp_path / "v.kiln"
    kiln.save(v, [1, 2], "list<i64>")
    assert kiln.load("FILE://" + Path(v).as_uri()[7:], "list<i64>").tolist() == [1, 2]

