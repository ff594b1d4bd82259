"""Pick the kernel implementation once, at import.

The compiled kernels (``kiln._kernels_c``) are the default.  The pure-Python
kernels are used when ``KILN_PUREPYTHON`` is set to a non-empty value other
than ``0``, on interpreters other than CPython, or when the extension is not
built.  ``IMPLEMENTATION`` says which (``"cython"`` or ``"python"``).
"""

import os
import platform

NO_EXTENSIONS = os.environ.get("KILN_PUREPYTHON", "") not in ("", "0") or \
    platform.python_implementation() != "CPython"

kernels = None
IMPLEMENTATION = "python"
if not NO_EXTENSIONS:
    try:
        from . import _kernels_c as kernels  # noqa: F401
        IMPLEMENTATION = "cython"
    except ImportError:
        kernels = None
if kernels is None:
    from . import _kernels_py as kernels  # noqa: F811
    IMPLEMENTATION = "python"
