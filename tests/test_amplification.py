"""Amplification (issue 11): what a small input can make a decode allocate.

Elements whose minimum wire size is 0 (``struct{}`` and structs made only of
such fields) are not bounded by the input's bytes, so every list of them in one
decoded value takes its count from one budget of ``max_count`` elements (spec
section 4.3); a count above what is left is ``LIMIT`` at its count word.  Lists
of elements with a nonzero minimum size are not charged.

The peak memory tracemalloc sees during any decode of these shapes is then at
most ``FACTOR * len(input) + max_count * <one zero-size element> + SLACK``,
where the budget term applies only to a type with a list of zero-size
elements (any other type builds nothing that its input's bytes do not pay
for).
tracemalloc sees every Python object and numpy's buffers (numpy registers
them), not a C extension's plain ``malloc``.  ``python -m
benchmarks.amplification`` measures the same shapes at larger sizes.
"""

import dataclasses
import json
import os
import struct
import subprocess
import sys
import time
import typing

import pytest

import kiln
from _util import ROOT, run_in_threads

sys.path.insert(0, os.path.join(ROOT, "fuzz"))
import oracle  # noqa: E402  (the fuzz oracle's bound must hold for every shape here)

# Bytes of objects per input byte, worst over the table.  The worst shape is
# list<struct{a:bool,}> decoded to dicts: one 1-key dict and its list slot per
# input byte, 192-193 bytes on CPython 3.11-3.13 and 240-241 on 3.10 (whose
# dicts are larger).  Next come list<Flag> (a 1-field dataclass per byte: 88,
# 160 on 3.10) and list<opt<struct{}>> (72).  The schema=True shapes below
# build several objects per byte and have the oracle's schema-aware bound.
FACTOR = 248 if sys.version_info < (3, 11) else 200
# one decoded struct{} element with its list slot: {} 72, an empty dataclass
# instance 80 (56 on 3.10), an empty NamedTuple 56
ZERO_ELEMENT_BYTES = 88
# one struct{a:struct{},} element: a 1-key dict holding {} (256 bytes, 304 on 3.10)
NESTED_ZERO_ELEMENT_BYTES = 320
# the fixed cost of one call (first-use caches, an error and its traceback)
SLACK = 128 * 1024

MAX_COUNT = 10_000          # the cap of the measured zero-size shapes: a small budget term
SIZE = 128 * 1024           # input bytes of each measured shape without zero-size lists
ZSIZE = 4 + 4 * MAX_COUNT   # ... and with them (every count is at most MAX_COUNT)
DEFAULT = kiln.DEFAULT_MAX_COUNT


def u32(n):
    return struct.pack("<I", n)


def lists(*counts):
    """A list of lists of zero-size elements with these counts."""
    return u32(len(counts)) + b"".join(u32(c) for c in counts)


def frame(t):
    return b"KLN0" + bytes(4) + struct.pack("<Q", kiln.as_type(t).schema_hash)


@dataclasses.dataclass
class Empty:
    pass


@dataclasses.dataclass
class Wrap:                 # struct{e:struct{},}: zero-size too
    e: Empty


@dataclasses.dataclass
class Holder:               # struct{a:list<struct{}>,b:list<struct{e:struct{},}>,}
    a: typing.List[Empty]
    b: typing.List[Wrap]


@dataclasses.dataclass
class Flag:                 # struct{a:bool,}: one byte
    a: bool


class EmptyNT(typing.NamedTuple):
    pass


def limit_at(impl, t, buf, offset, **kw):
    with pytest.raises(kiln.KilnError) as ei:
        impl.decode(buf, t, **kw)
    assert (ei.value.code, ei.value.offset) == ("LIMIT", offset), str(ei.value)


# --- (a) the budget -----------------------------------------------------------

@pytest.mark.parametrize("a,b,m", [(5, 5, 10), (10, 0, 10), (0, 10, 10), (3, 4, 10), (0, 0, 2),
                                   (1, 1, 2), (60_000, 40_000, 100_000)])
def test_two_lists_within_the_budget(impl, a, b, m):
    v = impl.decode(lists(a, b), "list<list<struct{}>>", max_count=m)
    assert v == [[{}] * a, [{}] * b]


@pytest.mark.parametrize("a,b,m", [(6, 5, 10), (10, 1, 10), (1, 10, 10), (9, 9, 10), (2, 1, 2),
                                   (60_000, 40_001, 100_000)])
