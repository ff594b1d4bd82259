"""Record files as Dask bags: ``read_records`` and ``to_records`` (re-exported
by :mod:`kiln.dask`).

Each partition is read or written by the worker that computes it, through its
own :class:`kiln.RecordFile` or :class:`kiln.RecordWriter`, so the files must
be reachable by the same path or URL from every worker.
"""

from typing import Any, Dict, List, Optional, Sequence, Union

import dask
import dask.bag as db

from .reader import RecordFile
from .writer import RecordWriter

__all__ = ["read_records", "to_records"]


def _paths(paths_or_glob: Union[str, Sequence[str]],
           storage_options: Optional[Dict[str, Any]]) -> List[str]:
    import fsspec
    fs, _, paths = fsspec.core.get_fs_token_paths(paths_or_glob, mode="rb",
                                                  storage_options=storage_options)
    protocol = fs.protocol[0] if isinstance(fs.protocol, (tuple, list)) else fs.protocol
    if protocol in ("file", "local"):
        return sorted(paths)
    return sorted(fs.unstrip_protocol(p) for p in paths)


def _read_part(path: str, type: Any, start: int, stop: Optional[int],
               options: Dict[str, Any]) -> List[Any]:
    with RecordFile(path, type, **options) as rf:
        return rf[start:stop]


def read_records(paths_or_glob: Union[str, Sequence[str]], type: Any, *,
                 records_per_partition: Optional[int] = None,
                 storage_options: Optional[Dict[str, Any]] = None,
                 **decode_options: Any) -> db.Bag:
    """A Dask bag of the records of one or more record files.

    Args:
        paths_or_glob: a path, a glob (``"data/part-*.kilnr"``), a URL or
            URL glob, or a list of them.
        type: the record type (as for :class:`kiln.RecordFile`).
        records_per_partition: split each file into partitions of this many
            records (read through the index; the counts are read when the bag
            is built); by default one partition per file.
        storage_options: for URLs, the fsspec filesystem's options.
        decode_options: as for :class:`kiln.RecordFile`.

    Raises:
        FileNotFoundError: no file matches.
        KilnError: when computed, as :class:`kiln.RecordFile`.
    """
    paths = _paths(paths_or_glob, storage_options)
    if not paths:
        raise FileNotFoundError("no record file matches %r" % (paths_or_glob,))
    t = type              # text, a Type and a bound class all pickle
    options = dict(decode_options)
    if storage_options:
        options["storage_options"] = storage_options
    parts = []
    for p in paths:
        if records_per_partition is None:
            parts.append(dask.delayed(_read_part)(p, t, 0, None, options))
            continue
        if records_per_partition < 1:
            raise ValueError("records_per_partition must be at least 1")
        with RecordFile(p, t, **options) as rf:
            n = len(rf)
        for a in range(0, max(n, 1), records_per_partition):
            parts.append(dask.delayed(_read_part)(p, t, a, a + records_per_partition, options))
    return db.from_delayed(parts)


def _write_part(values: Any, path: str, type: Any, options: Dict[str, Any]) -> str:
    with RecordWriter(path, type, **options) as w:
        for v in values:
            w.write(v)
    return path


def to_records(bag: db.Bag, path_template: str, type: Any, *, compute: bool = True,
               **writer_options: Any) -> Any:
    """Write each partition of ``bag`` as one record file.

    Args:
        bag: a Dask bag of values of ``type``.
        path_template: the file names, with ``*`` replaced by the partition
            number (``"out/part-*.kilnr"``).
        type: the record type (as for :class:`kiln.RecordWriter`).
        compute: write now and return the paths; ``False`` returns the
            delayed writes.
        writer_options: as for :class:`kiln.RecordWriter`.
    """
    if "*" not in path_template:
        raise ValueError("path_template needs a * for the partition number")
    t = type              # text, a Type and a bound class all pickle
    width = len(str(max(bag.npartitions - 1, 0)))
    writes = [dask.delayed(_write_part)(part, path_template.replace("*", str(i).zfill(width)),
                                        t, writer_options)
              for i, part in enumerate(bag.to_delayed())]
    if not compute:
        return writes
    return list(dask.compute(*writes))
