/* Free-threading helpers for kiln._kernels_c (see src/kernels/encode.pxi).

   Owned references to container items.  On a free-threaded build another
   thread may change a list or dict while we encode it, so a borrowed item
   could be freed under us: these take the reference atomically there
   (PyList_GetItemRef, PyDict_GetItemRef, 3.13+).  With the GIL they are the
   plain macro plus an incref.  kiln_list_item_ref returns NULL, with no
   error set, when i is past the end. */
#ifndef KILN_FT_H
#define KILN_FT_H
#include <Python.h>
static PyObject *kiln_list_item_ref(PyObject *l, Py_ssize_t i) {
#ifdef Py_GIL_DISABLED
    PyObject *o = PyList_GetItemRef(l, i);
    if (o == NULL) PyErr_Clear();
    return o;
#else
    PyObject *o;
    if (i >= PyList_GET_SIZE(l)) return NULL;
    o = PyList_GET_ITEM(l, i);
    Py_INCREF(o);
    return o;
#endif
}
#ifdef Py_GIL_DISABLED
#define KILN_FREE_THREADED 1
#else
#define KILN_FREE_THREADED 0
#endif
/* 1 with *out owned, 0 when missing, -1 with an error set */
static int kiln_dict_get_ref(PyObject *d, PyObject *k, PyObject **out) {
#if PY_VERSION_HEX >= 0x030D0000
    return PyDict_GetItemRef(d, k, out);
#else
    PyObject *o = PyDict_GetItemWithError(d, k);
    *out = o;
    if (o == NULL) return PyErr_Occurred() ? -1 : 0;
    Py_INCREF(o);
    return 1;
#endif
}
#endif
