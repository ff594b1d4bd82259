# kiln.Record's compiled base (see kiln/_record.py, which adds the metaclass
# that turns annotations into slots; its pure twin is kiln/_record.py's
# _PyRecordBase).  Instances hold their fields in slots, are built by the
# decoder without a call (build_direct in decode.pxi, KILN_BUILD_SLOTS with
# Node.brecord) and are left untracked by the collector while every field
# holds an atomic value (kiln_atomic in src/kiln_fields.h).  That is safe only
# while every store of another value tracks the instance again, so:
#
# - a Record class's slots are sealed when it is made (RecordMeta calls
#   RecordBase._kiln_seal): the slot descriptors' own __set__/__delete__
#   refuse ("readonly attribute"; object.__setattr__ already refuses a class
#   with a __setattr__ of C's); RecordBase's __init__, __setattr__ and
#   __delattr__ store into the slots themselves, tracking the instance again
#   before a value that is not atomic goes in (issue 38 item 16);
# - an instance is untracked only by the decoder (a new instance no code has
#   seen) or by __init__ when the only reference is its maker's (type.__call__:
#   reference count 1).  Anything else calling __init__ holds a reference of
#   its own; above all a __del__ doing so runs while subtype_dealloc has the
#   instance tracked around the finalizer and untracks it unchecked afterwards,
#   which crashed the interpreter (issue 38 item 1);
# - a class that was not sealed (made around RecordMeta.__new__) never has
#   instances untracked.
#
# Free-threaded builds never untrack.


cdef inline int record_untrack(object self, bint all_atomic) noexcept:
    """Leave ``self`` to reference counting alone when it holds atomic values
    only (nothing it holds can reach it back) and its class is sealed."""
    cls = type(self)
    if all_atomic and not KILN_FREE_THREADED and kiln_gc_tracked(self) and \
            kiln_type_lookup(cls, "__kiln_sealed__") == <PyObject *>cls:
        PyObject_GC_UnTrack(self)
    return 0


cdef inline int record_retrack(object self, object value) noexcept:
    if not kiln_atomic(<PyObject *>value) and kiln_is_gc(self) and not kiln_gc_tracked(self):
        PyObject_GC_Track(self)
    return 0


cdef int record_store(object self, object name, object value) except -1:
    """``self.name = value`` as object.__setattr__ does it, into a field's
    slot by its offset (the slot descriptor refuses: sealed), tracking the
    instance again first when the value is not atomic."""
    cdef PyObject *d = NULL
    cdef Py_ssize_t off = -1
    cls = type(self)
    if PyUnicode_Check(name):
        d = kiln_type_lookup(cls, name)
        if d != NULL:
            off = kiln_record_slot(cls, d)
    record_retrack(self, value)
    if off >= 0:
        kiln_slot_set(self, off, value)
    else:
        kiln_setattr(self, name, value)   # a property, no such field: the generic way
    return 0


cdef int record_seal(object cls) except -1:
    """Seal the slots of cls and of its Record bases (see above) and mark cls
    sealed: record_untrack asks for the mark of the instance's own class."""
    for k in cls.__mro__:
        if k is not RecordBase and issubclass(k, RecordBase):
            for d in list(vars(k).values()):
                kiln_record_seal_slot(k, <PyObject *>d)
    type.__setattr__(cls, "__kiln_sealed__", cls)
    return 0


