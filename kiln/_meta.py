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

import math

import numpy as np

from ._errors import EncodeError, KilnError
from ._types import parse_type
from ._wire import FRAME_SIZE, MAX_DEPTH, U32_MAX

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


def node_offset(nodes, i, at):
    """Where node ``i`` starts, for a node list framed at ``at`` (the frame, the
    list's count, then each node's fields in order)."""
    pos = at + FRAME_SIZE + 4
    for n in nodes[:i]:
        key = n["key"]
        pos += (4 + 1 + (0 if key is None else 4 + len(key.encode("utf-8", "surrogatepass")))
                + 1 + 8 + 8 + 4 + len(n["text"].encode("utf-8", "surrogatepass"))
                + 4 + len(n["raw"]))
    return pos


def from_nodes(nodes, at):
    """The metadata dict of a node list framed at ``at``; KilnError ``TYPE`` for a
    broken tree and ``DEPTH`` past 64 nested lists and dicts (the root included),
    at the offending node."""
    if not nodes or nodes[0]["kind"] != DICT or nodes[0]["parent"] != _ROOT:
        raise KilnError("TYPE", at, "metadata does not start with its root dict")

    def fail(code, i, reason):
        return KilnError(code, node_offset(nodes, i, at), "metadata node %d: %s" % (i, reason))

    values = []
    levels = []   # the lists and dicts around each node, itself included
    for i, n in enumerate(nodes):
        kind = n["kind"]
        if kind == NULL:
            v = None
        elif kind == BOOL:
            if n["int"] not in (0, 1):
                raise fail("TYPE", i, "bool is %d" % n["int"])
            v = n["int"] == 1
        elif kind == INT:
            v = n["int"]
        elif kind == FLOAT:
            v = n["float"]
        elif kind == STR:
            v = n["text"]
        elif kind == BYTES:
            v = n["raw"]
        elif kind in (INTS, FLOATS):
            if len(n["raw"]) % 8:
                raise fail("TYPE", i, "%d bytes are not whole numbers" % len(n["raw"]))
            v = np.frombuffer(n["raw"], "<i8" if kind == INTS else "<f8").tolist()
        elif kind == LIST:
            v = []
        elif kind == DICT:
            v = {}
        else:
            raise fail("TYPE", i, "unknown kind %d" % kind)
        bad = _unused_fault(n, kind)
        if bad is not None:
            raise fail("TYPE", i, "kind %d does not use %r, which must be %r, not %r"
                       % (kind, bad, _ZERO[bad], n[bad]))
        values.append(v)
        level = 1 if kind in _CONTAINERS else 0
        if i == 0:
            levels.append(level)
            continue
        p = n["parent"]
        if p >= i:
            raise fail("TYPE", i, "parent %d does not come before it" % p)
        level += levels[p]
        if level > MAX_DEPTH:
            raise fail("DEPTH", i, "metadata nests more than %d lists and dicts" % MAX_DEPTH)
        levels.append(level)
        holder = values[p]
        if isinstance(holder, list) and nodes[p]["kind"] == LIST:
            if n["key"] is not None:
                raise fail("TYPE", i, "a list item with a key")
            holder.append(v)
        elif isinstance(holder, dict) and nodes[p]["kind"] == DICT:
            k = n["key"]
            if k is None or k in holder:
                raise fail("TYPE", i, "a dict item without a key or with a repeated one")
            holder[k] = v
        else:
            raise fail("TYPE", i, "parent %d is not a list or dict" % p)
    return values[0]


def same(a, b):
    """Metadata equality that treats NaN as equal to itself (for tests)."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b
