"""The public API is typed: typical user code passes mypy --strict and pyright's
strict mode, and the mistakes in user_mistakes.py are each reported."""

import importlib.util
import json
import os
import re
import subprocess
import sys

import pytest

import kiln

from _util import mypy_path

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "typing")
# the folder that holds the kiln package: an editable install hides it behind
# an import hook that type checkers do not run
KILN_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(kiln.__file__)))
USER = os.path.join(HERE, "user_code.py")
MISTAKES = os.path.join(HERE, "user_mistakes.py")


def _mistake_lines():
    with open(MISTAKES) as f:
        return [i for i, line in enumerate(f, 1) if "# E:" in line]


def test_the_user_code_runs():
    r = subprocess.run([sys.executable, USER], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr


IN_CI = os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def _need(module, dist):
    """The checker is a test dependency: missing, the test skips naming it, or
    fails under CI=true (pip install -e '.[test]' installs both)."""
    if importlib.util.find_spec(module) is None:
        msg = "%s is not installed (pip install -e '.[test]' installs it)" % dist
        if IN_CI:
            pytest.fail(msg + " -- CI=true: required")
        pytest.skip(msg)


def _mypy(path, cache):
    _need("mypy", "mypy")
    env = dict(os.environ, MYPYPATH=mypy_path())
    return subprocess.run([sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent",
                           "--cache-dir", str(cache), "--no-error-summary", path],
                          capture_output=True, text=True, env=env, timeout=300)


def test_mypy_strict_accepts_typical_user_code(mypy_cache):
    r = _mypy(USER, mypy_cache)
    assert r.returncode == 0, r.stdout + r.stderr


def test_mypy_reports_each_mistake(mypy_cache):
    r = _mypy(MISTAKES, mypy_cache)
    lines = {int(m) for m in re.findall(r"user_mistakes\.py:(\d+): error", r.stdout)}
    assert lines == set(_mistake_lines()), r.stdout


def _pyright(path, tmp_path):
    _need("basedpyright", "basedpyright")
    conf = tmp_path / "pyrightconfig.json"
    conf.write_text(json.dumps({"extraPaths": [KILN_PARENT], "typeCheckingMode": "strict",
                                "pythonVersion": "%d.%d" % sys.version_info[:2]}))
    return subprocess.run([sys.executable, "-m", "basedpyright", "-p", str(conf),
                           "--pythonpath", sys.executable, "--outputjson", path],
                          capture_output=True, text=True, timeout=300)


def _pyright_errors(r):
    out = json.loads(r.stdout)
    return [d for d in out["generalDiagnostics"] if d["severity"] == "error"]


def test_pyright_strict_accepts_typical_user_code(tmp_path):
    r = _pyright(USER, tmp_path)
    assert _pyright_errors(r) == [], r.stdout[-4000:]


def test_pyright_reports_each_mistake(tmp_path):
    r = _pyright(MISTAKES, tmp_path)
    got = {d["range"]["start"]["line"] + 1 for d in _pyright_errors(r)}
    assert set(_mistake_lines()) <= got, r.stdout[-4000:]


FOUND = '''import dataclasses
import kiln

@dataclasses.dataclass
class S:
    a: int

x: S = kiln.decode(kiln.encode(S(1), S), S)
'''


def test_type_checkers_find_kiln_where_it_is_installed(tmp_path):
    """No search path given: a user's file in its own folder, checked with the
    environment's kiln as the README installs it (``pip install -e .`` in a
    checkout: a path entry, not an import hook; an installed wheel in CI's
    venvs).  Both checkers once said kiln could not be found after an
    editable install."""
    _need("mypy", "mypy")
    _need("basedpyright", "basedpyright")
    user = tmp_path / "user.py"
    user.write_text(FOUND)
    env = {k: v for k, v in os.environ.items() if k not in ("MYPYPATH", "PYTHONPATH")}
    r = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--cache-dir",
                        str(tmp_path / "mypy"), "user.py"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    (tmp_path / "pyrightconfig.json").write_text(json.dumps({"typeCheckingMode": "strict"}))
    r = subprocess.run([sys.executable, "-m", "basedpyright", "--pythonpath", sys.executable,
                        "--outputjson", "user.py"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300)
    assert _pyright_errors(r) == [], r.stdout[-4000:]