cdef class RecordBase:
    """The compiled base of :class:`kiln.Record` (use ``kiln.Record``)."""

    @staticmethod
    def _kiln_seal(cls):
        """Seal a new Record class's slots (kiln._record.RecordMeta calls it)."""
        record_seal(cls)

    def __init__(self, *args, **kwargs):
        cdef Py_ssize_t i, na = len(args), nf
        cdef bint atomic = True
        # only type.__call__'s reference: no code has seen the instance yet
        cdef bint fresh = kiln_refcnt(<PyObject *>self) == 1
        cls = type(self)
        names = cls.__kiln_fields__
        nf = len(names)
        if na > nf:
            raise TypeError(record_too_many(cls, nf, na))
        for i in range(na):
            v = args[i]
            record_store(self, names[i], v)
            if not kiln_atomic(<PyObject *>v):
                atomic = False
        if na < nf or kwargs:
            atomic = record_kwargs(self, cls, names, na, kwargs) and atomic
        record_untrack(self, atomic and fresh)

    def __setattr__(self, name, value):
        record_store(self, name, value)

    def __delattr__(self, name):
        cdef PyObject *d = NULL
        cdef Py_ssize_t off = -1
        cls = type(self)
        if PyUnicode_Check(name):
            d = kiln_type_lookup(cls, name)
            if d != NULL:
                off = kiln_record_slot(cls, d)
        if off < 0:
            kiln_delattr(self, name, NULL)
        elif kiln_slot_clear(self, off) < 0:
            raise AttributeError(name)   # an empty slot, as the slot descriptor says it

    def __eq__(self, other):
        if type(other) is not type(self):
            return NotImplemented
        return record_values(self) == record_values(other)

    def __ne__(self, other):
        if type(other) is not type(self):
            return NotImplemented
        return record_values(self) != record_values(other)

    def __repr__(self):
        return record_repr(self)

    def __reduce__(self):
        return (type(self), record_values(self))


cdef bint record_kwargs(object self, object cls, tuple names, Py_ssize_t na,
                        dict kwargs) except -1:
    """The fields after the positional ones, from ``kwargs`` or the defaults
    (the messages are the ones a dataclass's __init__ gives); True when every
    value stored is atomic."""
    cdef bint atomic = True
    defaults = cls.__kiln_defaults__
    missing = []
    for nm in names[na:]:
        if nm in kwargs:
            v = kwargs.pop(nm)
        elif nm in defaults:
            v = defaults[nm]
        else:
            missing.append(nm)
            continue
        record_store(self, nm, v)
        if not kiln_atomic(<PyObject *>v):
            atomic = False
    for nm in kwargs:
        if nm in names:
            raise TypeError("%s.__init__() got multiple values for argument %r"
                            % (cls.__qualname__, nm))
        raise TypeError("%s.__init__() got an unexpected keyword argument %r"
                        % (cls.__qualname__, nm))
    if missing:
        raise TypeError(record_missing(cls, missing))
    return atomic


cdef str record_too_many(object cls, Py_ssize_t nf, Py_ssize_t na):
    """What a dataclass's __init__ says (counting self, as CPython does)."""
    cdef Py_ssize_t nd = len(cls.__kiln_defaults__)
    if nd:
        return "%s.__init__() takes from %d to %d positional arguments but %d were given" % (
            cls.__qualname__, nf - nd + 1, nf + 1, na + 1)
    return "%s.__init__() takes %d positional argument%s but %d were given" % (
        cls.__qualname__, nf + 1, "" if nf == 0 else "s", na + 1)


cdef str record_missing(object cls, list missing):
    q = ["%r" % m for m in missing]
    if len(q) == 1:
        names = q[0]
    elif len(q) == 2:
        names = q[0] + " and " + q[1]
    else:
        names = ", ".join(q[:len(q) - 1]) + ", and " + q[len(q) - 1]
    return "%s.__init__() missing %d required positional argument%s: %s" % (
        cls.__qualname__, len(q), "" if len(q) == 1 else "s", names)


cdef tuple record_values(object self):
    return tuple([getattr(self, nm) for nm in type(self).__kiln_fields__])


cdef set _repr_running = set()


cdef str record_repr(object self):
    # like dataclasses' repr (reprlib.recursive_repr): a record inside itself is "..."
    key = (id(self), _get_ident())
    if key in _repr_running:
        return "..."
    _repr_running.add(key)
    try:
        return "%s(%s)" % (type(self).__qualname__, ", ".join(
            ["%s=%r" % (nm, getattr(self, nm)) for nm in type(self).__kiln_fields__]))
    finally:
        _repr_running.discard(key)
