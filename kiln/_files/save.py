"""Writing a whole tensor file or value at once: ``save_tensors`` and ``save``,
and the block writers ``TensorWriter`` shares (the head from
``kiln._dirhead.block_head``, then each payload straight from its buffer).

A tensor file is one standalone Kiln tensor directory, so any Kiln reader
decodes it; every payload starts at a 64-byte aligned file offset.  Metadata,
when given, is one more tensor, the last, named ``__metadata__``: a ``u8``
payload holding a framed Kiln value (see ``kiln._meta`` and spec/kiln-v2.md,
"Tensor files").  Writes to a path are atomic (``kiln._files.atomic``) and
checked as a reader checks them before they replace anything
(``kiln._files.declare``).
"""

import os
from typing import Any, Dict, Optional, Sequence, Union

from .. import _api, _meta
from .. import _wire as W
from .._dirhead import block_head
from .._errors import EncodeError
from . import checksum as _checksum, padded as _padded, progress as _progress
from .atomic import AlignedWriter, AtomicFile, WRITEBACK_STEP
from .paths import bytes_path
from .declare import _check_file, _check_meta
from .progress import Progress, ProgressLike
from .tables import normalize_tensors

PathLike = Union[str, "os.PathLike[str]"]
_P = W.R_PAYLOAD   # a write record's payload (or, in a head's records, its length)


def _pieces(payload: Any) -> Any:
    """A payload's bytes in pieces of _progress.STEP, for counting progress."""
    with memoryview(payload) as v:
        b = v.cast("B") if v.ndim != 1 or v.format != "B" else v
        for at in range(0, len(b), _progress.STEP):
            yield b[at:at + _progress.STEP]


def write_payload(write: Any, payload: Any, prog: Optional[Progress]) -> None:
    """One payload, in pieces of _progress.STEP bytes when progress is counted."""
    if prog is None:
        write(payload)
        return
    for piece in _pieces(payload):
        write(piece)
        prog.add(len(piece))


def write_block(out: AtomicFile, metas: Sequence[tuple], payloads: Sequence[Any],
                prog: Optional[Progress] = None) -> None:
    """Head, then each payload straight from its buffer (None: left as zeros), in
    writes that end on 2 MiB boundaries (:class:`AlignedWriter`)."""
    head, places, total = block_head(metas, 0, True)
    w = AlignedWriter(out, prog)
    w.write(head)
    base = len(head)
    for place, payload in zip(places, payloads):
        if payload is None:
            continue
        w.seek(base + place)
        if prog is None:
            w.write(payload)
        else:   # each piece counted once its bytes are in the file
            for piece in _pieces(payload):
                w.write(piece, counted=True)
    w.flush()
    out.f.truncate(base + total)   # a trailing hole or gap reads as zeros


def write_stream(f: Any, metas: Sequence[tuple], payloads: Sequence[Any],
                  prog: Optional[Progress] = None) -> None:
    """The block to a file object that may not seek: gaps written as zeros."""
    head, places, total = block_head(metas, 0, True)
    f.write(head)
    pos = 0
    for place, payload, meta in zip(places, payloads, metas):
        if place > pos:
            f.write(bytes(place - pos))
        # a memoryview, as a file object's write() is given everywhere (a payload
        # may be a numpy array, whose truth value a write loop cannot test)
        write_payload(f.write, memoryview(payload), prog)
        pos = place + meta[_P]
    if total > pos:
        f.write(bytes(total - pos))


def meta_record(metadata: Optional[Dict[str, Any]]) -> Optional[tuple]:
    if metadata is None:
        return None
    blob = _api.encode(_meta.to_nodes(metadata), _meta.META_TYPE, frame=True)
    return (W.DTYPE_CODES["u8"], (len(blob),), _meta.META_NAME.encode(), None, 0, 0,
            W.NO_AXIS, 0, W.NO_INDEX, W.NO_INDEX, memoryview(blob))


def save_tensors(path: PathLike, tensors: Any, *,
                 metadata: Optional[Dict[str, Any]] = None, checksum: bool = False,
                 progress: ProgressLike = None) -> None:
    """Write ``tensors`` (as :func:`kiln.encode_tensors` takes them) to ``path``.

    Each payload is written straight from its array: extra memory is the
    table, not the file.  The file is replaced atomically (a temporary file
    beside it, fsynced, then renamed over it).

    Args:
        path: a file path, or a binary file object (written in place from its
            current position, with no atomic replace).
        tensors: a mapping of name to array or :class:`kiln.Tensor` (sorted by
            name), a sequence, or a :class:`kiln.TensorDirectory`.
        metadata: a dict with str keys of None, bool, int, float, str, bytes,
            lists and dicts; stored as the last tensor, ``__metadata__``.
        checksum: also record a CRC-32 of every payload in the metadata
            (under the reserved key ``__kiln_checksum__``), which
            ``kiln check`` and ``verify=True`` compare; the tensors must be
            named.
        progress: True for a tqdm bar, or a callable ``fn(done_bytes,
            total_bytes)``, counting the payload bytes written (see
            :doc:`files`).

    Raises:
        EncodeError: as :func:`kiln.encode_tensors`; ``TYPE`` also for
            metadata of another kind, metadata with unnamed tensors, a
            tensor named ``__metadata__`` or a metadata key
            ``__kiln_checksum__``.
        OSError: the file cannot be written (the target is left as it was).

    Example:
        >>> kiln.save_tensors("model.kiln", {"w": np.ones((2, 3), np.float32)},
        ...                   metadata={"step": 3})
        >>> kiln.load_metadata("model.kiln")
        {'step': 3}
    """
    save_records(path, normalize_tensors(tensors), metadata, checksum, progress)


