"""Typed metadata of a tensor file, stored as one Kiln value.

Kiln types cannot nest themselves, so a tree of metadata (dicts, lists,
strings, integers, floats, bools, bytes, None) is written as a flat list of
nodes in depth-first order, each naming its parent; the list is an ordinary
framed Kiln value of type :data:`META_TYPE` (spec/kiln-v2.md, "Tensor files").
Reading checks the tree: every parent comes before its children and is a
list or a dict, dict children carry distinct keys, list children carry none,
and at most 64 lists and dicts nest (the root dict and lists of numbers
included), the limit of values, checked when saving too (``DEPTH``).
"""

import collections
import math

import numpy as np

from ._errors import EncodeError, KilnError
from ._types import parse_type, struct
from ._wire import DEFAULT_MAX_BYTES, FRAME_SIZE, MAX_DEPTH, U32_MAX

META_NAME = "__metadata__"
META_TYPE = parse_type("list<struct{parent:u32,key:opt<str>,kind:u8,int:i64,float:f64,"
                       "text:str,raw:list<u8>,}>")

NULL, BOOL, INT, FLOAT, STR, BYTES, LIST, DICT, INTS, FLOATS = range(10)
# INTS and FLOATS: a whole list of integers (i64) or floats (f64) in one node,
# its items little-endian in ``raw``: a long numeric array costs 8 bytes an item
_ROOT = U32_MAX
# the kinds that count as a level of nesting: a whole list of numbers is a list
_CONTAINERS = (LIST, DICT, INTS, FLOATS)
_I64 = (-(1 << 63), (1 << 63) - 1)
# the value fields each kind uses; the others must hold their zero
_USES = {NULL: (), BOOL: ("int",), INT: ("int",), FLOAT: ("float",), STR: ("text",),
         BYTES: ("raw",), LIST: (), DICT: (), INTS: ("raw",), FLOATS: ("raw",)}
_ZERO = {"int": 0, "float": 0.0, "text": "", "raw": b""}
_NP_FLOATS = (np.float16, np.float32, np.float64)
# each kind's unused fields as bits (int 1, float 2, text 4, raw 8): they must hold zero
_MUST_ZERO = {k: sum(b for f, b in (("int", 1), ("float", 2), ("text", 4), ("raw", 8))
                     if f not in used) for k, used in _USES.items()}


def _plain(value):
    """A numpy scalar as the Python value it stands for (np.int64(3) -> 3)."""
    if isinstance(value, np.generic):
        if isinstance(value, np.bool_):
            return bool(value)
        if isinstance(value, np.integer):
            return int(value)
        if isinstance(value, _NP_FLOATS):   # exact in a float (not np.longdouble)
            return float(value)
    return value


def _unused_fault(n, kind):
    """The name of a field kind ``kind`` does not use that is not zero, or None."""
    for f in _ZERO:
        if f in _USES[kind]:
            continue
        v = n[f]
        if f == "float":
            if v != 0.0 or math.copysign(1.0, v) < 0:   # NaN and -0.0 are not 0.0
                return f
        elif v != _ZERO[f]:
            return f
    return None


def _path(link):
    """The text of a lazily kept path: (outer link, segment) pairs."""
    parts = []
    while link is not None:
        link, seg = link
        parts.append(seg)
    return "".join(reversed(parts))


def to_nodes(meta):
    """The node list of a metadata dict (EncodeError for what it cannot hold:
    ``DEPTH`` past 64 nested lists and dicts, the root included)."""
    if not isinstance(meta, dict):
        raise EncodeError("TYPE", 0, "metadata must be a dict, not %s" % type(meta).__name__)
    nodes = []
    # (value, parent index, key, path link, ids of the containers above, level)
    stack = [(meta, _ROOT, None, None, (), 0)]
    while stack:
        value, parent, key, path, above, level = stack.pop()
        value = _plain(value)
        if isinstance(value, (list, tuple, dict)):
            if id(value) in above:
                raise EncodeError("TYPE", 0, "metadata contains itself", _path(path))
            level += 1
            if level > MAX_DEPTH:
                raise EncodeError("DEPTH", 0, "metadata nests more than %d lists and dicts"
                                  % MAX_DEPTH, _path(path))
            above = above + (id(value),)
        index = len(nodes)
        node = {"parent": parent, "key": key, "kind": NULL, "int": 0, "float": 0.0,
                "text": "", "raw": b""}
        children = []
        if value is None:
            pass
        elif value is True or value is False:
            node["kind"], node["int"] = BOOL, int(value)
        elif isinstance(value, int):
            if not _I64[0] <= value <= _I64[1]:
                raise EncodeError("TYPE", 0, "metadata integer does not fit i64", _path(path))
            node["kind"], node["int"] = INT, int(value)
        elif isinstance(value, float):
            node["kind"], node["float"] = FLOAT, float(value)
        elif isinstance(value, str):
            node["kind"], node["text"] = STR, value
        elif isinstance(value, (bytes, bytearray, memoryview)):
            node["kind"], node["raw"] = BYTES, bytes(value)
        elif isinstance(value, (list, tuple)) and len(value) > 1 and _numbers(value, int):
            node["kind"], node["raw"] = INTS, np.array(value, "<i8").tobytes()
        elif isinstance(value, (list, tuple)) and len(value) > 1 and _numbers(value, float):
            node["kind"], node["raw"] = FLOATS, np.array(value, "<f8").tobytes()
        elif isinstance(value, (list, tuple)):
            node["kind"] = LIST
            children = [(v, index, None, (path, "[%d]" % i), above, level)
                        for i, v in enumerate(value)]
        elif isinstance(value, dict):
            node["kind"] = DICT
            for k, v in value.items():
                if not isinstance(k, str):
                    raise EncodeError("TYPE", 0, "metadata keys must be str, got %s"
                                      % type(k).__name__, _path(path))
                children.append((v, index, k, (path, "[%r]" % (k,)), above, level))
        else:
            raise EncodeError("TYPE", 0, "metadata values are None, bool, int, float, str, "
                              "bytes, lists and dicts; got %s" % type(value).__name__,
                              _path(path))
        nodes.append(node)
        stack.extend(reversed(children))
    return nodes


