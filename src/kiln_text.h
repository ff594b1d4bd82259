/* Strings for kiln._kernels_c's decode (dec_text in src/kernels/decode.pxi).

   Every string is decoded from bytes nobody else can change.  The input
   may be shared (a bytearray another thread writes, an mmap another process
   rewrites), and CPython's UTF-8 decoder reads its input more than once
   (it scans for the widest character, then copies): decoding shared bytes
   in place can give a str that was never in the buffer, or an invalid one
   (a 1-byte str whose isascii() is true holding bytes above 127).  So the
   bytes are first copied once into private memory, and that copy is what
   is checked and decoded.

   Short strings (2 to KILN_SHORT_TEXT bytes) are copied straight into
   PyUnicode_New's 1-byte buffer and checked there a word at a time, which
   costs about half of PyUnicode_DecodeUTF8 on a 10-byte ASCII string;
   when they are not ASCII, that same copy is decoded.  Other strings are
   copied into a stack buffer (up to KILN_STACK_TEXT bytes) or a heap one,
   unless the caller says the input cannot change (exact bytes, or a
   private copy such as a dict key's). */
#ifndef KILN_TEXT_H
#define KILN_TEXT_H
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define KILN_SHORT_TEXT 128
#define KILN_STACK_TEXT 4096

#if defined(__GNUC__) || defined(__clang__)
#define KILN_NOINLINE __attribute__((noinline))
#elif defined(_MSC_VER)
#define KILN_NOINLINE __declspec(noinline)
#else
#define KILN_NOINLINE
#endif

/* PyUnicode_DecodeUTF8 of a private copy of the n bytes at s (kept out of
   line: its stack buffer must not grow the frames of the recursive decode) */
static KILN_NOINLINE PyObject *kiln_text_copied(const char *s, Py_ssize_t n,
                                                const char *errors) {
    char stack[KILN_STACK_TEXT];
    char *p = stack;
    PyObject *u;
    if (n > KILN_STACK_TEXT) {
        p = (char *)PyMem_Malloc((size_t)n);
        if (p == NULL) return PyErr_NoMemory();
    }
    memcpy(p, s, (size_t)n);
    u = PyUnicode_DecodeUTF8(p, n, errors);
    if (p != stack) PyMem_Free(p);
    return u;
}

/* A new str of the n bytes at s, strict UTF-8 (errors NULL) or with the
   error handler `errors`; NULL with the UnicodeDecodeError (or
   MemoryError) set.  `shared`: the bytes at s may change meanwhile.  Every
   byte is read once, by a copy, and only the copy is checked and decoded. */
static PyObject *kiln_text(const char *s, Py_ssize_t n, const char *errors, int shared) {
    Py_ssize_t i = 0;
    uint64_t acc = 0, w;
    const unsigned char *d;
    PyObject *u, *r;
    /* (one character: CPython's own decode gives its cached str) */
    if (n >= 2 && n <= KILN_SHORT_TEXT) {
        u = PyUnicode_New(n, 127);
        if (u == NULL) return NULL;
        d = PyUnicode_1BYTE_DATA(u);
        memcpy((void *)d, s, (size_t)n);
        for (; i + 8 <= n; i += 8) {
            memcpy(&w, d + i, 8);
            acc |= w;
        }
        for (; i < n; i++) acc |= d[i];
        if (!(acc & UINT64_C(0x8080808080808080))) return u;
        /* not ASCII: decode the copy (u is never handed out) */
        r = PyUnicode_DecodeUTF8((const char *)d, n, errors);
        Py_DECREF(u);
        return r;
    }
    if (shared && n > 0) return kiln_text_copied(s, n, errors);
    return PyUnicode_DecodeUTF8(s, n, errors);
}
#endif
