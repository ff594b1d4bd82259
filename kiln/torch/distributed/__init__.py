"""Kiln files as the storage of ``torch.distributed.checkpoint`` (DCP).

``KilnStorageWriter`` and ``KilnStorageReader`` plug into DCP's own engine:
``dcp.save(state_dict, storage_writer=KilnStorageWriter(folder))``,
``dcp.async_save(...)`` and ``dcp.load(state_dict,
storage_reader=KilnStorageReader(folder))``.  DCP's planners decide what
each rank writes (the local chunks of its DTensors and FSDP2 parameters,
replicated tensors once) and what each rank reads on a load into another
world size or layout; kiln stores and reads the bytes:

- every rank writes one plain kiln tensor file, ``dcp-<tag>-<rank>.kiln``
  (written under a temporary name, fsynced and renamed when complete): each
  local chunk is a tensor named after its key (``fqn``, or ``fqn@offsets``
  for a chunk that does not start at 0), each non-tensor entry (a step
  count, a ``BytesIO``) the ``u8`` bytes DCP serialized;
- the coordinator writes the commit record ``dcp.kiln.json`` last, in one
  atomic rename, once every rank's file is complete: DCP's metadata as
  strict JSON (no pickle), naming every file with its size.  A new save
  takes a new ``tag``; the files of the checkpoint it replaces are removed
  only after its commit, so a save that dies on any rank at any step leaves
  the previous checkpoint loadable (or, in an empty folder, no checkpoint:
  the reader then raises :class:`IncompleteCheckpointError` naming what is
  missing);
- a load reads, for each chunk box DCP asks for, only that box's bytes with
  ``pread`` into the destination tensor (the CRC-32 of a chunk read whole is
  checked when the file records one);
- :func:`consolidate` turns the folder into an ordinary kiln sharded set.

Importing this module imports torch (``import kiln`` and ``import
kiln.torch`` do not).
"""

import concurrent.futures
import contextlib
import dataclasses
import io
import os
import secrets
import threading
import uuid
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, StorageMeta
from torch.distributed.checkpoint.planner import (LoadItemType, LoadPlan, LoadPlanner, ReadItem,
                                                  SavePlan, SavePlanner, WriteItemType)
from torch.distributed.checkpoint.storage import StorageReader, StorageWriter, WriteResult
from torch.futures import Future

import kiln
from kiln import _access

from ._chunks import RankFile
from ._layout import (COMMIT_NAME, DTYPE_OF, IncompleteCheckpointError, Stored, chunk_name,
                      encode_commit, local_path as _local_path, parse_rank_file, rank_file,
                      read_commit, stray_files)

__all__ = ["KilnStorageWriter", "KilnStorageReader", "consolidate", "IncompleteCheckpointError",
           "COMMIT_NAME"]

PathLike = Union[str, "os.PathLike[str]"]
DCP_VERSION = "1.0.0"   # the version of DCP's Metadata the commit records (as FileSystemWriter)
_KILN_OF = {v: k for k, v in DTYPE_OF.items()}


@dataclasses.dataclass(frozen=True)
class _RankPlan:
    """The coordinator's word to each rank (a ``SavePlan``'s ``storage_data``)."""

    tag: str
    rank: int
    world: int


def _done(value: Any) -> Future:
    fut: Future = Future()
    fut.set_result(value)
    return fut


def _kiln_dtype(dtype: Any, what: str) -> str:
    name = str(dtype).replace("torch.", "")
    k = _KILN_OF.get(name)
    if k is None:
        raise kiln.EncodeError("TYPE", 0, "%s: torch dtype %s has no kiln twin" % (what, dtype))
    return k


class _CheckpointFolder:
    """What DCP asks of the writer and the reader alike: the checkpoint's id
    is its folder's path (the reader's also holding a commit record)."""

    path: str
    _needs_commit = False

    @property
    def checkpoint_id(self) -> str:
        return self.path

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Any) -> bool:
        try:
            p = _local_path(checkpoint_id, cls.__name__)
        except (TypeError, ValueError):
            return False
        return not cls._needs_commit or os.path.isfile(os.path.join(p, COMMIT_NAME))


