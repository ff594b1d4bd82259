# Tensor directory validation, one function per check step of spec section 7.
# The twin of kiln/_kernels_py/directory.py: the same step functions under the
# same names.  The header is copied into the state, and the descriptors and
# the name heap into private memory (read_table), before any of their fields
# is checked: every later step reads that copy, so a buffer another process or
# thread changes meanwhile cannot make a checked field differ from a used one.
# Payload bytes (padding, gaps, bools, packed tails) are read from the buffer,
# once each, at offsets the copy has bounded.  The payload contents (gaps,
# bools, packed tails) are checked here only when the whole block is asked
# for (validate_directory); validate_directory_copy (a lazy open) leaves them
# to check_payload, called by the file layer for one tensor when it is read.

cdef struct NameRef:
    const uint8_t *p
    uint32_t ln
    uint32_t idx


cdef int cmp_nameref(const void *a, const void *b) noexcept nogil:
    cdef const NameRef *x = <const NameRef *>a
    cdef const NameRef *y = <const NameRef *>b
    return cmp_bytes_then_index(x.p, x.ln, x.idx, y.p, y.ln, y.idx)


cdef struct Range:
    uint64_t off
    uint64_t idx


cdef int cmp_range(const void *a, const void *b) noexcept nogil:
    cdef const Range *x = <const Range *>a
    cdef const Range *y = <const Range *>b
    if x.off != y.off:
        return -1 if x.off < y.off else 1
    return -1 if x.idx < y.idx else (1 if x.idx > y.idx else 0)


cdef struct Dir:
    const uint8_t *b        # the caller's buffer
    Py_ssize_t n            # the length the directory's bounds are checked against
    Py_ssize_t have         # the bytes of b that may be read (n, or a head: see vdir)
    Py_ssize_t s            # where the directory starts
    bint standalone
    bint trusted
    uint64_t max_copy       # copies' cap (U64_MAX: none)
    uint64_t max_count
    uint64_t max_bytes
    uint8_t hdr[HEADER_SIZE]   # the header, copied once
    uint8_t *priv           # descriptors then name heap, copied once (owned), or NULL
    const uint8_t *tab      # the descriptors then the heap: priv, or in b when stable
    const uint8_t *heap     # tab + count * DESC_SIZE
    uint64_t *counts        # element count per descriptor (owned)
    uint8_t version
    uint8_t flags
    uint64_t count
    uint64_t name_bytes
    uint64_t payload_bytes
    uint64_t directory_bytes
    uint64_t want
    uint64_t base
    uint64_t block
    Py_ssize_t pb           # absolute offset of the payload base
    Py_ssize_t heap0        # absolute offset of the name heap
    bint named
    bint contents           # check the payload contents too (steps 10 and 11a)
    bint wide_ok            # a tensor file: flag bit 2 (wide name fields) allowed
    bint wide               # the name fields are u32 at d+112..d+127 (spec 12.3)
    Py_ssize_t at_name      # where a descriptor's name offset is (for errors)
    Py_ssize_t at_layout    # where its layout offset is
    uint64_t no_name        # the "no name" offset


cdef inline uint64_t name_off(Dir *st, const uint8_t *dp) noexcept:
    return kiln_ld_u32(dp + D_WNAME_OFF) if st.wide else kiln_ld_u16(dp + D_NAME_OFF)


cdef inline uint64_t name_len(Dir *st, const uint8_t *dp) noexcept:
    return kiln_ld_u32(dp + D_WNAME_LEN) if st.wide else kiln_ld_u16(dp + D_NAME_LEN)


cdef inline uint64_t layout_off(Dir *st, const uint8_t *dp) noexcept:
    return kiln_ld_u32(dp + D_WLAYOUT_OFF) if st.wide else kiln_ld_u16(dp + D_LAYOUT_OFF)


cdef inline uint64_t layout_len(Dir *st, const uint8_t *dp) noexcept:
    return kiln_ld_u32(dp + D_WLAYOUT_LEN) if st.wide else kiln_ld_u16(dp + D_LAYOUT_LEN)


