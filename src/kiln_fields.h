/* Reading the fields of a class-bound struct from C, for kiln._kernels_c
   (see enc_struct and read_fields in src/kernels/encode.pxi).

   What the pure kernel (and operator.attrgetter) does is getattr(obj, name)
   per field.  For an object of exactly the bound class, whose attribute
   lookup is object's own (tp_getattro == PyObject_GenericGetAttr), that
   lookup is decided by what the class's MRO holds under the name, and the
   compiled kernel looks that up once (field_kinds) and keeps the answer
   while the class's version tag stays the same (any change to the class or
   a base resets the tag):

   - a data descriptor that is a plain object slot (__slots__, dataclass
     slots=True): read the slot at its offset (KILN_FK_SLOT); an empty slot
     goes the generic way, which raises the same AttributeError;
   - a NamedTuple field accessor (_tuplegetter): the tuple item (KILN_FK_INDEX);
   - nothing, or a non-data descriptor (a class-level default, a method): the
     instance __dict__ wins if it holds the name, so look there with the
     interned name (KILN_FK_DICT), else go the generic way;
   - anything else (a property, ...): the generic way (KILN_FK_ATTR).

   The generic way is tp_getattro, exactly what getattr calls. */
#ifndef KILN_FIELDS_H
#define KILN_FIELDS_H
#include <Python.h>
#include <structmember.h>

#define KILN_FK_ATTR 0
#define KILN_FK_DICT 1
#define KILN_FK_SLOT 2
#define KILN_FK_INDEX 3

#ifndef Py_T_OBJECT_EX
#define Py_T_OBJECT_EX T_OBJECT_EX
#endif
#ifndef Py_READONLY
#define Py_READONLY READONLY
#endif

/* the class's version tag, 0 when it has none that is valid (up to 3.12 a
   flag says whether the tag is valid; from 3.13 the flag is never set and an
   invalid tag is 0) */
static unsigned int kiln_type_tag(PyObject *cls) {
    PyTypeObject *t = (PyTypeObject *)cls;
#if PY_VERSION_HEX < 0x030D0000 && defined(Py_TPFLAGS_VALID_VERSION_TAG)
    if (!(t->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG)) return 0;
#endif
#ifdef Py_GIL_DISABLED
    return _Py_atomic_load_uint32_relaxed(&t->tp_version_tag);
#else
    return t->tp_version_tag;
#endif
}

static int kiln_generic_getattr(PyObject *cls) {
    return ((PyTypeObject *)cls)->tp_getattro == PyObject_GenericGetAttr;
}

static int kiln_has_dict(PyObject *cls) {
    return ((PyTypeObject *)cls)->tp_dictoffset != 0;
}

/* what the MRO holds under name (borrowed; NULL when nothing, no error) */
static PyObject *kiln_type_lookup(PyObject *cls, PyObject *name) {
    return _PyType_Lookup((PyTypeObject *)cls, name);
}

static int kiln_is_data_descr(PyObject *d) {
    return Py_TYPE(d)->tp_descr_set != NULL;
}

/* the offset of a plain object slot of cls's instances whose flags are
   within `allowed`, else -1 (a slot descriptor of an unrelated class, put in
   cls's namespace, describes another layout: getattr and object.__setattr__
   refuse it, and so must we) */
static Py_ssize_t kiln_member_offset(PyObject *cls, PyObject *d, int allowed) {
    PyMemberDef *m;
    if (Py_TYPE(d) != &PyMemberDescr_Type) return -1;
    if (!PyType_IsSubtype((PyTypeObject *)cls, PyDescr_TYPE(d))) return -1;
    m = ((PyMemberDescrObject *)d)->d_member;
    if (m->type != Py_T_OBJECT_EX || (m->flags & ~allowed)) return -1;
    return m->offset;
}

/* a slot to read (a read-only one too) */
static Py_ssize_t kiln_slot_offset(PyObject *cls, PyObject *d) {
    return kiln_member_offset(cls, d, Py_READONLY);
}

/* the object in a slot, owned, or NULL when the slot is empty (no error) */
static PyObject *kiln_slot_get(PyObject *v, Py_ssize_t off) {
    PyObject *o = *(PyObject **)((char *)v + off);
    Py_XINCREF(o);
    return o;
}

