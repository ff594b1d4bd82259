"""``python -m kiln``: the ``kiln`` command (see kiln.cli)."""

import sys

from .cli import main, run_case  # noqa: F401  (run_case: used by tests and tools)

if __name__ == "__main__":
    sys.exit(main())
