#!/usr/bin/env bash
# Differential fuzzing under ASan + UBSan.
#   fuzz/run.sh HARNESS SECONDS [extra libFuzzer flags]
# HARNESS: frozen | directory | structured.  Findings land in fuzz/artifacts/.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
H="$1"; SECS="$2"; shift 2
DEST="$("$ROOT/tools/sanitize-build.sh" "/tmp/kiln-fuzz-$H")"
. "$ROOT/tools/sanitize-env.sh"
mkdir -p "$ROOT/fuzz/artifacts/$H" "/tmp/kiln-fuzz-work-$H"
case "$H" in
    frozen) SEED="$ROOT/fuzz/corpus/frozen" ;;
    directory) SEED="$ROOT/fuzz/corpus/directory" ;;
    *) SEED="" ;;
esac
cd "$DEST/fuzz"
exec python3 "fuzz_$H.py" -max_total_time="$SECS" -malloc_limit_mb=512 -rss_limit_mb=4096 \
    -timeout=20 -print_final_stats=1 -artifact_prefix="$ROOT/fuzz/artifacts/$H/" "$@" \
    "/tmp/kiln-fuzz-work-$H" $SEED