cdef void name_fields(Dir *st) noexcept:
    """Where this directory's name fields are: u16 at d+4..d+11, or u32 at
    d+112..d+127 with the wide flag (spec 12.3)."""
    st.wide = (st.flags & FLAG_WIDE) != 0
    st.at_name = D_WNAME_OFF if st.wide else D_NAME_OFF
    st.at_layout = D_WLAYOUT_OFF if st.wide else D_LAYOUT_OFF
    st.no_name = NO_NAME_WIDE if st.wide else NO_NAME


cdef inline const uint8_t *desc(Dir *st, uint64_t i) noexcept:
    """Descriptor ``i`` in the private copy (or the unchangeable buffer)."""
    return st.tab + DESC_SIZE * i


cdef inline Py_ssize_t dpos(Dir *st, uint64_t i) noexcept:
    """The absolute offset of descriptor ``i`` in the buffer (for errors)."""
    return st.s + HEADER_SIZE + DESC_SIZE * <Py_ssize_t>i


cdef int step1_magic(Dir *st) except -1:
    cdef Py_ssize_t s = st.s, avail = st.have - st.s
    if avail < 4:
        kfail("EOF", s, "a directory needs 4 bytes for its magic, %d remain" % max(avail, 0))
    if memcmp(st.b + s, b"KLNT", 4) != 0:
        kfail("FRAME", s, "directory magic is %r, not b'KLNT'" % ((<const char *>st.b + s)[:4],))
    if avail < HEADER_SIZE:
        kfail("EOF", s, "a directory header needs 64 bytes, %d remain" % avail)
    memcpy(st.hdr, st.b + s, HEADER_SIZE)
    st.version = st.hdr[H_VERSION]
    st.flags = st.hdr[H_FLAGS]
    st.count = kiln_ld_u32(st.hdr + H_COUNT)
    st.name_bytes = kiln_ld_u32(st.hdr + H_NAME_BYTES)
    st.payload_bytes = kiln_ld_u64(st.hdr + H_PAYLOAD_BYTES)
    st.directory_bytes = kiln_ld_u64(st.hdr + H_DIRECTORY_BYTES)
    return 0


cdef int step2_envelope(Dir *st) except -1:
    cdef Py_ssize_t k, s = st.s
    cdef uint8_t known = FLAG_NAMED | FLAG_LITTLE | (FLAG_WIDE if st.wide_ok else 0)
    if st.version != DIR_VERSION:
        kfail("FRAME", s + H_VERSION, "directory version is %d, not 2" % st.version)
    if st.flags & ~known:
        kfail("FRAME", s + H_FLAGS, "unknown directory flag bits %#x%s" % (
            st.flags & ~3, _W.WIDE_HINT if (st.flags & ~known) == FLAG_WIDE else ""))
    if not st.flags & FLAG_LITTLE:
        kfail("FRAME", s + H_FLAGS, "the little-endian flag is clear")
    name_fields(st)
    for k in range(H_RESERVED, H_COUNT):
        if st.hdr[k]:
            kfail("FRAME", s + k, "reserved header byte is not 0")
    for k in range(H_RESERVED32, HEADER_SIZE):
        if st.hdr[k]:
            kfail("FRAME", s + k, "reserved header byte is not 0")
    return 0


cdef int step3_caps(Dir *st) except -1:
    if st.count > st.max_count:
        kfail("LIMIT", st.s + H_COUNT, "tensor count %d is above the cap max_count=%d"
              % (st.count, st.max_count))
    if st.name_bytes > st.max_bytes:
        kfail("LIMIT", st.s + H_NAME_BYTES, "name heap of %d bytes is above the cap "
              "max_bytes=%d" % (st.name_bytes, st.max_bytes))
    return 0


