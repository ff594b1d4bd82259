"""Sharded checkpoints: ``kiln.save_sharded`` writes a set of shard files plus
an index, and ``kiln.open`` of that index (or of its folder) opens the set as
one ``Mapping[str, Tensor]``, each shard opened on first use (see
:doc:`files`, "Sharded checkpoints").

The index has the shape Hugging Face gives ``model.safetensors.index.json``,
so a tool that reads ``weight_map`` reads it::

    {"metadata": {"total_size": <payload bytes>}, "weight_map": {name: shard file}}

It is hostile input as a shard is: at most :data:`MAX_INDEX` bytes of strict
UTF-8 JSON (no repeated key, no NaN), ``weight_map`` mapping non-empty names
to plain file names in the index's folder (no ``/``, ``\\``, ``:`` or NUL,
not ``.`` or ``..``: nothing outside the folder is ever opened) ending in
the set's extension.  ``metadata.total_size``, when present, must be an
integer >= 0 and is otherwise not trusted (it is not compared with the
shards: that would open every shard).  When a shard is opened, its tensor
names must be exactly those the index maps to it: a tensor the index does
not list there (a name of another shard included: a name is in one shard
only) or a listed tensor the shard lacks is ``KilnError`` ``TYPE``.

A tensor saved under two names (tied weights) is stored once: the
``weight_map`` names the stored tensors only, and the index's metadata maps
each other name to its stored one under ``"__kiln_aliases__"``
(``kiln._files.tied.SET_ALIASES_KEY``, checked by ``tied.alias_fault``, the
rule a file's alias map is checked by too).  A shard name is checked as it is
and again after percent-decoding, and is percent-encoded when it is joined to
an index URL, so a name can never reach another path on a server that decodes
paths.

A set saved into a folder that holds a set is replaced whole: the new shards
take names no earlier set in the folder had (a random tag, so a reader still
holding an old index, which opens its shards by name on first use, meets
``FileNotFoundError``, never a later set's bytes), the index is replaced last
(one atomic rename), and only then are the old index's shards removed; a save that
fails or is killed at any step leaves the complete old set or the complete
new one (and at worst unused shard files).
"""

import os
import re
import threading
from typing import Any, Dict, Iterator, List, Mapping, Optional, Tuple, Union

from .. import _meta
from .. import _wire as W
from .._errors import KilnError
from .tables import Tensor
from .tied import SET_ALIASES_KEY, alias_fault
from .paths import is_index_name, is_sharded, url_parts   # (re-exported: the set module's names)

PathLike = Union[str, "os.PathLike[str]"]

MAX_INDEX = 100_000_000      # bytes of an index (safetensors' limit on its own header)
MAX_INDEX_VALUES = 1 << 21   # JSON values in an index (two a tensor: ~1M tensors)
KILN_INDEX = ".kiln.index.json"
ST_INDEX = ".safetensors.index.json"
# (compiled by re, and cached there, at the first parse_size: not at import)
_SIZE = r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?I?B?)\s*$"
_UNITS = {"": 1, "B": 1, "KB": 10 ** 3, "MB": 10 ** 6, "GB": 10 ** 9, "TB": 10 ** 12,
          "KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30, "TIB": 1 << 40,
          "K": 10 ** 3, "M": 10 ** 6, "G": 10 ** 9, "T": 10 ** 12}


def parse_size(size: Any) -> int:
    """Bytes of ``size``: an int, or text such as ``"5GB"`` (10**9) or ``"500MiB"``
    (2**20), as Hugging Face's ``max_shard_size`` takes it."""
    if isinstance(size, bool):
        raise ValueError("max_shard_size must be an int or a size such as '5GB', not a bool")
    if isinstance(size, int):
        n = size
    elif isinstance(size, str) and re.match(_SIZE, size, re.I):
        m = re.match(_SIZE, size, re.I)
        unit = m.group(2).upper()   # type: ignore[union-attr]
        if unit not in _UNITS:
            raise ValueError("max_shard_size %r: unknown unit %r" % (size, m.group(2)))  # type: ignore[union-attr]
        n = int(float(m.group(1)) * _UNITS[unit])   # type: ignore[union-attr]
    else:
        raise ValueError("max_shard_size must be an int or a size such as '5GB', not %r"
                         % (size,))
    if n <= 0:
        raise ValueError("max_shard_size must be above 0, not %r" % (size,))
    return n


# --- the index ---------------------------------------------------------------

