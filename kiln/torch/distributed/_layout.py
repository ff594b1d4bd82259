"""A kiln DCP checkpoint folder: the names of its files, the commit record
(DCP's ``Metadata`` as strict JSON, never a pickle) and what a reader checks
before it trusts one.

A folder holds one committed checkpoint at a time:

- ``dcp-<tag>-<rank>.kiln``: one plain kiln tensor file per rank of the save
  whose random ``tag`` the coordinator chose; each local chunk (and each
  non-tensor entry, as the ``u8`` bytes DCP serialized) is a tensor named
  after its key (``fqn`` or ``fqn@offsets``); the file's metadata says
  ``{"kiln.dcp": {"tag", "rank", "world"}}``.
- ``dcp.kiln.json``: the commit, written last and atomically by the
  coordinator once every rank's file is in place; it names every file (with
  its size) and every chunk.  No commit, no checkpoint.
"""

import os
import re
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import kiln
from kiln import _access

__all__ = ["COMMIT_NAME", "FORMAT", "IncompleteCheckpointError", "Stored", "rank_file",
           "parse_rank_file", "chunk_name", "encode_commit", "decode_commit", "read_commit",
           "DTYPE_OF", "stray_files", "check_files"]

COMMIT_NAME = "dcp.kiln.json"
FORMAT = "kiln-dcp"
VERSION = 1
_RANK_FILE = re.compile(r"^dcp-([0-9a-f]{12})-(\d{5})\.kiln$")
_MAX_COMMIT = 1 << 30   # bytes of a commit record kiln reads

# Kiln dtype name <-> torch dtype name (the same bits on both sides)
DTYPE_OF = {"f64": "float64", "f32": "float32", "f16": "float16", "bf16": "bfloat16",
            "f8e4m3": "float8_e4m3fn", "f8e5m2": "float8_e5m2", "e8m0": "float8_e8m0fnu",
            "bool": "bool", "i8": "int8", "u8": "uint8", "i16": "int16", "u16": "uint16",
            "i32": "int32", "u32": "uint32", "i64": "int64", "u64": "uint64"}


class IncompleteCheckpointError(RuntimeError):
    """The folder holds no complete checkpoint: no commit record, or a file
    the commit names is missing or has another size.

    Attributes:
        path: the checkpoint folder.
        missing: the files (or ranks' files) that are not there as committed.
    """

    def __init__(self, path: str, missing: List[str], why: str) -> None:
        self.path = path
        self.missing = missing
        RuntimeError.__init__(self, "%s: %s" % (path, why))


@dataclass(frozen=True)
class Stored:
    """Where one chunk (or one non-tensor entry) lives: the rank file and the
    tensor's name in it (the ``storage_data`` of DCP's ``WriteResult``)."""

    file: str
    name: str


def rank_file(tag: str, rank: int) -> str:
    return "dcp-%s-%05d.kiln" % (tag, rank)


def parse_rank_file(name: str) -> Optional[Tuple[str, int]]:
    m = _RANK_FILE.match(name)
    return (m.group(1), int(m.group(2))) if m else None


def chunk_name(fqn: str, offsets: Any) -> str:
    """A chunk's tensor name in its rank file: the key, then ``@`` and the
    chunk's offsets when any is not 0 (two chunks of one key differ there)."""
    if offsets is None or not any(offsets):
        return fqn
    return "%s@%s" % (fqn, ",".join(str(int(o)) for o in offsets))


def _ints(v: Any, what: str) -> List[int]:
    if not isinstance(v, list) or not all(type(x) is int and 0 <= x < 1 << 63 for x in v):
        raise ValueError("%s is not a list of ints >= 0" % what)
    return v


def _str(v: Any, what: str) -> str:
    if not isinstance(v, str):
        raise ValueError("%s is not a string" % what)
    return v


def _path_item(v: Any) -> bool:
    return isinstance(v, str) or (type(v) is int)