def _numbers(values, kind):
    """Are all items ints that fit i64 (bools excluded), or all floats?"""
    if kind is int:
        return all((type(v) is int or isinstance(v, np.integer)) and _I64[0] <= int(v) <= _I64[1]
                   for v in values)
    return all(type(v) is float or isinstance(v, _NP_FLOATS) for v in values)


FIELDS = ("parent", "key", "kind", "int", "float", "text", "raw")
_Node = collections.namedtuple("_Node", FIELDS)
# the node struct bound to a tuple class: a run of nodes decodes to small tuples
NODE_TYPE = struct(list(zip(FIELDS, ("u32", "opt<str>", "u8", "i64", "f64", "str", "list<u8>"))),
                   cls=_Node)
RUN = 4096   # nodes decoded, checked and let go at a time
WINDOW = 1 << 20   # the metadata's bytes read at a time (more for a run that needs it)


def _node_size(n):
    """The wire size of node ``n`` (a tuple in FIELDS order)."""
    key = n[1]
    return (4 + 1 + (0 if key is None else 4 + len(key.encode("utf-8", "surrogatepass")))
            + 1 + 8 + 8 + 4 + len(n[5].encode("utf-8", "surrogatepass")) + 4 + len(n[6]))


def _as_tuple(n):
    return tuple(n[f] for f in FIELDS) if isinstance(n, dict) else n


class _Tree:
    """The metadata dict built from its nodes as they come, a run at a time:
    only each node's value, its nesting level and whether it is a list or a
    dict are kept, never the nodes.  KilnError ``TYPE`` for a broken tree and
    ``DEPTH`` past 64 nested lists and dicts (the root included), at the
    offending node's file offset."""

    __slots__ = ("at", "values", "tags", "count")

    def __init__(self, at, count):
        self.at = at
        # each list's and dict's object by node index (only those: most nodes are
        # leaves, and a dict of the few costs less than a slot for every node)
        self.values = {}
        # a list or dict node: 2 * (the lists and dicts around it, itself included)
        # + 1 for a dict; any other node 0 (it may hold no children).  Made at its
        # full size once: ``count`` is bounded by the bytes the list holds
        self.tags = bytearray(count)
        self.count = 0

    def add(self, nodes, start):
        """Nodes ``self.count ..`` (tuples in FIELDS order), the first of them at
        file offset ``start``."""
        values, tags = self.values, self.tags
        i = self.count
        for j, n in enumerate(nodes):
            parent, key, kind, iv, fv, text, raw = n
            try:
                nz = (1 if iv else 0) | (4 if text else 0) | (8 if raw else 0) | \
                    (2 if fv or math.copysign(1.0, fv) < 0 else 0)   # NaN and -0.0 too
                if nz & _MUST_ZERO.get(kind, 0):
                    bad = _unused_fault(dict(zip(FIELDS, n)), kind)
                    if bad is not None:
                        raise _Fault("TYPE", "kind %d does not use %r, which must be %r, not %r"
                                     % (kind, bad, _ZERO[bad], n[FIELDS.index(bad)]))
                if kind == STR:
                    v = text
                elif kind == DICT:
                    v = {}
                elif kind == INT:
                    v = iv
                elif kind == LIST:
                    v = []
                elif kind == FLOAT:
                    v = fv
                elif kind == NULL:
                    v = None
                elif kind == BOOL:
                    if iv != 0 and iv != 1:
                        raise _Fault("TYPE", "bool is %d" % iv)
                    v = iv == 1
                elif kind == BYTES:
                    v = raw
                elif kind == INTS or kind == FLOATS:
                    if len(raw) % 8:
                        raise _Fault("TYPE", "%d bytes are not whole numbers" % len(raw))
                    v = np.frombuffer(raw, "<i8" if kind == INTS else "<f8").tolist()
                else:
                    raise _Fault("TYPE", "unknown kind %d" % kind)
                level = 1 if kind in _CONTAINERS else 0
                if i:
                    if parent >= i:
                        raise _Fault("TYPE", "parent %d does not come before it" % parent)
                    tag = tags[parent]
                    level += tag >> 1
                    if level > MAX_DEPTH:
                        raise _Fault("DEPTH", "metadata nests more than %d lists and dicts"
                                     % MAX_DEPTH)
                    if tag & 1:   # a dict
                        holder = values[parent]
                        if key is None or key in holder:
                            raise _Fault("TYPE", "a dict item without a key or with a "
                                         "repeated one")
                        holder[key] = v
                    elif tag:     # a list
                        if key is not None:
                            raise _Fault("TYPE", "a list item with a key")
                        values[parent].append(v)
                    else:
                        raise _Fault("TYPE", "parent %d is not a list or dict" % parent)
                elif kind != DICT or parent != _ROOT:
                    raise KilnError("TYPE", self.at, "metadata does not start with its root dict")
            except _Fault as f:
                off = start + sum(_node_size(m) for m in nodes[:j])
                raise KilnError(f.code, off, "metadata node %d: %s" % (i, f.reason)) from None
            if kind == DICT or kind == LIST:
                values[i] = v
                tags[i] = 2 * level + (kind == DICT)
            i += 1
        self.count = i

    def result(self):
        if not self.count:
            raise KilnError("TYPE", self.at, "metadata does not start with its root dict")
        return self.values[0]