def save_records(path: PathLike, records: list, metadata: Optional[Dict[str, Any]],
                 checksum: bool, progress: ProgressLike) -> None:
    """``save_tensors`` of write records (``normalize_tensors``'s)."""
    for rec in records:
        if rec[W.R_NAME] == _meta.META_NAME.encode():
            raise EncodeError("TYPE", 0, "the tensor name %r is reserved for metadata"
                              % _meta.META_NAME)
    if checksum:
        metadata = _checksum.with_entry(metadata, _checksum.digests(r[_P] for r in records))
    else:
        _checksum.refuse_key(metadata)
    meta = meta_record(metadata)
    if meta is not None:
        if records and records[0][W.R_NAME] is None:
            raise EncodeError("TYPE", 0, "metadata needs named tensors")
        records.append(meta)
    metas = [r[:_P] + (len(r[_P]),) for r in records]
    for i, m in enumerate(metas):
        _check_meta(m, i)
    with _progress.session(progress, "save") as prog:
        if prog is not None:
            prog.start(sum(m[_P] for m in metas))
        if hasattr(path, "write"):
            # a binary file object: written in place, from its current position
            write_stream(path, metas, [r[_P] for r in records], prog)
            return
        path = bytes_path(path, "kiln.save_tensors", "kiln.encode_tensors(tensors)")
        with AtomicFile(path) as out:   # committed at the end, discarded on any error
            write_block(out, metas, [r[_P] for r in records], prog)
            _check_file(out)   # never commit what a reader would refuse


def _type_of(value: Any) -> Any:
    """The type of a value whose class says it (dataclass, NamedTuple, Record)."""
    import dataclasses
    cls = value.__class__
    if (dataclasses.is_dataclass(cls) or (issubclass(cls, tuple) and hasattr(cls, "_fields"))
            or hasattr(cls, "__kiln_fields__")):
        from .._types import as_type
        return as_type(cls)
    raise TypeError("kiln.save needs a type for a %s value (only a dataclass, NamedTuple or "
                    "kiln.Record instance carries one): pass type=" % cls.__name__)


def save(path: PathLike, value: Any, type: Any = None, *, frame: bool = True,
         round_floats: bool = False, store_type: bool = True) -> None:
    """Encode ``value`` as ``type`` (framed by default) into ``path``, atomically.

    Tensor payloads are 64-byte aligned in the file: when the value's first
    tensor directory with payload bytes would start off a 64-byte boundary,
    the framed value follows an 8-byte pad head and up to 63 zero bytes
    (spec/kiln-v2.md section 13), which :func:`kiln.load` and ``kiln
    inspect``/``check`` read; older kiln versions refuse such a file
    (``FRAME`` at byte 0).  A value without tensors, or already aligned,
    is written as before, the framed value alone.  Only the first
    directory with payload bytes is aligned for certain; later directories
    of the same value (a second field, a list of them) are aligned when the
    bytes between happen to be a multiple of 64 (Frozen has no padding).

    The value's type text is stored in the head (version 2 of the pad head,
    spec/kiln-v2.md section 13), so :func:`kiln.load` needs no type and
    ``kiln inspect``/``check`` decode the value; ``store_type=False``
    writes the file as before (a head only where the alignment needs one),
    which kiln versions before the type head also read.

    Args:
        path: a file path, or a binary file object (written in place, aligned
            to the file's offsets from its current position when ``tell``
            works, else from the first byte written).
        value, round_floats: as for :func:`kiln.encode`.
        type: as for :func:`kiln.encode`; None takes it from the value's
            class (a dataclass, ``NamedTuple`` or :class:`kiln.Record`
            with annotations).
        store_type: store the type text (framed values only).
        frame: prefix the frame with the schema hash (the default here, so
            :func:`kiln.load` can check the file holds this type);
            ``frame=False`` writes the bare value, with no pad head (so no
            alignment of its payloads in the file).

    Raises:
        EncodeError: as :func:`kiln.encode`.
        KilnError: ``TYPE``/``DEPTH`` for a bad type.
        OSError: the file cannot be written (the target is left as it was).

    Example:
        >>> kiln.save("rec.kiln", {"id": 7}, "struct{id:i64,}")
        >>> kiln.load("rec.kiln", "struct{id:i64,}")
        {'id': 7}
    """
    if type is None:
        type = _type_of(value)
    if not frame:   # a bare value: no frame, so no place for a pad head
        head, data = b"", _api.encode(value, type, frame=False, round_floats=round_floats)
    else:   # the type head, or a pad head when the first directory with payload bytes needs one
        at = _position(path) if hasattr(path, "write") else 0
        head, data = _padded.encode(value, type, round_floats, at, bool(store_type))
    if hasattr(path, "write"):
        if head:
            path.write(head)
        path.write(data)
        return
    path = bytes_path(path, "kiln.save", "kiln.encode(value, type)")
    with AtomicFile(path) as out, memoryview(data) as view:
        out.f.write(head)
        for at in range(0, len(view), WRITEBACK_STEP):
            out.f.write(view[at:at + WRITEBACK_STEP])
            out.wrote(min(WRITEBACK_STEP, len(view) - at))


def _position(f: Any) -> int:
    """Where a file object's next byte lands (0 for a pipe or a socket: the pad
    then counts from the first byte written)."""
    try:
        return int(f.tell())
    except (AttributeError, OSError, ValueError):
        return 0


