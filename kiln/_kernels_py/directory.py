"""Tensor directory validation, one function per check step of spec section 7.

The twin of ``src/kernels/directory.pxi``: the same step functions under the
same names.  The header, the descriptors and the name heap are read once into
private objects (tuples and bytes) and every later step uses those.

The payload contents (bool bytes, an odd 4-bit tail, the alignment gaps) are
checked by the steps when the caller asks for the whole block at once
(``validate_directory``); ``validate_directory_copy`` (a lazy open) leaves
them to ``check_payload``, which the file layer calls for one tensor when
that tensor is read, so an open costs the table, whatever the payloads
claim.
"""

import math
import operator
import struct

import numpy as np

from .. import _wire as W
from .reader import err

# descriptor field offsets (for error positions) and tuple indexes (for values)
_D = W.DESC_SIZE


class Dir:
    """What the steps learn about one directory, as they learn it."""

    __slots__ = ("buf", "n", "have", "s", "standalone", "trusted", "max_count", "max_bytes", "max_copy",
                 "flags", "count", "name_bytes", "payload_bytes", "directory_bytes",
                 "reserved32", "want", "base", "block", "pb", "heap0", "named", "descs",
                 "counts", "names", "layouts", "heap", "contents", "wide_ok", "wide", "at_name",
                 "at_layout", "no_name", "raw")

    def __init__(self, buf, s, standalone, trusted, max_count, max_bytes, max_copy,
                 wide_ok=False):
        self.buf = buf
        self.n = self.have = len(buf)   # n: the bounds; have: the bytes that may be read
        self.s = s
        self.standalone = standalone
        self.trusted = trusted
        self.max_count = max_count
        self.max_bytes = max_bytes
        self.max_copy = max_copy   # None: copies are not capped
        self.contents = True       # check the payload contents too (steps 10 and 11a)
        self.wide_ok = wide_ok     # a tensor file: flag bit 2 (wide name fields) allowed
        self.wide = False
        self.at_name, self.at_layout, self.no_name = W.D_NAME_OFF, W.D_LAYOUT_OFF, W.NO_NAME

    def d(self, i):
        """The absolute offset of descriptor ``i``."""
        return self.s + W.HEADER_SIZE + _D * i


def step1_magic(st):
    s, avail = st.s, st.have - st.s
    if avail < 4:
        raise err("EOF", s, "a directory needs 4 bytes for its magic, %d remain" % max(avail, 0))
    magic = bytes(st.buf[s:s + 4])
    if magic != W.DIR_MAGIC:
        raise err("FRAME", s, "directory magic is %r, not %r" % (magic, W.DIR_MAGIC))
    if avail < W.HEADER_SIZE:
        raise err("EOF", s, "a directory header needs 64 bytes, %d remain" % avail)
    (_, version, st.flags, reserved, st.count, st.name_bytes, st.payload_bytes,
     st.directory_bytes, st.reserved32) = W.HEADER.unpack_from(st.buf, s)
    return version, reserved


def step2_envelope(st, version, reserved):
    s = st.s
    if version != W.DIR_VERSION:
        raise err("FRAME", s + W.H_VERSION, "directory version is %d, not 2" % version)
    known = W.FLAG_NAMED | W.FLAG_LITTLE | (W.FLAG_WIDE if st.wide_ok else 0)
    if st.flags & ~known:
        raise err("FRAME", s + W.H_FLAGS, "unknown directory flag bits %#x%s" % (
            st.flags & ~3, W.WIDE_HINT if (st.flags & ~known) == W.FLAG_WIDE else ""))
    if not st.flags & W.FLAG_LITTLE:
        raise err("FRAME", s + W.H_FLAGS, "the little-endian flag is clear")
    name_fields(st)
    if reserved:
        k = 0 if reserved & 0xFF else 1   # the u16 is little-endian: byte 6 is its low byte
        raise err("FRAME", s + W.H_RESERVED + k, "reserved header byte is not 0")
    if any(st.reserved32):
        k = next(k for k, b in enumerate(st.reserved32) if b)
        raise err("FRAME", s + W.H_RESERVED32 + k, "reserved header byte is not 0")


def name_fields(st):
    """Where this directory's name fields are: u16 at d+4..d+11, or u32 at
    d+112..d+127 with the wide flag (spec 12.3)."""
    st.wide = bool(st.flags & W.FLAG_WIDE)
    if st.wide:
        st.at_name, st.at_layout, st.no_name = W.D_WNAME_OFF, W.D_WLAYOUT_OFF, W.NO_NAME_WIDE


