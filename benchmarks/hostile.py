"""Hostile counts: the time and the traced allocation to reject must not grow with them.

Each case is a tiny buffer that claims a count (or a length) and then stops.
The count rises from 10^3 to 10^9 and then to 2^32-1; for each point we time
the rejection (same timing helper, interleaved over all points and both
implementations) and take the peak traced allocation of one rejection
(``tracemalloc``; it sees Python-level and numpy allocations, not a C
extension's plain ``malloc``).
"""

import dataclasses
import struct
import tracemalloc

import kiln
from kiln import _wire as W
from benchmarks.harness import KILN, Contender, measure

U32_MAX = W.U32_MAX
RAISED = dict(max_count=U32_MAX, max_bytes=U32_MAX)

# a case is "flat" when, over the claimed counts, the slowest point is within
# this factor of the fastest (each point taken at its fastest sample, which a
# busy neighbour cannot inflate) and the largest peak allocation is within this
# many bytes of the smallest
TIME_SPREAD_MAX = 2.0
ALLOC_SPREAD_MAX = 1024


def count_word(c):
    return struct.pack("<I", c)


def directory_header(count):
    """An unnamed little-endian v2 directory claiming ``count`` descriptors, none present."""
    return W.HEADER.pack(W.DIR_MAGIC, W.DIR_VERSION, W.FLAG_LITTLE, 0, count, 0, 0,
                         count * W.DESC_SIZE, bytes(W.HEADER_SIZE - W.H_RESERVED32))


@dataclasses.dataclass
class Case:
    name: str
    type: str
    buffer: object        # callable(count) -> bytes
    caps: dict
    code: str             # the error code every point must raise
    what: str


CASES = [
    Case("kiln-list-struct-hostile", "list<struct{id:i64,name:str,}>", count_word, RAISED,
         "EOF", "list count, no elements"),
    Case("kiln-v2-count-cap", "tensors", directory_header, dict(max_count=100), "LIMIT",
         "tensor_count above max_count=100"),
    Case("kiln-v2-directory-eof", "tensors", directory_header, RAISED, "EOF",
         "tensor_count, descriptors absent"),
    Case("str-length", "str", count_word, RAISED, "EOF", "string length, no bytes"),
]


def counts(quick):
    if quick:
        return [10 ** 3, 10 ** 6, 10 ** 9, U32_MAX]
    return [10 ** k for k in range(3, 10)] + [U32_MAX]


def rejection(decode, buf):
    """A callable that decodes ``buf`` and returns the error code it must raise."""
    def run():
        try:
            decode(buf)
        except kiln.KilnError as e:
            return e.code
        raise AssertionError("a hostile buffer was accepted")
    return run


def peak_allocation(fn):
    """Peak bytes traced by tracemalloc during one call of ``fn`` (after a warm call)."""
    tracemalloc.start()
    try:
        fn()
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        fn()
        return tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


def run(impls, cfg, quick):
    """Rows: one per case and implementation, with every point's time and allocation."""
    rows = []
    for case in CASES:
        points = []       # (impl, count, contender, code, peak)
        for im in impls:
            if im.kernels is None:
                rows.append(dict(case=case.name, what=case.what, impl=im.name,
                                 missing=im.missing))
                continue
            dec = kiln.Decoder(case.type, kernels=im.kernels, **case.caps).decode
            for c in counts(quick):
                fn = rejection(dec, case.buffer(c))
                points.append((im, c, Contender("%s %d" % (im.name, c), KILN, fn), fn(),
                               peak_allocation(fn)))
        measure([p[2] for p in points], cfg, "hostile " + case.name)
        for im in impls:
            mine = [p for p in points if p[0] is im]
            if not mine:
                continue
            times = [p[2].min for p in mine]
            peaks = [p[4] for p in mine]
            codes = sorted({p[3] for p in mine})
            time_spread = max(times) / min(times)
            alloc_spread = max(peaks) - min(peaks)
            rows.append(dict(
                case=case.name, what=case.what, impl=im.name, missing=None,
                codes=codes, expected=case.code,
                points=[dict(count=p[1], median_s=p[2].median, min_s=p[2].min,
                             max_s=p[2].max, number=p[2].number, code=p[3], peak_bytes=p[4])
                        for p in mine],
                time_spread=time_spread, alloc_spread=alloc_spread,
                flat=(codes == [case.code] and time_spread <= TIME_SPREAD_MAX
                      and alloc_spread <= ALLOC_SPREAD_MAX)))
    return rows