cdef int step4_arithmetic(Dir *st) except -1:
    # count < 2**32 and name_bytes < 2**32, so the sum cannot overflow u64
    st.want = st.count * DESC_SIZE + st.name_bytes
    if st.directory_bytes != st.want:
        kfail("TYPE", st.s + H_DIRECTORY_BYTES, "directory_bytes is %d, count and heap give %d"
              % (st.directory_bytes, st.want))
    return 0


cdef int step5_fits(Dir *st) except -1:
    cdef Py_ssize_t avail = st.n - st.s
    if HEADER_SIZE + st.want > <uint64_t>avail:
        kfail("EOF", st.s + H_COUNT, "%d descriptors and %d heap bytes need %d bytes, %d remain"
              % (st.count, st.name_bytes, HEADER_SIZE + st.want, avail))
    return 0


cdef int step6_block(Dir *st) except -1:
    cdef Py_ssize_t avail = st.n - st.s
    st.base = dir_align(HEADER_SIZE + st.want)
    if kiln_add_u64(st.base, st.payload_bytes, &st.block):
        kfail("LIMIT", st.s + H_PAYLOAD_BYTES, "payload_base + payload_bytes overflows u64")
    if st.block > <uint64_t>avail:
        kfail("EOF", st.s + H_PAYLOAD_BYTES, "the block needs %d bytes, %d remain"
              % (st.block, avail))
    st.pb = st.s + <Py_ssize_t>st.base
    st.heap0 = st.s + HEADER_SIZE + DESC_SIZE * <Py_ssize_t>st.count
    if st.pb > st.have:   # only a head-only check (have < n): its buffer ends before the payloads
        kfail("EOF", st.s + H_COUNT, "the table and its padding need %d bytes, %d were given"
              % (st.base, st.have - st.s))
    return 0


cdef int first_nonzero(Dir *st, Py_ssize_t a, Py_ssize_t e, str what) except -1:
    cdef Py_ssize_t k
    for k in range(a, e):
        if st.b[k]:
            kfail("TYPE", k, what)
    return 0


cdef int step7_padding(Dir *st) except -1:
    return first_nonzero(st, st.heap0 + <Py_ssize_t>st.name_bytes, st.pb,
                         "padding byte is not 0")


cdef int read_table(Dir *st, bint stable=False) except -1:
    """Copy the descriptors and the heap (bounded by step 5) once, after step 7,
    so every step and the rows read the bytes that were checked.  ``stable``:
    the buffer cannot change (exact bytes), so they are read where they are."""
    st.counts = <uint64_t *>PyMem_Malloc(sizeof(uint64_t) * (st.count + 1))
    if st.counts == NULL:
        raise MemoryError()
    if stable:
        st.tab = st.b + st.s + HEADER_SIZE
    else:
        st.priv = <uint8_t *>PyMem_Malloc(<size_t>st.want + 1)
        if st.priv == NULL:
            raise MemoryError()
        memcpy(st.priv, st.b + st.s + HEADER_SIZE, <size_t>st.want)
        st.tab = st.priv
    st.heap = st.tab + DESC_SIZE * st.count
    return 0


cdef int step8a_reserved(Dir *st) except -1:
    cdef uint64_t i
    cdef Py_ssize_t k
    cdef const uint8_t *dp
    for i in range(st.count):
        dp = desc(st, i)
        if dp[D_RESERVED]:
            kfail("FRAME", dpos(st, i) + D_RESERVED, "reserved descriptor byte is not 0")
        if st.wide:   # bytes 4..11 (the u16 name fields) are reserved
            if kiln_ld_u64(dp + D_NARROW):
                for k in range(D_NARROW, D_NARROW + 8):
                    if dp[k]:
                        kfail("FRAME", dpos(st, i) + k, "reserved descriptor byte is not 0")
            continue
        # (the 16 reserved bytes as two words; the first byte set is named)
        if DESC_SIZE - D_RESERVED16 != 16 or \
                kiln_ld_u64(dp + D_RESERVED16) | kiln_ld_u64(dp + D_RESERVED16 + 8):
            for k in range(D_RESERVED16, DESC_SIZE):
                if dp[k]:
                    kfail("FRAME", dpos(st, i) + k, "reserved descriptor byte is not 0")
    return 0


