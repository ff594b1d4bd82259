"""The file API is typed (issue 32, point 1): kiln.open gives a KilnFile (or a
RemoteFile for a URL), both Mapping[str, Tensor]; kiln.load(path, R) is an R.
tests/typing/file_api.py runs, and passes mypy --strict and pyright --strict."""

import os
import subprocess
import sys

from test_typing import HERE, _mypy, _pyright, _pyright_errors

FILE_API = os.path.join(HERE, "file_api.py")


def test_the_file_api_code_runs():
    r = subprocess.run([sys.executable, FILE_API], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr


def test_mypy_strict_accepts_the_file_api_code(tmp_path):
    r = _mypy(FILE_API, tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr


def test_pyright_strict_accepts_the_file_api_code(tmp_path):
    r = _pyright(FILE_API, tmp_path)
    assert _pyright_errors(r) == [], r.stdout[-4000:]
