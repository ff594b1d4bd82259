"""Kiln on Dask: tensors travel as frames, files become lazy dask arrays.

``import kiln.dask`` registers serializers with ``distributed.protocol``: a
:class:`kiln.Tensor` or :class:`kiln.TensorDirectory` goes over the wire as a
small header (dtypes, shapes, names, links) and one frame per payload, the
payload's own memory with no copy; on arrival the tensors view the received
frames (read-only or not, as they come).  Everything else that holds tensors
(records, lists) travels through pickle protocol 5, whose out-of-band buffers
are the same payload frames.

``from_kiln(path, name, chunks=...)`` is a dask array over one tensor of a
Kiln file: each chunk is read by the worker that computes it, through its own
mapping of the file (so the file must be reachable by that path from every
worker), touching only that chunk's pages.

Needs the ``dask`` extra: ``pip install "kiln-wire[dask]"``.
"""

from typing import Any, Dict, List, Optional, Tuple

try:
    import dask.array as _da
    from distributed.protocol import dask_deserialize, dask_serialize
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("kiln.dask needs dask and distributed: pip install "
                      "\"kiln-wire[dask]\"") from e

import numpy as np

from ._tensor import Tensor, TensorDirectory, numpy_dtype

__all__ = ["from_kiln"]


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
