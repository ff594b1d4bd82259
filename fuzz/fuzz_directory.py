"""atheris harness: tensor directories (views, copies, trusted, small caps)."""
import sys

import atheris

with atheris.instrument_imports():
    import oracle


def TestOneInput(data):
    oracle.check_directory_input(data)


if __name__ == "__main__":
    atheris.Setup(sys.argv, TestOneInput)
    atheris.Fuzz()