def test_two_lists_over_the_budget_is_limit_at_the_second_count(impl, a, b, m):
    limit_at(impl, "list<list<struct{}>>", lists(a, b), 8, max_count=m)


def test_one_list_over_the_cap_is_limit_at_its_own_count(impl):
    limit_at(impl, "list<list<struct{}>>", lists(11, 0), 4, max_count=10)
    limit_at(impl, "list<list<struct{}>>", lists(0, 11), 8, max_count=10)


def test_list_of_empty_structs_at_and_over_the_cap(impl):
    t = "list<struct{}>"
    assert impl.decode(u32(10), t, max_count=10) == [{}] * 10
    limit_at(impl, t, u32(11), 0, max_count=10)
    limit_at(impl, t, u32(DEFAULT + 1), 0)
    limit_at(impl, t, u32(2 ** 32 - 1), 0, max_count=2 ** 32 - 1 - 1)


def test_the_budget_spans_every_list_of_the_value(impl):
    t = "list<list<struct{}>>"
    assert impl.decode(lists(*[1] * 10), t, max_count=10) == [[{}]] * 10
    assert impl.decode(lists(0, 0, 0, 3, 0, 7), t, max_count=10) == [[]] * 3 + [[{}] * 3, [],
                                                                            [{}] * 7]
    limit_at(impl, t, lists(0, 0, 0, 3, 0, 8), 4 + 4 * 5, max_count=10)
    # two levels of lists: the sixth one-element list of the second is one too many
    t = "list<list<list<struct{}>>>"
    assert impl.decode(u32(2) + lists(*[1] * 5) * 2, t, max_count=10) == [[[{}]] * 5] * 2
    limit_at(impl, t, u32(2) + lists(*[1] * 5) + lists(*[1] * 6), 28 + 4 * 6, max_count=10)


def test_three_levels_share_one_budget(impl):
    t = "list<list<list<struct{}>>>"
    # [[2, 2], [2, 2, 2]]: ten zero-size elements in five lists
    buf = u32(2) + lists(2, 2) + lists(2, 2, 2)
    assert impl.decode(buf, t, max_count=10) == [[[{}] * 2] * 2, [[{}] * 2] * 3]
    limit_at(impl, t, u32(2) + lists(2, 2) + lists(2, 2, 3), 4 + 12 + 12, max_count=10)


def test_the_budget_is_per_call(impl):
    dec = impl.decoder("list<list<struct{}>>", max_count=10)
    ok, over = lists(5, 5), lists(5, 6)
    for _ in range(3):
        assert dec.decode(ok) == [[{}] * 5] * 2
    for _ in range(2):
        with pytest.raises(kiln.KilnError) as ei:
            dec.decode(over)
        assert (ei.value.code, ei.value.offset) == ("LIMIT", 8)
        assert dec.decode(ok) == [[{}] * 5] * 2


