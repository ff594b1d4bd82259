"""The one place where the tensor objects meet a kernel's tensor part.

A kernel's tensor part (``kiln._kernel.INTERFACE_TENSORS``:
``src/kernels/tensors.pxi`` compiled, ``kiln/_kernels_py/tensors.py`` pure)
serves ``Tensor.numpy``, ``TensorDirectory.values()``/``to_dict()``, the
base of a decoded directory's arrays, the view directories the compiled
decoder builds in C, the DLPack capsule destructor, and the construction
checks of a hand-made tensor or directory.  :func:`bind` hands the classes to
a kernel and puts its part in place; each module of this package takes its
own share through its ``_bind`` (no class is changed from outside its
module).  ``kiln/_tensors/__init__.py`` binds the kernels ``import kiln``
picked, once; the test suite's ``impl`` fixture binds each kernel under test
in turn, so ``impl`` decides the tensor objects' path too.

The compiled part declines the classes (``tensor_setup`` or
``directory_setup`` returns False) on a free-threaded build, by design and
declared in ``kiln._compat.COMPILED_TENSOR_LAYER``; the pure part then serves
the objects while the compiled codec runs.  Anywhere else a decline (a slot
renamed on one side, numpy's C-API table not the one the kernel knows) is a
fault: ``BOUND.part`` says which part runs, and ``tests/test_paths.py`` fails
when it is not the declared one.
"""

import types

from . import checks, directory, dlpack, tensor
from .arrays import numpy_py
from .dtypes import SHAPED
from .hooks import HOOKS

BOUND = types.SimpleNamespace(kernels=None, part=None)
"""``kernels``: the kernel module bound (the construction checks run on it);
``part``: the module whose tensor part serves the objects (``kernels``
itself, or the pure kernels where the compiled part declined)."""


def _setup(part):
    return bool(part.tensor_setup(tensor.Tensor, SHAPED, numpy_py)) and \
        bool(part.directory_setup(directory.TensorDirectory, HOOKS))


def bind(kernels):
    """Serve the tensor objects with ``kernels``' tensor part; returns the part in use."""
    part = kernels
    if not _setup(part):
        from .. import _kernels_py as part   # (the declared exception, or a fault: see above)
        _setup(part)
    tensor._bind(part)
    directory._bind(part)
    dlpack._bind(part)
    checks._bind(kernels)
    BOUND.kernels, BOUND.part = kernels, part
    return part
