"""RecordFile[R], RecordWriter[R] and StreamDecoder[R] are typed: the user code
passes mypy --strict and pyright strict, and each marked mistake is reported."""

import re


import test_typing as TT

USER = TT.os.path.join(TT.HERE, "records_code.py")
MISTAKES = TT.os.path.join(TT.HERE, "records_mistakes.py")


def _marked():
    with open(MISTAKES) as f:
        return {i for i, line in enumerate(f, 1) if "# E:" in line}


def test_user_code_runs():
    r = TT.subprocess.run([TT.sys.executable, USER], capture_output=True, text=True,
                          timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr


def test_mypy(mypy_cache):
    ok = TT._mypy(USER, mypy_cache)
    assert ok.returncode == 0, ok.stdout
    r = TT._mypy(MISTAKES, mypy_cache)
    assert {int(m) for m in re.findall(r"records_mistakes\.py:(\d+): error", r.stdout)} \
        == _marked(), r.stdout


def test_pyright(tmp_path):
    assert TT._pyright_errors(TT._pyright(USER, tmp_path)) == []
    got = {d["range"]["start"]["line"] + 1 for d in TT._pyright_errors(TT._pyright(MISTAKES,
                                                                                    tmp_path))}
    assert _marked() <= got
