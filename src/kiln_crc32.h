/* kiln_crc32.h: CRC-32 of zlib, gzip and PNG (reflected polynomial
 * 0xEDB88320, initial value and final xor 0xFFFFFFFF), the checksum of the
 * record container (spec/records.md).  kiln_crc32(c, p, n) gives the value
 * Python's zlib.crc32(bytes(p[:n]), c) gives, so a CRC can be continued
 * across pieces as with zlib.
 *
 * Table driven, eight bytes a step ("slicing by 8"), and carry-less
 * multiplication where the CPU has it (below): no library needed, so the
 * compiled kernels build wherever a C compiler does.  The tables are filled
 * once by kiln_crc32_init(), called when the module is imported.
 */
#ifndef KILN_CRC32_H
#define KILN_CRC32_H

#include <stddef.h>
#include <stdint.h>
#include "kiln_endian.h"

static uint32_t kiln_crc_tab[8][256];

static inline uint32_t kiln_crc32_table(uint32_t crc, const unsigned char *p, size_t n) {
    const uint32_t (*t)[256] = (const uint32_t (*)[256])kiln_crc_tab;
    uint32_t a, b;
    while (n >= 8) {
        a = kiln_ld_u32(p) ^ crc;       /* little-endian loads: the same on any host */
        b = kiln_ld_u32(p + 4);
        crc = t[7][a & 0xFFu] ^ t[6][(a >> 8) & 0xFFu] ^ t[5][(a >> 16) & 0xFFu] ^
              t[4][a >> 24] ^ t[3][b & 0xFFu] ^ t[2][(b >> 8) & 0xFFu] ^
              t[1][(b >> 16) & 0xFFu] ^ t[0][b >> 24];
        p += 8;
        n -= 8;
    }
    while (n--)
        crc = (crc >> 8) ^ t[0][(crc ^ *p++) & 0xFFu];
    return crc;
}

/* On x86 with PCLMULQDQ (most x86-64 CPUs since 2010), runs of 64 bytes and
 * more are folded with carry-less multiplications, the method of Gopal,
 * Ozturk et al., "Fast CRC Computation for Generic Polynomials Using
 * PCLMULQDQ Instruction" (Intel, 2009): four 128-bit lanes folded 64 bytes
 * a step, folded into one lane, then reduced to 32 bits (Barrett).  The
 * constants are x^k mod P for the folding distances of the reflected
 * polynomial, and P and floor(x^64 / P) for the reduction.  Chosen at run
 * time (kiln_crc_simd); the table above does the rest and other hosts. */
#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__)) && \
    !defined(KILN_NO_SIMD_CRC)
#define KILN_CRC_CLMUL 1
#include <immintrin.h>

static int kiln_crc_simd = 0;

