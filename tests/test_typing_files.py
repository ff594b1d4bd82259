"""The file API is typed (issue 32, point 1): kiln.open gives a KilnFile (or a
RemoteFile for a URL), both Mapping[str, Tensor]; kiln.load(path, R) is an R.
tests/typing/file_api.py runs, and passes mypy --strict and pyright --strict."""

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from test_typing import HERE, KILN_PARENT, _mypy, _need, _pyright, _pyright_errors

FILE_API = os.path.join(HERE, "file_api.py")


def test_the_file_api_code_runs():
    r = subprocess.run([sys.executable, FILE_API], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr


def test_mypy_strict_accepts_the_file_api_code(mypy_cache):
    r = _mypy(FILE_API, mypy_cache)
    assert r.returncode == 0, r.stdout + r.stderr


def test_pyright_strict_accepts_the_file_api_code(tmp_path):
    r = _pyright(FILE_API, tmp_path)
    assert _pyright_errors(r) == [], r.stdout[-4000:]


def _readme_mypy_config():
    """The [tool.mypy] part of the README's advice for an editable install."""
    with open(os.path.join(KILN_PARENT, "README.md"), encoding="utf-8") as f:
        text = f.read()
    block = text.split("# pyproject.toml of your project\n", 1)[1].split("```", 1)[0]
    return block.split("[tool.pyright]", 1)[0]


def test_the_readme_mypy_config_for_a_checkout_works(tmp_path):
    """README, "Type checking": mypy pointed at the checkout with the config shown
    checks the user's code only (without follow_imports it reported kiln's own
    internals: about a thousand errors)."""
    if not os.path.isfile(os.path.join(KILN_PARENT, "README.md")):
        pytest.skip("kiln is an installed wheel here, not a checkout: the README's advice "
                    "for a checkout does not apply")
    _need("mypy", "mypy")
    conf = _readme_mypy_config().replace("/path/to/kiln-checkout", KILN_PARENT)
    (tmp_path / "pyproject.toml").write_text(conf)
    shutil.copy(FILE_API, tmp_path / "user.py")
    env = {k: v for k, v in os.environ.items() if k not in ("MYPYPATH", "PYTHONPATH")}
    r = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / "c"),
                        "user.py"], capture_output=True, text=True, cwd=tmp_path, env=env,
                       timeout=300)
    assert r.returncode == 0 and "Success" in r.stdout, r.stdout[-3000:]


def test_a_compat_editable_install_type_checks(tmp_path):
    """``pip install -e . --config-settings editable_mode=compat`` puts the checkout
    on a .pth line in site-packages; a venv made so (and one more .pth line for
    numpy) is what mypy --strict sees through --python-executable."""
    _need("mypy", "mypy")
    _need("basedpyright", "basedpyright")
    venv = tmp_path / "ev"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    py = str(venv / "bin" / "python")
    site = subprocess.run([py, "-c", "import site; print(site.getsitepackages()[0])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    np_site = os.path.dirname(os.path.dirname(np.__file__))
    with open(os.path.join(site, "__editable__.kiln_wire.pth"), "w") as f:
        f.write(KILN_PARENT + "\n" + np_site + "\n")
    shutil.copy(FILE_API, tmp_path / "user.py")
    env = {k: v for k, v in os.environ.items() if k not in ("MYPYPATH", "PYTHONPATH")}
    r = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--python-executable", py,
                        "--cache-dir", str(tmp_path / "c"), "user.py"], capture_output=True,
                       text=True, cwd=tmp_path, env=env, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:]
    (tmp_path / "pyrightconfig.json").write_text('{"typeCheckingMode": "strict"}')
    r = subprocess.run([sys.executable, "-m", "basedpyright", "-p",
                        str(tmp_path / "pyrightconfig.json"), "--pythonpath", py,
                        "--outputjson", str(tmp_path / "user.py")], capture_output=True,
                       text=True, cwd=tmp_path, env=env, timeout=300)
    assert _pyright_errors(r) == [], r.stdout[-3000:]


def test_a_kiln_file_is_a_mapping(tmp_path):
    from collections.abc import Mapping
    import kiln
    p = tmp_path / "m.kiln"
    kiln.save_tensors(p, {"a": np.ones(2, np.float32), "b": np.zeros(3, np.int8)})
    with kiln.open(p) as f:
        assert isinstance(f, Mapping) and isinstance(f, kiln.KilnFile)
        assert f.keys() == ["a", "b"] and list(f) == ["a", "b"] and len(f) == 2
        assert [k for k, _ in f.items()] == ["a", "b"] and len(f.values()) == 2
        assert "a" in f and "z" not in f and f.get("z") is None and f.get("z", 5) == 5
        assert f.get("b").numpy().tolist() == [0, 0, 0]
        assert sorted(dict(f)) == ["a", "b"] and f == f and len({f}) == 1
    with kiln.open(p) as g:
        assert g != f    # a file is a handle: compared by identity
