/* A DLPack capsule destructor for kiln._dlpack (which builds the capsules with
   ctypes).  A capsule is destroyed while an exception may be pending (the stack
   unwinding past an unused capsule); this destructor saves and restores the
   error state around the deleter call, which a ctypes callback cannot do.  A
   consumer renames the capsule when it takes it ("used_dltensor..."), so only
   a capsule nobody took is released here. */
#ifndef KILN_DLPACK_H
#define KILN_DLPACK_H
#include <Python.h>
#include <stdint.h>

typedef struct { uint32_t major, minor; } kiln_dl_version;
typedef struct kiln_dl_versioned {
    kiln_dl_version version;
    void *manager_ctx;
    void (*deleter)(struct kiln_dl_versioned *);
} kiln_dl_versioned;            /* the head of DLManagedTensorVersioned */

typedef struct kiln_dl_legacy_tail {
    void *manager_ctx;
    void (*deleter)(void *);
} kiln_dl_legacy_tail;

static void kiln_dl_destroy(PyObject *capsule) {
    PyObject *t, *v, *tb;
    PyErr_Fetch(&t, &v, &tb);
    if (PyCapsule_IsValid(capsule, "dltensor_versioned")) {
        kiln_dl_versioned *m = (kiln_dl_versioned *)PyCapsule_GetPointer(capsule,
                                                                          "dltensor_versioned");
        if (m != NULL && m->deleter != NULL) m->deleter(m);
    } else if (PyCapsule_IsValid(capsule, "dltensor")) {
        /* DLManagedTensor: the DLTensor (48 bytes on 64-bit hosts) comes first */
        char *m = (char *)PyCapsule_GetPointer(capsule, "dltensor");
        if (m != NULL) {
            kiln_dl_legacy_tail *tail = (kiln_dl_legacy_tail *)(m + KILN_DLTENSOR_SIZE);
            if (tail->deleter != NULL) tail->deleter(m);
        }
    }
    PyErr_Clear();
    PyErr_Restore(t, v, tb);
}
#endif
