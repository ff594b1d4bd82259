"""Kiln on Dask: tensors travel as frames, files become lazy dask arrays.

Serializers registered with ``distributed.protocol`` (by ``import kiln`` in a
process that has distributed, or that imports it later: nothing to preload on
workers, see ``kiln/_dask_hook.py``; ``import kiln.dask`` does it at once): a
:class:`kiln.Tensor` or :class:`kiln.TensorDirectory` goes over the wire as a
small header (dtypes, shapes, names, links) and one frame per payload, the
payload's own memory with no copy; on arrival the tensors view the received
frames (read-only or not, as they come); a list of them goes one item at a
time.  Everything else that holds tensors (records as dicts, dataclasses)
travels through pickle protocol 5, whose out-of-band buffers are the same
payload frames.  ``dask.sizeof`` counts a tensor's payload bytes.

``from_kiln(path, name, chunks=...)`` is a dask array over one tensor of a
Kiln file: each chunk is read by the worker that computes it, through its own
mapping of the file (so the file must be reachable by that path from every
worker), touching only that chunk's pages.

Needs the ``dask`` extra: ``pip install "kiln-wire[dask]"``.
"""

from typing import Any, Dict, List, Optional, Tuple

try:   # (dask.array is imported by from_kiln and to_kiln: a worker meeting a
    # kiln value imports this module, see kiln/_dask_hook.py, and needs only these)
    from dask.sizeof import sizeof as _sizeof
    from distributed.protocol import dask_deserialize, dask_serialize
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("kiln.dask needs dask and distributed: pip install "
                      "\"kiln-wire[dask]\"") from e

import numpy as np

from ._tensors import Tensor, TensorDirectory, numpy_dtype

__all__ = ["from_kiln", "to_kiln"]


_PLAIN = [None, 0, 0, None, 0, None, None]   # layout .. outer_index of a plain tensor


def _header(t: Tensor) -> List[Any]:
    """A tensor's description as a short list (msgpack-friendly): code, shape,
    name, and the layout and quantization fields only when any is set."""
    rest = [t.layout, t.block_size, t.quant_scheme, t.quant_axis, t.group_size,
            t.scale_index, t.outer_index]
    head = [t.code, list(t.shape), t.name]
    return head if rest == _PLAIN else head + rest


def _tensor(h: List[Any], frame: Any) -> Tensor:
    code, shape, name = h[0], h[1], h[2]
    if len(h) == 3:
        return Tensor(frame, dtype=code, shape=shape, name=name)
    return Tensor(frame, dtype=code, shape=shape, name=name, layout=h[3], block_size=h[4],
                  quant_scheme=h[5], quant_axis=h[6], group_size=h[7], scale_index=h[8],
                  outer_index=h[9])


@dask_serialize.register(Tensor)
def _serialize_tensor(t: Tensor) -> Tuple[Dict[str, Any], List[Any]]:
    return {"kiln-tensor": _header(t)}, [t.data]


@dask_deserialize.register(Tensor)
def _deserialize_tensor(header: Dict[str, Any], frames: List[Any]) -> Tensor:
    return _tensor(header["kiln-tensor"], _one(frames))


@dask_serialize.register(TensorDirectory)
def _serialize_directory(d: TensorDirectory) -> Tuple[Dict[str, Any], List[Any]]:
    ts = d.values()
    return {"kiln-tensors": [_header(t) for t in ts]}, [t.data for t in ts]


@dask_deserialize.register(TensorDirectory)
def _deserialize_directory(header: Dict[str, Any], frames: List[Any]) -> TensorDirectory:
    hs = header["kiln-tensors"]
    if len(frames) != len(hs):
        raise ValueError("kiln.dask: %d frames for %d tensors" % (len(frames), len(hs)))
    return TensorDirectory(_tensor(h, f) for h, f in zip(hs, frames))


def _one(frames: List[Any]) -> Any:
    # distributed merges a frame it split before calling a deserializer; a list
    # of pieces is joined all the same rather than misread
    return frames[0] if len(frames) == 1 else b"".join(bytes(f) for f in frames)