/* the object in a slot, borrowed, or NULL when the slot is empty */
static PyObject *kiln_slot_peek(PyObject *v, Py_ssize_t off) {
    return *(PyObject **)((char *)v + off);
}

/* store x (a new reference is taken) in the slot at off, dropping the old value */
static void kiln_slot_set(PyObject *v, Py_ssize_t off, PyObject *x) {
    PyObject **p = (PyObject **)((char *)v + off);
    PyObject *old = *p;
    Py_INCREF(x);
    *p = x;
    Py_XDECREF(old);
}

/* store x in the empty slot at off of a new instance, taking over the
   caller's reference */
static void kiln_slot_steal(PyObject *v, Py_ssize_t off, PyObject *x) {
    PyObject **p = (PyObject **)((char *)v + off);
    PyObject *old = *p;
    *p = x;
    Py_XDECREF(old);
}

/* a new, empty instance as cls.__new__(cls) makes it when that is object.__new__ */
static PyObject *kiln_alloc(PyObject *cls) {
    return ((PyTypeObject *)cls)->tp_alloc((PyTypeObject *)cls, 0);
}

/* Building a class-bound struct's instance on decode without calling Python
   (see dec_struct in src/kernels/decode.pxi and kiln._types._direct_build,
   which decides in Python that the class's generated __init__ does nothing
   but these steps):

   - KILN_BUILD_SLOTS: object.__new__(cls), then each field stored in its slot
     (what object.__setattr__ does for a plain, writable object slot);
   - KILN_BUILD_INIT: object.__new__(cls), then the generated __init__
     called with the values straight from a C array (no argument tuple, no
     type call), for a class of more than 4 fields whose __init__ stores with
     ``self.x = x``: the interpreter's specialised attribute store costs less
     than object.__setattr__ from C (about 180 instructions a field in 3.11),
     which wins only while there are few fields to pay for the frame;
   - KILN_BUILD_ATTRS: object.__new__(cls), then object.__setattr__ per field
     from C, for a frozen class (whose __init__ calls object.__setattr__ from
     Python, four times the cost), keyword-only fields or up to 4 fields;
   - KILN_BUILD_TUPLE: tuple.__new__(cls, values) (a NamedTuple);
   - KILN_BUILD_CALL: make(*values).

   The decision is kept while the class's version tag stays the one it was
   made under, the metaclass's __call__ is type's and the __init__ keeps its
   code and what its closure's cells hold (kiln_build_ok); it is checked
   after the fields are decoded, which
   may run code (a nested class's __init__) that changes the class. */
#define KILN_BUILD_CALL 0
#define KILN_BUILD_INIT 1
#define KILN_BUILD_ATTRS 4
#define KILN_BUILD_SLOTS 2
#define KILN_BUILD_TUPLE 3

/* a slot object.__setattr__ may store in (not a read-only one) */
static Py_ssize_t kiln_slot_offset_w(PyObject *cls, PyObject *d) {
    return kiln_member_offset(cls, d, 0);
}

/* the decision is still good: the class's version tag is the one it was
   made under, the metaclass calls as type does, the generated __init__'s
   code was not replaced and its closure's cells hold what they held then
   (neither changes a version tag).  `closure` is the __init__'s closure
   when the decision was made (None or a tuple of cells, which a function
   keeps for life), `cells` what the cells held then (owned by the caller,
   so a pointer seen again is the same object).  The __init__'s defaults are
   no part of it: every parameter is given a value. */
static int kiln_build_ok(PyObject *cls, unsigned int tag, PyObject *init, PyObject *code,
                         PyObject *closure, PyObject *cells) {
    Py_ssize_t i, n;
    if (!(tag != 0 && kiln_type_tag(cls) == tag
          && Py_TYPE(cls)->tp_call == PyType_Type.tp_call
          && PyFunction_GET_CODE(init) == code))
        return 0;
    if (closure == Py_None) return 1;
    n = PyTuple_GET_SIZE(closure);
    if (PyTuple_GET_SIZE(cells) != n) return 0;
    for (i = 0; i < n; i++) {
        if (PyCell_GET(PyTuple_GET_ITEM(closure, i)) != PyTuple_GET_ITEM(cells, i)) return 0;
    }
    return 1;
}

