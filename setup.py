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


_HOW_TO_SKIP = (
    "kiln: the compiled kernels could not be built (%s). kiln also works without "
    "them, only slower: install the pure-Python build with\n"
    "    KILN_NO_EXTENSIONS=1 pip install kiln-wire\n"
    "(or from a checkout: KILN_NO_EXTENSIONS=1 pip install .). To compile, install a C "
    "compiler and the Python headers (python3-dev) and try again.")


def build_ext_with_hint():
    """setuptools' build_ext, whose failure says how to install without a compiler."""
    from setuptools.command.build_ext import build_ext
    from setuptools.errors import CCompilerError, CompileError, ExecError, PlatformError

    class BuildExt(build_ext):
        def run(self):
            try:
                super().run()
            except (CCompilerError, CompileError, ExecError, PlatformError) as e:
                raise SystemExit(_HOW_TO_SKIP % e) from None

        def build_extension(self, ext):
            try:
                super().build_extension(ext)
            except (CCompilerError, CompileError, ExecError, PlatformError) as e:
                raise SystemExit(_HOW_TO_SKIP % e) from None

    return BuildExt


if NO_EXT:
    setup()
else:
    try:
        ext_modules = extensions()
    except ImportError as e:   # Cython missing outside an isolated build
        raise SystemExit(_HOW_TO_SKIP % e) from None
    setup(ext_modules=ext_modules, cmdclass={"build_ext": build_ext_with_hint()})
