"""atheris harness: record containers through the file reader and the stream
decoder, on both kernels (see records_oracle.py)."""
import os
import sys

sys.setdlopenflags(sys.getdlopenflags() | os.RTLD_GLOBAL)
import atheris  # noqa: E402

import numpy  # noqa: E402,F401

with atheris.instrument_imports(include=["kiln", "records_oracle"]):
    import records_oracle

if __name__ == "__main__":
    atheris.Setup(sys.argv, records_oracle.check_records_input)
    atheris.Fuzz()
