"""Build the compiled kernels, kiln._kernels_c, from src/.

On CPython the extension is required: a compile error fails the build.
KILN_NO_EXTENSIONS=1 builds the pure-Python package instead (for the
py3-none-any wheel and for platforms without a C compiler).
"""

import os
import platform

from setuptools import Extension, setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
# The golden cases have one source, spec/; the wheel's copy (kiln/data/, read by
# "kiln cases") is written from it here.  An editable install and a checkout on
# sys.path read spec/ itself (kiln/data/__init__.py), so nothing is written then.
CASES = ("spec/kiln-v2-cases.json", "kiln/data/kiln-v2-cases.json")

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


class BuildPy(build_py):
    """build_py, plus the golden cases copied from spec/ into the package."""

    def _cases_target(self):
        return os.path.join(self.build_lib, *CASES[1].split("/"))

    def run(self):
        super().run()
        if not self.editable_mode:
            src = os.path.join(HERE, *CASES[0].split("/"))
            if not os.path.isfile(src):
                raise SystemExit("kiln: %s is missing; the package's golden cases are "
                                 "built from it" % CASES[0])
            self.mkpath(os.path.dirname(self._cases_target()))
            self.copy_file(src, self._cases_target())

    def get_outputs(self, include_bytecode=True):
        out = super().get_outputs(include_bytecode)
        return out if self.editable_mode else out + [self._cases_target()]

    def get_output_mapping(self):
        out = super().get_output_mapping()
        if not self.editable_mode:
            out[self._cases_target()] = os.path.join(HERE, *CASES[0].split("/"))
        return out


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
    setup(cmdclass={"build_py": BuildPy})
else:
    try:
        ext_modules = extensions()
    except ImportError as e:   # Cython missing outside an isolated build
        raise SystemExit(_HOW_TO_SKIP % e) from None
    setup(ext_modules=ext_modules, cmdclass={"build_ext": build_ext_with_hint(),
                                             "build_py": BuildPy})
