"""The tensor part of the pure kernel: the twin of ``src/kernels/tensors.pxi``.

What the tensor layer (``kiln/_tensors/``) and a kernel hand each other, under
the names of the kernel interface (``kiln._kernel.Kernels``, its tensor part),
bound in one place (``kiln/_tensors/bind.py``).  The compiled twin makes the
arrays and Tensor objects of decoded directories in C over one held buffer
export; here every call takes the tensor layer's Python path, so the
``setup`` calls only keep what that path needs and the fast paths decline
(``tensors_fill`` and ``hold_buffer`` return None).
"""

from .. import _wire as W
from . import directory as K

_numpy = None   # the tensor layer's Python Tensor.numpy (tensor_setup)


def tensor_setup(cls, shaped, py_numpy):
    """Take kiln.Tensor, its whole-element dtypes and its Python numpy(); True."""
    global _numpy
    _numpy = py_numpy
    return True


def directory_setup(cls, hooks):
    """Take kiln.TensorDirectory and the tensor hooks; True (decode calls
    ``hooks.build`` for every directory)."""
    return True


def tensor_numpy_method(tensor):
    """kiln.Tensor.numpy: the tensor layer's Python path."""
    return _numpy(tensor)


def tensors_fill(directory):
    """TensorDirectory.values() of a decoded directory: None, the Python path
    makes each Tensor."""
    return None


def tensors_dict_method(directory):
    """kiln.TensorDirectory.to_dict: ``{t.name: t.numpy()}``."""
    return {t.name: t.numpy() for t in directory.values()}


def hold_buffer(mv):
    """None: the arrays of a decoded directory are numpy views of its owner."""
    return None


def dlpack_destructor():
    """None: a ctypes callback cannot keep a pending exception across the
    release, so a ctypes-built capsule has no destructor here."""
    return None


def check_links(head):
    """The table rules that need the whole directory, over the canonical head
    of a hand-made directory (no payloads): steps 8b, 9 and 11b, as the
    compiled twin runs them; a fault is a KilnError at its offset in ``head``."""
    st = K.Dir(head, 0, False, False, W.U32_MAX, W.U32_MAX, None)
    st.contents = False
    K.step1_magic(st)
    K.name_fields(st)
    K.step4_arithmetic(st)
    K.step5_fits(st)
    st.heap0 = W.HEADER_SIZE + W.DESC_SIZE * st.count
    K.read_table(st)
    K.step8b_heap(st)
    K.step9_descriptors(st)
    K.step11b_quantization(st)
