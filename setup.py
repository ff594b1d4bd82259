"""Build the compiled kernels, kiln._kernels_c, from src/.

On CPython the extension is required: a compile error fails the build.
KILN_NO_EXTENSIONS=1 builds the pure-Python package instead (for the
py3-none-any wheel and for platforms without a C compiler).
"""

import os
import platform

from setuptools import Extension, setup

NO_EXT = os.environ.get("KILN_NO_EXTENSIONS", "") not in ("", "0") or \
    platform.python_implementation() != "CPython"


def extensions():
    if NO_EXT:
        return []
    from Cython.Build import cythonize

    macros = []
    cflags = []
    if os.environ.get("KILN_DEBUG_BUILD"):
        cflags += ["-O0", "-g"]
    ext = Extension(
        "kiln._kernels_c",
        sources=["src/_kernels_c.pyx"],
        include_dirs=["src"],
        define_macros=macros,
        extra_compile_args=cflags,
    )
    return cythonize(
        [ext],
        compiler_directives={
            "language_level": 3,
            "freethreading_compatible": True,
            "embedsignature": True,
            "boundscheck": False,
            "wraparound": False,
            "cdivision": True,
            "initializedcheck": False,
        },
    )


setup(ext_modules=extensions())
