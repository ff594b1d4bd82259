"""Implementation selection, and the documentation matching the code."""

import os
import re
import subprocess
import sys


import kiln
from _util import ROOT
from conftest import compiled_kernels


def _impl_in_subprocess(env_extra):
    env = dict(os.environ)
    env.pop("KILN_PUREPYTHON", None)
    env.update(env_extra)
    r = subprocess.run([sys.executable, "-c", "import kiln; print(kiln.IMPLEMENTATION)"],
                       env=env, capture_output=True, text=True, check=True)
    return r.stdout.strip()


def test_compiled_is_the_default(pytestconfig):
    compiled_kernels(pytestconfig)  # an ImportError while expected fails this test
    assert _impl_in_subprocess({}) == "cython"


def test_purepython_env_forces_python():
    assert _impl_in_subprocess({"KILN_PUREPYTHON": "1"}) == "python"


def test_implementation_matches_kernels():
    from kiln import _compat
    assert kiln.IMPLEMENTATION == ("cython" if _compat.kernels.__name__.endswith("_c")
                                   else "python")


def test_readme_examples_run(impl):
    # every python block of the README, in order, against each implementation
    with open(os.path.join(ROOT, "README.md")) as f:
        src = f.read()
    blocks = re.findall(r"```python\n(.*?)```", src, re.S)
    assert len(blocks) >= 2
    ns = {}
    from kiln import _compat
    saved = _compat.kernels, _compat.IMPLEMENTATION
    _compat.kernels, _compat.IMPLEMENTATION = impl.kernels, impl.name
    try:
        for i, block in enumerate(blocks):
            exec(compile(block, "README.md block %d" % (i + 1), "exec"), ns)
    finally:
        _compat.kernels, _compat.IMPLEMENTATION = saved
    assert ns["r"].id == 7 and ns["r"].values.tolist() == [1.0, -2.5]
    assert ns["r"].tags == [1, 2]
