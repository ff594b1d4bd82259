"""Opening and loading: ``kiln.open`` (a :class:`KilnFile`, or a
:class:`kiln.remote.RemoteFile` for a URL), ``load_tensors``,
``load_metadata`` and ``load``.  A URL's reader (``kiln._files.remote``) is
imported only when a URL is given."""

import os
from typing import (TYPE_CHECKING, Any, BinaryIO, Dict, List, Optional, TypeVar, Union,
                    overload)
from typing import Type as _ClassOf

from .. import _api
from .. import _wire as W
from .._errors import KilnError
from . import checksum as _checksum, progress as _progress
from .base import add_foreign_hint, file_base, name_fault, split_metadata
from .kilnfile import KilnFile
from .local import map_file, read_owned, unmap
from .paths import Source, source
from .progress import Progress, ProgressLike
from .tables import TensorDirectory, mapping_intact, rows

if TYPE_CHECKING:
    from .._types import Type
    from .remote import RemoteFile
    from .sharded import ShardedFile

PathLike = Union[str, "os.PathLike[str]"]
T = TypeVar("T")


@overload
def open(path: BinaryIO, *, trusted: bool = ...,  # noqa: A001
         max_count: int = ..., max_bytes: int = ...,
         verify: Optional[bool] = ...) -> KilnFile: ...


@overload
def open(path: "os.PathLike[str]", *, trusted: bool = ...,  # noqa: A001
         max_count: int = ..., max_bytes: int = ...,
         verify: Optional[bool] = ...) -> Union[KilnFile, "ShardedFile"]: ...


@overload
def open(path: str, *, trusted: bool = ..., max_count: int = ...,  # noqa: A001
         max_bytes: int = ..., verify: Optional[bool] = ...,
         storage_options: Optional[Dict[str, Any]] = ...
         ) -> Union[KilnFile, "RemoteFile", "ShardedFile"]: ...


def open(path: Any, **options: Any) -> Any:  # noqa: A001  (kiln.open)
    """Open a tensor file lazily: the table is checked once, tensors are read on access.

    Args:
        path: a file path, a binary file object, or an fsspec URL
            (``s3://...``, ``https://...``; see :mod:`kiln.remote`), whose
            table is read with one range request and each tensor's bytes
            only when it is accessed.  A sharded set's index
            (``model.kiln.index.json``, a path or a URL) or a folder holding
            one opens the set as one mapping, a :class:`kiln.ShardedFile`
            (see :func:`kiln.save_sharded`).
        options: ``trusted``, ``max_count``, ``max_bytes`` (as for
            :class:`kiln.Decoder`); ``verify`` (a file written with
            checksums has each tensor's payload compared with its CRC-32 the
            first time it is read whole; ``verify=False`` turns it off, see
            :class:`KilnFile`); for a URL also ``storage_options`` (a dict
            for the fsspec filesystem).

    Returns:
        KilnFile, :class:`kiln.remote.RemoteFile` for a URL, or
        :class:`kiln.ShardedFile` for a set: use it as a context manager.
        Each is a ``Mapping[str, Tensor]`` with ``rows``, ``tensors``,
        ``metadata``, ``verify`` and ``shards`` (a file's own name, a set's
        shards); type checkers see a ``KilnFile`` for a file object,
        ``KilnFile | ShardedFile`` for a ``pathlib.Path`` (a folder or an
        index is a set) and ``KilnFile | RemoteFile | ShardedFile`` for a
        ``str`` (which may be a URL); narrow with ``isinstance`` for what one
        kind alone has (``KilnFile.checksums``, ``ShardedFile.aliases``).

    Raises:
        KilnError: an invalid file (see :class:`KilnFile`).
        OSError: the file cannot be opened;
            :class:`kiln.remote.RemoteFileChanged` when a remote file changes
            after it was opened.

    Example:
        >>> kiln.save_tensors("model.kiln", {"w": np.ones(4, np.float16)})
        >>> with kiln.open("model.kiln") as f:
        ...     w = f["w"].numpy()
        >>> w.tolist()
        [1.0, 1.0, 1.0, 1.0]
    """
    src = path if type(path) is Source else source(path)   # resolved once: the layers
    if src.kind == "set":                                   # below take it as it is
        from .sharded import ShardedFile
        return ShardedFile(src.local, **options)
    try:
        if src.kind == "url":
            return _remote_file(src, options)
        return KilnFile(src, **options)
    except KilnError as e:
        raise name_fault(e, src.name)


