#!/usr/bin/env bash
# Differential fuzzing under ASan + UBSan (see fuzz/README.md).
#   fuzz/run.sh HARNESS SECONDS [extra libFuzzer flags]
# HARNESS: frozen | directory | structured | safetensors | gguf | npz | records | parsers.  Findings land in fuzz/artifacts/HARNESS/.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
H="$1"; SECS="$2"; shift 2
VENV="${KILN_SAN_VENV:-/tmp/kiln-san-venv}"
DEST="$("$ROOT/tools/sanitize-build.sh" "/tmp/kiln-fuzz-$H" fuzzer-no-link)"
. "$ROOT/tools/sanitize-env.sh"
# ASan + libFuzzer in one preloaded library, so coverage reaches the fuzzer
PRELOAD="$(LD_PRELOAD= "$ROOT/tools/build-asan-fuzzer.sh")"
LD_PRELOAD= mkdir -p "$ROOT/fuzz/artifacts/$H" "/tmp/kiln-fuzz-work-$H"
SEED=()
case "$H" in
    frozen) SEED=("$ROOT/fuzz/corpus/frozen") ;;
    directory) SEED=("$ROOT/fuzz/corpus/directory") ;;
    structured) SEED=("$ROOT/fuzz/corpus/frozen") ;;  # any bytes seed Hypothesis' choices
    safetensors|gguf|npz) SEED=("$ROOT/fuzz/corpus/$H") ;;
    records) SEED=("$ROOT/fuzz/corpus/records") ;;
    parsers) SEED=("$ROOT/fuzz/corpus/parsers") ;;
esac
cd "$DEST/fuzz"
export PYTHONPATH="$DEST:$DEST/fuzz"
export LD_PRELOAD="$PRELOAD"
# /usr/bin/time reports the fuzzer's own CPU time (the build above is not counted)
TIMER=()
if [ -x /usr/bin/time ]; then
    TIMER=(/usr/bin/time -f "kiln-fuzz $H: cpu user %U s, sys %S s, wall %e s, max rss %M KiB")
fi
exec "${TIMER[@]}" "$VENV/bin/python" "fuzz_$H.py" -max_total_time="$SECS" -malloc_limit_mb=512 \
    -rss_limit_mb=4096 -timeout=20 -print_final_stats=1 \
    -artifact_prefix="$ROOT/fuzz/artifacts/$H/" "$@" "/tmp/kiln-fuzz-work-$H" "${SEED[@]}"