def encode_commit(md: Any, tag: str, world: int, files: Dict[str, int]) -> bytes:
    """DCP's ``Metadata`` (its ``storage_data`` filled from the write results)
    as the commit record's bytes; ``ValueError`` for what JSON cannot keep."""
    import json
    import torch
    from torch.distributed.checkpoint.metadata import (BytesStorageMetadata, MetadataIndex,
                                                       TensorStorageMetadata)
    torch_names = {getattr(torch, n): k for k, n in DTYPE_OF.items() if hasattr(torch, n)}
    tensors: Dict[str, Any] = {}
    entries: Dict[str, Any] = {}
    sd = md.storage_data
    for fqn, m in md.state_dict_metadata.items():
        if isinstance(m, BytesStorageMetadata):
            s = sd.get(MetadataIndex(fqn))
            if s is None:
                raise ValueError("no rank wrote the entry %r" % fqn)
            entries[fqn] = [s.file, s.name]
            continue
        assert isinstance(m, TensorStorageMetadata)
        p = m.properties
        if p.dtype not in torch_names:
            raise ValueError("tensor %r: torch dtype %s has no Kiln dtype" % (fqn, p.dtype))
        chunks = []
        for c in m.chunks:
            s = sd.get(MetadataIndex(fqn, c.offsets))
            if s is None:
                raise ValueError("no rank wrote chunk %s of %r" % (list(c.offsets), fqn))
            chunks.append([list(c.offsets), list(c.sizes), s.file, s.name])
        tensors[fqn] = {"dtype": torch_names[p.dtype], "size": list(m.size),
                        "requires_grad": bool(p.requires_grad), "pin_memory": bool(p.pin_memory),
                        "chunks": chunks}
    planner = md.planner_data
    if planner is not None:
        if not isinstance(planner, dict) or not all(
                isinstance(k, str) and isinstance(v, tuple) and all(map(_path_item, v))
                for k, v in planner.items()):
            raise ValueError("the planner's data is not {key: (str or int, ...)}: kiln's "
                             "commit record keeps only that (DefaultSavePlanner's)")
        planner = {k: list(v) for k, v in planner.items()}
    sm = md.storage_meta
    meta = None if sm is None else {"checkpoint_id": None if sm.checkpoint_id is None
                                    else os.fspath(sm.checkpoint_id),
                                    "save_id": sm.save_id, "modules": list(sm.modules or [])}
    rec = {"format": FORMAT, "version": VERSION, "dcp_version": md.version, "tag": tag,
           "world": world, "files": dict(sorted(files.items())), "tensors": tensors,
           "entries": entries, "planner_data": planner, "storage_meta": meta}
    return json.dumps(rec, separators=(",", ":")).encode("utf-8") + b"\n"


def decode_commit(raw: bytes, where: str) -> Tuple[Any, Dict[str, Any]]:
    """(DCP's ``Metadata``, the record) from a commit record's bytes, every
    field checked (``KilnError`` ``FRAME`` naming the field otherwise)."""
    try:
        rec = _access.strict_json(raw.decode("utf-8"))
        return _metadata(rec), rec
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        raise kiln.KilnError("FRAME", 0, "%s: not a kiln DCP commit record (%s)"
                             % (where, e)) from None


