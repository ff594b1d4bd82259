"""Writing sharded sets: ``kiln.save_sharded`` (shards, then the index, a set
already there replaced whole) and the helpers ``kiln convert`` shares for
replacing a set (see :mod:`kiln._files.sharded` for the layout and the
reading side)."""

import os
from typing import Any, Dict, List, Mapping, Optional, Tuple

from .. import _wire as W
from .._errors import EncodeError, KilnError
from .sharded import KILN_INDEX, PathLike, parse_index, parse_size, plain_file_name, read_index
from .paths import bytes_path
from .tied import SET_ALIASES_KEY, alias_fault, same_memory_key

__all__ = ["save_sharded", "write_index", "shard_names", "split", "shared_tensors",
           "old_shards", "fresh_names", "uncache_shards", "drop_shards", "make_folder",
           "remove_made", "save_set"]


def shard_names(prefix: str, n: int, ext: str) -> List[str]:
    return ["%s-%05d-of-%05d%s" % (prefix, i + 1, n, ext) for i in range(n)]


def write_index(path: str, wm: Mapping[str, str], meta: Dict[str, Any]) -> None:
    """The index JSON, written atomically."""
    import json
    from .atomic import AtomicFile
    blob = json.dumps({"metadata": meta, "weight_map": dict(wm)}, indent=2).encode() + b"\n"
    with AtomicFile(path) as out:
        out.f.write(blob)
        out.wrote(len(blob))


# what one shard file can hold (spec/kiln-v2.md 6.2 and 12.3): a u32 tensor
# count and a u32 name heap, each less the room of the metadata tensor that
# every shard may carry (its name, and one more tensor)
SHARD_MAX_TENSORS = W.U32_MAX - 1
SHARD_MAX_NAME_BYTES = W.U32_MAX - len(b"__metadata__")


def split(sizes: List[int], cap: int, heaps: Optional[List[int]] = None,
          max_tensors: int = SHARD_MAX_TENSORS,
          max_heap: int = SHARD_MAX_NAME_BYTES) -> List[List[int]]:
    """Consecutive groups of indices, each at most ``cap`` payload bytes (a
    tensor larger than ``cap`` alone in its shard), and each a file can hold:
    at most ``max_tensors`` tensors and ``max_heap`` bytes of names
    (``heaps``: each tensor's name and layout bytes), so no shard is cut that
    cannot be written.  A tensor whose own names pass ``max_heap`` is
    refused here, before anything is written."""
    groups: List[List[int]] = []
    cur: List[int] = []
    have = names = 0
    for i, n in enumerate(sizes):
        h = heaps[i] if heaps is not None else 0
        if h > max_heap:
            raise EncodeError("LIMIT", 0, "tensor %d: its name and layout name take %d bytes, "
                              "above a file's name heap of %d" % (i, h, max_heap))
        if cur and (have + n > cap or len(cur) >= max_tensors or names + h > max_heap):
            groups.append(cur)
            cur, have, names = [], 0, 0
        cur.append(i)
        have += n
        names += h
    if cur or not groups:
        groups.append(cur)
    return groups


def make_folder(folder: str) -> Optional[str]:
    """``os.makedirs(folder)``; returns the outermost folder it created (None
    when ``folder`` was there), which :func:`remove_made` takes away again
    after a failed save."""
    top = None
    at = os.path.abspath(folder)
    while not os.path.lexists(at):
        top = at
        parent = os.path.dirname(at)
        if parent == at:
            break
        at = parent
    os.makedirs(folder, exist_ok=True)
    return top


def remove_made(folder: str, top: Optional[str]) -> None:
    """Remove ``folder`` and its parents up to ``top`` (what :func:`make_folder`
    created), each only while it is empty: a failed save leaves no empty
    folder behind, and never removes what someone else put there meanwhile."""
    if top is None:
        return
    at = os.path.abspath(folder)
    while True:
        try:
            os.rmdir(at)
        except OSError:
            return
        if at == top:
            return
        at = os.path.dirname(at)


