/* kiln_endian.h: host byte order, little-endian loads/stores, byte swaps
 * and overflow-checked u64 arithmetic for the compiled kernels.
 *
 * The wire format is little-endian.  KILN_HOST_BIG_ENDIAN is decided here,
 * at compile time, from the compiler's byte-order macros; the kernels never
 * look at sys.byteorder.
 */
#ifndef KILN_ENDIAN_H
#define KILN_ENDIAN_H

#include <stdint.h>
#include <string.h>

#if defined(__BYTE_ORDER__) && defined(__ORDER_BIG_ENDIAN__) && \
    defined(__ORDER_LITTLE_ENDIAN__)
#  if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
#    define KILN_HOST_BIG_ENDIAN 1
#  elif __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#    define KILN_HOST_BIG_ENDIAN 0
#  else
#    error "kiln: mixed-endian hosts are not supported"
#  endif
#elif defined(_WIN32) || defined(__LITTLE_ENDIAN__) || defined(__x86_64__) || \
      defined(__i386__) || defined(_M_X64) || defined(_M_IX86) || \
      defined(_M_ARM64) || defined(_M_ARM) || defined(__AARCH64EL__) || \
      defined(__ARMEL__) || defined(__MIPSEL__)
#  define KILN_HOST_BIG_ENDIAN 0
#elif defined(__BIG_ENDIAN__) || defined(__AARCH64EB__) || defined(__ARMEB__) || \
      defined(__MIPSEB__) || defined(__sparc__) || defined(__s390__)
#  define KILN_HOST_BIG_ENDIAN 1
#else
#  error "kiln: cannot determine the host byte order"
#endif

#if defined(_MSC_VER) && !defined(__clang__)
#  include <stdlib.h>
#  define kiln_bswap16(x) _byteswap_ushort(x)
#  define kiln_bswap32(x) _byteswap_ulong(x)
#  define kiln_bswap64(x) _byteswap_uint64(x)
#  define KILN_UNLIKELY(x) (x)
#else
#  define kiln_bswap16(x) __builtin_bswap16(x)
#  define kiln_bswap32(x) __builtin_bswap32(x)
#  define kiln_bswap64(x) __builtin_bswap64(x)
#  define KILN_UNLIKELY(x) __builtin_expect(!!(x), 0)
#endif

#if KILN_HOST_BIG_ENDIAN
#  define KILN_LE16(x) kiln_bswap16(x)
#  define KILN_LE32(x) kiln_bswap32(x)
#  define KILN_LE64(x) kiln_bswap64(x)
#else
#  define KILN_LE16(x) (x)
#  define KILN_LE32(x) (x)
#  define KILN_LE64(x) (x)
#endif

/* little-endian loads from unaligned memory */
static inline uint16_t kiln_ld_u16(const void *p) {
    uint16_t v; memcpy(&v, p, 2); return (uint16_t)KILN_LE16(v);
}
static inline uint32_t kiln_ld_u32(const void *p) {
    uint32_t v; memcpy(&v, p, 4); return (uint32_t)KILN_LE32(v);
}
static inline uint64_t kiln_ld_u64(const void *p) {
    uint64_t v; memcpy(&v, p, 8); return (uint64_t)KILN_LE64(v);
}
static inline float kiln_ld_f32(const void *p) {
    uint32_t v = kiln_ld_u32(p); float f; memcpy(&f, &v, 4); return f;
}
static inline double kiln_ld_f64(const void *p) {
    uint64_t v = kiln_ld_u64(p); double f; memcpy(&f, &v, 8); return f;
}

/* little-endian stores to unaligned memory */
static inline void kiln_st_u16(void *p, uint16_t v) {
    v = (uint16_t)KILN_LE16(v); memcpy(p, &v, 2);
}
static inline void kiln_st_u32(void *p, uint32_t v) {
    v = (uint32_t)KILN_LE32(v); memcpy(p, &v, 4);
}
static inline void kiln_st_u64(void *p, uint64_t v) {
    v = (uint64_t)KILN_LE64(v); memcpy(p, &v, 8);
}
static inline void kiln_st_f32(void *p, float f) {
    uint32_t v; memcpy(&v, &f, 4); kiln_st_u32(p, v);
}
static inline void kiln_st_f64(void *p, double f) {
    uint64_t v; memcpy(&v, &f, 8); kiln_st_u64(p, v);
}

