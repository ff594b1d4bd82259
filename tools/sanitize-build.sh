#!/usr/bin/env bash
# Build a copy of the tree with kiln._kernels_c compiled by clang under
# AddressSanitizer + UndefinedBehaviorSanitizer.  Prints the copy's path.
#   tools/sanitize-build.sh [DEST]      (default: /tmp/kiln-asan)
# Needs: clang and libclang-rt-14-dev (Debian: apt-get install clang libclang-rt-14-dev).
set -euo pipefail
SRC="$(cd "$(dirname "$0")/.." && pwd)"
DEST="${1:-/tmp/kiln-asan}"
command -v clang >/dev/null || { echo "clang is missing: apt-get install clang libclang-rt-14-dev" >&2; exit 2; }
rm -rf "$DEST"
mkdir -p "$DEST"
(cd "$SRC" && git ls-files -co --exclude-standard -z | grep -zv '\.so$' | xargs -0 cp --parents -t "$DEST")
cd "$DEST"
SAN="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g -O1"
CC=clang LDSHARED="clang -shared" CFLAGS="$SAN" LDFLAGS="-fsanitize=address,undefined -shared-libasan" \
    python3 setup.py -q build_ext --inplace --force >/dev/null
echo "$DEST"