def _metadata(rec: Any) -> Any:
    import torch
    from torch.distributed.checkpoint.metadata import (
        BytesStorageMetadata, ChunkStorageMetadata, Metadata, MetadataIndex, StorageMeta,
        TensorProperties, TensorStorageMetadata)
    if not isinstance(rec, dict) or rec.get("format") != FORMAT:
        raise ValueError("format is not %r" % FORMAT)
    if rec.get("version") != VERSION:
        raise ValueError("version %r (this kiln reads %d)" % (rec.get("version"), VERSION))
    files = rec["files"]
    if not isinstance(files, dict) or not all(
            parse_rank_file(k) and type(v) is int and v >= 0 for k, v in files.items()):
        raise ValueError("files is not {rank file: size}")
    sdm: Dict[str, Any] = {}
    storage: Dict[Any, Stored] = {}

    def stored(file: Any, name: Any, what: str) -> Stored:
        if file not in files or not isinstance(name, str) or not name:
            raise ValueError("%s names %r, not a committed file" % (what, file))
        return Stored(file, name)

    tensors, entries = rec["tensors"], rec["entries"]
    if not isinstance(tensors, dict) or not isinstance(entries, dict):
        raise ValueError("tensors or entries is not an object")
    for fqn, t in tensors.items():
        dtype = getattr(torch, DTYPE_OF.get(_str(t["dtype"], "dtype"), ""), None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError("tensor %r: unknown dtype %r" % (fqn, t["dtype"]))
        size = _ints(t["size"], "tensor %r size" % fqn)
        chunks = []
        if not isinstance(t["chunks"], list):
            raise ValueError("tensor %r: chunks is not a list" % fqn)
        for c in t["chunks"]:
            if not isinstance(c, list) or len(c) != 4:
                raise ValueError("tensor %r: a chunk is not [offsets, sizes, file, name]" % fqn)
            off = _ints(c[0], "tensor %r chunk offsets" % fqn)
            sz = _ints(c[1], "tensor %r chunk sizes" % fqn)
            if len(off) != len(size) or len(sz) != len(size) or any(
                    o + n > d and n for o, n, d in zip(off, sz, size)):
                raise ValueError("tensor %r: chunk %s %s is outside its size %s"
                                 % (fqn, off, sz, size))
            chunks.append(ChunkStorageMetadata(offsets=torch.Size(off), sizes=torch.Size(sz)))
            storage[MetadataIndex(fqn, torch.Size(off))] = stored(c[2], c[3], "tensor %r" % fqn)
        _tiles(fqn, size, chunks)
        props = TensorProperties(dtype=dtype, requires_grad=bool(t["requires_grad"]),
                                 pin_memory=bool(t["pin_memory"]))
        sdm[fqn] = TensorStorageMetadata(properties=props, size=torch.Size(size), chunks=chunks)
    for fqn, e in entries.items():
        if not isinstance(e, list) or len(e) != 2:
            raise ValueError("entry %r is not [file, name]" % fqn)
        sdm[fqn] = BytesStorageMetadata()
        storage[MetadataIndex(fqn)] = stored(e[0], e[1], "entry %r" % fqn)
    planner = rec["planner_data"]
    if planner is not None:
        if not isinstance(planner, dict) or not all(
                isinstance(v, list) and all(map(_path_item, v)) for v in planner.values()):
            raise ValueError("planner_data is not {key: [str or int, ...]}")
        planner = {k: tuple(v) for k, v in planner.items()}
    sm = rec["storage_meta"]
    meta = None
    if sm is not None:
        meta = StorageMeta(checkpoint_id=sm["checkpoint_id"], save_id=_str(sm["save_id"],
                           "save_id"), modules=[_str(m, "modules") for m in sm["modules"]])
    version = rec["dcp_version"]
    return Metadata(state_dict_metadata=sdm, planner_data=planner, storage_data=storage,
                    storage_meta=meta, version=version if isinstance(version, str) else None)


def _tiles(fqn: str, size: List[int], chunks: List[Any]) -> None:
    """``ValueError`` unless the chunks cover the tensor exactly once: no two
    overlap, and their elements add up to the tensor's (a record that left a
    hole would load, or consolidate, memory no chunk wrote).  Boxes are swept
    in order of their first offset; only those still open along the first
    axis are compared."""
    def volume(dims: Any) -> int:
        n = 1
        for d in dims:
            n *= d
        return n
    boxes = sorted((list(c.offsets), list(c.sizes)) for c in chunks if volume(c.sizes))
    open_: List[Tuple[List[int], List[int]]] = []
    for off, sz in boxes:
        open_ = [b for b in open_ if not size or b[0][0] + b[1][0] > off[0]]
        for o2, s2 in open_:
            if all(a < c + m and c < a + n for a, n, c, m in zip(off, sz, o2, s2)):
                raise ValueError("tensor %r: chunks %s+%s and %s+%s overlap"
                                 % (fqn, o2, s2, off, sz))
        open_.append((off, sz))
    have, want = sum(volume(sz) for _, sz in boxes), volume(size)
    if have != want:
        raise ValueError("tensor %r: its chunks hold %d of its %d elements" % (fqn, have, want))


def read_commit(folder: str) -> Tuple[Any, Dict[str, Any]]:
    """The committed checkpoint of ``folder`` (its record read through one
    descriptor), its files checked to be there with their committed sizes;
    ``IncompleteCheckpointError`` naming what is missing otherwise."""
    path = os.path.join(folder, COMMIT_NAME)
    try:
        f = _access.open_regular_file(path)
    except FileNotFoundError:
        raise _no_commit(folder) from None
    with f:
        size = os.fstat(f.fileno()).st_size
        if size > _MAX_COMMIT:
            raise kiln.KilnError("LIMIT", 0, "%s: a commit record of %d bytes is above "
                                 "kiln's cap of %d" % (path, size, _MAX_COMMIT))
        raw = f.read(size + 1)
    md, rec = decode_commit(raw, path)
    check_files(folder, rec["files"])
    return md, rec


def check_files(folder: str, files: Dict[str, int]) -> None:
    missing = []
    for name, size in sorted(files.items()):
        try:
            got = os.stat(os.path.join(folder, name)).st_size
        except FileNotFoundError:
            missing.append(name)
            continue
        if got != size:
            missing.append(name)
    if missing:
        raise IncompleteCheckpointError(folder, missing, "the committed checkpoint is "
                                        "incomplete: %s missing or of another size than "
                                        "committed" % ", ".join(missing))


def _no_commit(folder: str) -> IncompleteCheckpointError:
    """The error for a folder without a commit: what an unfinished save left."""
    tags: Dict[str, List[int]] = {}
    world: Dict[str, int] = {}
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return IncompleteCheckpointError(folder, [COMMIT_NAME], "no such folder")
    for name in names:
        p = parse_rank_file(name)
        if p is None:
            continue
        tags.setdefault(p[0], []).append(p[1])
        try:
            with kiln.open(os.path.join(folder, name)) as f:
                info = (f.metadata or {}).get("kiln.dcp") or {}
            if type(info.get("world")) is int:
                world[p[0]] = info["world"]
        except (OSError, kiln.KilnError):
            pass
    if not tags:
        return IncompleteCheckpointError(folder, [COMMIT_NAME], "no committed kiln DCP "
                                         "checkpoint (%s is missing)" % COMMIT_NAME)
    parts, missing = [], [COMMIT_NAME]
    for tag, ranks in sorted(tags.items()):
        n = world.get(tag)
        lost = [r for r in range(n) if r not in ranks] if n else []
        missing += [rank_file(tag, r) for r in lost]
        parts.append("save %s left the files of rank%s %s%s" % (
            tag, "" if len(ranks) == 1 else "s", ", ".join(map(str, sorted(ranks))),
            "; the files of rank%s %s are missing" % ("" if len(lost) == 1 else "s",
                                                      ", ".join(map(str, lost)))
            if lost else ""))
    return IncompleteCheckpointError(folder, missing, "no committed checkpoint: %s is "
                                     "missing (a save stopped before its commit: %s)"
                                     % (COMMIT_NAME, "; ".join(parts)))


def stray_files(folder: str, keep_tag: str) -> List[str]:
    """The rank files in ``folder`` of any save but ``keep_tag`` (replaced or
    never committed)."""
    out = []
    for name in os.listdir(folder):
        p = parse_rank_file(name)
        if p is not None and p[0] != keep_tag:
            out.append(name)
    return out


def local_path(path: Any, what: str) -> str:
    """``path`` as a local folder's path (bytes as every kiln path, see
    ``kiln._files.paths.bytes_path``; ``TypeError`` for another object,
    ``ValueError`` for a URL: DCP's folders are local)."""
    path = _access.bytes_path(path, what)
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError("%s takes a folder path (str, bytes or os.PathLike), not %s"
                        % (what, type(path).__name__))
    p = os.fspath(path)
    if _access.is_url(p):
        raise ValueError("%s writes and reads local folders, not %r" % (what, p))
    return p