cdef int step8b_heap(Dir *st) except -1:
    cdef uint64_t i, cursor = 0, noff, nlen, loff, llen
    cdef const uint8_t *dp
    cdef bint fits = True   # every offset and length within u16 (wide: not canonical)
    st.named = (st.flags & FLAG_NAMED) != 0
    if st.named and st.count == 0:
        kfail("TYPE", st.s + H_FLAGS, "name flag set on an empty directory")
    for i in range(st.count):   # the flag pass over every descriptor, then the walk
        dp = desc(st, i)
        nlen = name_len(st, dp)
        if not st.named:
            if nlen != 0 or name_off(st, dp) != st.no_name:
                kfail("TYPE", dpos(st, i) + st.at_name,
                      "tensor has a name but the name flag is clear")
        elif nlen == 0:
            kfail("TYPE", dpos(st, i) + st.at_name, "tensor has no name but the name flag is set")
    for i in range(st.count if st.named else 0):
        dp = desc(st, i)
        noff = name_off(st, dp)
        nlen = name_len(st, dp)
        if noff != cursor or cursor + nlen > st.name_bytes:
            kfail("TYPE", dpos(st, i) + st.at_name, "name slice (%d, %d) is not the next %d "
                  "heap bytes" % (noff, nlen, nlen))
        if noff > U16_MAX or nlen > U16_MAX:
            fits = False
        cursor += nlen
    for i in range(st.count):
        dp = desc(st, i)
        loff = layout_off(st, dp)
        llen = layout_len(st, dp)
        if llen == 0:
            if loff != st.no_name:
                kfail("TYPE", dpos(st, i) + st.at_layout, "empty layout name with offset %d"
                      % loff)
            continue
        if loff != cursor or cursor + llen > st.name_bytes:
            kfail("TYPE", dpos(st, i) + st.at_layout, "layout slice (%d, %d) is not the next "
                  "heap bytes" % (loff, llen))
        if loff > U16_MAX or llen > U16_MAX:
            fits = False
        cursor += llen
    if cursor != st.name_bytes:
        kfail("TYPE", st.s + H_NAME_BYTES, "name heap has %d bytes, names use %d"
              % (st.name_bytes, cursor))
    if st.wide and fits:
        kfail("TYPE", st.s + H_FLAGS, "wide name fields, but every name offset and length "
              "fits the u16 fields")
    return 0


cdef int step8c_utf8(Dir *st) except -1:
    cdef uint64_t i, off
    cdef int64_t bad
    cdef const uint8_t *dp
    if st.trusted:
        return 0
    if st.named:
        for i in range(st.count):
            dp = desc(st, i)
            off = name_off(st, dp)
            bad = kiln_utf8_first_error(st.heap + off, name_len(st, dp))
            if bad >= 0:
                kfail("UTF8", st.heap0 + <Py_ssize_t>off + bad, "invalid UTF-8 in a tensor name")
    for i in range(st.count):
        dp = desc(st, i)
        if layout_len(st, dp):
            off = layout_off(st, dp)
            bad = kiln_utf8_first_error(st.heap + off, layout_len(st, dp))
            if bad >= 0:
                kfail("UTF8", st.heap0 + <Py_ssize_t>off + bad, "invalid UTF-8 in a layout name")
    return 0


cdef bint names_ascend(Dir *st) noexcept:
    """Are the names in strictly ascending byte order (as an encoder writes a
    mapping)?  Then none repeats, and the sort is not needed."""
    cdef uint64_t i
    cdef const uint8_t *dp = desc(st, 0)
    cdef const uint8_t *p = st.heap + name_off(st, dp)
    cdef const uint8_t *q
    cdef Py_ssize_t ln = name_len(st, dp), lq
    for i in range(1, st.count):
        dp = desc(st, i)
        q = st.heap + name_off(st, dp)
        lq = name_len(st, dp)
        if cmp_bytes_then_index(p, ln, 0, q, lq, 1) >= 0 or (ln == lq and memcmp(p, q, ln) == 0):
            return False
        p = q
        ln = lq
    return True


