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


def _free_threaded_build():
    flags = getattr(__import__("sys"), "abiflags", None)
    if flags is not None:
        return "t" in flags
    import sysconfig  # (Windows has no abiflags)
    return bool(sysconfig.get_config_var("Py_GIL_DISABLED"))


# The one declared exception to "the compiled kernels run everything": on a
# free-threaded build the compiled kernels' tensor part (Tensor.numpy, the
# TensorDirectory values()/to_dict() and view directories built in C, see
# src/kernels/tensors.pxi) declines the classes by design, and
# kiln/_tensors/bind.py serves the objects with the pure kernel's tensor part
# (so the pure kernel is imported there too); the codec itself is still
# compiled.  tests/test_paths.py and tests/test_startup.py hold kiln to exactly this.
FREE_THREADED_BUILD = _free_threaded_build()
COMPILED_TENSOR_LAYER = IMPLEMENTATION == "cython" and not FREE_THREADED_BUILD
