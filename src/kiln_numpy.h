/* numpy's C-API for kiln._kernels_c (see src/kernels/numpy.pxi). */
#ifndef KILN_NUMPY_H
#define KILN_NUMPY_H
#include <Python.h>
/* numpy's C-API table, read at run time from numpy's _ARRAY_API capsule
   (no numpy headers at build time).  Slot 0 is PyArray_GetNDArrayCVersion,
   slot 2 &PyArray_Type, slot 94 PyArray_NewFromDescr: the same slots for
   numpy 1.x and 2.x.  Used only after kiln_np_setup's checks pass. */
typedef unsigned int (*kiln_npver_t)(void);
typedef PyObject *(*kiln_npnew_t)(PyTypeObject *, PyObject *, int, Py_ssize_t *,
                                  Py_ssize_t *, void *, int, PyObject *);
static void **kiln_np_api = NULL;
static unsigned int kiln_np_abi(void) { return ((kiln_npver_t)kiln_np_api[0])(); }
static void *kiln_np_type(void) { return kiln_np_api[2]; }
static PyObject *kiln_np_new(PyObject *descr, Py_ssize_t n) {
    Py_INCREF(descr);  /* PyArray_NewFromDescr steals the descriptor */
    return ((kiln_npnew_t)kiln_np_api[94])((PyTypeObject *)kiln_np_api[2], descr, 1, &n,
                                           NULL, NULL, 0, NULL);
}
/* PyArrayObject_fields: the data pointer follows PyObject_HEAD */
static char *kiln_np_data(PyObject *a) { return *(char **)((char *)a + sizeof(PyObject)); }
/* The head of PyArrayObject_fields (numpy's public, ABI-stable layout in
   1.x and 2.x).  kiln_np_plain_1d: is `a` a 1-D C-contiguous array whose
   descriptor is exactly `descr`?  Then its data and length, without the
   buffer protocol's bookkeeping.  Checked against the buffer protocol in
   _np_setup before it is ever used. */
typedef struct {
    PyObject_HEAD
    char *data;
    int nd;
    Py_ssize_t *dimensions;
    Py_ssize_t *strides;
    PyObject *base;
    PyObject *descr;
    int flags;
} kiln_np_head;
static int kiln_np_plain_1d(PyObject *a, PyObject *descr, char **data, Py_ssize_t *n) {
    kiln_np_head *h = (kiln_np_head *)a;
    if (h->descr != descr || h->nd != 1 || !(h->flags & 0x0001)) return 0;
    *data = h->data;
    *n = h->dimensions[0];
    return 1;
}
/* An array over `data` (nd dims, C order, read-only: no NPY_ARRAY_WRITEABLE)
   whose base is `base`: numpy's PyArray_NewFromDescr (slot 94) and
   PyArray_SetBaseObject (slot 282, the same in 1.x and 2.x), which steals
   its reference to the base even when it fails. */
typedef int (*kiln_npsetbase_t)(PyObject *, PyObject *);
static PyObject *kiln_np_view(PyObject *descr, int nd, Py_ssize_t *dims, char *data,
                              PyObject *base) {
    PyObject *a;
    Py_INCREF(descr);
    a = ((kiln_npnew_t)kiln_np_api[94])((PyTypeObject *)kiln_np_api[2], descr, nd, dims,
                                        NULL, data, 0, NULL);
    if (a == NULL) return NULL;
    Py_INCREF(base);
    if (((kiln_npsetbase_t)kiln_np_api[282])(a, base) < 0) {
        Py_DECREF(a);
        return NULL;
    }
    return a;
}
#endif