cdef int step8d_duplicates(Dir *st) except -1:
    cdef NameRef *refs = NULL
    cdef uint64_t i, j
    cdef const uint8_t *dp
    if not st.named or st.count < 2 or names_ascend(st):
        return 0
    refs = <NameRef *>PyMem_Malloc(sizeof(NameRef) * st.count)
    if refs == NULL:
        raise MemoryError()
    try:
        for i in range(st.count):
            dp = desc(st, i)
            refs[i].p = st.heap + name_off(st, dp)
            refs[i].ln = <uint32_t>name_len(st, dp)
            refs[i].idx = <uint32_t>i
        qsort(refs, st.count, sizeof(NameRef), cmp_nameref)
        j = st.count
        for i in range(1, st.count):
            if refs[i].ln == refs[i - 1].ln and \
                    memcmp(refs[i].p, refs[i - 1].p, refs[i].ln) == 0 and refs[i].idx < j:
                j = refs[i].idx
        if j < st.count:
            dp = desc(st, j)
            nm = (<const char *>st.heap + name_off(st, dp))[:name_len(st, dp)]
            kfail("TYPE", dpos(st, j) + st.at_name, "tensor name %r repeats" % nm)
    finally:
        PyMem_Free(refs)
    return 0


cdef int step9_descriptors(Dir *st) except -1:
    cdef uint64_t i
    for i in range(st.count):
        st.counts[i] = descriptor(st, i)
    return 0


cdef uint64_t element_count(Dir *st, uint64_t i, uint64_t rank) except? 0xFFFFFFFFFFFFFFFF:
    """The product of the dimensions: 0 when one is 0, LIMIT when it overflows u64."""
    cdef const uint8_t *dp = desc(st, i)
    cdef uint64_t ne = 1
    cdef Py_ssize_t k
    for k in range(<Py_ssize_t>rank):
        if kiln_ld_u64(dp + D_SHAPE + 8 * k) == 0:
            return 0    # a zero dimension makes the exact product 0
    for k in range(<Py_ssize_t>rank):
        if kiln_mul_u64(ne, kiln_ld_u64(dp + D_SHAPE + 8 * k), &ne):
            kfail("LIMIT", dpos(st, i) + D_SHAPE, "element count overflows u64")
    return ne


