"""kiln: the Kiln wire format (Frozen records plus tensor directories) for Python.

Quick use::

    import kiln
    t = kiln.parse_type("struct{id:i64,values:list<f64>,}")
    buf = kiln.encode({"id": 7, "values": [1.0, 2.5]}, t)
    kiln.decode(buf, t)   # {'id': 7, 'values': array([1. , 2.5])}

``import kiln`` loads the records and tensors core only.  The files
(``kiln.save_tensors``, ``kiln.open``...), the schemas
(``kiln.schema_from_json``...) and the modules ``kiln.files``,
``kiln.schema``, ``kiln.remote``, ``kiln.convert``, ``kiln.dask``,
``kiln.torch`` and ``kiln.cli`` are imported the first time one of their
names is used (module ``__getattr__``, PEP 562): ``kiln.open(...)`` works as
before, and so does ``import kiln.dask``.  ``ml_dtypes`` is imported when a bf16 or float8
tensor first becomes a numpy array.
"""

from typing import TYPE_CHECKING, Any, List

from ._errors import KilnError, EncodeError
from ._plan import Some
from ._types import (Type, parse_type, as_type, struct, list_, opt, dict_, bool_, i8, i16,
                     i32, i64, u8, u16, u32, u64, int_, uint, f32, f64, str_, bytes_, tensors,
                     MAX_DEPTH)
from ._tensors import Tensor, TensorDirectory, unpack_nibbles, pack_nibbles, numpy_dtype
from ._api import (Encoder, Decoder, encode, decode, encode_tensors, decode_tensors,
                   DEFAULT_MAX_COUNT, DEFAULT_MAX_BYTES)
from ._compat import IMPLEMENTATION
from . import _dask_hook

if TYPE_CHECKING:   # what type checkers see; at run time __getattr__ imports them
    from ._record import Record
    from ._aliases import (I8, I16, I32, I64, U8, U16, U32, U64, F32, F64, Bool, I8Array,
                           I16Array, I32Array, I64Array, U8Array, U16Array, U32Array, U64Array,
                           F32Array, F64Array, BoolArray)
    from .schema import SchemaError, schema_from_json, to_json_schema
    from .files import (save_tensors, load_tensors, load_metadata, save, load, open, KilnFile,
                        TensorWriter, save_sharded, ShardedFile)
    from . import cli, convert, dask, files, remote, schema, torch
    from .records import RecordWriter, RecordFile, iter_records, StreamDecoder

__version__ = "0.1.0"

__all__ = [
    "KilnError", "EncodeError", "Some", "Record", "Type", "parse_type", "as_type", "struct", "list_", "opt",
    "dict_", "bool_", "i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64", "int_", "uint",
    "f32", "f64", "str_", "bytes_", "tensors", "Tensor", "TensorDirectory", "unpack_nibbles",
    "pack_nibbles", "numpy_dtype", "Encoder", "Decoder", "encode", "decode", "encode_tensors",
    "decode_tensors", "IMPLEMENTATION", "MAX_DEPTH", "DEFAULT_MAX_COUNT", "DEFAULT_MAX_BYTES",
    "I8", "I16", "I32", "I64", "U8", "U16", "U32", "U64", "F32", "F64", "Bool", "I8Array",
    "I16Array", "I32Array", "I64Array", "U8Array", "U16Array", "U32Array", "U64Array",
    "F32Array", "F64Array", "BoolArray", "save_tensors", "load_tensors", "load_metadata",
    "save", "load", "open", "KilnFile", "TensorWriter", "save_sharded", "ShardedFile",
    "SchemaError", "schema_from_json",
    "to_json_schema",
    "RecordWriter", "RecordFile", "iter_records", "StreamDecoder",
]

# name -> the submodule that defines it, imported on first use
_LAZY = {
    "save_tensors": "files", "load_tensors": "files", "load_metadata": "files", "save": "files",
    "load": "files", "open": "files", "KilnFile": "files", "TensorWriter": "files",
    "save_sharded": "files", "ShardedFile": "files",
    "SchemaError": "schema", "schema_from_json": "schema", "to_json_schema": "schema",
    "RecordWriter": "records", "RecordFile": "records", "iter_records": "records",
    "StreamDecoder": "records",
    "Record": "_record",
    # the annotation aliases (they import numpy.typing)
    **{name: "_aliases" for name in (
        "I8", "I16", "I32", "I64", "U8", "U16", "U32", "U64", "F32", "F64", "Bool", "I8Array",
        "I16Array", "I32Array", "I64Array", "U8Array", "U16Array", "U32Array", "U64Array",
        "F32Array", "F64Array", "BoolArray")},
}
_SUBMODULES = ("cli", "convert", "dask", "files", "records", "remote", "schema", "torch")


def __getattr__(name: str) -> Any:
    """``kiln.open``, ``kiln.schema_from_json``, ``kiln.dask``...: imported on first use."""
    import importlib
    where = _LAZY.get(name)
    if where is not None:
        value = getattr(importlib.import_module("." + where, __name__), name)
    elif name in _SUBMODULES:
        value = importlib.import_module("." + name, __name__)
    else:
        raise AttributeError("module 'kiln' has no attribute %r" % name)
    globals()[name] = value   # once: later lookups are plain attribute reads
    return value


def __dir__() -> List[str]:
    return sorted(set(globals()) | set(_LAZY) | set(_SUBMODULES))


_dask_hook.install()   # distributed finds kiln's serializers (see kiln/_dask_hook.py)