def load_tensors(path: PathLike, *, copy: bool = False, into: Optional[Any] = None,
                 verify: bool = True, progress: ProgressLike = None,
                 **options: Any) -> TensorDirectory:
    """The tensors of a file: views of its mapping, or (``copy=True``) owned copies.

    A copy is read straight into one block the directory owns (one copy, no
    mapping); ``max_copy_bytes`` and the other options are as for
    :func:`kiln.decode_tensors`.

    Args:
        path: a file path or a binary file object.
        copy: read the payloads into memory the directory owns.
        into: a mapping of tensor name to a writable array the caller owns
            (see :meth:`kiln.TensorDirectory.copy_into`): every target is
            checked first, then each payload is written once into its
            target, straight from the file's mapping.
        verify: compare every payload with the CRC-32 the file records
            (written with ``checksum=True``) before returning, on by
            default (a file without checksums has nothing to compare);
            ``KilnError`` ``CHECKSUM`` names the first tensor that differs,
            at its payload's offset in the file.  ``verify=False`` skips it.
        progress: with ``copy=True``: True for a tqdm bar, or a callable
            ``fn(done_bytes, total_bytes)``, counting the file's bytes read
            (a ValueError without ``copy``: views read nothing).
        options: ``trusted``, ``max_count``, ``max_bytes``, ``max_copy_bytes``
            (for a URL, whose payloads are all fetched, the cap applies with
            or without ``copy``).

    Returns:
        TensorDirectory: the tensors, without the metadata (see
        :func:`kiln.load_metadata`); with ``into``, views of the file.

    Raises:
        KilnError: an invalid file (see :class:`KilnFile`); ``CHECKSUM``.
        TypeError, ValueError, KeyError: a bad ``into`` target (nothing
            written).
        OSError: the file cannot be opened.

    Example:
        >>> kiln.save_tensors("model.kiln", [np.zeros(2, np.uint8)])
        >>> kiln.load_tensors("model.kiln", copy=True)[0].numpy().tolist()
        [0, 0]
    """
    src = source(path)   # resolved once: the layers below take it as it is
    if src.kind == "set":
        if isinstance(src.local, str) and os.path.isdir(src.local):
            from .sharded import find_index
            find_index(src.local)   # a folder with no index: kiln.open's answer, the same
        raise ValueError("%s is a sharded set: open it with kiln.open (one mapping over its "
                         "shards), or load_tensors each shard" % src.name)
    if progress is not None and progress is not False and not copy:
        raise ValueError("progress= counts the bytes a copy reads: it needs copy=True "
                         "(views read nothing)")
    if into is not None:
        if copy:
            raise ValueError("pass copy=True or into=..., not both")
        with open(src, verify=verify, **options) as f:
            d = f.tensors()
            d.copy_into(into)
            return d
    with _progress.session(progress, "load") as prog:
        try:
            return _load_tensors(src, copy, verify, prog, options)
        except KilnError as e:
            raise name_fault(e, src.name)