def step3_caps(st):
    if st.count > st.max_count:
        raise err("LIMIT", st.s + W.H_COUNT, "tensor count %d is above the cap max_count=%d"
                  % (st.count, st.max_count))
    if st.name_bytes > st.max_bytes:
        raise err("LIMIT", st.s + W.H_NAME_BYTES, "name heap of %d bytes is above the cap "
                  "max_bytes=%d" % (st.name_bytes, st.max_bytes))


def step4_arithmetic(st):
    # count < 2**32 and name_bytes < 2**32, so the sum cannot overflow u64
    st.want = st.count * _D + st.name_bytes
    if st.directory_bytes != st.want:
        raise err("TYPE", st.s + W.H_DIRECTORY_BYTES, "directory_bytes is %d, count and heap "
                  "give %d" % (st.directory_bytes, st.want))


def step5_fits(st):
    avail = st.n - st.s
    if W.HEADER_SIZE + st.want > avail:
        raise err("EOF", st.s + W.H_COUNT, "%d descriptors and %d heap bytes need %d bytes, "
                  "%d remain" % (st.count, st.name_bytes, W.HEADER_SIZE + st.want, avail))


def step6_block(st):
    st.base = W.dir_align(W.HEADER_SIZE + st.want)
    st.block = st.base + st.payload_bytes
    if st.block > W.U64_MAX:
        raise err("LIMIT", st.s + W.H_PAYLOAD_BYTES, "payload_base + payload_bytes overflows u64")
    if st.block > st.n - st.s:
        raise err("EOF", st.s + W.H_PAYLOAD_BYTES, "the block needs %d bytes, %d remain"
                  % (st.block, st.n - st.s))
    st.pb = st.s + st.base
    st.heap0 = st.s + W.HEADER_SIZE + _D * st.count
    if st.pb > st.have:   # only a head-only check (have < n): its buffer ends before the payloads
        raise err("EOF", st.s + W.H_COUNT, "the table and its padding need %d bytes, %d were "
                  "given" % (st.base, st.have - st.s))


def step7_padding(st):
    heap_end = st.heap0 + st.name_bytes
    _first_nonzero(st.buf, heap_end, st.pb, "padding byte is not 0")


def _first_nonzero(buf, a, b, what):
    if a < b:
        gap = bytes(buf[a:b])
        if any(gap):
            k = next(k for k, v in enumerate(gap) if v)
            raise err("TYPE", a + k, what)


def read_table(st):
    """The descriptors (one tuple each) and the heap, copied once: only after
    step 7.  ``st.raw``: the private copy of the descriptors' bytes the
    tuples are unpacked from (a narrow directory's checked table, as is)."""
    s0 = st.s + W.HEADER_SIZE
    st.raw = bytes(st.buf[s0:s0 + _D * st.count])
    if st.wide:   # the u32 name fields where the steps read names, bytes 4..11 as "reserved"
        st.descs = list(map(_WIDE_ORDER, _WIDE.iter_unpack(st.raw)))
    else:
        st.descs = list(W.DESC.iter_unpack(st.raw))
    st.heap = st.names = bytes(st.buf[st.heap0:st.heap0 + st.name_bytes])  # names: for now


# a wide descriptor (bytes 4..11 one reserved field, the u32 name fields last),
# its fields put in the places of DESC's tuple
_WIDE = struct.Struct("<HBB8sIHHIIIQQ8QIIII")
_WIDE_ORDER = operator.itemgetter(0, 1, 2, 20, 21, 22, 23, *range(4, 20), 3)


def step8a_reserved(st):
    resv = W.D_NARROW if st.wide else W.D_RESERVED16
    zero = bytes(8 if st.wide else 16)
    if not any(dsc[W.I_RESERVED] or dsc[W.I_RESERVED16] != zero for dsc in st.descs):
        return   # (else the first fault, in descriptor order)
    for i, dsc in enumerate(st.descs):
        d = st.d(i)
        if dsc[W.I_RESERVED]:
            raise err("FRAME", d + W.D_RESERVED, "reserved descriptor byte is not 0")
        if any(dsc[W.I_RESERVED16]):
            k = next(k for k, b in enumerate(dsc[W.I_RESERVED16]) if b)
            raise err("FRAME", d + resv + k, "reserved descriptor byte is not 0")


