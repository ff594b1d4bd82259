"""``python -m kiln``: the ``kiln`` command (see kiln.cli)."""

import sys
from typing import Any

from .cli import main


def __getattr__(name: str) -> Any:   # run_case (used by tests and tools), on first use
    if name == "run_case":
        from .cli import run_case
        return run_case
    raise AttributeError("module 'kiln.__main__' has no attribute %r" % name)


if __name__ == "__main__":
    sys.exit(main())