def _load_tensors(src: Source, copy: bool, verify: bool, prog: Optional[Progress],
                  options: Dict[str, Any]) -> TensorDirectory:
    cap = options.get("max_copy_bytes")
    if src.kind == "url":
        with _remote_file(src, dict(options, verify=verify)) as f:
            # every payload fetched into memory the directory owns
            if cap is not None:
                _copy_cap(f, cap)
            d = f.tensors()
            if prog is not None:   # fetched in one go: reported once
                n = sum(t.nbytes for t in d.values())
                prog.start(n)
                prog.add(n)
            return d
    if copy and src.kind == "file" and options.get("max_copy_bytes") is None:
        from .overlap import Overlapped   # (only a copying load sums while it reads)
        early = Overlapped(options.get("trusted", False),
                           options.get("max_count", W.DEFAULT_MAX_COUNT),
                           options.get("max_bytes", W.DEFAULT_MAX_BYTES)) \
            if verify else None   # the CRCs computed while the file is read
        owned = read_owned(src.local, prog, early)
        if "max_bytes" not in options:   # the name heap's cap follows the file's size
            options = dict(options, max_bytes=max(W.DEFAULT_MAX_BYTES, len(owned)))
        return _tensors_of(_api.decode_tensors(owned, **options), src.name, verify,
                           None if early is None else early.known)
    if copy and (cap is not None or src.kind == "object"):
        # the cap checked on the table (read with pread), then the file read
        # whole with pread through the descriptor kiln.open opened (never its
        # mapping, never its name again): a file truncated meanwhile is EOF,
        # never SIGBUS, and every byte is from the generation whose table
        # was checked
        with KilnFile(src, verify=False, **{k: v for k, v in options.items()
                                            if k in ("trusted", "max_count", "max_bytes")}) as f:
            if cap is not None:
                _api._check_caps(0, cap)
                _check_copy_cap(f.path, _row_lengths(f), cap)
            owned = _read_whole(f, prog)
        if "max_bytes" not in options:   # the name heap's cap follows the file's size
            options = dict(options, max_bytes=max(W.DEFAULT_MAX_BYTES, len(owned)))
        return _tensors_of(_api.decode_tensors(owned, **options), src.name, verify)
    if not copy and src.kind == "file":
        # views: opened as kiln.open opens (the table and metadata read with pread,
        # every payload's checks and CRC-32 read with pread), never read through
        # the mapping by kiln: a file truncated meanwhile is EOF, never SIGBUS
        f = KilnFile(src, verify=verify, **{k: v for k, v in options.items()
                                           if k in ("trusted", "max_count", "max_bytes")})
        try:
            return f.tensors()
        finally:
            f.close()   # the views keep the mapping
    mm = map_file(src)
    try:
        mapping_intact(mm, src.name)   # not truncated since it was mapped
        d = _api.decode_tensors(mm, copy=copy, **options)
        mapping_intact(mm, src.name)
        d = _tensors_of(d, src.name, verify)
        if prog is not None:   # copied by the kernel in one go: reported once
            prog.start(len(mm))
            prog.add(len(mm))
        return d
    finally:
        unmap(mm)   # unmapped now when copied; with views, when the last view goes


def _tensors_of(d: TensorDirectory, path: str, verify: bool,
                known: Optional[Dict[Any, int]] = None) -> TensorDirectory:
    base = file_base(rows(d))   # before the split: the metadata's name is in the heap
    d, _, sums = split_metadata(d, path)
    if verify and sums is not None:   # offsets in the file, whichever buffer d copied into
        _checksum.check_directory(sums, d, path, base=base, known=known)
    return d


def load_metadata(path: PathLike) -> Optional[Dict[str, Any]]:
    """The metadata of a tensor file (None when it has none).

    Reads and checks the table and the metadata only, not the payloads.

    Raises:
        KilnError: an invalid file or metadata (see :class:`KilnFile`).
        OSError: the file cannot be opened.

    Example:
        >>> kiln.save_tensors("model.kiln", {"w": np.ones(1)}, metadata={"lr": 0.5})
        >>> kiln.load_metadata("model.kiln")
        {'lr': 0.5}
    """
    src = source(path)   # resolved once
    try:
        with _remote_file(src, {}) if src.kind == "url" else KilnFile(src) as f:
            return f.metadata
    except KilnError as e:
        raise name_fault(e, src.name)


def _copy_cap(f: Any, cap: Any) -> None:
    """``max_copy_bytes`` for a URL, whose payloads are all fetched into memory:
    ``LIMIT`` at the first longer payload's byte_length field, as for a local
    copy, before anything past the table is fetched."""
    _api._check_caps(0, cap)
    _check_copy_cap(f.path, f._payload_lengths(), cap)


def _check_copy_cap(path: str, lengths: Any, cap: int) -> None:
    """``LIMIT`` at the byte_length field of the first payload above ``cap``
    (``lengths``: every payload's, the metadata's included, in table order)."""
    for i, n in enumerate(lengths):
        if n > cap:
            raise KilnError("LIMIT", W.HEADER_SIZE + W.DESC_SIZE * i + W.D_BYTE_LENGTH,
                            "%s: payload of %d bytes is above the copy cap max_copy_bytes=%d"
                            % (path, n, cap))


def _row_lengths(f: Any) -> List[int]:
    """Every payload's length of an open local file, the metadata's (its last
    row) included, from its checked table (nothing read)."""
    out = [row[W.R_BYTE_LENGTH] for row in rows(f._dir)]
    if f._meta_place is not None:
        out.append(f._meta_place[1])
    return out


