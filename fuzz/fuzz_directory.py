"""atheris harness: tensor directories (views, copies, trusted, small caps)."""
import os
import sys

# the sanitized extension is built with -fsanitize=fuzzer-no-link: its coverage
# hooks resolve against the libFuzzer inside atheris, so load that globally
sys.setdlopenflags(sys.getdlopenflags() | os.RTLD_GLOBAL)
import atheris  # noqa: E402

with atheris.instrument_imports():
    import oracle


def TestOneInput(data):
    oracle.check_directory_input(data)


if __name__ == "__main__":
    atheris.Setup(sys.argv, TestOneInput)
    atheris.Fuzz()