def _unique(pairs: List[Tuple[str, Any]]) -> Dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):   # a key repeats: find the first
        seen = set()
        for k, _ in pairs:
            if k in seen:
                raise ValueError("the key %r repeats in one object" % k)
            seen.add(k)
    return out


def _no_constant(name: str) -> Any:
    raise ValueError("%s is not JSON" % name)


def strict_json(text: str) -> Any:
    """``json.loads`` as a hostile file's header or index is read: a key that
    repeats in one object and NaN/Infinity are ValueErrors (safetensors' own
    parser refuses both; so does kiln for a set's index)."""
    import json
    return json.loads(text, object_pairs_hook=_unique, parse_constant=_no_constant)


def _at(raw: bytes, text: str) -> int:
    """The byte offset of the JSON string ``text`` in the index (0 when not found)."""
    import json
    k = raw.find(json.dumps(text).encode("utf-8"))
    if k < 0:
        k = raw.find(json.dumps(text, ensure_ascii=False).encode("utf-8"))
    return max(k, 0)


def _plain(name: str) -> bool:
    return name not in ("", ".", "..") and not any(c in name for c in "/\\:\0") and \
        name.strip() == name


def plain_file_name(name: Any) -> bool:
    """A file name in the index's own folder: no directory part, nothing outside,
    as it is and after percent-decoding (what a server that decodes paths sees)."""
    if not isinstance(name, str) or not _plain(name):
        return False
    if "%" not in name:
        return True
    from urllib.parse import unquote
    return _plain(unquote(name, errors="strict")) if _decodes(name) else False


def _decodes(name: str) -> bool:
    from urllib.parse import unquote
    try:
        unquote(name, errors="strict")
    except UnicodeDecodeError:
        return False
    return True


def parse_index(raw: bytes, path: str, suffix: str, max_count: int = W.DEFAULT_MAX_COUNT
                ) -> "Index":
    """The :class:`Index` of the index bytes ``raw``, checked (see the module
    doc); ``suffix``: the shards' extension (``.kiln`` or ``.safetensors``)."""
    import json   # here: kiln.open of a plain file loads no JSON parser
    if len(raw) > MAX_INDEX:
        raise KilnError("LIMIT", 0, "%s: an index of %d bytes is above kiln's cap of %d"
                        % (path, len(raw), MAX_INDEX))
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise KilnError("UTF8", e.start, "%s: the index is not UTF-8" % path) from None
    # (a JSON value takes a byte at least: an index no longer than the cap needs no count)
    if len(raw) > MAX_INDEX_VALUES and \
            text.count(",") + text.count("{") + text.count("[") + 1 > MAX_INDEX_VALUES:
        raise KilnError("LIMIT", 0, "%s: the index may hold more than %d JSON values"
                        % (path, MAX_INDEX_VALUES))
    try:
        doc = strict_json(text)
    except json.JSONDecodeError as e:
        raise KilnError("FRAME", len(text[:e.pos].encode("utf-8")),
                        "%s: the index is not JSON (%s)" % (path, e.msg)) from None
    except (ValueError, RecursionError) as e:
        raise KilnError("FRAME", 0, "%s: the index is not JSON (%s)" % (
            path, e if isinstance(e, ValueError) else "nested too deep")) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("weight_map"), dict):
        raise KilnError("TYPE", 0, "%s: an index is a JSON object with a \"weight_map\" object "
                        "of tensor name to shard file" % path)
    meta = doc.get("metadata")
    if meta is None:
        meta = {}
    if not isinstance(meta, dict):
        raise KilnError("TYPE", _at(raw, "metadata"), "%s: the index's \"metadata\" is not an "
                        "object" % path)
    total = meta.get("total_size")
    if total is not None and (type(total) is not int or total < 0):
        raise KilnError("TYPE", _at(raw, "total_size"), "%s: the index's total_size %r is "
                        "not an integer >= 0" % (path, total))
    wm: Dict[str, str] = doc["weight_map"]
    if len(wm) > max_count:
        raise KilnError("LIMIT", _at(raw, "weight_map"), "%s: the index lists %d tensors, above "
                        "max_count=%d" % (path, len(wm), max_count))
    for name in ("", _meta.META_NAME):
        if name in wm:
            raise KilnError("TYPE", _at(raw, name), "%s: the index lists the tensor name %r "
                            "(empty or reserved)" % (path, name))
    groups: Dict[str, List[str]] = {}   # shard file -> its tensors (a set has few shards)
    for name, shard in wm.items():
        g = groups.get(shard) if type(shard) is str else None
        if g is None:
            if not plain_file_name(shard):
                raise KilnError("TYPE", _at(raw, name), "%s: tensor %r maps to %r, which is not "
                                "a file name in the index's folder (no path, nothing outside it)"
                                % (path, name, shard))
            if not shard.endswith(suffix) or shard == suffix:
                raise KilnError("TYPE", _at(raw, name), "%s: tensor %r maps to %r, which is not "
                                "a %s shard" % (path, name, shard, suffix))
            groups[shard] = g = []
        g.append(name)
    return Index(wm, meta, groups, _aliases(raw, path, meta, wm))


