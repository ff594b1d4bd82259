"""Pure-Python kernels, in the same parts as the compiled ones.

=================  ===========================  ===========================================
part               here                         compiled twin
=================  ===========================  ===========================================
reader             ``reader.py``                ``src/kernels/reader.pxi``
Frozen decode      ``decode.py``                ``src/kernels/decode.pxi``
Frozen encode      ``encode.py``                ``src/kernels/encode.pxi``
directory checks   ``directory.py``             ``src/kernels/directory.pxi``
directory writing  ``dirwrite.py``              ``src/kernels/dirwrite.pxi``
tensor objects     ``tensors.py``               ``src/kernels/tensors.pxi``
=================  ===========================  ===========================================

The kernel interface (``kiln._kernel.Kernels``, checked against both kernels by
the tests) is what the layers above call:

``compile_decoder(plan, frame_hash, trusted, max_count, max_bytes, copy, max_copy=None)``
    Compile a :class:`kiln._plan.Plan` into a decode program.  ``frame_hash``
    is the schema hash a frame must carry, or ``None`` for a bare value.  The
    program's ``decode(buf)`` takes any contiguous buffer and returns the
    Python value, or raises :class:`kiln.KilnError`.  With ``copy`` tensor
    payloads are copied into storage the result owns; ``max_copy`` (None: no
    cap) caps one copied payload.

``compile_encoder(plan, frame_hash, round_floats=False)``
    Compile a plan into an encode program with ``encode(value) -> bytes`` and
    ``encode_into(value, buffer, offset) -> end`` (``buffer`` is a bytearray,
    resized so that it ends at ``end``).  With ``round_floats`` a float array
    of a wider dtype may round to a narrower list element; without it a value
    that would change is an EncodeError.

``validate_directory(buf, start, standalone, trusted, max_count, max_bytes, max_copy=None, wide=False)``
``validate_directory_copy(buf, start, standalone, trusted, max_count, max_bytes, length=None, wide=False)``
    Check one tensor directory block starting at ``start`` of the byte
    buffer ``buf`` in the spec's check order.  Returns ``(end, payload_base,
    table)`` where ``table`` is a list of descriptor tuples ``(code, shape,
    name, layout, block_size, quant_scheme, quant_axis, group_size,
    scale_index, outer_index, byte_offset, byte_length)``; ``name``/``layout``
    are raw bytes or None.  Nothing is built per descriptor before the
    directory is known to fit.
    ``validate_directory_copy`` runs the same checks and returns ``(end,
    payload_base, count, named, table_bytes, names)``: the checked copy of the
    descriptors and the name heap, for rows built on demand
    (``kiln._rows.LazyRows``), and the names as bytes (None when unnamed).
    It leaves out the payload contents (each bool byte 0 or 1, an odd 4-bit
    tail's high nibble 0, the alignment gaps all 0): a lazy open checks a
    tensor's with ``check_payload`` when that tensor is read.
    ``wide``: the caller reads a tensor file, whose directory may set flag
    bit 2 (u32 name fields, spec section 12.3); without it that bit is
    ``FRAME`` as every other unknown flag.

``check_header(buf, start, max_count, max_bytes, length=None, wide=False)``
    Steps 1 to 6 from the header at ``start`` and ``len(buf)`` alone; returns
    the payload base (from ``start``): what a remote reader checks before it
    asks for the table.

``check_payload(buf, at, code, count, nbytes, origin)``
    Check the bytes of ``buf`` as positions ``at ..`` of one tensor's payload
    (dtype ``code``, ``count`` elements, ``nbytes`` bytes) and of the
    alignment gap after it (positions from ``nbytes``): the contents checks
    of steps 10 and 11a, for one tensor or a run of it.  ``TYPE`` at
    ``origin`` + the position of the first bad byte.

``write_directory(records, out)``
    Append the canonical block for normalized tensor records to the bytearray
    ``out`` (see ``dirwrite.py`` for the record layout); returns where it starts.

The tensor part (``tensors.py``) is what the tensor objects of
``kiln/_tensors/`` and a kernel hand each other, bound once by
``kiln/_tensors/bind.py``: ``tensor_setup(cls, shaped, py_numpy)`` and
``directory_setup(cls, hooks)`` (True when the part can serve those
classes), ``tensor_numpy_method(tensor)`` and
``tensors_dict_method(directory)`` (``Tensor.numpy`` and
``TensorDirectory.to_dict``), ``tensors_fill(directory)`` (the Tensors of a
decoded directory, or None for the Python path), ``hold_buffer(mv)`` (the
base of a decoded directory's arrays, or None), ``dlpack_destructor()`` (a
C capsule destructor's address, or None) and ``check_links(head)`` (the
whole-directory table rules over the canonical head of a hand-made
directory).

``decode_records(program, buf, origin, offsets, first, last, verify, out, budget=None)``
``decode_stream(program, buf, at, origin, number, verify, cap, ocrc, out, budget=None)``
``crc32(data, value=0)``
``encode_record(program, value, base=-1, crc=True)``
``encode_records(program, values, room, limit, offsets, base=-1)``
    The record container's loop (``kiln.records``): check and decode the
    records of a range of a file's index, or the complete records at the
    front of a stream's buffer, with a compiled decode program, the records
    of one read sharing one budget of zero-size elements (``budget``); write
    one record, or the records of an iterator's values into one buffer (head,
    framed value, CRC, and each record's offset), padded when ``base`` (the
    container offset of the buffer's byte 0) is given so that the first
    tensor directory with payload bytes starts 64-aligned; see ``records.py``.
    ``crc32`` is ``zlib.crc32``'s function.

Everything else in the parts is private to the kernel.  The Python layer
(``kiln._types``, ``kiln._api``, ``kiln._tensors``) builds plans and objects;
loops over elements, fields and descriptors live in the kernels.
"""

from .decode import compile_decoder
from .directory import check_header, check_payload, validate_directory, \
    validate_directory_copy
from .dirwrite import write_directory
from .encode import compile_encoder
from .records import crc32, decode_records, decode_stream, encode_record, encode_records

from .tensors import check_links, directory_setup, dlpack_destructor, hold_buffer, \
    tensor_numpy_method, tensor_setup, tensors_dict_method, tensors_fill

__all__ = ["compile_decoder", "compile_encoder", "validate_directory", "validate_directory_copy",
           "check_header", "check_payload", "write_directory",
           # the record container's loop (records.py)
           "crc32", "decode_records", "decode_stream", "encode_record", "encode_records",
           # the tensor part (tensors.py)
           "tensor_setup", "directory_setup", "tensor_numpy_method", "tensors_fill",
           "tensors_dict_method", "hold_buffer", "dlpack_destructor", "check_links"]