class _LazyTensor:
    """What dask.array.from_array slices: one tensor of a file, read per chunk."""

    def __init__(self, path: str, name: Any, shape: Tuple[int, ...], dtype: Any,
                 rows: Any = None) -> None:
        self.path, self.name, self.shape, self.dtype = path, name, shape, np.dtype(dtype)
        self.ndim = len(shape)
        self.rows = rows   # a URL's kiln.remote.RowSource

    def __getitem__(self, index: Any) -> np.ndarray:
        if self.rows is not None:
            return self._remote(index)
        from . import files
        with files.open(self.path) as f:
            return np.array(f[self.name].numpy()[index])   # a copy: the mapping closes

    def _remote(self, index: Any) -> np.ndarray:
        """One range request for the span of rows ``index`` covers, then ``index``
        applied as numpy applies it (ints, slices of any step, Ellipsis, None)."""
        key = index if isinstance(index, tuple) else (index,)
        if not self.shape:   # rank 0: the one value
            value = np.frombuffer(self.rows.read(0, 1), self.dtype).reshape(())
            return np.array(value[index])
        n = self.shape[0]
        k = 0                # the entry for axis 0 comes after any None (new axes)
        while k < len(key) and key[k] is None:
            k += 1
        first = key[k] if k < len(key) else slice(None)
        lo, hi, pick = 0, n, None
        if isinstance(first, slice):
            a, b, step = first.indices(n)
            lo, hi = (a, b) if step > 0 else (b + 1, a + 1)
            hi = max(lo, hi)
            pick = slice(None, None, step)
        elif isinstance(first, (int, np.integer)) and not isinstance(first, (bool, np.bool_)):
            i = range(n)[first]      # IndexError when out of range, as numpy
            lo, hi, pick = i, i + 1, 0
        # else (an Ellipsis first, a boolean, an array): every row, the index as given
        block = np.frombuffer(self.rows.read(lo, hi), self.dtype).reshape(
            (hi - lo,) + self.shape[1:])
        if pick is not None:
            key = key[:k] + (pick,) + key[k + 1:]
        return np.array(block[key])


def _tokenize(*parts: Any) -> str:
    import hashlib
    return hashlib.sha1(repr(parts).encode()).hexdigest()[:16]


def from_kiln(path: str, name: Any, chunks: Any = "auto", *,
              name_prefix: Optional[str] = None,
              storage_options: Optional[Dict[str, Any]] = None) -> Any:
    """A dask array over tensor ``name`` of the Kiln file at ``path``, read lazily.

    Each chunk is read by the worker that computes it, from its own mapping
    of the file (so every worker must reach the file by this path), touching
    only that chunk's pages; chunks are copies, so no mapping outlives a task.
    ``path`` may be an fsspec URL (``s3://``, ``https://``...): then each
    chunk of leading-axis rows is one range request made by its worker (see
    :mod:`kiln.remote`), and building the array fetches only the table.

    Args:
        path: the tensor file, or an fsspec URL.
        name: the tensor's name (or position).
        chunks: as for ``dask.array.from_array`` (``"auto"``, ``(1024, -1)``...).
        name_prefix: the dask graph key (default: from the file's name,
            tensor and modification time or remote version).
        storage_options: for a URL, passed to its fsspec filesystem.

    Returns:
        dask.array.Array: the tensor's shape and numpy dtype.

    Raises:
        KilnError: the file is not a valid tensor file (its table is checked
            once, here).
        KeyError: no tensor of that name.
        TypeError: a packed (i4, u4, e2m1) or opaque tensor, which has no
            numpy array form.

    Example:
        >>> kiln.save_tensors("m.kiln", {"w": np.arange(12, dtype=np.float32).reshape(4, 3)})
        >>> a = kiln.dask.from_kiln("m.kiln", "w", chunks=(2, -1))
        >>> a.chunks, float(a.sum().compute(scheduler="sync"))
        (((2, 2), (3,)), 66.0)
    """
    import dask.array as _da
    from . import files
    from .remote import is_url
    import os
    if isinstance(path, str) and path.startswith("file://"):
        path = path[len("file://"):]   # a local file, as kiln.open takes it
    remote = is_url(path)
    options = {"storage_options": storage_options} if remote and storage_options else {}
    if not remote:
        path = os.path.abspath(os.fspath(path))
    rows = None
    with files.open(path, **options) as f:
        # the table only: a remote tensor's bytes are not fetched here
        t = f._tensors_view()[name] if remote else f[name]
        if t.dtype in ("i4", "u4", "e2m1") or not isinstance(t.dtype, str):
            raise TypeError("from_kiln: tensor %r is %s, which has no numpy array form"
                            % (name, t.dtype))
        shape, dtype = tuple(t.shape), numpy_dtype(t.code)
        del t
        if remote:
            rows = f.row_source(name)
            version: Any = f._version
        else:
            version = os.stat(path).st_mtime_ns
    token = "kiln-%s-%s-%s" % (os.path.basename(path), name,
                               _tokenize(path, name, version))
    return _da.from_array(_LazyTensor(path, name, shape, dtype, rows), chunks=chunks,
                          meta=np.empty((0,) * len(shape), dtype),
                          name=name_prefix or token, asarray=False, fancy=False)


