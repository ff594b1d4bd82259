/* kiln_crc32.h: CRC-32 of zlib, gzip and PNG (reflected polynomial
 * 0xEDB88320, initial value and final xor 0xFFFFFFFF), the checksum of the
 * record container (spec/records.md).  kiln_crc32(c, p, n) gives the value
 * Python's zlib.crc32(bytes(p[:n]), c) gives, so a CRC can be continued
 * across pieces as with zlib.
 *
 * Table driven, eight bytes a step ("slicing by 8"): no library needed, so
 * the compiled kernels build wherever a C compiler does.  The tables are
 * filled once by kiln_crc32_init(), called when the module is imported.
 */
#ifndef KILN_CRC32_H
#define KILN_CRC32_H

#include <stddef.h>
#include <stdint.h>
#include "kiln_endian.h"

static uint32_t kiln_crc_tab[8][256];

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
}

static inline uint32_t kiln_crc32(uint32_t crc, const unsigned char *p, size_t n) {
    const uint32_t (*t)[256] = (const uint32_t (*)[256])kiln_crc_tab;
    uint32_t a, b;
    crc = ~crc;
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
    return ~crc;
}

#endif