def _aliases(raw: bytes, path: str, meta: Dict[str, Any], wm: Dict[str, str]
             ) -> Dict[str, str]:
    found = meta.get(SET_ALIASES_KEY)
    if found is None:
        return {}
    bad = alias_fault(found, wm)
    if bad:
        raise KilnError("TYPE", _at(raw, SET_ALIASES_KEY), "%s: the index's %s %s" % (
            path, SET_ALIASES_KEY, bad))
    return found


class Index:
    """A checked index (made by :func:`parse_index`; shared between opens of
    the same bytes, so never changed): ``weight_map`` (name -> shard file, the
    index's order), ``meta`` (its metadata object), ``groups`` (shard file ->
    its names, in the order the index first names the shards), ``names``."""

    __slots__ = ("weight_map", "meta", "groups", "names", "aliases")

    def __init__(self, weight_map: Dict[str, str], meta: Dict[str, Any],
                 groups: Dict[str, List[str]], aliases: Dict[str, str]) -> None:
        self.weight_map, self.meta, self.groups = weight_map, meta, groups
        self.names = list(weight_map)
        self.aliases = aliases


# The last few indexes parsed, by their exact bytes: reopening a set whose
# index has not changed skips the JSON parse (a rewritten index has other bytes,
# so it is parsed again).  An index above _MEMO_MAX bytes is never kept.
_MEMO: Dict[Tuple[bytes, str, int], Index] = {}
_MEMO_MAX = 1 << 20   # about 10,000 names; kept: at most 4 MiB of index text and its dicts
_MEMO_KEEP = 4


def load_index(raw: bytes, path: str, suffix: str, max_count: int = W.DEFAULT_MAX_COUNT
               ) -> Index:
    """:func:`parse_index`, remembered for the last few index contents."""
    key = (raw, suffix, max_count)
    found = _MEMO.get(key)
    if found is not None:
        return found
    found = parse_index(raw, path, suffix, max_count)
    if len(raw) <= _MEMO_MAX:
        while len(_MEMO) >= _MEMO_KEEP:
            try:
                del _MEMO[next(iter(_MEMO))]   # the oldest (another thread may race it)
            except (KeyError, StopIteration, RuntimeError):
                break
        _MEMO[key] = found
    return found


def check_shard(names: List[str], wanted: List[str], shard: str, index: str) -> None:
    """``TYPE`` unless shard ``shard`` holds exactly the tensors ``wanted`` (the
    names the index maps to it): offsets are of the shard's descriptors."""
    want = set(wanted)
    if len(names) == len(want) == len(wanted) and want.issuperset(names):
        return   # as many names, none twice, each wanted: exactly the wanted ones
    seen = set()
    for i, n in enumerate(names):
        at = W.HEADER_SIZE + W.DESC_SIZE * i + W.D_NAME_OFF
        if n in seen:
            raise KilnError("TYPE", at, "%s: tensor %r is in the shard twice" % (shard, n))
        seen.add(n)
        if n not in want:
            raise KilnError("TYPE", at, "%s: holds tensor %r, which the index %s does not map to "
                            "this shard (a name in two shards, or a shard not made for this "
                            "index)" % (shard, n, index))
    missing = [n for n in wanted if n not in seen]
    if missing:
        raise KilnError("TYPE", 0, "%s: the index %s maps %d tensors to this shard that it does "
                        "not hold, the first %r" % (shard, index, len(missing), missing[0]))


def find_index(folder: str, suffix: str = KILN_INDEX) -> str:
    """The one ``*<suffix>`` index in ``folder`` (ValueError for none or several)."""
    found = sorted(n for n in os.listdir(folder) if n.endswith(suffix))
    if len(found) == 1:
        return os.path.join(folder, found[0])
    if not found:
        other = [n for n in os.listdir(folder) if n.endswith(".index.json")] or \
            sorted(n for n in os.listdir(folder) if n.endswith(".safetensors"))
        hint = (": it holds %s, %s, not Kiln: convert the folder with kiln convert %s "
                "OUT.kiln (or kiln.convert.convert)"
                % (other[0], "a sharded set's index" if other[0].endswith(".index.json")
                   else "a safetensors file", folder)) if other else ""
        raise IsADirectoryError("%s is a folder holding no *%s index%s" % (folder, suffix, hint))
    raise ValueError("%s holds %d *%s indexes (%s): open one of them"
                     % (folder, len(found), suffix, ", ".join(found)))


