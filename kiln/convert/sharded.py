"""Sharded sets (``*.safetensors.index.json`` / ``*.kiln.index.json`` plus
their shards) converted shard by shard to a set of the other format, or
merged into one ``.kiln`` file; and a ``.kiln`` file copied to a ``.kiln``
file with checksums added (``kiln convert --checksum a.kiln b.kiln``).

The source index is checked as :mod:`kiln._files.sharded` checks one (shard
names plain file names in its folder, nothing outside it), and every shard's
tensor names must be exactly the ones the index maps to it before anything
is written.  A set's shards are written beside the destination index, the
index last (atomically), so a failed conversion leaves no new index; a set
already at the destination is replaced whole (new shard names, the index
replaced last, the old shards removed after).  The
source index's ``metadata`` object is copied as it is (its ``total_size``
included: it is not recomputed), so ``weight_map`` and ``metadata`` survive
a round trip; an index without one gets the ``total_size`` of the payloads.
"""

import os
from typing import Any, Dict, List, Optional, Tuple

from .. import _wire as W
from .._access import (FILE_ALIASES_KEY, KILN_INDEX, SET_ALIASES_KEY, ST_INDEX, check_shard,
                       drop_shards, fresh_names, make_folder, old_shards, open_kiln_file,
                       open_regular_file, parse_index, read_index, remove_made, table,
                       tensor_offset, tensor_row, uncache_shards, write_index)
from .._errors import KilnError
from ._common import ConvertError, UnsupportedConversion


def index_kind(path: str) -> Optional[str]:
    """``"kiln-set"`` or ``"safetensors-set"`` for an index path, else None."""
    if path.endswith(KILN_INDEX):
        return "kiln-set"
    if path.endswith(ST_INDEX):
        return "safetensors-set"
    return None


def _index(path: str, suffix: str
           ) -> Tuple[Dict[str, str], Dict[str, Any], Dict[str, List[str]]]:
    """(weight_map, index metadata, shard file -> its names in the order the
    index first names the shards) of the index at ``path``."""
    try:
        ix = parse_index(read_index(path), path, suffix)
    except KilnError as e:
        if isinstance(e, ConvertError):
            raise
        raise ConvertError(path, e.offset, e.reason, e.code) from None
    return ix.weight_map, ix.meta, ix.groups


def _checked(wanted: List[str], names: List[str], where: str, index: str) -> None:
    try:
        check_shard(names, wanted, where, index)
    except KilnError as e:
        raise ConvertError(where, e.offset, e.reason, e.code) from None


def _st_names(where: str) -> Tuple[List[str], int]:
    """(tensor names in file order, payload bytes) of a safetensors shard, checked."""
    from ._common import map_source
    from .safetensors import read_header
    with open_regular_file(where) as f:
        mm = map_source(where, f)
        try:
            _, table, _ = read_header(where, mm)
        finally:
            mm.close()
    return [t[0] for t in table], sum(t[4] - t[3] for t in table)


def _kiln_names(where: str) -> Tuple[List[str], int]:
    with open_kiln_file(where) as f:
        raw = table(f)
        return f.keys(), sum(t.nbytes for t in raw.values())


def convert_set(src: str, dst: str, a: str, b: str, checksum: bool, progress: Any) -> int:
    """A set to a set of the other format, or a set (or one kiln file) to one kiln file."""
    if b == "kiln":
        return _to_one_kiln(src, a, dst, checksum, progress)
    if (a, b) not in (("safetensors-set", "kiln-set"), ("kiln-set", "safetensors-set")):
        raise UnsupportedConversion("no conversion from %s to %s (a set converts to a set of "
                                    "the other format, or to one .kiln file)" % (a, b))
    to_kiln = b == "kiln-set"
    if checksum and not to_kiln:
        raise UnsupportedConversion("%s: checksums are recorded in .kiln files only" % dst)
    suffix, out_ext = (".safetensors", ".kiln") if to_kiln else (".kiln", ".safetensors")
    wm, meta, shards = _index(src, suffix)
    names_of = _st_names if to_kiln else _kiln_names
    folder, out_folder = os.path.dirname(src), os.path.dirname(dst) or "."
    total = 0
    for s in shards:   # every shard checked against the index before anything is written
        where = os.path.join(folder, s)
        names, n = names_of(where)
        _checked(shards[s], names, where, src)
        total += n
    old = old_shards(dst, out_ext)   # a set at dst is replaced whole (kiln._files.sharded)
    uncache_shards(out_folder, old)
    plain = [s[:-len(suffix)] + out_ext for s in shards]
    renamed = dict(zip(shards, fresh_names(plain, dst, out_ext)))
    made = make_folder(out_folder)   # removed again if the conversion fails
    count = 0
    written: List[str] = []
    try:
        for s in shards:
            where, out = os.path.join(folder, s), os.path.join(out_folder, renamed[s])
            if to_kiln:
                from .safetensors import safetensors_to_kiln
                count += safetensors_to_kiln(where, out, checksum, progress)
            else:
                from .safetensors import kiln_to_safetensors
                count += kiln_to_safetensors(where, out, progress)
            written.append(renamed[s])
        out_meta = dict(meta) if meta else {"total_size": total}
        write_index(dst, {n: renamed[s] for n, s in wm.items()}, out_meta)
    except BaseException:
        drop_shards(out_folder, [n for n in written if n not in old], [])
        remove_made(out_folder, made)
        raise
    drop_shards(out_folder, old, list(renamed.values()))
    return count


