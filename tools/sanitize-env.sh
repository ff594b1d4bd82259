# Source this to run Python with the ASan/UBSan runtime preloaded (the
# interpreter itself is not instrumented, so the runtime must come first).
ASAN_RT="$(clang -print-file-name=libclang_rt.asan-x86_64.so)"
export LD_PRELOAD="$ASAN_RT"
# CPython's own allocations are not freed at exit: leak checking is off.
export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:allocator_may_return_null=1:halt_on_error=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
# PyMem through the system malloc so ASan sees every Python allocation
export PYTHONMALLOC=malloc
