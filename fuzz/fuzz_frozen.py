"""atheris harness: Frozen values under a few fixed types (see oracle.FROZEN_TYPES)."""
import sys

import atheris

with atheris.instrument_imports():
    import oracle


def TestOneInput(data):
    oracle.check_frozen_input(data)


if __name__ == "__main__":
    atheris.Setup(sys.argv, TestOneInput)
    atheris.Fuzz()