def shared_tensors(tensors: Any, aliases: Optional[Mapping[str, str]]
                   ) -> Tuple[Any, Dict[str, str]]:
    """(the tensors to store, alias -> stored name): a value given under several
    names of a mapping (one tensor by :func:`kiln._files.tied.same_memory_key`)
    stored once, under the first name in sorted order (as
    :func:`kiln.save_tensors` orders them), and ``aliases`` added (checked
    later, against the stored names, by :func:`kiln._files.tied.alias_fault`)."""
    found: Dict[str, str] = {}
    if isinstance(tensors, Mapping) and not hasattr(tensors, "to_dict"):
        items = sorted(((k, v) for k, v in tensors.items() if isinstance(k, str)),
                       key=lambda kv: kv[0].encode("utf-8", "surrogatepass"))
        first: Dict[Any, str] = {}
        keep: Dict[str, Any] = {}
        for k, v in items:
            key = same_memory_key(v)
            if key is not None and key in first:
                found[k] = first[key]
                continue
            if key is not None:
                first[key] = k
            keep[k] = v
        if found:
            tensors = dict(keep, **{k: v for k, v in tensors.items() if not isinstance(k, str)})
    if aliases:
        found.update(aliases)
    return tensors, found


def old_shards(index: str, suffix: str) -> List[str]:
    """The shard files the index at ``index`` lists now (none when there is no
    index, or one that cannot be read: nothing of it is trusted then)."""
    try:
        return list(parse_index(read_index(index), index, suffix).groups)
    except (OSError, KilnError):
        return []


def fresh_names(names: List[str], index: str, ext: str) -> List[str]:
    """The shard names for a set written beside (or over) the index ``index``:
    ``names`` as they are for the first set in its folder (no file at
    ``index``, none of ``names`` there either); else ``names`` with one random
    tag of 16 hex digits before ``ext``, a tag no file in the folder has.  A
    reader still holding an earlier index opens its shards by name, on first
    use: a name once given to a shard of an index that was replaced must
    never come back (the names the replaced index lists are not enough: the
    index before it may have used the plain names, and a reader may still
    hold it)."""
    import secrets
    folder = os.path.dirname(index) or "."

    def free(candidates: List[str]) -> bool:
        return not any(os.path.lexists(os.path.join(folder, n)) for n in candidates)

    if not os.path.lexists(index) and free(names):
        return names
    while True:
        tag = secrets.token_hex(8)
        tagged = [n[:-len(ext)] + "." + tag + ext for n in names]
        if free(tagged):
            return tagged


def uncache_shards(folder: str, old: List[str]) -> None:
    """Before a set is written over another: the old shards' cached pages
    given back, for the new shards to take (``pagecache.drop_cached``)."""
    from .pagecache import drop_cached
    drop_cached([os.path.join(folder, n) for n in old if plain_file_name(n)])


def drop_shards(folder: str, old: List[str], new: List[str]) -> None:
    """Remove the replaced set's shards (after its index was replaced); a
    large one's pages and blocks are freed after the call returns, as an
    atomic replace frees the file it replaced (``atomic.hold_old``)."""
    from .pagecache import free_later, hold_old
    keep = set(new)
    for name in old:
        if name not in keep and plain_file_name(name):
            path = os.path.join(folder, name)
            held = hold_old(path)
            try:
                os.remove(path)
            except FileNotFoundError:
                pass
            finally:
                free_later(held)


