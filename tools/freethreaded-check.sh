#!/usr/bin/env bash
# Run the whole test suite on a free-threaded CPython with the GIL off.
#
#   tools/freethreaded-check.sh [PYTHON]     (default: /opt/py313t/bin/python3.13t)
#
# Without a free-threaded interpreter, build one first (Debian; the source comes
# from Debian's archive, no other network needed):
#
#   curl -fO http://deb.debian.org/debian/pool/main/p/python3.13/python3.13_3.13.5.orig.tar.xz
#   tar xf python3.13_3.13.5.orig.tar.xz && cd Python-3.13.5
#   ./configure --disable-gil --prefix=/opt/py313t --with-ensurepip=install
#   make -j2 && make install
#
# The script makes a fresh venv, installs the project with its test extra
# less safetensors and ray (no free-threaded wheels; the project install builds
# the compiled kernels for that interpreter), checks that the
# interpreter really is free-threaded, and runs pytest with PYTHON_GIL=0 and the
# compiled kernels required.  It fails if importing kiln turned the GIL back on
# (CPython does that for a module not declared free-threading safe).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PY="${1:-/opt/py313t/bin/python3.13t}"
[ $# -gt 0 ] && shift
VENV="${KILN_FT_VENV:-/tmp/kiln-ft-venv}"
"$PY" -c 'import sysconfig, sys; sys.exit(0 if sysconfig.get_config_var("Py_GIL_DISABLED") else "not a free-threaded build: %s" % sys.executable)'
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
exec "$VENV/bin/python" -m pytest --c-extensions -q -p no:cacheprovider "$@"