cdef uint64_t descriptor(Dir *st, uint64_t i) except? 0xFFFFFFFFFFFFFFFF:
    """Step 9 for one descriptor; returns its element count."""
    cdef const uint8_t *dp = desc(st, i)
    cdef Py_ssize_t d = dpos(st, i), k
    cdef uint64_t code = kiln_ld_u16(dp + D_DTYPE), rank = dp[D_RANK], ne, need, off, e
    cdef uint64_t block_size = kiln_ld_u32(dp + D_BLOCK_SIZE)
    cdef uint64_t blen = kiln_ld_u64(dp + D_BYTE_LENGTH)
    cdef uint64_t llen = layout_len(st, dp)
    cdef bint opaque = OPAQUE_MIN <= code <= OPAQUE_MAX
    if not opaque and not (1 <= code <= DTYPE_MAX):
        kfail("TYPE", d + D_DTYPE, "dtype code %d is not defined" % code)
    if rank > MAX_RANK:
        kfail("TYPE", d + D_RANK, "rank %d is above 8" % rank)
    for k in range(<Py_ssize_t>rank, MAX_RANK):
        if kiln_ld_u64(dp + D_SHAPE + 8 * k):
            kfail("TYPE", d + D_SHAPE + 8 * k, "shape slot %d past rank %d is not 0" % (k, rank))
    ne = element_count(st, i, rank)
    if opaque:
        if llen == 0:
            kfail("TYPE", d + st.at_layout, "opaque dtype %d needs a layout name" % code)
        if block_size == 0:
            kfail("TYPE", d + D_BLOCK_SIZE, "opaque dtype %d needs a block size" % code)
        if blen % block_size:
            kfail("TYPE", d + D_BYTE_LENGTH, "byte length %d is not a multiple of block size %d"
                  % (blen, block_size))
    else:
        if block_size:
            kfail("TYPE", d + D_BLOCK_SIZE, "block size %d on a non-opaque dtype" % block_size)
        if llen:
            kfail("TYPE", d + st.at_layout, "layout name on a non-opaque dtype")
        if PACKED[code]:
            need = ne // 2 + (ne & 1)
        elif kiln_mul_u64(ne, DW[code], &need):
            kfail("LIMIT", d + D_BYTE_LENGTH, "byte length of %d elements overflows u64" % ne)
        if blen != need:
            kfail("TYPE", d + D_BYTE_LENGTH, "byte length is %d, %d elements of %s need %d"
                  % (blen, ne, _W.DTYPES[code][0], need))
    off = kiln_ld_u64(dp + D_BYTE_OFFSET)
    if kiln_add_u64(off, blen, &e):
        kfail("LIMIT", d + D_BYTE_OFFSET, "payload range end overflows u64")
    if e > st.payload_bytes:
        kfail("TYPE", d + D_BYTE_OFFSET, "payload range [%d, %d) is past payload_bytes %d"
              % (off, e, st.payload_bytes))
    return ne


cdef bint ranges_ascend(Dir *st) noexcept:
    """Does each non-empty payload range start at or after the end of the one
    before it (as an encoder places them)?  Then none overlaps, and the sort
    is not needed."""
    cdef uint64_t i, off, blen, end = 0
    for i in range(st.count):
        blen = kiln_ld_u64(desc(st, i) + D_BYTE_LENGTH)
        if blen:
            off = kiln_ld_u64(desc(st, i) + D_BYTE_OFFSET)
            if off < end or kiln_add_u64(off, blen, &end):
                return False
    return True


cdef int step9_overlaps(Dir *st) except -1:
    cdef Range *ranges = NULL
    cdef uint64_t i, j, nr = 0, off, e, top_end = 0, top_i = 0
    cdef bint have_top = False
    for i in range(st.count):
        if kiln_ld_u64(desc(st, i) + D_BYTE_LENGTH):
            nr += 1
    if nr < 2 or ranges_ascend(st):
        return 0
    ranges = <Range *>PyMem_Malloc(sizeof(Range) * nr)
    if ranges == NULL:
        raise MemoryError()
    try:
        j = 0
        for i in range(st.count):
            if kiln_ld_u64(desc(st, i) + D_BYTE_LENGTH):
                ranges[j].off = kiln_ld_u64(desc(st, i) + D_BYTE_OFFSET)
                ranges[j].idx = i
                j += 1
        qsort(ranges, nr, sizeof(Range), cmp_range)
        for j in range(nr):
            off = ranges[j].off
            i = ranges[j].idx
            if have_top and off < top_end:
                kfail("TYPE", dpos(st, i if i > top_i else top_i) + D_BYTE_OFFSET,
                      "payload ranges of tensors %d and %d overlap"
                      % (i if i < top_i else top_i, i if i > top_i else top_i))
            e = off + kiln_ld_u64(desc(st, i) + D_BYTE_LENGTH)
            if not have_top or e > top_end:
                top_end = e
                top_i = i
                have_top = True
    finally:
        PyMem_Free(ranges)
    return 0


