"""What every atheris harness here shares: load libFuzzer globally, then import
the oracle (and through it kiln) with Python coverage instrumentation."""
import os
import sys

# the sanitized extension is built with -fsanitize=fuzzer-no-link: its coverage
# hooks resolve against the libFuzzer inside atheris, so load that globally
sys.setdlopenflags(sys.getdlopenflags() | os.RTLD_GLOBAL)
import atheris  # noqa: E402

# instrument only our own code: numpy's Python layer, imported through kiln,
# would otherwise be instrumented too and slow every input down
import numpy  # noqa: E402,F401

with atheris.instrument_imports(include=["kiln", "oracle"]):
    import oracle  # noqa: F401


def main(test_one_input):
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()
