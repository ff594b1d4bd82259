"""The golden cases that ship with kiln (``kiln cases``).

Their one source is ``spec/kiln-v2-cases.json``.  A built wheel holds a copy at
``kiln/data/kiln-v2-cases.json``, written from spec/ by setup.py's build_py; a
source checkout and an editable install hold no copy and read spec/ itself.
"""

import os

CASES_NAME = "kiln-v2-cases.json"


def cases_path() -> str:
    """The path of the golden-case file: the wheel's copy when there is one,
    else ``spec/`` of the checkout this package sits in."""
    here = os.path.dirname(os.path.abspath(__file__))
    built = os.path.join(here, CASES_NAME)
    if os.path.isfile(built):
        return built
    return os.path.join(os.path.dirname(os.path.dirname(here)), "spec", CASES_NAME)
