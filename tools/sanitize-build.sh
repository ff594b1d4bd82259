#!/usr/bin/env bash
# Build a copy of the tree with kiln._kernels_c compiled by clang under
# AddressSanitizer + UndefinedBehaviorSanitizer.  Prints the copy's path.
#   tools/sanitize-build.sh [DEST] [extra clang -fsanitize= flags, e.g. fuzzer-no-link]
# Needs clang and libclang-rt-14-dev (Debian: apt-get install clang libclang-rt-14-dev).
# Build tools come from a private venv (KILN_SAN_VENV, default /tmp/kiln-san-venv)
# with the pinned Cython and setuptools of constraints/build.txt.
set -euo pipefail
SRC="$(cd "$(dirname "$0")/.." && pwd)"
DEST="${1:-/tmp/kiln-asan}"
EXTRA="${2:-}"
VENV="${KILN_SAN_VENV:-/tmp/kiln-san-venv}"
command -v clang >/dev/null || { echo "clang is missing: apt-get install clang libclang-rt-14-dev" >&2; exit 2; }
if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q -c "$SRC/constraints/build.txt" setuptools Cython >&2
    "$VENV/bin/pip" install -q numpy pytest hypothesis ml_dtypes atheris >&2
fi
rm -rf "$DEST"
mkdir -p "$DEST"
(cd "$SRC" && git ls-files -co --exclude-standard -z | grep -zv '\.so$' | xargs -0 cp --parents -t "$DEST")
cd "$DEST"
SAN="address,undefined${EXTRA:+,$EXTRA}"
CC=clang LDSHARED="clang -shared" \
    CFLAGS="-fsanitize=$SAN -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g -O1" \
    LDFLAGS="-fsanitize=address,undefined -shared-libasan" \
    "$VENV/bin/python" setup.py -q build_ext --inplace --force >/dev/null
echo "$DEST"
