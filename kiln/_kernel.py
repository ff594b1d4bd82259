"""The kernel interface: what the layers above call on a kernel module.

Both ``kiln._kernels_py`` and ``kiln._kernels_c`` satisfy :class:`Kernels`;
``tests/test_house.py`` compares every signature with the one here, and
checks ``kiln/_kernels_c.pyi`` against the compiled module.  The full
description of each call is in the ``kiln._kernels_py`` docstring.

The interface has two parts.  The codec (``INTERFACE_CODEC``) is what the API
and file layers call.  The tensor part (``INTERFACE_TENSORS``) is everything
the tensor objects of ``kiln/_tensors/`` and a kernel hand each other: the
setup calls that take the classes (their slots are named in ``kiln/_wire.py``,
``TENSOR_SLOTS`` and ``DIRECTORY_SLOTS``), the methods and fast paths the
objects run, the DLPack destructor, and the table check of a hand-made
directory.  ``kiln/_tensors/bind.py`` binds it, in one place.
"""

from typing import Any, Callable, Dict, Iterator, List, Optional, Protocol, Sequence, Tuple

from ._plan import Plan

# (code, shape, name, layout, block_size, quant_scheme, quant_axis, group_size,
#  scale_index, outer_index, byte_offset, byte_length)
Row = Tuple[int, Tuple[int, ...], Optional[bytes], Optional[bytes], int, int, int, int, int,
            int, int, int]
# (code, shape, name, layout, block_size, quant_scheme, quant_axis, group_size,
#  scale_index, outer_index, payload)
Record = Tuple[int, Tuple[int, ...], Optional[bytes], Optional[bytes], int, int, int, int, int,
               int, Any]


class DecodeProgram(Protocol):
    def decode(self, buf: Any) -> Any: ...

    def list_head(self, buf: Any, length: Optional[int] = None) -> Tuple[int, int]: ...

    def decode_items(self, buf: Any, at: int, count: int, out: List[Any]) -> int: ...


class EncodeProgram(Protocol):
    def encode(self, value: Any) -> bytes: ...

    def encode_into(self, value: Any, buffer: bytearray, offset: int = 0) -> int: ...


class Kernels(Protocol):
    def compile_decoder(self, plan: Plan, frame_hash: Optional[int], trusted: bool,
                        max_count: int, max_bytes: int, copy: bool,
                        max_copy: Optional[int] = None) -> DecodeProgram: ...

    def compile_encoder(self, plan: Plan, frame_hash: Optional[int],
                        round_floats: bool = False) -> EncodeProgram: ...

    def validate_directory(self, buf: Any, start: int, standalone: bool, trusted: bool,
                           max_count: int, max_bytes: int,
                           max_copy: Optional[int] = None, wide: bool = False
                           ) -> Tuple[int, int, List[Row]]: ...

    def validate_directory_copy(self, buf: Any, start: int, standalone: bool, trusted: bool,
                                max_count: int, max_bytes: int, length: Optional[int] = None,
                                wide: bool = False) -> Tuple[int, int, int, bool, bytes,
                                           List[Optional[bytes]]]: ...

    def check_header(self, buf: Any, start: int, max_count: int, max_bytes: int,
                     length: Optional[int] = None, wide: bool = False) -> int: ...

    def check_payload(self, buf: Any, at: int, code: int, count: int, nbytes: int,
                      origin: int) -> None: ...

    def write_directory(self, records: Sequence[Record], out: bytearray) -> int: ...

    # --- the tensor part (src/kernels/tensors.pxi, kiln/_kernels_py/tensors.py) ---

    def tensor_setup(self, cls: type, shaped: Dict[int, Any], py_numpy: Callable[[Any], Any]
                     ) -> bool: ...

    def directory_setup(self, cls: type, hooks: Any) -> bool: ...

    def tensor_numpy_method(self, tensor: Any) -> Any: ...

    def tensors_fill(self, directory: Any) -> Optional[List[Any]]: ...

    def tensors_dict_method(self, directory: Any) -> Dict[Optional[str], Any]: ...

    def hold_buffer(self, mv: Any) -> Optional[Any]: ...

    def dlpack_destructor(self) -> Optional[int]: ...

    def check_links(self, head: Any) -> None: ...

    # --- the record container (src/kernels/records.pxi, kiln/_kernels_py/records.py) ---
    # (kiln.records): its record loop and checksum
    def crc32(self, data: Any, value: int = 0) -> int: ...

    def decode_records(self, program: DecodeProgram, buf: Any, origin: int, offsets: Any,
                       first: int, last: int, verify: bool, out: List[Any],
                       budget: Optional[List[int]] = None) -> None: ...

    def decode_stream(self, program: DecodeProgram, buf: Any, at: int, origin: int,
                      number: int, verify: bool, cap: int, ocrc: int, out: List[Any],
                      budget: Optional[List[int]] = None) -> Tuple[int, int, int]: ...

    def encode_record(self, program: EncodeProgram, value: Any, base: int = -1,
                      crc: bool = True) -> bytes: ...

    def encode_records(self, program: EncodeProgram, values: Iterator[Any], room: int,
                       limit: int, offsets: Any,
                       base: int = -1) -> Tuple[bytes, bool, Optional[Exception]]: ...


INTERFACE_CODEC = ("compile_decoder", "compile_encoder", "validate_directory",
                   "validate_directory_copy", "check_header", "check_payload",
                   "write_directory")
INTERFACE_RECORDS = ("crc32", "decode_records", "decode_stream", "encode_record",
                     "encode_records")
INTERFACE_TENSORS = ("tensor_setup", "directory_setup", "tensor_numpy_method", "tensors_fill",
                     "tensors_dict_method", "hold_buffer", "dlpack_destructor", "check_links")
INTERFACE = INTERFACE_CODEC + INTERFACE_RECORDS + INTERFACE_TENSORS
