"""What every atheris harness here shares: load libFuzzer globally, then import
the oracle (and through it kiln) with Python coverage instrumentation."""
import os
import sys

# the sanitized extension is built with -fsanitize=fuzzer-no-link: its coverage
# hooks resolve against the libFuzzer inside atheris, so load that globally
sys.setdlopenflags(sys.getdlopenflags() | os.RTLD_GLOBAL)
import atheris  # noqa: E402

with atheris.instrument_imports():
    import oracle  # noqa: F401


def main(test_one_input):
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()