def _read_whole(f: Any, prog: Optional[Progress]) -> Any:
    """The whole of open file ``f`` in an array this process owns, read with
    pread through its descriptor (held for the read), a step at a time, or
    copied from the bytes of a file object without one; ``EOF`` where the
    file now ends first."""
    import numpy as np
    from .._pread import read_exactly
    from .progress import STEP
    shared = f._fd
    data = f._mm
    size = len(data)
    out = np.empty(size, np.uint8)
    view = memoryview(out)
    if prog is not None:
        prog.start(size)
    try:
        if shared is None:
            view[:] = memoryview(data).cast("B")
            if prog is not None:
                prog.add(size)
        else:
            with shared.held(f.path) as fd:
                for at in range(0, size, STEP):
                    n = min(STEP, size - at)
                    read_exactly(fd, view[at:at + n], at, f.path, "the file")
                    if prog is not None:
                        prog.add(n)
    finally:
        view.release()
    out.flags.writeable = False
    return out


def _remote_file(src: Source, options: Dict[str, Any]) -> Any:
    """The :class:`kiln.remote.RemoteFile` of a URL (its reader imported now)."""
    from .remote import RemoteFile
    options = dict(options)
    options.pop("max_copy_bytes", None)
    return RemoteFile(src.given, **options)


@overload
def load(path: Union[PathLike, BinaryIO], type: _ClassOf[T], *, frame: bool = ...,
         copy: bool = ..., trusted: bool = ..., max_count: int = ..., max_bytes: int = ...,
         max_copy_bytes: Optional[int] = ...) -> T: ...


@overload
def load(path: Union[PathLike, BinaryIO], type: Union["Type", str, None] = ..., *,
         frame: bool = ..., copy: bool = ..., trusted: bool = ..., max_count: int = ...,
         max_bytes: int = ..., max_copy_bytes: Optional[int] = ...) -> Any: ...


def load(path: Any, type: Any = None, *, frame: bool = True, copy: bool = False,
         **options: Any) -> Any:
    """Decode the file at ``path`` as one value of ``type`` (framed by default).

    The file is mapped; tensors in the value view the mapping unless
    ``copy=True``.  A file that :func:`kiln.save` wrote with a pad head (so
    that the value's payloads are 64-byte aligned) is read after its head and
    pad; errors count their offsets from the file's first byte.

    Args:
        path: a file path or a binary file object.
        type: as for :func:`kiln.decode`; with a class the result is an
            instance of it, and type checkers know it.  None: the type text
            :func:`kiln.save` stored in the file (``TypeError`` for a file
            that stores none).
        frame: the file starts with a frame (as :func:`kiln.save` writes).
        copy, options: as for :func:`kiln.decode`.  ``max_count`` and
            ``max_bytes`` left unset grow to the file's size, so what
            :func:`kiln.save` wrote loads back (``max_count`` keeps its
            default for a type with zero-size elements, see the README's caps).

    Raises:
        KilnError: as :func:`kiln.decode` (``SCHEMA`` when the file holds
            another type); ``EOF`` for an empty file.
        OSError: the file cannot be opened.

    Example:
        >>> kiln.save("rec.kiln", [1.5, 2.5], "list<f64>")
        >>> kiln.load("rec.kiln", "list<f64>").tolist()
        [1.5, 2.5]
    """
    from . import padded as _padded
    src = source(path)   # resolved once
    mm = map_file(src)
    try:
        # a pad head before the frame (kiln.save's, spec section 13), maybe with the
        # type text: the value after it, with error offsets made the file's
        try:
            start, stored = _padded.saved_head(mm) if frame else (0, None)
        except KilnError as e:
            raise name_fault(e, src.name)
        if type is None:
            if stored is None and (not frame or (bytes(mm[start:start + 4]) == W.FRAME_MAGIC
                                                 and len(mm) - start >= W.FRAME_SIZE)):
                raise TypeError("%s stores no type (written with store_type=False, by an "
                                "older kiln, or not by kiln.save): pass the type"
                                % src.name)
            # no whole frame here (another format, a damaged or cut file): the frame
            # check below reports it, as it does when a type is given ("u8" is never read)
            type = "u8" if stored is None else stored
        # caps the caller left unset grow to the file's size (_api._file_caps)
        options = _api._file_caps(len(mm), type, options)
        buf = memoryview(mm)[start:] if start else mm
        try:
            return _api.decode(buf, type, frame=frame, copy=copy, **options)
        except KilnError as e:
            add_foreign_hint(_padded.shifted(e, start), mm, W.FRAME_MAGIC)
            raise name_fault(e, src.name)
        finally:
            if buf is not mm:
                try:
                    buf.release()   # now, unless a view of the value holds it
                except BufferError:
                    pass
    finally:
        unmap(mm)


__all__ = ["open", "load_tensors", "load_metadata", "load"]