class KilnStorageWriter(_CheckpointFolder, StorageWriter):
    """DCP's ``StorageWriter`` for kiln files (see the module doc).

    Args:
        path: the checkpoint folder (created when missing).  A checkpoint
            already in it is replaced when this save commits, not before.
        thread_count: threads writing this rank's payloads (into its one
            file, with positional writes).
        checksum: record a CRC-32 of every chunk (read back at the end of
            each rank's write; checked by loads that read a chunk whole and
            by :func:`consolidate`).  Off by default, as for
            :func:`kiln.torch.save_file` (torch's writers record none).
        enable_consolidation: after the commit, the coordinator runs
            :func:`consolidate` into ``consolidated_path``.
        consolidated_path: the folder of the consolidated set (default
            ``<path>/consolidated``).
        max_shard_size: the consolidated set's shard size.

    Example:
        >>> import torch.distributed.checkpoint as dcp
        >>> dcp.save(model.state_dict(), storage_writer=KilnStorageWriter("ckpt"))
    """

    def __init__(self, path: PathLike, *, thread_count: int = 1, checksum: bool = False,
                 enable_consolidation: bool = False,
                 consolidated_path: Optional[PathLike] = None,
                 max_shard_size: Any = "5GB") -> None:
        super().__init__()
        self.path = _local_path(path, "KilnStorageWriter")
        if type(thread_count) is not int or thread_count < 1:
            raise ValueError("thread_count must be an int >= 1, not %r" % (thread_count,))
        self.thread_count = thread_count
        self.checksum = bool(checksum)
        self.enable_consolidation = bool(enable_consolidation)
        self.consolidated_path = None if consolidated_path is None else \
            _local_path(consolidated_path, "consolidated_path")
        self.max_shard_size = max_shard_size
        self.save_id = uuid.uuid4().hex
        self.rank: Optional[int] = None
        self.is_coordinator = False
        self._plan: Optional[_RankPlan] = None

    # -- DCP's contract ------------------------------------------------------
    def reset(self, checkpoint_id: Optional[PathLike] = None) -> None:
        if checkpoint_id:
            self.path = _local_path(checkpoint_id, "KilnStorageWriter")
        self.save_id = uuid.uuid4().hex
        self._plan = None

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self.is_coordinator = is_coordinator
        self.rank = kwargs.get("rank")
        if kwargs.get("use_collectives", True) is False:
            raise ValueError("KilnStorageWriter needs DCP's collectives (use_collectives="
                             "True): its coordinator commits every rank's file at once")

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        os.makedirs(self.path, exist_ok=True)
        return plan

    def prepare_global_plan(self, plans: List[SavePlan]) -> List[SavePlan]:
        tag = secrets.token_hex(6)
        self._plan = _RankPlan(tag, 0, len(plans))
        return [dataclasses.replace(p, storage_data=_RankPlan(tag, i, len(plans)))
                for i, p in enumerate(plans)]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future:
        sp = plan.storage_data
        if not isinstance(sp, _RankPlan):
            raise ValueError("the save plan carries no KilnStorageWriter plan (was it made "
                             "by another storage writer?)")
        name = rank_file(sp.tag, sp.rank)
        target = os.path.join(self.path, name)
        if os.path.lexists(target):
            raise ValueError("%s exists: the plan repeats an earlier save's tag (a cached "
                             "plan?); kiln never writes over a committed file" % target)
        return _done(_write_rank_file(target, name, sp, plan.items, planner,
                                      self.thread_count, self.checksum))

    def finish(self, metadata: Metadata, results: List[List[WriteResult]]) -> None:
        sp = self._plan
        if sp is None:
            raise RuntimeError("finish() before prepare_global_plan(): not the coordinator")
        storage: Dict[Any, Any] = {}
        for rank_results in results:
            for wr in rank_results:
                storage[wr.index] = wr.storage_data
        metadata.storage_data = storage
        metadata.storage_meta = self.storage_meta()
        metadata.version = DCP_VERSION
        files = {}
        for r in range(sp.world):
            fn = rank_file(sp.tag, r)
            files[fn] = os.stat(os.path.join(self.path, fn)).st_size
        blob = encode_commit(metadata, sp.tag, sp.world, files)
        with _access.AtomicFile(os.path.join(self.path, COMMIT_NAME)) as out:
            out.f.write(blob)
            out.wrote(len(blob))
        _drop_replaced(self.path, sp.tag)
        if self.enable_consolidation:
            consolidate(self.path, self.consolidated_path or os.path.join(self.path,
                                                                          "consolidated"),
                        max_shard_size=self.max_shard_size)

    def storage_meta(self) -> Optional[StorageMeta]:
        return StorageMeta(checkpoint_id=self.path, save_id=self.save_id)