class _Fault(Exception):
    def __init__(self, code, reason):
        super().__init__(reason)
        self.code, self.reason = code, reason


def from_nodes(nodes, at):
    """The metadata dict of a node list (dicts, as ``to_nodes`` makes them)
    framed at ``at``; the checks of :class:`_Tree`."""
    tree = _Tree(at, len(nodes))
    tree.add([_as_tuple(n) for n in nodes], at + FRAME_SIZE + 4)
    return tree.result()


def read(source, size, at, kernels):
    """The metadata dict of the framed node list of ``size`` bytes that
    ``source(start, n)`` gives (bytes ``start .. start + n`` of it; the
    list at file offset ``at``), decoded by ``kernels`` a run of :data:`RUN`
    nodes at a time from a window of its bytes, and built as it goes: no
    list of every node and no copy of every byte is ever held, so the peak
    is the dict plus one window (1 MiB, or twice the bytes of the largest
    run).  Wire faults (``EOF``, ``LIMIT``, ``UTF8``, ``FRAME``, ``SCHEMA``,
    ``TRAILING``) come as :class:`WireError`, their offsets in the list's
    bytes; a broken tree as ``from_nodes`` says it, at file offsets.  The
    fault is the one the one-shot decode gives (the whole list decoded, then
    the tree built): the first tree fault is kept while the later runs are
    still decoded for their wire faults and the trailing bytes.

    The caps follow ``size``: a string or a count the bytes hold is never
    refused (what is claimed is still checked against the bytes present
    before anything is built for it)."""
    cap = max(DEFAULT_MAX_BYTES, 1 << max(0, size - 1).bit_length())
    head, item = _programs(kernels, cap, cap)
    want = WINDOW
    w0, win = 0, source(0, min(want, size))
    try:
        count, p = head.list_head(win, size)
    except KilnError as e:
        raise WireError(e.code, e.offset, e.reason) from None
    tree = _Tree(at, count)   # count: checked against the bytes its nodes need
    fault = None              # the first tree fault, raised once the wire is checked
    done = 0
    while done < count:
        k = min(RUN, count - done)
        if w0 + len(win) < size and w0 + len(win) - p < want // 2:
            w0, win = p, None   # slide the window to the run (the old one goes first)
            win = source(p, min(want, size - p))
        nodes = []
        try:
            end = item.decode_items(win, p - w0, k, nodes)
        except KilnError as e:
            if e.code == "EOF" and w0 + len(win) < size:   # the run goes past the window
                want *= 2
                w0, win = p, None   # the old window goes before the new one is read
                win = source(p, min(want, size - p))
                continue
            raise WireError(e.code, w0 + e.offset, e.reason) from None
        if fault is None:
            try:
                tree.add(nodes, at + p)
            except KilnError as e:
                fault, tree = e, None   # no more building: the runs are only decoded
        p = w0 + end
        done += k
    if p != size:
        raise WireError("TRAILING", p, "%d bytes follow the value" % (size - p))
    if fault is not None:
        raise fault
    return tree.result()


class WireError(KilnError):
    """A wire fault of the metadata blob, its offset in the blob."""


_PROGRAMS = {}


def _programs(kernels, max_count, max_bytes):
    """The framed list's head program and the node program, compiled once per
    kernel module and caps."""
    key = (id(kernels), max_count, max_bytes)
    got = _PROGRAMS.get(key)
    if got is None or got[0] is not kernels:
        head = kernels.compile_decoder(META_TYPE.plan(), META_TYPE.schema_hash, False,
                                       max_count, max_bytes, False)
        item = kernels.compile_decoder(NODE_TYPE.plan(), None, False, max_count, max_bytes,
                                       False)
        got = _PROGRAMS[key] = (kernels, head, item)
    return got[1], got[2]


def same(a, b):
    """Metadata equality that treats NaN as equal to itself (for tests)."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b