cdef int step10_placement(Dir *st) except -1:
    cdef uint64_t i, r = 0, want_off, off
    for i in range(st.count):
        want_off = dir_align(r)
        off = kiln_ld_u64(desc(st, i) + D_BYTE_OFFSET)
        if off != want_off:
            kfail("TYPE", dpos(st, i) + D_BYTE_OFFSET, "byte_offset %d is not the canonical %d"
                  % (off, want_off))
        r = want_off + kiln_ld_u64(desc(st, i) + D_BYTE_LENGTH)
    if st.payload_bytes != r:
        kfail("TYPE", st.s + H_PAYLOAD_BYTES, "payload_bytes is %d, the canonical end is %d"
              % (st.payload_bytes, r))
    if not st.contents:
        return 0   # the gaps: with their tensors (check_payload)
    r = 0
    for i in range(st.count):
        off = kiln_ld_u64(desc(st, i) + D_BYTE_OFFSET)
        if off > r:
            first_nonzero(st, st.pb + <Py_ssize_t>r, st.pb + <Py_ssize_t>off,
                          "alignment gap byte is not 0")
        r = off + kiln_ld_u64(desc(st, i) + D_BYTE_LENGTH)
    return 0


cdef int step11a_payload_bytes(Dir *st) except -1:
    cdef uint64_t i, blen
    cdef Py_ssize_t a
    if not st.contents:
        return 0   # with each tensor, when it is read (check_payload)
    for i in range(st.count):
        a = st.pb + <Py_ssize_t>kiln_ld_u64(desc(st, i) + D_BYTE_OFFSET)
        blen = kiln_ld_u64(desc(st, i) + D_BYTE_LENGTH)
        payload_contents(st.b + a, <Py_ssize_t>blen, 0, kiln_ld_u16(desc(st, i) + D_DTYPE),
                         st.counts[i], blen, a)
    return 0


cdef int payload_contents(const uint8_t *p, Py_ssize_t n, uint64_t at, uint64_t code,
                          uint64_t count, uint64_t nbytes, Py_ssize_t origin) except -1:
    """Check ``p[0:n]``, the bytes at positions ``at ..`` of one payload of
    ``nbytes`` bytes and the alignment gap after it (positions from
    ``nbytes`` on); errors at ``origin`` + position.  Each byte is read once."""
    cdef Py_ssize_t end = 0, k
    cdef int64_t bad
    cdef uint8_t v
    if at < nbytes:
        end = <Py_ssize_t>(nbytes - at) if nbytes - at < <uint64_t>n else n
    if code == DTYPE_BOOL:
        if end:
            bad = kiln_first_bad_bool(p, <size_t>end, &v)
            if bad >= 0:
                kfail("TYPE", origin + <Py_ssize_t>at + <Py_ssize_t>bad,
                      "bool byte is %d, not 0 or 1" % v)
    elif code <= DTYPE_MAX and PACKED[code] and count & 1 and at < nbytes and \
            nbytes <= at + <uint64_t>n:
        if p[nbytes - 1 - at] & 0xF0:
            kfail("TYPE", origin + <Py_ssize_t>nbytes - 1,
                  "high nibble of an odd packed tail is not 0")
    for k in range(end, n):
        if p[k]:
            kfail("TYPE", origin + <Py_ssize_t>at + k, "alignment gap byte is not 0")
    return 0


cdef int step11b_quantization(Dir *st) except -1:
    cdef uint64_t i
    for i in range(st.count):
        quantization(st, i)
    return 0


cdef Py_ssize_t step12_trailing(Dir *st) except -1:
    cdef Py_ssize_t end = st.s + <Py_ssize_t>st.block
    cdef uint64_t i, blen
    if st.standalone and end != st.n:
        kfail("TRAILING", end, "%d bytes follow the directory" % (st.n - end))
    if st.max_copy != U64_MAX:
        for i in range(st.count):
            blen = kiln_ld_u64(desc(st, i) + D_BYTE_LENGTH)
            if blen > st.max_copy:
                kfail("LIMIT", dpos(st, i) + D_BYTE_LENGTH, "payload of %d bytes is above the "
                      "copy cap max_copy_bytes=%d" % (blen, st.max_copy))
    return end
