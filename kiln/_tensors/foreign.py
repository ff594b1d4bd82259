"""Arrays of other libraries that numpy cannot take whole: a torch tensor is
read by its raw bytes, so every torch dtype with a Kiln twin (bf16 and the
float8 kinds included) is saved without ml_dtypes.

torch is never imported here: a torch tensor can only exist once something
imported torch (``sys.modules``).  What ``Tensor.from_numpy`` does with one:

- a dtype with a Kiln twin (:data:`TORCH_NAMES`): its bytes, viewed as
  ``uint8`` (no copy for a contiguous CPU tensor; a non-contiguous one is
  copied once into C order, as a non-contiguous numpy array is);
- ``requires_grad``: its data (``detach()``; the gradient is not data);
- ``float4_e2m1fn_x2``: Kiln's ``e2m1`` (the same bytes; the last axis
  counts elements, twice torch's);
- any other dtype (complex, the ``fnuz`` float8 kinds, torch's bit-width
  shells ``int1``..``uint7``), a quantized, sparse or nested tensor, or one on another
  device than the CPU: ``TypeError`` saying why, which the encoders report
  as ``EncodeError`` naming the tensor.
"""

import sys
from typing import Any, Dict, Optional, Tuple

import numpy as np

from .._wire import DTYPE_CODES

# torch dtype name -> Kiln dtype name: the dtypes with the same bits on both sides
TORCH_NAMES = {
    "float64": "f64", "float32": "f32", "float16": "f16", "bfloat16": "bf16",
    "float8_e4m3fn": "f8e4m3", "float8_e5m2": "f8e5m2", "float8_e8m0fnu": "e8m0",
    "bool": "bool", "int8": "i8", "uint8": "u8", "int16": "i16", "uint16": "u16",
    "int32": "i32", "uint32": "u32", "int64": "i64", "uint64": "u64",
    # two OCP MX FP4 values a byte, the first in the low nibble (torch's
    # c10/util/Float4_e2m1fn_x2.h), as Kiln packs e2m1: the same bytes, and a
    # Kiln shape whose last axis counts elements (twice torch's, which counts bytes)
    "float4_e2m1fn_x2": "e2m1",
}
_E2M1 = DTYPE_CODES["e2m1"]

_CODES: Dict[Any, int] = {}   # torch dtype -> Kiln code, filled on first use
_NUMPY_NATIVE: set = set()   # torch dtypes whose .numpy() needs no view, filled with _CODES


def torch_codes(torch: Any) -> Dict[Any, int]:
    """{torch dtype: Kiln dtype code} of the dtypes this torch has."""
    if not _CODES:
        for tname, kname in TORCH_NAMES.items():
            dt = getattr(torch, tname, None)
            if dt is not None:
                _CODES[dt] = DTYPE_CODES[kname]
        _NUMPY_NATIVE.update(getattr(torch, n) for n in (
            "float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8"))
    return _CODES


def torch_parts(x: Any) -> Optional[Tuple[int, Tuple[int, ...], np.ndarray]]:
    """(Kiln code, shape, the bytes as a 1-D uint8 array) of a torch tensor;
    None for anything else; ``TypeError`` for a torch tensor kiln cannot store."""
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(x, torch.Tensor):
        return None
    if x.is_quantized:
        raise TypeError("a quantized torch tensor: kiln stores plain tensors "
                        "(call .dequantize() or store .int_repr() and the scales)")
    code = torch_codes(torch).get(x.dtype)
    if code is None:
        raise TypeError("torch dtype %s has no Kiln dtype (kiln stores %s)"
                        % (str(x.dtype).replace("torch.", ""), ", ".join(TORCH_NAMES)))
    if x.layout != torch.strided or getattr(x, "is_nested", False):
        raise TypeError("a %s torch tensor: kiln stores dense tensors (call .to_dense() first)"
                        % str(x.layout).replace("torch.", ""))
    device = x.device.type
    if device == "meta":
        raise TypeError("a torch tensor on the meta device holds no values to store (.cpu() "
                        "cannot give it any): load or compute its values first, e.g. "
                        "kiln.torch.load_model(model, path, assign=True) for a model built "
                        "on the meta device, or model.to_empty(device='cpu') and fill it")
    if device != "cpu":
        raise TypeError("a torch tensor on device %s: kiln reads CPU memory (call .cpu() "
                        "first; kiln.torch.save_file does)" % x.device)
    if code == _E2M1 and x.dim() == 0:
        raise TypeError("a 0-d float4_e2m1fn_x2 torch tensor: its byte holds two elements "
                        "and no axis to count them along (store it with shape (1,))")
    if x.requires_grad:   # its data (.numpy() refuses a tensor that requires grad)
        x = x.detach()
    if x.is_neg():   # torch's lazy negation: store the values, not the bit (the conjugate
        x = x.resolve_neg()   # bit is a complex tensor's alone, and kiln has no complex)
    if not x.is_contiguous():
        x = x.contiguous()   # one copy into C order, as for a non-contiguous numpy array
    shape = tuple(x.shape)   # (torch.Size holds ints)
    if x.numel() == 1 and x.stride() != (1,) * x.dim():   # one element, any stride
        x = torch.empty(shape, dtype=x.dtype).copy_(x)    # (x.imag of one)
    if x.dtype in _NUMPY_NATIVE:
        raw = x.numpy()   # over x itself: no second torch tensor is made (fewer objects
    else:                 # for the collector to walk in a save of many tensors)
        # (torch calls a tensor contiguous whatever the stride of a size-1 or
        # empty axis; its reshape to one axis has stride 1, which the view needs)
        raw = x.reshape(-1).view(torch.uint8).numpy()
    raw = raw.reshape(-1).view(np.uint8)   # numpy views of C-ordered memory: no copy
    if code == _E2M1:
        shape = shape[:-1] + (2 * shape[-1],)   # elements, not bytes
    return code, shape, raw
