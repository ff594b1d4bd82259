/* Short ASCII strings for kiln._kernels_c's decode (dec_text_at in
   src/kernels/decode.pxi).

   PyUnicode_DecodeUTF8 spends about 175 instructions on a 10-byte ASCII
   string (the generic decoder's set-up, its ASCII scan, the allocation);
   copying the bytes into PyUnicode_New's 1-byte buffer and checking them
   there a word at a time costs about half.  Anything that is not
   ASCII, and long strings (where CPython's own one-pass decode is the
   better loop), go to PyUnicode_DecodeUTF8 as before: the result is the
   same str either way. */
#ifndef KILN_TEXT_H
#define KILN_TEXT_H
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define KILN_SHORT_TEXT 128

/* *out = a new str of the n bytes at s, when they are ASCII and
   n <= KILN_SHORT_TEXT: 1; not that: 0 (the caller decodes); -1 on error.
   The bytes are read once, by the copy, and the copy is what is checked:
   the input may change under us (shared memory), and a 1-byte str must
   never hold a byte above 127. */
static int kiln_short_ascii(const char *s, Py_ssize_t n, PyObject **out) {
    Py_ssize_t i = 0;
    uint64_t acc = 0, w;
    const unsigned char *d;
    PyObject *u;
    /* one character: CPython's own decode gives its cached str */
    if (n < 2 || n > KILN_SHORT_TEXT) return 0;
    u = PyUnicode_New(n, 127);
    if (u == NULL) return -1;
    d = PyUnicode_1BYTE_DATA(u);
    memcpy((void *)d, s, (size_t)n);
    for (; i + 8 <= n; i += 8) {
        memcpy(&w, d + i, 8);
        acc |= w;
    }
    for (; i < n; i++) acc |= d[i];
    if (acc & UINT64_C(0x8080808080808080)) {
        Py_DECREF(u);
        return 0;
    }
    *out = u;
    return 1;
}
#endif