def _drop_replaced(folder: str, tag: str) -> None:
    """After a commit: the rank files of every other save, and the temporary
    files killed writers of other saves left."""
    for fn in stray_files(folder, tag):
        _remove(os.path.join(folder, fn))
    for fn in os.listdir(folder):
        if fn.startswith(".dcp-") and fn.endswith(".kiln-tmp"):
            base = fn[1:].split(".kiln.", 1)[0] + ".kiln"
            p = parse_rank_file(base)
            if p is not None and p[0] != tag:
                _remove(os.path.join(folder, fn))


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def _write_rank_file(target: str, name: str, sp: _RankPlan, items: Sequence[Any],
                     planner: SavePlanner, threads: int, checksum: bool) -> List[WriteResult]:
    """This rank's items into its kiln file (declared from the plan, each
    payload resolved lazily and written in place); the WriteResults."""
    results: List[WriteResult] = []
    meta = {"kiln.dcp": {"tag": sp.tag, "rank": sp.rank, "world": sp.world}}
    with kiln.TensorWriter(target, metadata=meta, checksum=checksum) as w:   # discarded on
        # an exception: the file appears complete or not at all
        byte_items: Dict[str, bytes] = {}
        todo: List[Tuple[str, Any]] = []
        for item in items:
            if item.type == WriteItemType.BYTE_IO:
                data = planner.resolve_data(item)
                raw = data.getvalue() if isinstance(data, io.BytesIO) else bytes(data.read())
                tname = chunk_name(item.index.fqn, None)
                w.add(tname, "u8", (len(raw),))
                byte_items[tname] = raw
                results.append(WriteResult(item.index, len(raw), Stored(name, tname)))
                continue
            td = item.tensor_data
            tname = chunk_name(item.index.fqn, td.chunk.offsets)
            shape = tuple(int(n) for n in td.chunk.sizes)
            dt = _kiln_dtype(td.properties.dtype, item.index.fqn)
            w.add(tname, dt, shape)
            nbytes = int(np.prod(shape, dtype=np.int64)) * td.properties.dtype.itemsize
            todo.append((tname, item))
            results.append(WriteResult(item.index, nbytes, Stored(name, tname)))
        for tname, raw in byte_items.items():
            w.write(tname, raw)

        def one(job: Tuple[str, Any]) -> None:
            tname, item = job
            t = planner.resolve_data(item).detach()
            if t.device.type != "cpu":
                t = t.cpu()
            if t.is_neg() or t.is_conj():
                t = t.resolve_conj().resolve_neg()
            w.write(tname, t.contiguous())

        if threads > 1 and len(todo) > 1:
            with concurrent.futures.ThreadPoolExecutor(threads) as pool:
                list(pool.map(one, todo))
        else:
            for job in todo:
                one(job)
    return results


