"""tests/conftest.py fails a run for the kiln-named entries the run itself left
in its own temporary folder, and never for what another process writes in the
system's temporary folder meanwhile (issue 60, item 15).  Each case runs a
small pytest session in a child process with this conftest."""

import os
import shutil
import subprocess
import sys

import kiln

HERE = os.path.dirname(os.path.abspath(__file__))


def _session(tmp_path, body):
    suite = tmp_path / "suite"
    suite.mkdir()
    shutil.copy(os.path.join(HERE, "conftest.py"), suite / "conftest.py")
    (suite / "test_one.py").write_text(body)
    system_tmp = tmp_path / "system-tmp"   # the child's system temporary folder
    system_tmp.mkdir()
    env = dict(os.environ, TMPDIR=str(system_tmp),   # the kiln under test, wherever it is
               PYTHONPATH=os.path.dirname(os.path.dirname(kiln.__file__)))
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        "--rootdir", str(suite), "--basetemp", str(tmp_path / "base"),
                        str(suite)],
                       cwd=str(suite), env=env, capture_output=True, text=True, timeout=120)
    return r, system_tmp


def test_another_process_in_the_system_tmp_does_not_fail_the_run(tmp_path):
    r, system_tmp = _session(tmp_path, (
        "import os\n"
        "def test_other():\n"
        "    os.mkdir(os.path.join(%r, 'kiln-demo-by-another-process'))\n" % str(tmp_path / "system-tmp")))
    assert r.returncode == 0, r.stdout + r.stderr
    assert os.listdir(system_tmp) == ["kiln-demo-by-another-process"]


def test_what_the_run_left_in_its_own_tmp_fails_it(tmp_path):
    r, _ = _session(tmp_path, (
        "import tempfile\n"
        "def test_leaves():\n"
        "    tempfile.mkdtemp(prefix='kiln-left-')\n"))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "the suite left 1 entries" in r.stdout and "kiln-left-" in r.stdout


# --- issue 60, item 16: the README says how to run the torch tests ------------------

ROOT = os.path.dirname(HERE)


def test_the_readme_says_how_to_run_the_torch_tests():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    start = readme.index("## The two commands")
    section = readme[start:readme.index("\n## ", start + 1)]
    assert "python -m pytest --c-extensions -q -m torch --require-torch" in section
    assert "pip install 'torch==" in section and "transformers" in section


def test_no_skip_message_calls_torch_outside_ci():
    stale = []
    for name in sorted(os.listdir(HERE)):
        if name.endswith(".py") and name != os.path.basename(__file__):
            with open(os.path.join(HERE, name), encoding="utf-8") as f:
                if "not a CI dependency" in f.read():
                    stale.append(name)
    assert stale == []