/* copy n items of width w (1, 2, 4 or 8 bytes), reversing each item's bytes */
static inline void kiln_swap_copy(void *dst, const void *src, size_t n, int w) {
    unsigned char *d = (unsigned char *)dst;
    const unsigned char *s = (const unsigned char *)src;
    size_t i;
    switch (w) {
    case 2:
        for (i = 0; i < n; i++) {
            uint16_t v; memcpy(&v, s + 2 * i, 2); v = kiln_bswap16(v); memcpy(d + 2 * i, &v, 2);
        }
        break;
    case 4:
        for (i = 0; i < n; i++) {
            uint32_t v; memcpy(&v, s + 4 * i, 4); v = kiln_bswap32(v); memcpy(d + 4 * i, &v, 4);
        }
        break;
    case 8:
        for (i = 0; i < n; i++) {
            uint64_t v; memcpy(&v, s + 8 * i, 8); v = kiln_bswap64(v); memcpy(d + 8 * i, &v, 8);
        }
        break;
    default:
        if (n) memcpy(d, s, n * (size_t)w);
        break;
    }
}

/* overflow-checked u64 arithmetic: return 1 on overflow (and leave *r unspecified) */
static inline int kiln_mul_u64(uint64_t a, uint64_t b, uint64_t *r) {
#if defined(__GNUC__) || defined(__clang__)
    return __builtin_mul_overflow(a, b, r);
#else
    if (a != 0 && b > UINT64_MAX / a) return 1;
    *r = a * b;
    return 0;
#endif
}
static inline int kiln_add_u64(uint64_t a, uint64_t b, uint64_t *r) {
#if defined(__GNUC__) || defined(__clang__)
    return __builtin_add_overflow(a, b, r);
#else
    if (b > UINT64_MAX - a) return 1;
    *r = a + b;
    return 0;
#endif
}

/* index of the first byte above 1 in p[0:n], or -1; *value gets that byte.
   Every byte is read once (a word, then its local copy), so a buffer another
   thread or process changes cannot make the reported byte differ from the
   one that failed. */
static inline int64_t kiln_first_bad_bool(const unsigned char *p, size_t n,
                                          unsigned char *value) {
    size_t i = 0, k;
    for (; i + 8 <= n; i += 8) {
        uint64_t v; unsigned char b[8];
        memcpy(&v, p + i, 8);
        if (v & UINT64_C(0xFEFEFEFEFEFEFEFE)) {
            memcpy(b, &v, 8);
            for (k = 0; k < 8; k++) {
                if (b[k] > 1) { *value = b[k]; return (int64_t)(i + k); }
            }
        }
    }
    for (; i < n; i++) {
        unsigned char c = p[i];
        if (c > 1) { *value = c; return (int64_t)i; }
    }
    return -1;
}

/* strict UTF-8 (RFC 3629 / Unicode table 3-7): the offset of the lead byte of
 * the first ill-formed sequence (what CPython reports as
 * UnicodeDecodeError.start), or -1 when p[0:n] is well formed */
static inline int64_t kiln_utf8_first_error(const unsigned char *p, size_t n) {
    size_t i = 0;
    while (i < n) {
        unsigned char c = p[i];
        if (c < 0x80) {
            /* ASCII run, 8 at a time */
            while (i + 8 <= n) {
                uint64_t v; memcpy(&v, p + i, 8);
                if (v & UINT64_C(0x8080808080808080)) break;
                i += 8;
            }
            while (i < n && p[i] < 0x80) i++;
            continue;
        }
        if (c >= 0xC2 && c <= 0xDF) {
            if (i + 1 >= n || (p[i + 1] & 0xC0) != 0x80) return (int64_t)i;
            i += 2;
        } else if (c >= 0xE0 && c <= 0xEF) {
            unsigned char lo = 0x80, hi = 0xBF;
            if (c == 0xE0) lo = 0xA0;
            else if (c == 0xED) hi = 0x9F;
            if (i + 1 >= n || p[i + 1] < lo || p[i + 1] > hi) return (int64_t)i;
            if (i + 2 >= n || (p[i + 2] & 0xC0) != 0x80) return (int64_t)i;
            i += 3;
        } else if (c >= 0xF0 && c <= 0xF4) {
            unsigned char lo = 0x80, hi = 0xBF;
            if (c == 0xF0) lo = 0x90;
            else if (c == 0xF4) hi = 0x8F;
            if (i + 1 >= n || p[i + 1] < lo || p[i + 1] > hi) return (int64_t)i;
            if (i + 2 >= n || (p[i + 2] & 0xC0) != 0x80) return (int64_t)i;
            if (i + 3 >= n || (p[i + 3] & 0xC0) != 0x80) return (int64_t)i;
            i += 4;
        } else {
            return (int64_t)i;
        }
    }
    return -1;
}

#endif /* KILN_ENDIAN_H */
