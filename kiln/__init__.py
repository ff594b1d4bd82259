"""kiln: the Kiln wire format (Frozen records plus tensor directories) for Python.

Quick use::

    import kiln
    t = kiln.parse_type("struct{id:i64,values:list<f64>,}")
    buf = kiln.encode({"id": 7, "values": [1.0, 2.5]}, t)
    kiln.decode(buf, t)   # {'id': 7, 'values': array([1. , 2.5])}
"""

from ._errors import KilnError, EncodeError
from ._plan import Some
from ._types import (Type, parse_type, as_type, struct, list_, opt, dict_, bool_, i8, i16,
                     i32, i64, u8, u16, u32, u64, int_, uint, f32, f64, str_, bytes_, tensors,
                     MAX_DEPTH)
from ._tensor import Tensor, TensorDirectory, unpack_nibbles, pack_nibbles, numpy_dtype
from ._api import (Encoder, Decoder, encode, decode, encode_tensors, decode_tensors,
                   DEFAULT_MAX_COUNT, DEFAULT_MAX_BYTES)
from ._compat import IMPLEMENTATION
from .schema import SchemaError, schema_from_json, to_json_schema
from .files import (save_tensors, load_tensors, load_metadata, save, load, open, KilnFile,
                    TensorWriter)
from ._aliases import (I8, I16, I32, I64, U8, U16, U32, U64, F32, F64, Bool, I8Array, I16Array,
                       I32Array, I64Array, U8Array, U16Array, U32Array, U64Array, F32Array,
                       F64Array, BoolArray)
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .records import RecordWriter, RecordFile, iter_records, StreamDecoder

# parts imported on first use (PEP 562): public name -> module
_LAZY = {
    "RecordWriter": ".records", "RecordFile": ".records", "iter_records": ".records",
    "StreamDecoder": ".records",
}


def __getattr__(name):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError("module 'kiln' has no attribute %r" % (name,))
    import importlib
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))

__version__ = "0.1.0"

__all__ = [
    "KilnError", "EncodeError", "Some", "Type", "parse_type", "as_type", "struct", "list_", "opt",
    "dict_", "bool_", "i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64", "int_", "uint",
    "f32", "f64", "str_", "bytes_", "tensors", "Tensor", "TensorDirectory", "unpack_nibbles",
    "pack_nibbles", "numpy_dtype", "Encoder", "Decoder", "encode", "decode", "encode_tensors",
    "decode_tensors", "IMPLEMENTATION", "MAX_DEPTH", "DEFAULT_MAX_COUNT", "DEFAULT_MAX_BYTES",
    "I8", "I16", "I32", "I64", "U8", "U16", "U32", "U64", "F32", "F64", "Bool", "I8Array",
    "I16Array", "I32Array", "I64Array", "U8Array", "U16Array", "U32Array", "U64Array",
    "F32Array", "F64Array", "BoolArray", "save_tensors", "load_tensors", "load_metadata",
    "save", "load", "open", "KilnFile", "TensorWriter", "SchemaError", "schema_from_json",
    "to_json_schema",
    "RecordWriter", "RecordFile", "iter_records", "StreamDecoder",
]