/* object.__new__(cls) (its checks included: an abstract class is refused) */
static PyObject *kiln_object_new(PyObject *cls, PyObject *empty) {
    return PyBaseObject_Type.tp_new((PyTypeObject *)cls, empty, NULL);
}

/* tuple.__new__(cls, (values,)) */
static PyObject *kiln_tuple_new(PyObject *cls, PyObject *args) {
    return PyTuple_Type.tp_new((PyTypeObject *)cls, args, NULL);
}

/* a new instance of the tuple subclass cls with n empty items, allocated as
   tuple.__new__(cls, values) allocates it (items NULL until stored: a
   tuple's dealloc and traverse skip those) */
static PyObject *kiln_tuple_alloc(PyObject *cls, Py_ssize_t n) {
    return ((PyTypeObject *)cls)->tp_alloc((PyTypeObject *)cls, n);
}

/* init(*args[0:n]); what type.__call__ checks of __init__'s result included */
static int kiln_call_init(PyObject *init, PyObject *const *args, size_t n) {
    PyObject *r = PyObject_Vectorcall(init, args, n, NULL);
    if (r == NULL) return -1;
    if (r != Py_None) {
        PyErr_Format(PyExc_TypeError, "__init__() should return None, not '%.200s'",
                     Py_TYPE(r)->tp_name);
        Py_DECREF(r);
        return -1;
    }
    Py_DECREF(r);
    return 0;
}

/* kiln.Record (src/kernels/record.pxi): a value that references no other
   object a collector could find a cycle through */
static int kiln_atomic(PyObject *o) {
    PyTypeObject *t = Py_TYPE(o);
    return t == &PyLong_Type || t == &PyFloat_Type || t == &PyUnicode_Type
        || t == &PyBytes_Type || o == Py_None || t == &PyBool_Type;
}

/* kiln.Record (src/kernels/record.pxi): make the object slot `d` of a new
   Record class `cls`, one of its own, read-only to the slot descriptor's own
   __set__ and __delete__: every store then goes
   through RecordBase, which tracks the instance again before it stores a value
   that is not atomic.  Reads (and the interpreter's specialised slot loads)
   are unchanged.  1 when sealed, 0 when `d` is not such a slot. */
static int kiln_record_seal_slot(PyObject *cls, PyObject *d) {
    PyMemberDef *m;
    if (Py_TYPE(d) != &PyMemberDescr_Type || PyDescr_TYPE(d) != (PyTypeObject *)cls) return 0;
    m = ((PyMemberDescrObject *)d)->d_member;
    if (m->type != Py_T_OBJECT_EX) return 0;
    m->flags |= Py_READONLY;
    return 1;
}

/* the offset of a Record field's slot (sealed or not), else -1 */
static Py_ssize_t kiln_record_slot(PyObject *cls, PyObject *d) {
    return kiln_member_offset(cls, d, Py_READONLY);
}

/* empty the slot at off (the old value dropped); 0, or -1 when it was empty */
static int kiln_slot_clear(PyObject *v, Py_ssize_t off) {
    PyObject **p = (PyObject **)((char *)v + off);
    PyObject *old = *p;
    if (old == NULL) return -1;
    *p = NULL;
    Py_DECREF(old);
    return 0;
}

static Py_ssize_t kiln_refcnt(PyObject *o) {
    return Py_REFCNT(o);
}

static int kiln_is_gc(PyObject *o) {
    return PyObject_IS_GC(o);
}

/* tracked by the collector (never for an object of a type without GC) */
static int kiln_gc_tracked(PyObject *o) {
    return PyObject_IS_GC(o) && PyObject_GC_IsTracked(o);
}

/* kiln.Record's decision is still good: the class's version tag is the one
   it was made under and the metaclass calls as type does (the base's
   __init__, __new__ and __setattr__ are kiln's: a class that defines its own
   is called, see kiln._plan.direct_build) */
static int kiln_record_ok(PyObject *cls, unsigned int tag) {
    return tag != 0 && kiln_type_tag(cls) == tag
        && Py_TYPE(cls)->tp_call == PyType_Type.tp_call;
}

static int kiln_exact_type(PyObject *v, PyObject *cls) {
    return (PyObject *)Py_TYPE(v) == cls;
}
#endif
