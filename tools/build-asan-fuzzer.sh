#!/usr/bin/env bash
# Merge clang's ASan runtime (which bundles UBSan's handlers) with libFuzzer
# into one shared library to LD_PRELOAD under atheris.  The plain ASan runtime
# would provide weak coverage hooks that shadow libFuzzer's and blind the
# fuzzer, so those hooks are stripped from its sanitizer_coverage object.
#   tools/build-asan-fuzzer.sh [OUT]   (default /tmp/kiln-asan-fuzzer/asan_with_fuzzer.so)
set -euo pipefail
OUT="${1:-/tmp/kiln-asan-fuzzer/asan_with_fuzzer.so}"
L="$(dirname "$(clang -print-file-name=libclang_rt.asan-x86_64.a)")"
W="$(mktemp -d)"
mkdir -p "$W/a" "$W/f" "$(dirname "$OUT")"
(cd "$W/a" && ar x "$L/libclang_rt.asan-x86_64.a" && ar x "$L/libclang_rt.asan_cxx-x86_64.a" \
    && rm -f asan_preinit.cpp.o)
(cd "$W/f" && ar x "$L/libclang_rt.fuzzer_no_main-x86_64.a")
COV="$W/a/sanitizer_coverage_libcdep_new.cpp.o"
nm "$COV" | awk '$2 ~ /[TWV]/ {print $3}' | sort > "$W/cov"
nm "$W"/f/*.o 2>/dev/null | awk '$2 ~ /[TWV]/ {print $3}' | sort -u > "$W/fz"
comm -12 "$W/cov" "$W/fz" | sed 's/^/--strip-symbol=/' | xargs objcopy "$COV"
clang++ -shared -fPIC -o "$OUT" "$W"/a/*.o "$W"/f/*.o -lpthread -ldl -lrt -lm
rm -rf "$W"
echo "$OUT"