def test_the_budget_is_per_call_across_threads(impl):
    m = 1000
    dec = impl.decoder("list<list<struct{}>>", max_count=m)
    ok, over = lists(m // 2, m // 2), lists(m // 2, m // 2 + 1)

    def work():
        for _ in range(100):
            assert len(dec.decode(ok)[1]) == m // 2
            try:
                dec.decode(over)
            except kiln.KilnError as e:
                assert (e.code, e.offset) == ("LIMIT", 8)
            else:
                raise AssertionError("the budget was exceeded")
    run_in_threads(work)


def test_a_decode_inside_a_decode_has_its_own_budget(impl):
    # a class-bound zero-size struct runs user code while the outer list is
    # decoded; that code decodes a full budget of its own.  Neither may refresh
    # nor drain the other's budget.
    inner = impl.decoder("list<struct{}>", max_count=4)
    seen = []

    @dataclasses.dataclass
    class Reenter:
        def __post_init__(self):
            seen.append(len(inner.decode(u32(4))))

    t = kiln.list_(kiln.list_(Reenter))
    dec = impl.decoder(t, max_count=4)
    v = dec.decode(lists(2, 2))
    assert [len(x) for x in v] == [2, 2] and seen == [4] * 4
    with pytest.raises(kiln.KilnError) as ei:
        dec.decode(lists(4, 1))
    assert (ei.value.code, ei.value.offset) == ("LIMIT", 8)


@pytest.mark.parametrize("t,value", [
    # opt<struct{}> takes one byte: its lists are bounded by the input
    ("list<list<opt<struct{}>>>", [[{}] * 5, [None, {}, {}, None, {}], [{}] * 5]),
    ("list<list<list<i32>>>", [[[]] * 5] * 3),
    ("list<list<struct{a:bool,}>>", [[{"a": True}] * 5] * 3),
    ("list<list<str>>", [[""] * 5] * 3),
    ("list<list<list<u8>>>", [[b""] * 5] * 3),
    ("list<dict<str,struct{}>>", [{k: {} for k in "abcde"}] * 3),
    ("list<list<opt<struct{a:struct{},}>>>", [[{"a": {}}] * 5] * 3),
    # lists of lists of struct{} are not charged; the empty innermost ones draw 0
    ("list<list<list<struct{}>>>", [[[]] * 5] * 3),
])
def test_elements_with_a_nonzero_minimum_are_not_charged(impl, t, value):
    # max_count=10, and more than 10 such elements in the value
    buf = impl.encode(value, t)
    assert impl.encode(impl.decode(buf, t, max_count=10), t) == buf


def test_uncharged_elements_do_not_use_the_budget(impl):
    t = "struct{a:list<struct{}>,b:list<list<opt<struct{}>>>,}"
    value = {"a": [{}] * 10, "b": [[{}] * 5] * 3}
    buf = impl.encode(value, t)
    assert impl.decode(buf, t, max_count=10) == value


def test_tensor_counts_are_not_charged(impl):
    import numpy as np
    t = "struct{d:tensors,a:list<struct{}>,}"
    d = {"x": np.zeros(2, np.float32), "y": np.ones(3, np.int8), "z": np.arange(4)}
    buf = impl.encode({"d": d, "a": [{}] * 4}, t)
    v = impl.decode(buf, t, max_count=4)
    assert len(v["d"]) == 3 and v["a"] == [{}] * 4


@pytest.mark.parametrize("a,b", [(4, 6), (10, 0), (0, 10), (5, 6), (0, 11)])
def test_struct_fields_share_the_budget(impl, a, b):
    t = "struct{a:list<struct{}>,b:list<struct{a:struct{},}>,}"
    buf = u32(a) + u32(b)
    if a + b <= 10:
        assert impl.decode(buf, t, max_count=10) == {"a": [{}] * a, "b": [{"a": {}}] * b}
    else:
        limit_at(impl, t, buf, 4, max_count=10)


def test_dict_values_share_the_budget(impl):
    t = "dict<str,list<struct{}>>"

    def buf(a, b):
        return u32(2) + u32(1) + b"a" + u32(a) + u32(1) + b"b" + u32(b)
    assert impl.decode(buf(3, 7), t, max_count=10) == {"a": [{}] * 3, "b": [{}] * 7}
    limit_at(impl, t, buf(3, 8), 18, max_count=10)
    limit_at(impl, t, buf(10, 1), 18, max_count=10)


def test_opt_lists_share_the_budget(impl):
    t = "list<opt<list<struct{}>>>"
    buf = u32(3) + b"\1" + u32(6) + b"\0" + b"\1" + u32(4)
    assert impl.decode(buf, t, max_count=10) == [[{}] * 6, None, [{}] * 4]
    limit_at(impl, t, u32(3) + b"\1" + u32(6) + b"\0" + b"\1" + u32(5), 11, max_count=10)


def test_nested_zero_size_elements_count_once_each(impl):
    t = "list<list<struct{a:struct{},b:struct{},}>>"
    assert impl.decode(lists(4, 6), t, max_count=10) == [[{"a": {}, "b": {}}] * 4,
                                                          [{"a": {}, "b": {}}] * 6]
    limit_at(impl, t, lists(4, 7), 8, max_count=10)


def test_class_bound_structs_share_the_budget(impl):
    assert impl.decode(u32(4) + u32(6), Holder, max_count=10) == Holder([Empty()] * 4,
                                                                        [Wrap(Empty())] * 6)
    limit_at(impl, Holder, u32(4) + u32(7), 4, max_count=10)
    t = kiln.list_(kiln.list_(Empty))
    assert impl.decode(lists(5, 5), t, max_count=10) == [[Empty()] * 5] * 2
    limit_at(impl, t, lists(5, 6), 8, max_count=10)
    nt = kiln.list_(kiln.list_(EmptyNT))
    assert impl.decode(lists(5, 5), nt, max_count=10) == [[EmptyNT()] * 5] * 2
    limit_at(impl, nt, lists(5, 6), 8, max_count=10)


def test_frame_offsets_and_trusted(impl):
    t = "list<list<struct{}>>"
    limit_at(impl, t, frame(t) + lists(5, 6), 16 + 8, frame=True, max_count=10)
    assert impl.decode(frame(t) + lists(5, 5), t, frame=True, max_count=10) == [[{}] * 5] * 2
    limit_at(impl, t, lists(5, 6), 8, trusted=True, max_count=10)


def test_the_module_decode_applies_the_budget():
    t = "list<list<struct{}>>"
    with pytest.raises(kiln.KilnError) as ei:
        kiln.decode(lists(5, 6), t, max_count=10)
    assert (ei.value.code, ei.value.offset) == ("LIMIT", 8)


# --- (b) peak memory of zero-size and nearly-zero-size shapes -------------------

def _rep(unit, size=SIZE):
    """A list of as many ``unit`` elements as fit in ``size`` bytes."""
    k = (size - 4) // len(unit)
    return u32(k) + unit * k


def _spread(over):
    # MAX_COUNT inner lists of struct{} with one element each: the whole
    # budget; ``over`` gives the first one a second element
    return lists(*([2 if over else 1] + [1] * (MAX_COUNT - 1)))


def _dict_keys(size=SIZE):
    k = (size - 4) // 9
    return u32(k) + b"".join(u32(5) + b"%05d" % i for i in range(k))


def _named_lists(n, count):
    return u32(n) + b"".join(u32(1) + bytes([97 + i]) + u32(count) for i in range(n))


class Shape:
    """One measured input: type, builder, expected outcome, the bound that applies.

    A type with a list of zero-size elements is decoded with ``max_count=MAX_COUNT``
    and its bound has the budget term ``MAX_COUNT * elem`` (``elem``: one
    zero-size element of the type); any other type is decoded at the default
    caps and has none.  ``schema=True`` shapes are checked against the fuzz
    oracle's schema-aware bound instead of FACTOR: one input byte there builds
    one object per zero-size struct in the type."""

    def __init__(self, name, t, build, code=None, elem=ZERO_ELEMENT_BYTES, schema=False):
        self.name, self.t, self.build, self.code = name, kiln.as_type(t), build, code
        self.elem, self.schema = elem, schema
        self.charged = oracle.zero_size_shape(self.t)[1]
        self.max_count = MAX_COUNT if self.charged else DEFAULT


def _empty_directories(impl):
    unit = impl.encode_tensors({})
    assert len(unit) == 64
    return _rep(unit, SIZE // 2)


TABLE = [
    # one byte or one count word per element, nothing charged
    Shape("list<opt<struct{}>>", "list<opt<struct{}>>", lambda i: _rep(b"\1")),
    Shape("list<opt<Empty>>", kiln.list_(kiln.opt(Empty)), lambda i: _rep(b"\1")),
    Shape("list<opt<i32>> absent", "list<opt<i32>>", lambda i: _rep(b"\0")),
    Shape("list<list<i32>> empty", "list<list<i32>>", lambda i: _rep(u32(0))),
    Shape("list<list<struct{}>> empty", "list<list<struct{}>>", lambda i: _rep(u32(0), ZSIZE)),
    Shape("list<list<list<struct{}>>> empty", "list<list<list<struct{}>>>",
          lambda i: _rep(u32(0), ZSIZE)),
    Shape("list<opt<list<struct{}>>> empty", "list<opt<list<struct{}>>>",
          lambda i: _rep(b"\1" + u32(0), 4 + 5 * MAX_COUNT)),
    Shape("list<str> empty", "list<str>", lambda i: _rep(u32(0))),
    Shape("list<list<str>> empty", "list<list<str>>", lambda i: _rep(u32(0))),
    Shape("list<list<u8>> empty", "list<list<u8>>", lambda i: _rep(u32(0))),
    Shape("list<dict<str,i32>> empty", "list<dict<str,i32>>", lambda i: _rep(u32(0))),
    Shape("dict<str,struct{}> 5-byte keys", "dict<str,struct{}>", lambda i: _dict_keys()),
    Shape("list<tensors> empty", "list<tensors>", _empty_directories),
    Shape("list<struct{a:bool,}>", "list<struct{a:bool,}>", lambda i: _rep(b"\1")),
    Shape("list<Flag>", kiln.list_(Flag), lambda i: _rep(b"\1")),
    Shape("list<struct{a:list<i32>,}> empty", "list<struct{a:list<i32>,}>",
          lambda i: _rep(u32(0))),
    # zero-size elements: the budget
    Shape("list<struct{}> at the cap", "list<struct{}>", lambda i: u32(MAX_COUNT)),
    Shape("list<Empty> at the cap", kiln.list_(Empty), lambda i: u32(MAX_COUNT)),
    Shape("list<struct{a:struct{},}> at the cap", "list<struct{a:struct{},}>",
          lambda i: u32(MAX_COUNT), elem=NESTED_ZERO_ELEMENT_BYTES),
    Shape("list<list<struct{}>> spread to the cap", "list<list<struct{}>>",
          lambda i: _spread(False)),
    Shape("list<list<struct{}>> spread over the cap", "list<list<struct{}>>",
          lambda i: _spread(True), code=("LIMIT", 4 + 4 * (MAX_COUNT - 1))),
    # the 36-byte input at this cap, and wider and deeper versions
    Shape("list<list<struct{}>> 8 x cap", "list<list<struct{}>>",
          lambda i: lists(*[MAX_COUNT] * 8), code=("LIMIT", 8)),
    Shape("list<list<struct{}>> 1000 x cap", "list<list<struct{}>>",
          lambda i: lists(*[MAX_COUNT] * 1000), code=("LIMIT", 8)),
    Shape("list<list<list<struct{}>>> 8 x 8 x cap", "list<list<list<struct{}>>>",
          lambda i: u32(8) + lists(*[MAX_COUNT] * 8) * 8, code=("LIMIT", 12)),
    Shape("struct{a:list<struct{}>,b:list<struct{a:struct{},}>,} cap + cap",
          "struct{a:list<struct{}>,b:list<struct{a:struct{},}>,}",
          lambda i: u32(MAX_COUNT) * 2, code=("LIMIT", 4), elem=NESTED_ZERO_ELEMENT_BYTES),
    Shape("dict<str,list<struct{}>> 8 x cap", "dict<str,list<struct{}>>",
          lambda i: _named_lists(8, MAX_COUNT), code=("LIMIT", 18)),
    Shape("list<list<Empty>> 8 x cap", kiln.list_(kiln.list_(Empty)),
          lambda i: lists(*[MAX_COUNT] * 8), code=("LIMIT", 8)),
    Shape("list<opt<list<struct{}>>> 8 x cap", "list<opt<list<struct{}>>>",
          lambda i: u32(8) + (b"\1" + u32(MAX_COUNT)) * 8, code=("LIMIT", 10)),
    # one input byte, several objects: the factor grows with the type
    Shape("list<struct{a:opt<struct{}>,}>", "list<struct{a:opt<struct{}>,}>",
          lambda i: _rep(b"\1", SIZE // 4), schema=True),
    Shape("list<struct{a:bool,b..i:struct{},}>",
          "list<struct{a:bool,%s}>" % "".join("%s:struct{}," % c for c in "bcdefghi"),
          lambda i: _rep(b"\1", SIZE // 4), schema=True),
    Shape("list<opt<struct{a:struct{a:struct{a:struct{},},},}>>",
          "list<opt<struct{a:struct{a:struct{a:struct{},},},}>>",
          lambda i: _rep(b"\1", SIZE // 4), schema=True),
]


def _bound(shape, n):
    if shape.schema:
        return oracle.allocation_bound(shape.t, n, shape.max_count)
    return FACTOR * n + (shape.max_count * shape.elem if shape.charged else 0) + SLACK


def _peak(dec, buf):
    v, err, peak = oracle.traced_decode(dec.decode, buf)
    del v
    return err, peak


@pytest.mark.parametrize("shape", TABLE, ids=[s.name for s in TABLE])
def test_peak_memory(impl, shape):
    t = shape.t
    dec = impl.decoder(t, max_count=shape.max_count)
    dec.decode(bytes(t.min_size))       # first-use caches are not the input's cost
    buf = shape.build(impl)
    err, peak = _peak(dec, buf)
    bound = _bound(shape, len(buf))
    assert peak <= bound, ("%s: %d input bytes, peak %d bytes (%.1fx), bound %d (%s)"
                           % (shape.name, len(buf), peak, peak / len(buf), bound,
                              err or "accepted"))
    got = (err.code, err.offset) if err else None
    assert got == shape.code, str(err)
    # the fuzz oracle's schema-aware bound is never tighter than the table's
    assert oracle.allocation_bound(t, len(buf), shape.max_count) >= bound


def test_oracle_bound_matches_the_published_factor():
    assert oracle.AMPLIFICATION_FACTOR >= FACTOR
    assert oracle.ZERO_NODE_BYTES * 1 >= ZERO_ELEMENT_BYTES
    assert oracle.ZERO_NODE_BYTES * 2 >= NESTED_ZERO_ELEMENT_BYTES
    assert oracle.ALLOCATION_SLACK >= SLACK


# --- the inputs at the default caps, in a child with 2 GiB of address space --

CHILD = r"""
import json, resource, struct, sys, time
sys.path.insert(0, sys.argv[1])
import importlib
import kiln
kernels = importlib.import_module(sys.argv[2])
CAP = kiln.DEFAULT_MAX_COUNT
cases = [
    # 36 bytes: 8 lists of 16,777,216 empty structs (9 GB before the budget)
    ("list<list<struct{}>>", struct.pack("<9I", 8, *[CAP] * 8)),
    # 5 bytes: a full budget, then one trailing byte
    ("list<struct{}>", struct.pack("<I", CAP) + b"\0"),
]
decoders = [kiln.Decoder(t, kernels=kernels) for t, _ in cases]


def vm(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) * 1024


import gc
gc.disable()   # millions of empty containers: the collector would only slow this down
# (seen on 3.13.5t, whose collector is far slower on such heaps)
limit = vm("VmSize:") + int(sys.argv[3])
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
rss0 = vm("VmRSS:")
out = []
for (t, buf), dec in zip(cases, decoders):
    t0 = time.perf_counter()
    try:
        dec.decode(buf)
        r = ["accepted"]
    except kiln.KilnError as e:
        r = [e.code, e.offset]
    except MemoryError:
        r = ["MemoryError"]
    out.append(dict(result=r, seconds=time.perf_counter() - t0))
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - rss0
print(json.dumps(dict(cases=out, peak_rss=peak)))
"""
CHILD_ADDRESS_SPACE = 2 << 30
CHILD_TIMEOUT = 60
KERNEL_MODULES = {"python": "kiln._kernels_py", "cython": "kiln._kernels_c"}


@pytest.fixture(scope="module", autouse=True)
def default_cap_children(request):
    """Start the default-cap children for every implementation that will be
    tested, as the module starts, so that they run beside its other tests."""
    names = sorted({item.callspec.params["impl"] for item in request.session.items
                    if getattr(item, "originalname", None) == "test_default_caps_in_a_child"})
    top = os.path.dirname(os.path.dirname(os.path.abspath(kiln.__file__)))
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    procs = {}
    for name in names:
        procs[name] = (subprocess.Popen(
            [sys.executable, "-c", CHILD, top, KERNEL_MODULES[name], str(CHILD_ADDRESS_SPACE)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env), time.monotonic())
    yield procs
    for p, _ in procs.values():
        if p.poll() is None:
            p.kill()
        p.communicate()


def test_default_caps_in_a_child(impl, default_cap_children):
    p, started = default_cap_children[impl.name]
    try:
        out, err = p.communicate(timeout=max(1.0, CHILD_TIMEOUT - (time.monotonic() - started)))
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()
        pytest.fail("the default-cap inputs took more than %d s" % CHILD_TIMEOUT)
    assert p.returncode == 0, "child failed (%d): %s" % (p.returncode, err.decode()[-2000:])
    doc = json.loads(out)
    nested, trailing = doc["cases"]
    assert nested["result"] == ["LIMIT", 8], nested
    assert trailing["result"] == ["TRAILING", 4], trailing
    # (how long they take is measured by python -m benchmarks.amplification, not asserted)
    # the budget term: at most one full budget of {} was ever live
    assert doc["peak_rss"] <= DEFAULT * ZERO_ELEMENT_BYTES + (64 << 20), doc