def step8b_heap(st):
    st.named = bool(st.flags & W.FLAG_NAMED)
    if st.named and st.count == 0:
        raise err("TYPE", st.s + W.H_FLAGS, "name flag set on an empty directory")
    for i, dsc in enumerate(st.descs):   # the flag pass over every descriptor, then the walk
        noff, nlen = dsc[W.I_NAME_OFF], dsc[W.I_NAME_LEN]
        if not st.named:
            if nlen != 0 or noff != st.no_name:
                raise err("TYPE", st.d(i) + st.at_name, "tensor has a name but the name "
                          "flag is clear")
        elif nlen == 0:
            raise err("TYPE", st.d(i) + st.at_name, "tensor has no name but the name flag "
                      "is set")
    cursor = 0
    for i, dsc in enumerate(st.descs if st.named else ()):
        noff, nlen = dsc[W.I_NAME_OFF], dsc[W.I_NAME_LEN]
        if noff != cursor or cursor + nlen > st.name_bytes:
            raise err("TYPE", st.d(i) + st.at_name, "name slice (%d, %d) is not the next "
                      "%d heap bytes" % (noff, nlen, nlen))
        cursor += nlen
    for i, dsc in enumerate(st.descs):
        loff, llen = dsc[W.I_LAYOUT_OFF], dsc[W.I_LAYOUT_LEN]
        if llen == 0:
            if loff != st.no_name:
                raise err("TYPE", st.d(i) + st.at_layout, "empty layout name with offset %d"
                          % loff)
            continue
        if loff != cursor or cursor + llen > st.name_bytes:
            raise err("TYPE", st.d(i) + st.at_layout, "layout slice (%d, %d) is not the next "
                      "heap bytes" % (loff, llen))
        cursor += llen
    if cursor != st.name_bytes:
        raise err("TYPE", st.s + W.H_NAME_BYTES, "name heap has %d bytes, names use %d"
                  % (st.name_bytes, cursor))
    if st.wide and _narrow_fits(st):
        raise err("TYPE", st.s + W.H_FLAGS, "wide name fields, but every name offset and "
                  "length fits the u16 fields")
    heap = st.names
    st.names = [heap[dsc[W.I_NAME_OFF]:dsc[W.I_NAME_OFF] + dsc[W.I_NAME_LEN]]
                if st.named else None for dsc in st.descs]
    st.layouts = [heap[dsc[W.I_LAYOUT_OFF]:dsc[W.I_LAYOUT_OFF] + dsc[W.I_LAYOUT_LEN]]
                  if dsc[W.I_LAYOUT_LEN] else None for dsc in st.descs]


def _narrow_fits(st):
    """Would u16 name fields hold this heap (then the canonical file is narrow)?"""
    for dsc in st.descs:
        for off, ln in ((dsc[W.I_NAME_OFF], dsc[W.I_NAME_LEN]),
                        (dsc[W.I_LAYOUT_OFF], dsc[W.I_LAYOUT_LEN])):
            if ln and (off > W.U16_MAX or ln > W.U16_MAX):
                return False
    return True


def step8c_utf8(st):
    if st.trusted:
        return
    for which, field, what in ((st.names, W.I_NAME_OFF, "tensor name"),
                               (st.layouts, W.I_LAYOUT_OFF, "layout name")):
        for i, nm in enumerate(which):
            if nm is None:
                continue
            try:
                nm.decode("utf-8")
            except UnicodeDecodeError as ex:
                raise err("UTF8", st.heap0 + st.descs[i][field] + ex.start, "invalid UTF-8 "
                          "in a %s" % what) from None


def step8d_duplicates(st):
    if not st.named:
        return
    seen = set()
    for i, nm in enumerate(st.names):
        if nm in seen:
            raise err("TYPE", st.d(i) + st.at_name, "tensor name %r repeats" % nm)
        seen.add(nm)