# --- reading ---------------------------------------------------------------

def read_index(path: str) -> bytes:
    """The index file's bytes (a regular file: a FIFO or a device is refused
    before anything waits on it, as for a tensor file)."""
    from .local import open_regular_stat
    fd, st = open_regular_stat(path)
    try:
        size = st.st_size
        if size > MAX_INDEX:
            raise KilnError("LIMIT", 0, "%s: an index of %d bytes is above kiln's cap of %d"
                            % (path, size, MAX_INDEX))
        parts = []
        left = size + 1   # (what it holds now: one more byte than fstat saw is cut)
        while left > 0:
            b = os.read(fd, left)
            if not b:
                break
            parts.append(b)
            left -= len(b)
        return b"".join(parts)
    finally:
        os.close(fd)


def _read_remote(url: str, storage_options: Optional[Dict[str, Any]]) -> bytes:
    from .fetch import source
    src = source(url, storage_options)
    try:
        first = src.first(1 << 20)
        size = int(src.size or 0)
        if size > MAX_INDEX:
            raise KilnError("LIMIT", 0, "%s: an index of %d bytes is above kiln's cap of %d"
                            % (url, size, MAX_INDEX))
        if size > len(first):
            first += src.read(len(first), size, "the index")
        return first[:size]
    finally:
        src.close()