def to_kiln(path: Any, arrays: Dict[str, Any], *, metadata: Optional[Dict[str, Any]] = None,
            blocks_at_once: int = 4) -> None:
    """Write dask arrays (or numpy arrays) into a Kiln tensor file, a block of
    rows at a time, through :class:`kiln.TensorWriter`.

    Each array is rechunked to whole rows (one chunk across every axis but
    the first); ``blocks_at_once`` blocks are computed together (on the
    active scheduler, a ``distributed`` cluster included) and written at
    their rows' place in the file, so memory holds that many blocks, not the
    array.  The file is replaced atomically when every row is written; an
    error leaves the old file.

    Args:
        path: the target file.
        arrays: tensor names to arrays, written in this order.
        metadata: as for :func:`kiln.save_tensors`.
        blocks_at_once: how many blocks to compute before writing them.

    Raises:
        EncodeError: a dtype Kiln has no twin for (``TYPE``); metadata that
            cannot be stored.
        ValueError: a tensor without whole-byte rows (``blocks_at_once`` < 1).

    Example:
        >>> import dask.array as da
        >>> x = da.arange(12, chunks=5).reshape(4, 3)
        >>> kiln.dask.to_kiln("d.kiln", {"x": x})
        >>> kiln.load_tensors("d.kiln")["x"].numpy()[3].tolist()
        [9, 10, 11]
    """
    import dask
    import dask.array as _da
    from .files import TensorWriter
    if blocks_at_once < 1:
        raise ValueError("blocks_at_once must be at least 1")
    with TensorWriter(path, metadata=metadata) as w:
        plans = []
        for name, x in arrays.items():
            if not isinstance(x, _da.Array):
                x = _da.from_array(np.asarray(x), chunks=-1)
            code = Tensor.from_numpy(np.empty((0,), x.dtype)).code
            if any(np.isnan(d) for d in x.shape):
                raise ValueError("to_kiln: %r has an unknown shape %s: compute its chunk "
                                 "sizes first" % (name, x.shape))
            w.add(name, code, tuple(int(d) for d in x.shape))
            if x.ndim > 1:
                x = x.rechunk({axis: -1 for axis in range(1, x.ndim)})
            plans.append((name, x))
        for name, x in plans:
            if x.ndim == 0:
                w.write(name, np.asarray(x.compute()))
                continue
            starts = [0]
            for c in x.chunks[0]:
                starts.append(starts[-1] + c)
            blocks = [x.blocks[j] for j in range(x.numblocks[0])]
            for j in range(0, len(blocks), blocks_at_once):
                parts = dask.compute(*blocks[j:j + blocks_at_once])
                for k, part in enumerate(parts):
                    w.write_rows(name, starts[j + k], np.ascontiguousarray(part))
            if not blocks:   # no chunks at all along a zero-length axis
                w.write_rows(name, 0, np.empty(x.shape, x.dtype))


@_sizeof.register(Tensor)
def _sizeof_tensor(t: Tensor) -> int:
    # what a worker's memory accounting counts: the payload, not the small object
    return t.nbytes + 100


@_sizeof.register(TensorDirectory)
def _sizeof_directory(d: TensorDirectory) -> int:
    return sum(t.nbytes + 100 for t in d.values()) + 100


# --- record files: kiln.records.dask ------------------------------------------------
from .records.dask import read_records, to_records  # noqa: E402

__all__ += ["read_records", "to_records"]