def step9_descriptors(st):
    """Step 9: a plain descriptor that is right taken here, any other by
    :func:`_descriptor` (its first fault, or an opaque dtype's checks)."""
    counts = []
    add, dtypes, packed, top = counts.append, W.DTYPES, W.PACKED, W.U64_MAX
    limit, rank_max = st.payload_bytes, W.MAX_RANK
    for i, dsc in enumerate(st.descs):
        code, rank = dsc[W.I_DTYPE], dsc[W.I_RANK]
        info = dtypes.get(code)
        if info is not None and rank <= rank_max and not dsc[W.I_BLOCK_SIZE] and \
                not dsc[W.I_LAYOUT_LEN]:
            shape = dsc[W.I_SHAPE:W.I_SHAPE + rank_max]
            if not any(shape[rank:]):
                ne = math.prod(shape[:rank])
                blen = dsc[W.I_BYTE_LENGTH]
                if ne <= top and blen == ((ne + 1) // 2 if code in packed else ne * info[1]) \
                        and dsc[W.I_BYTE_OFFSET] + blen <= limit:
                    add(ne)
                    continue
        add(_descriptor(st, i, dsc))
    st.counts = counts


def _descriptor(st, i, dsc):
    """Step 9 for one descriptor; returns its element count."""
    d = st.s + W.HEADER_SIZE + _D * i
    code, rank = dsc[W.I_DTYPE], dsc[W.I_RANK]
    opaque = W.OPAQUE_MIN <= code <= W.OPAQUE_MAX
    if not opaque and code not in W.DTYPES:
        raise err("TYPE", d + W.D_DTYPE, "dtype code %d is not defined" % code)
    if rank > W.MAX_RANK:
        raise err("TYPE", d + W.D_RANK, "rank %d is above 8" % rank)
    shape = dsc[W.I_SHAPE:W.I_SHAPE + W.MAX_RANK]
    if any(shape[rank:]):
        k = next(k for k in range(rank, W.MAX_RANK) if shape[k])
        raise err("TYPE", d + W.D_SHAPE + 8 * k, "shape slot %d past rank %d is not 0"
                  % (k, rank))
    ne = math.prod(shape[:rank])   # exact: 0 with a zero dimension, whatever the others
    if ne > W.U64_MAX:
        raise err("LIMIT", d + W.D_SHAPE, "element count overflows u64")
    block_size, blen = dsc[W.I_BLOCK_SIZE], dsc[W.I_BYTE_LENGTH]
    if opaque:
        if dsc[W.I_LAYOUT_LEN] == 0:
            raise err("TYPE", d + st.at_layout, "opaque dtype %d needs a layout name" % code)
        if block_size == 0:
            raise err("TYPE", d + W.D_BLOCK_SIZE, "opaque dtype %d needs a block size" % code)
        if blen % block_size:
            raise err("TYPE", d + W.D_BYTE_LENGTH, "byte length %d is not a multiple of block "
                      "size %d" % (blen, block_size))
    else:
        if block_size:
            raise err("TYPE", d + W.D_BLOCK_SIZE, "block size %d on a non-opaque dtype"
                      % block_size)
        if dsc[W.I_LAYOUT_LEN]:
            raise err("TYPE", d + st.at_layout, "layout name on a non-opaque dtype")
        name, w = W.DTYPES[code][0], W.DTYPES[code][1]
        need = (ne + 1) // 2 if code in W.PACKED else ne * w
        if need > W.U64_MAX:
            raise err("LIMIT", d + W.D_BYTE_LENGTH, "byte length of %d elements overflows u64"
                      % ne)
        if blen != need:
            raise err("TYPE", d + W.D_BYTE_LENGTH, "byte length is %d, %d elements of %s need "
                      "%d" % (blen, ne, name, need))
    off = dsc[W.I_BYTE_OFFSET]
    if off + blen > W.U64_MAX:
        raise err("LIMIT", d + W.D_BYTE_OFFSET, "payload range end overflows u64")
    if off + blen > st.payload_bytes:
        raise err("TYPE", d + W.D_BYTE_OFFSET, "payload range [%d, %d) is past payload_bytes "
                  "%d" % (off, off + blen, st.payload_bytes))
    return ne


def _placement(descs):
    """``(end, None)`` when every payload offset is canonical (step 10; such
    ranges never overlap), else ``(None, (i, want))`` for the first not."""
    r = 0
    for i, dsc in enumerate(descs):
        want = W.dir_align(r)
        if dsc[W.I_BYTE_OFFSET] != want:
            return None, (i, want)
        r = want + dsc[W.I_BYTE_LENGTH]
    return r, None


def step9_overlaps(st):
    descs = st.descs
    if _placement(descs)[1] is None:
        return   # (no two canonical ranges overlap)
    ranges = sorted((dsc[W.I_BYTE_OFFSET], i) for i, dsc in enumerate(descs)
                    if dsc[W.I_BYTE_LENGTH])
    top_end = -1
    top_i = -1
    for off, i in ranges:
        if off < top_end:
            j = max(i, top_i)
            raise err("TYPE", st.d(j) + W.D_BYTE_OFFSET, "payload ranges of tensors %d and %d "
                      "overlap" % (min(i, top_i), j))
        e = off + descs[i][W.I_BYTE_LENGTH]
        if e > top_end:
            top_end, top_i = e, i


def step10_placement(st):
    r, bad = _placement(st.descs)
    if bad is not None:
        i, want = bad
        raise err("TYPE", st.d(i) + W.D_BYTE_OFFSET, "byte_offset %d is not the canonical %d"
                  % (st.descs[i][W.I_BYTE_OFFSET], want))
    if st.payload_bytes != r:
        raise err("TYPE", st.s + W.H_PAYLOAD_BYTES, "payload_bytes is %d, the canonical end is "
                  "%d" % (st.payload_bytes, r))
    if not st.contents:
        return   # the gaps: with their tensors (check_payload)
    r = 0
    for dsc in st.descs:
        off = dsc[W.I_BYTE_OFFSET]
        _first_nonzero(st.buf, st.pb + r, st.pb + off, "alignment gap byte is not 0")
        r = off + dsc[W.I_BYTE_LENGTH]


def step11a_payload_bytes(st):
    if not st.contents:
        return   # with each tensor, when it is read (check_payload)
    for i, dsc in enumerate(st.descs):
        blen = dsc[W.I_BYTE_LENGTH]
        a = st.pb + dsc[W.I_BYTE_OFFSET]
        _payload_contents(st.buf, a, a + blen, 0, dsc[W.I_DTYPE], st.counts[i], blen, a)


_CHUNK = 1 << 20   # payload bytes copied and scanned at a time


def _payload_contents(buf, lo, hi, at, code, count, nbytes, origin):
    """Check ``buf[lo:hi]``, the bytes at positions ``at ..`` of one payload of
    ``nbytes`` bytes and the alignment gap after it (positions from
    ``nbytes`` on); errors at ``origin`` + position.  Each byte is read once,
    through a private copy of at most ``_CHUNK`` bytes."""
    end = lo + max(0, min(hi - lo, nbytes - at))          # where the gap starts in buf
    if code == W.DTYPE_BOOL:
        for a in range(lo, end, _CHUNK):
            raw = np.frombuffer(bytes(buf[a:min(end, a + _CHUNK)]), np.uint8)
            bad = raw > 1
            if bad.any():
                k = int(np.argmax(bad))
                raise err("TYPE", origin + at + (a - lo) + k, "bool byte is %d, not 0 or 1"
                          % int(raw[k]))
    elif code in W.PACKED and count & 1 and at < nbytes <= at + (hi - lo):
        k = nbytes - 1 - at
        if buf[lo + k] & 0xF0:
            raise err("TYPE", origin + nbytes - 1, "high nibble of an odd packed tail is not 0")
    for a in range(end, hi, _CHUNK):
        gap = bytes(buf[a:min(hi, a + _CHUNK)])
        if gap.count(0) != len(gap):
            k = next(k for k, v in enumerate(gap) if v)
            raise err("TYPE", origin + at + (a - lo) + k, "alignment gap byte is not 0")


def check_payload(buf, at, code, count, nbytes, origin):
    """Check the bytes of ``buf``: positions ``at .. at + len(buf)`` of one
    tensor's payload (dtype ``code``, ``count`` elements, ``nbytes`` bytes)
    followed by its alignment gap, as steps 10 and 11a would: each bool byte
    0 or 1, an odd 4-bit tail's high nibble 0 (when ``buf`` holds the last
    payload byte), every gap byte 0.  ``TYPE`` at ``origin`` + the position
    of the first bad byte; returns None."""
    if at < 0 or count < 0 or nbytes < 0 or origin < 0:
        raise ValueError("at, count, nbytes and origin must be non-negative")
    view = memoryview(buf)
    try:   # (released on the way out, whatever happens: the caller may close buf)
        mv = view if view.ndim == 1 and view.itemsize == 1 else view.cast("B")
        try:
            if origin + at + len(mv) + nbytes >= 0x7FFFFFFFFFFFFFFF or code > 0xFFFF:
                raise ValueError("offsets past 2**63 or a dtype code past u16")
            _payload_contents(mv, 0, len(mv), at, code, count, nbytes, origin)
        finally:
            mv.release()
    finally:
        view.release()


_UNQUANTIZED = (0, W.NO_AXIS, 0, W.NO_INDEX, W.NO_INDEX)   # descriptor fields 8..12


def step11b_quantization(st):
    for i, dsc in enumerate(st.descs):
        if dsc[W.I_QUANT_SCHEME:W.I_OUTER_INDEX + 1] != _UNQUANTIZED:
            _quantization(st, i, dsc)


def _quantization(st, i, dsc):
    d, descs, count = st.d(i), st.descs, st.count
    scheme, axis, group = dsc[W.I_QUANT_SCHEME], dsc[W.I_QUANT_AXIS], dsc[W.I_GROUP_SIZE]
    scale, outer = dsc[W.I_SCALE_INDEX], dsc[W.I_OUTER_INDEX]
    if scheme > W.QUANT_SCHEMES:
        raise err("TYPE", d + W.D_QUANT_SCHEME, "quant scheme %d is not 0, 1 or 2" % scheme)
    if scheme == 0:
        for value, none, at, what in ((axis, W.NO_AXIS, W.D_QUANT_AXIS, "quant axis"),
                                      (group, 0, W.D_GROUP_SIZE, "group size"),
                                      (scale, W.NO_INDEX, W.D_SCALE_INDEX, "scale index"),
                                      (outer, W.NO_INDEX, W.D_OUTER_INDEX, "outer index")):
            if value != none:
                raise err("TYPE", d + at, "%s set without a scheme" % what)
        return
    rank = dsc[W.I_RANK]
    if rank == 0 or axis >= rank:
        raise err("TYPE", d + W.D_QUANT_AXIS, "quant axis %d is not below rank %d" % (axis, rank))
    if group == 0:
        raise err("TYPE", d + W.D_GROUP_SIZE, "group size is 0")
    if scale >= count or scale == i:
        raise err("TYPE", d + W.D_SCALE_INDEX, "scale index %d does not name another tensor"
                  % scale)
    if descs[scale][W.I_QUANT_SCHEME] != 0:
        raise err("TYPE", d + W.D_SCALE_INDEX, "scale tensor %d is itself quantized (a chain)"
                  % scale)
    if scheme == 1:
        if outer != W.NO_INDEX:
            raise err("TYPE", d + W.D_OUTER_INDEX, "outer index set on scheme 1")
    else:
        if outer >= count or outer == i or outer == scale:
            raise err("TYPE", d + W.D_OUTER_INDEX, "outer index %d does not name a third tensor"
                      % outer)
        od = descs[outer]
        if od[W.I_DTYPE] != W.DTYPE_F32 or od[W.I_QUANT_SCHEME] != 0 or st.counts[outer] != 1:
            raise err("TYPE", d + W.D_OUTER_INDEX, "outer tensor %d is not one unquantized f32"
                      % outer)
    if not st.trusted:
        shape = dsc[W.I_SHAPE:W.I_SHAPE + rank]
        groups = -(-shape[axis] // group)
        for k in range(rank):
            if k != axis:
                groups *= shape[k]
        if st.counts[scale] != groups:
            raise err("TYPE", d + W.D_SCALE_INDEX, "scale tensor has %d elements, %d groups "
                      "need %d" % (st.counts[scale], groups, groups))


def step12_trailing(st):
    end = st.s + st.block
    if st.standalone and end != st.n:
        raise err("TRAILING", end, "%d bytes follow the directory" % (st.n - end))
    if st.max_copy is not None:
        for i, dsc in enumerate(st.descs):
            if dsc[W.I_BYTE_LENGTH] > st.max_copy:
                raise err("LIMIT", st.d(i) + W.D_BYTE_LENGTH, "payload of %d bytes is above the "
                          "copy cap max_copy_bytes=%d" % (dsc[W.I_BYTE_LENGTH], st.max_copy))
    return end


def make_table(st):
    """One row per descriptor, in the layout the kernel interface documents."""
    return [(dsc[W.I_DTYPE], dsc[W.I_SHAPE:W.I_SHAPE + dsc[W.I_RANK]], st.names[i],
             st.layouts[i], dsc[W.I_BLOCK_SIZE], dsc[W.I_QUANT_SCHEME], dsc[W.I_QUANT_AXIS],
             dsc[W.I_GROUP_SIZE], dsc[W.I_SCALE_INDEX], dsc[W.I_OUTER_INDEX],
             dsc[W.I_BYTE_OFFSET], dsc[W.I_BYTE_LENGTH]) for i, dsc in enumerate(st.descs)]


def check_header(buf, start, max_count, max_bytes, length=None, wide=False):
    """Steps 1 to 6 only, from the header at ``start`` and the length of
    ``buf`` (or ``length``, when ``buf`` holds only the header): returns the
    payload base (from ``start``), so a reader that fetches the table knows,
    before it asks, that the table is within the caps and the buffer."""
    if start < 0 or max_count < 0 or max_bytes < 0:
        raise ValueError("start, max_count and max_bytes must be non-negative")
    st = Dir(buf, start, True, False, max_count, max_bytes, None, bool(wide))
    if length is not None:
        if not len(buf) <= length <= 0x7FFFFFFFFFFFFFFF:
            raise ValueError("length must be at least len(buf) and at most 2**63-1")
        st.n = length
        if len(buf) - start >= W.HEADER_SIZE:   # only the header is read
            st.have = length
    step2_envelope(st, *step1_magic(st))
    step3_caps(st)
    step4_arithmetic(st)
    step5_fits(st)
    step6_block(st)
    return st.base


def validate_directory_copy(buf, start, standalone, trusted, max_count, max_bytes,
                            length=None, wide=False):
    """Check the directory at ``start`` as validate_directory does, except the
    payload contents (left to check_payload); returns (end, payload_base,
    count, named, table_bytes, names): the checked copy of the descriptors and
    the name heap, from which rows are built on demand (kiln._rows.LazyRows),
    and every name (bytes, or None when unnamed).  The descriptors are packed
    again from the values the steps checked, never read again from ``buf``.

    ``length``: the bounds are those of a buffer of this many bytes, of which
    ``buf`` holds only the head (at least through the payload base, else
    ``EOF``); no payload byte is read."""
    if start < 0 or max_count < 0 or max_bytes < 0:
        raise ValueError("start, max_count and max_bytes must be non-negative")
    if length is not None and not len(buf) <= length <= 0x7FFFFFFFFFFFFFFF:
        raise ValueError("length must be at least len(buf) and at most 2**63-1")
    st = _checked(buf, start, standalone, trusted, max_count, max_bytes, None, False, length,
                  wide)
    end = step12_trailing(st)
    # the table as checked: the private copy every step's tuples were unpacked
    # from (a wide one's name fields where the file has them)
    blob = st.raw + st.heap
    return end, st.base, st.count, bool(st.named), blob, list(st.names)


def _checked(buf, start, standalone, trusted, max_count, max_bytes, max_copy, contents=True,
             length=None, wide=False):
    st = Dir(buf, start, standalone, trusted, max_count, max_bytes, max_copy, bool(wide))
    st.contents = contents
    if length is not None:
        st.n = length
    step2_envelope(st, *step1_magic(st))
    step3_caps(st)
    step4_arithmetic(st)
    step5_fits(st)
    step6_block(st)
    step7_padding(st)
    read_table(st)   # nothing is built per descriptor before the directory is known to fit
    step8a_reserved(st)
    step8b_heap(st)
    step8c_utf8(st)
    step8d_duplicates(st)
    step9_descriptors(st)
    step9_overlaps(st)
    step10_placement(st)
    step11a_payload_bytes(st)
    step11b_quantization(st)
    return st


def validate_directory(buf, start, standalone, trusted, max_count, max_bytes, max_copy=None,
                       wide=False):
    """Check the directory at ``start`` step by step; returns (end, payload_base, table).

    ``max_copy``: when not None, a payload longer than this is LIMIT (a cap
    for payloads the caller will copy)."""
    if start < 0 or max_count < 0 or max_bytes < 0 or (max_copy is not None and max_copy < 0):
        raise ValueError("start, max_count, max_bytes and max_copy must be non-negative")
    st = _checked(buf, start, standalone, trusted, max_count, max_bytes, max_copy, wide=wide)
    end = step12_trailing(st)
    return end, st.base, make_table(st)