class ShardedFile(Mapping[str, Tensor]):
    """A sharded set opened as one ``Mapping[str, Tensor]`` (made by
    :func:`kiln.open` of an index, a folder holding one, or an index URL).

    ``keys()`` are the index's names in its order; ``f[name]``,
    ``f.rows(name, start, stop)``, ``get``, ``in``, ``values()``,
    ``items()`` and ``tensors()`` (a dict) read through the shard that
    holds the tensor, opened (mapped, or for a URL its table fetched) the
    first time one of its tensors is read, with the options given to
    :func:`kiln.open` (``verify`` included).  Opening reads the index only.

    Example:
        >>> kiln.save_sharded({"a": np.arange(4.0), "b": np.ones(2)}, "set",
        ...                   max_shard_size=32)
        'set/model.kiln.index.json'
        >>> with kiln.open("set/model.kiln.index.json") as f:
        ...     f.shards, f.rows("a", 1, 3).tolist()
        (['model-00001-of-00002.kiln', 'model-00002-of-00002.kiln'], [1.0, 2.0])

    Attributes:
        path: the index.
        shards: the shard files, in the order the index first names them.
        total_size: the index's ``metadata.total_size`` (None when absent;
            not compared with the shards).
        weight_map: a copy of the index's name -> shard file map.
    """

    def __init__(self, path: Any, **options: Any) -> None:
        storage = options.pop("storage_options", None)
        p = path if isinstance(path, str) else os.fspath(path)
        self._remote = "://" in p
        if not self._remote and not p.endswith(".index.json") and os.path.isdir(p):
            p = find_index(p)
        base, self._query = url_parts(p) if self._remote else (p, "")
        if not base.endswith(KILN_INDEX):
            raise KilnError("FRAME", 0, "%s is not a kiln index (*%s)%s" % (
                p, KILN_INDEX, "; convert a safetensors set with kiln convert "
                "model.safetensors.index.json model.kiln.index.json" if p.endswith(ST_INDEX)
                else ""))
        self.path = p
        raw = _read_remote(p, storage) if self._remote else read_index(p)
        index = load_index(raw, p, ".kiln", options.get("max_count", W.DEFAULT_MAX_COUNT))
        self._map, self._groups, self._names = index.weight_map, index.groups, index.names
        self._aliases = index.aliases
        self.total_size = index.meta.get("total_size")
        self.shards = list(index.groups)
        self._options = options
        self._storage = storage
        self._open: Dict[str, Any] = {}
        self._lock = threading.Lock()
        self._closed = False

    @property
    def weight_map(self) -> Dict[str, str]:
        return dict(self._map)

    @property
    def aliases(self) -> Dict[str, str]:
        """The other names of stored tensors (tied weights saved once): alias ->
        stored name; ``f[alias]`` reads the stored tensor, ``keys()`` lists the
        stored names only."""
        return dict(self._aliases)

    def shard_path(self, shard: str) -> str:
        """Where the shard file ``shard`` is: a path beside the index, or a URL
        (the name percent-encoded, the index URL's query kept)."""
        if self._remote:
            from urllib.parse import quote
            return url_parts(self.path)[0].rsplit("/", 1)[0] + "/" + quote(shard, safe="") + \
                self._query
        return os.path.join(os.path.dirname(self.path), shard)

    def shard(self, shard: str) -> Any:
        """The open shard file ``shard`` (a :class:`kiln.KilnFile`, or a
        :class:`kiln.remote.RemoteFile` for a URL), opened and checked against
        the index on first use."""
        with self._lock:
            if self._closed:
                raise ValueError("%s is closed" % self.path)
            f = self._open.get(shard)
            if f is not None:
                return f
            wanted = self._groups.get(shard)
            if wanted is None:
                raise KeyError(shard)
            where = self.shard_path(shard)
            if self._remote:
                from .remote import RemoteFile
                f = RemoteFile(where, storage_options=self._storage, **self._options)
            else:
                from .kilnfile import KilnFile
                f = KilnFile(where, **self._options)
            try:
                check_shard(f.keys(), wanted, where, self.path)
            except BaseException:
                f.close()
                raise
            self._open[shard] = f
            return f

    def _key(self, name: Any) -> str:
        if isinstance(name, str):
            if name not in self._map:
                if name in self._aliases:
                    return self._aliases[name]
                raise KeyError(name)
            return name
        index = getattr(name, "__index__", None)
        if index is None or isinstance(name, bool):
            raise KeyError(name)
        k, n = index(), len(self._names)
        if not -n <= k < n:
            raise IndexError("tensor index %d out of range for %d tensors" % (k, n))
        return self._names[k]

    def __getitem__(self, name: Any) -> Tensor:
        if isinstance(name, slice):
            return [self[i] for i in range(*name.indices(len(self)))]  # type: ignore
        key = self._key(name)
        return self.shard(self._map[key])[key]

    def rows(self, name: Any, start: int, stop: int) -> Any:
        """Rows ``start:stop`` of a tensor, read through its shard's ``rows``."""
        key = self._key(name)
        return self.shard(self._map[key]).rows(key, start, stop)

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def __contains__(self, name: object) -> bool:
        return name in self._map or name in self._aliases

    def keys(self) -> List[str]:  # type: ignore[override]
        return list(self._names)

    def values(self) -> List[Tensor]:  # type: ignore[override]
        return [t for _, t in self.items()]

    def items(self) -> List[Tuple[str, Tensor]]:  # type: ignore[override]
        got: Dict[str, Tensor] = {}
        for shard in dict.fromkeys(self._map[k] for k in self._names):
            f = self.shard(shard)   # its keys are the index's names for it (check_shard):
            got.update(zip(f.keys(), f.values()))   # each shard's payloads checked together
        return [(k, got[k]) for k in self._names]

    def get(self, name: Any, default: Any = None) -> Any:
        try:
            return self[name]
        except (KeyError, IndexError):
            return default

    def tensors(self) -> Dict[str, Tensor]:
        """Every tensor, in the index's order (every shard opened), then each
        alias as the same object as its stored tensor."""
        out = dict(self.items())
        for alias, name in self._aliases.items():
            out[alias] = out[name]
        return out

    @property
    def metadata(self) -> Optional[Dict[str, Any]]:
        """The metadata of the first shard (:func:`kiln.save_sharded` writes the
        same metadata into every shard); None when it has none."""
        return self.shard(self.shards[0]).metadata if self.shards else None

    def verify(self) -> None:
        """``f.verify()`` of every shard (``CHECKSUM`` from the first that fails or
        records none)."""
        for s in self.shards:
            self.shard(s).verify()

    def close(self) -> None:
        """Close the shards opened so far; views already taken stay valid."""
        with self._lock:
            self._closed = True
            opened, self._open = list(self._open.values()), {}
        for f in opened:
            f.close()

    def __enter__(self) -> "ShardedFile":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __eq__(self, other: object) -> bool:
        return self is other

    def __hash__(self) -> int:
        return id(self)

    def __repr__(self) -> str:
        return "<kiln.ShardedFile %r, %d tensors in %d shards%s>" % (
            self.path, len(self._names), len(self.shards), ", closed" if self._closed else "")
