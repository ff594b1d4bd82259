# The quantization fields of one descriptor (spec section 7, step 11b): the
# helpers of directory.pxi's step11b_quantization, kept here so that file holds
# the steps themselves.  Their twins are in kiln/_kernels_py/directory.py.


cdef int scheme0_fields(Dir *st, uint64_t i) except -1:
    cdef const uint8_t *dp = desc(st, i)
    cdef Py_ssize_t d = dpos(st, i)
    if kiln_ld_u16(dp + D_QUANT_AXIS) != NO_AXIS:
        kfail("TYPE", d + D_QUANT_AXIS, "quant axis set without a scheme")
    if kiln_ld_u32(dp + D_GROUP_SIZE):
        kfail("TYPE", d + D_GROUP_SIZE, "group size set without a scheme")
    if kiln_ld_u32(dp + D_SCALE_INDEX) != NO_INDEX:
        kfail("TYPE", d + D_SCALE_INDEX, "scale index set without a scheme")
    if kiln_ld_u32(dp + D_OUTER_INDEX) != NO_INDEX:
        kfail("TYPE", d + D_OUTER_INDEX, "outer index set without a scheme")
    return 0


cdef int quantization(Dir *st, uint64_t i) except -1:
    cdef const uint8_t *dp = desc(st, i)
    cdef Py_ssize_t d = dpos(st, i)
    cdef uint64_t scheme = kiln_ld_u16(dp + D_QUANT_SCHEME), axis = kiln_ld_u16(dp + D_QUANT_AXIS)
    cdef uint64_t group = kiln_ld_u32(dp + D_GROUP_SIZE), scale = kiln_ld_u32(dp + D_SCALE_INDEX)
    cdef uint64_t outer = kiln_ld_u32(dp + D_OUTER_INDEX), rank = dp[D_RANK]
    if scheme > QUANT_SCHEMES:
        kfail("TYPE", d + D_QUANT_SCHEME, "quant scheme %d is not 0, 1 or 2" % scheme)
    if scheme == 0:
        return scheme0_fields(st, i)
    if rank == 0 or axis >= rank:
        kfail("TYPE", d + D_QUANT_AXIS, "quant axis %d is not below rank %d" % (axis, rank))
    if group == 0:
        kfail("TYPE", d + D_GROUP_SIZE, "group size is 0")
    if scale >= st.count or scale == i:
        kfail("TYPE", d + D_SCALE_INDEX, "scale index %d does not name another tensor" % scale)
    if kiln_ld_u16(desc(st, scale) + D_QUANT_SCHEME) != 0:
        kfail("TYPE", d + D_SCALE_INDEX, "scale tensor %d is itself quantized (a chain)" % scale)
    if scheme == 1:
        if outer != NO_INDEX:
            kfail("TYPE", d + D_OUTER_INDEX, "outer index set on scheme 1")
    else:
        if outer >= st.count or outer == i or outer == scale:
            kfail("TYPE", d + D_OUTER_INDEX, "outer index %d does not name a third tensor"
                  % outer)
        if kiln_ld_u16(desc(st, outer) + D_DTYPE) != DTYPE_F32 or \
                kiln_ld_u16(desc(st, outer) + D_QUANT_SCHEME) != 0 or st.counts[outer] != 1:
            kfail("TYPE", d + D_OUTER_INDEX, "outer tensor %d is not one unquantized f32" % outer)
    if not st.trusted:
        scale_groups(st, i, axis, group, rank, scale)
    return 0


cdef int scale_groups(Dir *st, uint64_t i, uint64_t axis, uint64_t group, uint64_t rank,
                      uint64_t scale) except -1:
    """The scale tensor has one element per group (the check a trusted reader skips)."""
    cdef const uint8_t *dp = desc(st, i)
    cdef uint64_t dim = kiln_ld_u64(dp + D_SHAPE + 8 * axis)
    cdef uint64_t groups = dim // group + (1 if dim % group else 0)
    cdef bint zero = groups == 0, big = False
    cdef Py_ssize_t k
    for k in range(<Py_ssize_t>rank):
        if k != <Py_ssize_t>axis:
            dim = kiln_ld_u64(dp + D_SHAPE + 8 * k)
            if dim == 0:
                zero = True
            elif not big and kiln_mul_u64(groups, dim, &groups):
                big = True
    if zero:
        groups = 0
        big = False
    if big or st.counts[scale] != groups:
        kfail("TYPE", dpos(st, i) + D_SCALE_INDEX, "scale tensor has %d elements, %d groups "
              "need %d" % (st.counts[scale], groups, groups))
    return 0