class KilnStorageReader(_CheckpointFolder, StorageReader):
    """DCP's ``StorageReader`` for a folder :class:`KilnStorageWriter` wrote.

    ``read_metadata`` reads the commit record and checks every file it names
    is there with its committed size (:class:`IncompleteCheckpointError`
    naming what is missing otherwise); each rank then opens only the files
    holding chunks it needs and reads only the boxes DCP's plan asks for.

    Args:
        path: the checkpoint folder.
        verify: check the CRC-32 of chunks read whole, where recorded.
        thread_count: threads reading this rank's files.

    Attributes:
        bytes_read: payload bytes this reader read in its last load.
    """

    _needs_commit = True

    def __init__(self, path: PathLike, *, verify: bool = True, thread_count: int = 1) -> None:
        super().__init__()
        self.path = _local_path(path, "KilnStorageReader")
        if type(thread_count) is not int or thread_count < 1:
            raise ValueError("thread_count must be an int >= 1, not %r" % (thread_count,))
        self.verify = bool(verify)
        self.thread_count = thread_count
        self.load_id = uuid.uuid4().hex
        self.storage_data: Dict[Any, Any] = {}
        self.bytes_read = 0
        self._files: Dict[str, int] = {}

    def reset(self, checkpoint_id: Optional[PathLike] = None) -> None:
        self.storage_data = {}
        if checkpoint_id:
            self.path = _local_path(checkpoint_id, "KilnStorageReader")
        self.load_id = uuid.uuid4().hex

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        md, rec = read_commit(self.path)
        self._files = dict(rec["files"])
        if md.storage_meta is None:
            md.storage_meta = StorageMeta()
        md.storage_meta.load_id = self.load_id
        return md

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any,
                              **kwargs: Any) -> None:
        if metadata.storage_data is None:
            raise ValueError("the checkpoint's metadata has no storage data")
        self.storage_data = metadata.storage_data
        if not self._files:   # metadata read by another reader (DCP passes it on)
            self._files = dict(read_commit(self.path)[1]["files"])

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: List[LoadPlan]) -> List[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future:
        per_file: Dict[str, List[ReadItem]] = {}
        for req in plan.items:
            st = self.storage_data.get(req.storage_index)
            if not isinstance(st, Stored):
                raise IncompleteCheckpointError(self.path, [str(req.storage_index.fqn)],
                                                "the commit record holds no chunk %s of %r"
                                                % (list(req.storage_index.offset or []),
                                                   req.storage_index.fqn))
            per_file.setdefault(st.file, []).append(req)
        self.bytes_read = 0
        lock = threading.Lock()   # the planner is not promised to be thread safe

        def one_file(fn: str) -> int:
            rf = RankFile(os.path.join(self.path, fn), self.verify, self._files.get(fn))
            try:
                for req in per_file[fn]:
                    _read_item(rf, self.storage_data[req.storage_index].name, req, planner,
                               lock)
                return rf.bytes_read
            finally:
                rf.close()

        names = sorted(per_file)
        if self.thread_count > 1 and len(names) > 1:
            with concurrent.futures.ThreadPoolExecutor(self.thread_count) as pool:
                self.bytes_read = sum(pool.map(one_file, names))
        else:
            self.bytes_read = sum(one_file(fn) for fn in names)
        return _done(None)



def _byte_view(t: Any) -> Optional[memoryview]:
    """The bytes of a contiguous CPU tensor, writable, or None."""
    if t.device.type != "cpu" or not t.is_contiguous() or t.is_neg() or t.is_conj():
        return None
    flat = t.reshape(-1)
    if flat.numel() == 0:
        return memoryview(bytearray(0))
    return memoryview(flat.view(torch.uint8).numpy()).cast("B")


def _read_item(rf: RankFile, tname: str, req: ReadItem, planner: LoadPlanner,
               lock: threading.Lock) -> None:
    if req.type == LoadItemType.BYTE_IO:
        raw = rf.read_whole(tname)
        with lock:
            planner.load_bytes(req, io.BytesIO(bytes(raw)))
        return
    _, shape, kdt, _ = rf.tensor(tname)
    dtype = getattr(torch, DTYPE_OF.get(kdt, ""), None)
    if not isinstance(dtype, torch.dtype):
        raise kiln.KilnError("TYPE", 0, "%s: tensor %r has dtype %s, which torch lacks"
                             % (rf.path, tname, kdt))
    with lock:
        target = planner.resolve_tensor(req).detach()
    lengths = [int(n) for n in req.lengths]
    if list(target.shape) != lengths:
        raise ValueError("%r: DCP asks for a box of %s into a tensor of %s"
                         % (req.dest_index.fqn, lengths, list(target.shape)))
    view = _byte_view(target) if target.dtype == dtype else None
    if view is not None:
        rf.read_box(tname, [int(o) for o in req.storage_offsets], lengths, view,
                    dtype.itemsize)
    else:
        buf = torch.empty(lengths, dtype=dtype)
        rf.read_box(tname, [int(o) for o in req.storage_offsets], lengths, _byte_view(buf),
                    dtype.itemsize)
        target.copy_(buf)
    with lock:
        planner.commit_tensor(req, target)


# -- consolidation -------------------------------------------------------------
def consolidate(path: PathLike, out: PathLike, *, max_shard_size: Any = "5GB",
                prefix: str = "model", checksum: bool = False, thread_count: int = 4,
                verify: bool = True) -> str:
    """Turn a kiln DCP checkpoint into an ordinary kiln sharded set; returns
    the index's path (``<out>/<prefix>.kiln.index.json``).

    Each tensor is written once, whole, into shard files of at most
    ``max_shard_size`` payload bytes (a larger tensor alone in its shard):
    a tensor whose chunks are whole rows (``Shard(0)``, a replica) is copied
    chunk by chunk file to file (:meth:`kiln.TensorWriter.write_rows_from`),
    each chunk's CRC-32 checked first where recorded; any other layout is
    assembled in memory from its chunks' boxes (read with ``pread``).
    ``thread_count`` threads write tensors at once, each holding at most one
    tensor in memory: about the largest tensor a thread, never the model.
    Non-tensor entries (a step count, pickled ``BytesIO`` items) have no
    place in a tensor set: their keys are listed in the index's metadata
    under ``"dcp.entries"``.
    A set already in ``out`` is replaced whole, as :func:`kiln.save_sharded`
    replaces one; one that fails leaves the old set, or nothing (no folder
    it created either).

    Raises:
        IncompleteCheckpointError: ``path`` holds no complete checkpoint.
        KilnError: a rank file that is damaged or disagrees with the commit.
    """
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    folder = _local_path(path, "consolidate")
    dest = _local_path(out, "consolidate")
    if type(thread_count) is not int or thread_count < 1:
        raise ValueError("thread_count must be an int >= 1, not %r" % (thread_count,))
    if not prefix or os.sep in prefix or prefix in (".", ".."):
        raise ValueError("prefix must be a plain file name, not %r" % (prefix,))
    cap = _access.parse_size(max_shard_size)
    md, rec = read_commit(folder)
    files: Dict[str, int] = rec["files"]
    tensors: List[Tuple[str, Any]] = []
    entries: List[str] = []
    for fqn, m in md.state_dict_metadata.items():
        if isinstance(m, TensorStorageMetadata):
            tensors.append((fqn, m))
        else:
            entries.append(fqn)
    tensors.sort(key=lambda x: x[0])
    sizes = [int(np.prod(list(m.size), dtype=np.int64)) * m.properties.dtype.itemsize
             for _, m in tensors]
    groups: List[List[int]] = []
    cur: List[int] = []
    have = 0
    for i, n in enumerate(sizes):
        if cur and have + n > cap:
            groups.append(cur)
            cur, have = [], 0
        cur.append(i)
        have += n
    if cur or not groups:
        groups.append(cur)
    made = _access.make_folder(dest)   # taken away again if the set fails
    index = os.path.join(dest, prefix + ".kiln.index.json")
    old = _access.old_shards(index, ".kiln")
    _access.uncache_shards(dest, old)
    names = _access.fresh_names(["%s-%05d-of-%05d.kiln" % (prefix, i + 1, len(groups))
                                 for i in range(len(groups))], index, ".kiln")
    opened: Dict[str, RankFile] = {}
    open_lock = threading.Lock()

    def rank(fn: str) -> RankFile:
        with open_lock:
            if fn not in opened:
                opened[fn] = RankFile(os.path.join(folder, fn), verify, files.get(fn))
            return opened[fn]

    def one(job: Tuple[Any, int]) -> None:
        fqn, m = tensors[job[1]]
        _assemble(job[0], fqn, m, md, rank)

    try:
        with contextlib.ExitStack() as stack:   # a writer discards its file on any error
            jobs = []
            for k, group in enumerate(groups):
                w = stack.enter_context(kiln.TensorWriter(os.path.join(dest, names[k]),
                                                          checksum=checksum))
                for i in group:
                    fqn, m = tensors[i]
                    w.add(fqn, _kiln_dtype(m.properties.dtype, fqn), tuple(m.size))
                    jobs.append((w, i))
            jobs.sort(key=lambda j: -sizes[j[1]])   # the largest first: the threads end together
            if thread_count > 1 and len(jobs) > 1:
                with concurrent.futures.ThreadPoolExecutor(min(thread_count, len(jobs))) as pool:
                    for f in [pool.submit(one, j) for j in jobs]:
                        f.result()
            else:
                for j in jobs:
                    one(j)
        wm = {tensors[i][0]: names[k] for k, g in enumerate(groups) for i in g}
        meta: Dict[str, Any] = {"total_size": sum(sizes)}
        if entries:
            meta["dcp.entries"] = sorted(entries)
        _access.write_index(index, wm, meta)
    except BaseException:
        for fn in names:
            if fn not in old:
                _remove(os.path.join(dest, fn))
        _access.remove_made(dest, made)
        raise
    finally:
        for rf in opened.values():
            rf.close()
    _access.drop_shards(dest, old, names)
    return index


def _assemble(w: Any, fqn: str, m: Any, md: Metadata, rank: Any) -> None:
    """Tensor ``fqn`` whole into writer ``w`` from its chunks: file to file
    where the chunks are whole rows (FSDP's ``Shard(0)``, a replica), each
    chunk's CRC-32 checked first where recorded; else assembled in memory."""
    size = [int(n) for n in m.size]
    dtype = m.properties.dtype
    total = int(np.prod(size, dtype=np.int64))
    if total == 0:
        w.write(fqn, None)
        return
    chunks, seen = [], 0
    for c in m.chunks:
        lengths = [int(n) for n in c.sizes]
        n = int(np.prod(lengths, dtype=np.int64))
        if not n:
            continue
        st = md.storage_data[MetadataIndex(fqn, c.offsets)]
        rf = rank(st.file)
        at, shape, _, _ = rf.tensor(st.name)
        if list(shape) != lengths:
            raise kiln.KilnError("TYPE", at, "%s: chunk %r is %s, the commit says %s"
                                 % (rf.path, st.name, list(shape), lengths))
        chunks.append(([int(o) for o in c.offsets], lengths, st.name, rf, at))
        seen += n
    if seen != total:
        raise IncompleteCheckpointError(os.path.dirname(chunks[0][3].path if chunks else ""),
                                        [fqn], "tensor %r: its chunks cover %d of its %d "
                                        "elements" % (fqn, seen, total))
    if len(chunks) == 1:   # one chunk, the whole tensor (bool bytes checked on the way)
        _, _, name, rf, at = chunks[0]
        rf.check_whole(name)
        w.write_from(fqn, rf.file, at)
        return
    if dtype != torch.bool and all(off[1:] == [0] * (len(size) - 1) and lengths[1:] == size[1:]
                                   for off, lengths, _, _, _ in chunks):
        for off, lengths, name, rf, at in chunks:   # row blocks
            rf.check_whole(name)
            w.write_rows_from(fqn, off[0], lengths[0], rf.file, at)
        return
    data = torch.empty(size, dtype=dtype)
    for off, lengths, name, rf, _ in chunks:
        part = data[tuple(slice(o, o + n) for o, n in zip(off, lengths))]
        view = _byte_view(part)
        if view is not None:
            rf.read_box(name, [0] * len(size), lengths, view, dtype.itemsize)
        else:
            buf = torch.empty(lengths, dtype=dtype)
            rf.read_box(name, [0] * len(size), lengths, _byte_view(buf), dtype.itemsize)
            part.copy_(buf)
    w.write(fqn, data)