def save_sharded(tensors: Any, folder: PathLike, *, max_shard_size: Any = "5GB",
                 metadata: Optional[Dict[str, Any]] = None, checksum: bool = False,
                 prefix: str = "model", aliases: Optional[Mapping[str, str]] = None) -> str:
    """Write ``tensors`` as a sharded set in ``folder``: shard files
    ``model-00001-of-0000N.kiln`` of at most ``max_shard_size`` payload bytes
    each (a larger tensor alone in its shard), then the index
    ``model.kiln.index.json`` (``{"metadata": {"total_size": N}, "weight_map":
    {name: shard}}``, as Hugging Face's); returns the index's path.

    Args:
        tensors: a mapping of name to array or :class:`kiln.Tensor` (sorted by
            name, as :func:`kiln.save_tensors` sorts it) or a
            :class:`kiln.TensorDirectory` (its order); every tensor named.
        folder: created when missing.
        max_shard_size: an int (bytes) or text: ``"5GB"`` (10**9 bytes a GB),
            ``"500MiB"`` (2**20 a MiB).
        metadata, checksum: as for :func:`kiln.save_tensors`, for every shard.
        prefix: the file names' stem.
        aliases: other names of stored tensors (alias -> stored name), kept in
            the index (:attr:`ShardedFile.aliases`).  A value given under two
            names of ``tensors`` (the same object, or an array or torch tensor
            over the same memory with the same shape, strides and dtype: tied
            weights) is stored once too, under the first name in sorted
            order, the others recorded as its aliases.

    Each shard and the index are written atomically; the index last.  A set
    already in the folder under the same index name is replaced whole: the
    new shards take names no earlier set in the folder had (a random tag
    before the extension, whenever an index is there already), the index is
    replaced in one rename, and the old shards are removed after it (a
    reader of an old set meets ``FileNotFoundError`` for a shard it had not
    opened yet, never another set's bytes).  A save that fails or is
    killed at any step leaves the complete old set or the complete new one;
    one that fails (an exception, not a kill) into a folder it created
    removes that folder again, so nothing is left.  Shards are cut by
    payload bytes and also where a file's u32 tensor count or name heap
    would run out, so every shard can be written (names past 16-bit
    offsets take the wide fields, spec/kiln-v2.md 12.3).

    Raises:
        EncodeError: as :func:`kiln.save_tensors`; ``TYPE`` for an unnamed or
            linked (quantized) tensor, whose links a split would break.
        ValueError: a bad ``max_shard_size`` or ``prefix``.
        OSError: a file cannot be written.

    Example:
        >>> index = kiln.save_sharded({"a": np.zeros(1000, np.float32),
        ...                            "b": np.ones(1000, np.float32)}, "ckpt",
        ...                           max_shard_size="4kB")
        >>> index
        'ckpt/model.kiln.index.json'
        >>> with kiln.open("ckpt") as f:
        ...     f.keys(), f["b"].numpy()[:2].tolist()
        (['a', 'b'], [1.0, 1.0])
    """
    return save_set(tensors, folder, max_shard_size=max_shard_size, metadata=metadata,
                    checksum=checksum, prefix=prefix, aliases=aliases, once=False)


def save_set(tensors: Any, folder: PathLike, *, max_shard_size: Any,
             metadata: Optional[Dict[str, Any]], checksum: bool, prefix: str,
             aliases: Optional[Mapping[str, str]], once: bool) -> str:
    """:func:`save_sharded`; ``once``: ``tensors`` holds each tensor once
    already (``kiln.torch``'s ``shared_names`` found its other names, given
    as ``aliases``), so the search for values given under two names is not
    made again."""
    from .save import save_records
    from .tables import normalize_tensors
    folder = bytes_path(folder, "kiln.save_sharded", "kiln.encode_tensors")
    cap = parse_size(max_shard_size)
    if not plain_file_name(prefix):
        raise ValueError("prefix must be a plain file name, not %r" % (prefix,))
    if once:
        found = dict(aliases or {})
    else:
        tensors, found = shared_tensors(tensors, aliases)
    records = normalize_tensors(tensors)
    names: List[str] = []
    for i, r in enumerate(records):
        if r[W.R_NAME] is None:
            raise EncodeError("TYPE", 0, "tensor %d has no name: a sharded set needs names" % i)
        if r[W.R_SCALE_INDEX] != W.NO_INDEX or r[W.R_OUTER_INDEX] != W.NO_INDEX:
            raise EncodeError("TYPE", 0, "tensor %r links other tensors by position "
                              "(quantized): a sharded set cannot split it" % r[W.R_NAME])
        names.append(r[W.R_NAME].decode("utf-8"))
    bad = alias_fault(found, set(names))
    if bad:
        raise EncodeError("TYPE", 0, "the aliases %s" % bad)
    sizes = [len(memoryview(r[W.R_PAYLOAD]).cast("B")) for r in records]
    groups = split(sizes, cap, [len(r[W.R_NAME]) + len(r[W.R_LAYOUT] or b"") for r in records])
    folder = os.fspath(folder)
    made = make_folder(folder)
    index = os.path.join(folder, prefix + KILN_INDEX)
    old = old_shards(index, ".kiln")
    uncache_shards(folder, old)
    files = fresh_names(shard_names(prefix, len(groups), ".kiln"), index, ".kiln")
    wm: Dict[str, str] = {}
    written: List[str] = []
    try:
        for group, fn in zip(groups, files):
            save_records(os.path.join(folder, fn), [records[i] for i in group], metadata,
                         checksum, None)
            written.append(fn)
            for i in group:
                wm[names[i]] = fn
        meta: Dict[str, Any] = {"total_size": sum(sizes)}
        if found:
            meta[SET_ALIASES_KEY] = dict(sorted(found.items()))
        write_index(index, wm, meta)
    except BaseException:
        drop_shards(folder, [fn for fn in written if fn not in old], [])
        remove_made(folder, made)   # a folder this save created goes too: nothing is left
        raise
    drop_shards(folder, old, files)
    return index