def _to_one_kiln(src: str, a: str, dst: str, checksum: bool, progress: Any) -> int:
    """Every tensor of a set, or of one kiln file, into the one kiln file ``dst``."""
    if a == "kiln":
        return _kiln_copy(src, dst, checksum, progress)
    from ..files import TensorWriter
    suffix = ".safetensors" if a == "safetensors-set" else ".kiln"
    wm, index_meta, shards = _index(src, suffix)
    folder = os.path.dirname(src)
    plan: List[Tuple[str, List[Any]]] = []   # per shard: its path, its entries
    metas: List[Optional[Dict[str, Any]]] = []
    for s in shards:
        where = os.path.join(folder, s)
        meta, entries, summed = _entries(where, a)
        _checked(shards[s], [e.name for e in entries], where, src)
        checksum = checksum or summed
        metas.append(meta)
        plan.append((where, entries))
    order = {n: i for i, n in enumerate(wm)}   # the index's order
    every = sorted((e for _, es in plan for e in es), key=lambda e: order[e.name])
    with TensorWriter(dst, metadata=_one_file_metadata(metas, index_meta, src), checksum=checksum,
                      progress=progress) as w:
        for e in every:
            w.add(e.name, e.dtype, e.shape, **e.options)
        for where, entries in plan:
            with open_regular_file(where) as source:
                for e in entries:
                    if e.dtype == "bool":
                        from ._common import check_bools
                        check_bools(where, source.fileno(), e.offset, e.nbytes)
                    w.write_from(e.name, source, e.offset)
    return len(every)


def _entries(where: str, a: str) -> Tuple[Optional[Dict[str, Any]], List[Any], bool]:
    """(metadata, entries, had checksums) of one shard; a kiln shard's recorded
    checksums are compared first (fresh ones would otherwise bless damage)."""
    if a == "safetensors-set":
        from ._common import map_source
        from .safetensors import _entries as st_entries
        with open_regular_file(where) as f:
            mm = map_source(where, f)
            try:
                meta, entries = st_entries(where, mm)
            finally:
                mm.close()
        return meta, entries, False
    from ._copy import Entry
    with open_kiln_file(where) as f:
        if f.checksums is not None:
            f.verify()
        out: List[Any] = []
        for name, t in table(f).items():
            row = tensor_row(t)
            if row[W.R_SCALE_INDEX] != W.NO_INDEX or row[W.R_OUTER_INDEX] != W.NO_INDEX:
                raise ConvertError(where, W.HEADER_SIZE + W.DESC_SIZE * len(out),
                                   "tensor %r links other tensors by position (quantized): it "
                                   "cannot move into another file" % name, "TYPE")
            opts: Dict[str, Any] = {}
            if row[W.R_CODE] >= W.OPAQUE_MIN:
                opts = {"layout": row[W.R_LAYOUT].decode("utf-8"),
                        "block_size": row[W.R_BLOCK_SIZE], "nbytes": row[W.R_BYTE_LENGTH]}
            out.append(Entry(name, row[W.R_CODE], tuple(row[W.R_SHAPE]), tensor_offset(t),
                             row[W.R_BYTE_LENGTH], opts))
        return f.metadata, out, f.checksums is not None


def _merged(metas: List[Optional[Dict[str, Any]]], src: str) -> Optional[Dict[str, Any]]:
    """The shards' metadata as one dict: a key two shards give different values is
    ConvertError (nothing is dropped silently)."""
    out: Dict[str, Any] = {}
    for m in metas:
        for k, v in (m or {}).items():
            if k in out and out[k] != v:
                raise ConvertError(src, 0, "the shards' metadata disagree on %r (%r and %r): "
                                   "one file holds one value" % (k, out[k], v), "TYPE")
            out[k] = v
    return out or None


def _one_file_metadata(metas: List[Optional[Dict[str, Any]]], index_meta: Dict[str, Any],
                       src: str) -> Optional[Dict[str, Any]]:
    """The metadata of the one file a set becomes: the shards' (:func:`_merged`)
    and the set's aliases (tied names), moved from the index to the key one
    file keeps them under (``__kiln_torch_aliases__``, where
    ``kiln.torch.load_file`` and ``load_model`` read them), so every name of
    the set is a name of the file.  The index's counts of the whole set
    (``total_size``, Hugging Face's ``total_parameters``) are not copied."""
    aliases = index_meta.get(SET_ALIASES_KEY)
    extra: List[Optional[Dict[str, Any]]] = [{FILE_ALIASES_KEY: dict(aliases)}] if aliases else []
    return _merged(metas + extra, src)


def _kiln_copy(src: str, dst: str, checksum: bool, progress: Any) -> int:
    """``kiln convert --checksum a.kiln b.kiln``: the tensors (every field), the
    metadata and fresh checksums, after comparing the ones ``src`` records."""
    if not checksum:
        raise UnsupportedConversion("no conversion from kiln to kiln (pass --checksum to add "
                                    "checksums)")
    if os.path.abspath(src) == os.path.abspath(dst):
        raise UnsupportedConversion("%s: the destination is the source: write another file"
                                    % dst)
    from ..files import save_tensors
    with open_kiln_file(src) as f:
        if f.checksums is not None:
            f.verify()
        d = f.tensors()
        save_tensors(dst, d, metadata=f.metadata, checksum=True, progress=progress)
        return len(d)
