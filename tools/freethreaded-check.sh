#!/usr/bin/env bash
# Run the thread stress suite, then the whole test suite, on a free-threaded
# CPython with the GIL off: the interpreter the free-threaded wheels target,
# 3.14t.
#
#   tools/freethreaded-check.sh [PYTHON] [pytest args...]
#       PYTHON: default python3.14t on PATH, else /opt/py314t/bin/python3.14t
#   KILN_STRESS_ROUNDS=N   rounds of each stress case (default 5; the suite's
#                          own run of tests/test_thread_stress.py does 1)
#   KILN_FT_STRESS_ONLY=1  stop after the stress suite
#   KILN_FT_ANY=1          accept a free-threaded CPython older than 3.14
#                          (3.13t has bytearray and memoryview races of its
#                          own: see docs/threads.md)
#
# Without a free-threaded interpreter, build one from the CPython 3.14 source
# (slow on 2 cores: run it with nice):
#
#   ./configure --disable-gil --prefix=/opt/py314t --with-ensurepip=install
#   make -j2 && make install
#
# The script makes a fresh venv, installs the project with its test extra
# less safetensors and ray (no free-threaded wheels; the project install builds
# the compiled kernels for that interpreter), checks that the
# interpreter really is free-threaded, and runs pytest with PYTHON_GIL=0 and the
# compiled kernels required: first tests/test_thread_stress.py (each case of
# issue 28 in a child process under a time limit, both kernels,
# KILN_STRESS_ROUNDS rounds), then everything.  It fails if importing kiln
# turned the GIL back on (CPython does that for a module not declared
# free-threading safe).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
if [ $# -gt 0 ]; then
    PY="$1"; shift
elif command -v python3.14t >/dev/null; then
    PY="$(command -v python3.14t)"
else
    PY=/opt/py314t/bin/python3.14t
fi
VENV="${KILN_FT_VENV:-/tmp/kiln-ft-venv}"
"$PY" -c 'import sysconfig, sys; sys.exit(0 if sysconfig.get_config_var("Py_GIL_DISABLED") else "not a free-threaded build: %s" % sys.executable)'
"$PY" -c 'import os, sys; sys.exit(0 if sys.version_info >= (3, 14) or os.environ.get("KILN_FT_ANY") else "%s is %s: the free-threaded wheels target 3.14t (KILN_FT_ANY=1 to run anyway)" % (sys.executable, sys.version.split()[0]))'
rm -rf "$VENV"
"$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
# mypy 2 needs ast-serialize, which has no free-threaded wheel (and building it
# needs crates.io): keep mypy below 2 here
FT_CONSTRAINTS="$(mktemp)"
{ [ -n "${PIP_CONSTRAINT:-}" ] && cat "$PIP_CONSTRAINT"; echo "mypy<2"; } > "$FT_CONSTRAINTS"
# The test extra, less the packages that have no free-threaded wheel and need
# network to build (safetensors and moto's cryptography: crates.io; Ray has no
# source at all): their tests skip, saying so.
FT_REQS="$(mktemp)"
"$VENV/bin/python" - "$ROOT/pyproject.toml" > "$FT_REQS" <<'EOF'
import re, sys, tomllib
skip = {"safetensors", "ray", "moto", "flask", "flask-cors"}
for req in tomllib.load(open(sys.argv[1], "rb"))["project"]["optional-dependencies"]["test"]:
    if re.match(r"[A-Za-z0-9_.-]+", req).group(0).lower() not in skip:
        print(req)
EOF
(cd "$ROOT" && PIP_CONSTRAINT="$FT_CONSTRAINTS" "$VENV/bin/python" -m pip install -q \
    --prefer-binary --only-binary=hypothesis -e . -r "$FT_REQS")
rm -f "$FT_CONSTRAINTS" "$FT_REQS"
cd "$ROOT"
export PYTHON_GIL=0
"$VENV/bin/python" - <<'EOF'
import sys, kiln
print("python", sys.version.split()[0], "gil enabled:", sys._is_gil_enabled(),
      "kiln:", kiln.IMPLEMENTATION)
assert not sys._is_gil_enabled() and kiln.IMPLEMENTATION == "cython"
EOF
export KILN_STRESS_ROUNDS="${KILN_STRESS_ROUNDS:-5}"
"$VENV/bin/python" -m pytest --c-extensions -q -p no:cacheprovider tests/test_thread_stress.py
[ -n "${KILN_FT_STRESS_ONLY:-}" ] && exit 0
unset KILN_STRESS_ROUNDS
exec "$VENV/bin/python" -m pytest --c-extensions -q -p no:cacheprovider "$@"