__attribute__((target("pclmul,sse4.1")))
static uint32_t kiln_crc32_clmul(uint32_t crc, const unsigned char *p, size_t n) {
    /* n >= 64 and a multiple of 16; crc is the running (inverted) state */
    const __m128i k1k2 = _mm_set_epi64x(0x01c6e41596LL, 0x0154442bd4LL);
    const __m128i k3k4 = _mm_set_epi64x(0x00ccaa009eLL, 0x01751997d0LL);
    const __m128i k5 = _mm_set_epi64x(0, 0x0163cd6124LL);
    const __m128i poly = _mm_set_epi64x(0x01f7011641LL, 0x01db710641LL);
    const __m128i low32 = _mm_setr_epi32(~0, 0, ~0, 0);
    __m128i x1, x2, x3, x4, t1, t2, t3, t4;

    x1 = _mm_xor_si128(_mm_loadu_si128((const __m128i *)p), _mm_cvtsi32_si128((int)crc));
    x2 = _mm_loadu_si128((const __m128i *)(p + 16));
    x3 = _mm_loadu_si128((const __m128i *)(p + 32));
    x4 = _mm_loadu_si128((const __m128i *)(p + 48));
    p += 64;
    n -= 64;
    while (n >= 64) {                       /* four lanes, 64 bytes a step */
        t1 = _mm_clmulepi64_si128(x1, k1k2, 0x00);
        t2 = _mm_clmulepi64_si128(x2, k1k2, 0x00);
        t3 = _mm_clmulepi64_si128(x3, k1k2, 0x00);
        t4 = _mm_clmulepi64_si128(x4, k1k2, 0x00);
        x1 = _mm_xor_si128(_mm_clmulepi64_si128(x1, k1k2, 0x11), t1);
        x2 = _mm_xor_si128(_mm_clmulepi64_si128(x2, k1k2, 0x11), t2);
        x3 = _mm_xor_si128(_mm_clmulepi64_si128(x3, k1k2, 0x11), t3);
        x4 = _mm_xor_si128(_mm_clmulepi64_si128(x4, k1k2, 0x11), t4);
        x1 = _mm_xor_si128(x1, _mm_loadu_si128((const __m128i *)p));
        x2 = _mm_xor_si128(x2, _mm_loadu_si128((const __m128i *)(p + 16)));
        x3 = _mm_xor_si128(x3, _mm_loadu_si128((const __m128i *)(p + 32)));
        x4 = _mm_xor_si128(x4, _mm_loadu_si128((const __m128i *)(p + 48)));
        p += 64;
        n -= 64;
    }
#define KILN_FOLD(x, y) do { __m128i lo_ = _mm_clmulepi64_si128((x), k3k4, 0x00); \
        (x) = _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128((x), k3k4, 0x11), (y)), lo_); \
    } while (0)
    KILN_FOLD(x1, x2);                      /* four lanes into one */
    KILN_FOLD(x1, x3);
    KILN_FOLD(x1, x4);
    while (n >= 16) {                       /* then 16 bytes a step */
        KILN_FOLD(x1, _mm_loadu_si128((const __m128i *)p));
        p += 16;
        n -= 16;
    }
#undef KILN_FOLD
    /* 128 bits to 64, then to 32 with the Barrett reduction */
    x2 = _mm_clmulepi64_si128(x1, k3k4, 0x10);
    x1 = _mm_xor_si128(_mm_srli_si128(x1, 8), x2);
    x2 = _mm_srli_si128(x1, 4);
    x1 = _mm_xor_si128(_mm_clmulepi64_si128(_mm_and_si128(x1, low32), k5, 0x00), x2);
    x2 = _mm_clmulepi64_si128(_mm_and_si128(x1, low32), poly, 0x10);
    x2 = _mm_clmulepi64_si128(_mm_and_si128(x2, low32), poly, 0x00);
    x1 = _mm_xor_si128(x1, x2);
    return (uint32_t)_mm_extract_epi32(x1, 1);
}
#else
#define KILN_CRC_CLMUL 0
static int kiln_crc_simd = 0;
#endif

static void kiln_crc32_init(void) {
    uint32_t i, c;
    int k;
    for (i = 0; i < 256; i++) {
        c = i;
        for (k = 0; k < 8; k++)
            c = (c & 1u) ? (c >> 1) ^ 0xEDB88320u : c >> 1;
        kiln_crc_tab[0][i] = c;
    }
    for (k = 1; k < 8; k++)
        for (i = 0; i < 256; i++) {
            c = kiln_crc_tab[k - 1][i];
            kiln_crc_tab[k][i] = (c >> 8) ^ kiln_crc_tab[0][c & 0xFFu];
        }
#if KILN_CRC_CLMUL
    __builtin_cpu_init();
    kiln_crc_simd = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
#endif
}

/* Test hook: use the carry-less path where the CPU has it (1) or the table
 * alone (0); returns whether the carry-less path is now in use. */
static int kiln_crc32_use_simd(int on) {
#if KILN_CRC_CLMUL
    kiln_crc_simd = on && __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
#else
    (void)on;
#endif
    return kiln_crc_simd;
}

static inline uint32_t kiln_crc32(uint32_t crc, const unsigned char *p, size_t n) {
    crc = ~crc;
#if KILN_CRC_CLMUL
    if (kiln_crc_simd && n >= 64) {
        size_t run = n & ~(size_t)15;
        crc = kiln_crc32_clmul(crc, p, run);
        p += run;
        n -= run;
    }
#endif
    return ~kiln_crc32_table(crc, p, n);
}

#endif
