# kiln.Record's compiled base (see kiln/_record.py, which adds the metaclass
# that turns annotations into slots; its pure twin is kiln/_record.py's
# _PyRecordBase).  Instances hold their fields in slots, are built by the
# decoder without a call (build_direct in decode.pxi, KILN_BUILD_SLOTS with
# Node.brecord) and are left untracked by the collector while every field
# holds an atomic value (kiln_atomic in src/kiln_fields.h): storing anything
# else through __setattr__ tracks the instance again.  Free-threaded builds
# never untrack.


cdef inline int record_untrack(object self, bint all_atomic) noexcept:
    """Leave ``self`` to reference counting alone when it holds atomic values
    only (nothing it holds can reach it back)."""
    if all_atomic and not KILN_FREE_THREADED and kiln_gc_tracked(self):
        PyObject_GC_UnTrack(self)
    return 0


cdef inline int record_retrack(object self, object value) noexcept:
    if not kiln_atomic(<PyObject *>value) and kiln_is_gc(self) and not kiln_gc_tracked(self):
        PyObject_GC_Track(self)
    return 0


cdef class RecordBase:
    """The compiled base of :class:`kiln.Record` (use ``kiln.Record``)."""

    def __init__(self, *args, **kwargs):
        cdef Py_ssize_t i, na = len(args), nf
        cdef bint atomic = True
        cls = type(self)
        names = cls.__kiln_fields__
        nf = len(names)
        if na > nf:
            raise TypeError(record_too_many(cls, nf, na))
        for i in range(na):
            v = args[i]
            kiln_setattr(self, names[i], v)
            if not kiln_atomic(<PyObject *>v):
                atomic = False
        if na < nf or kwargs:
            atomic = record_kwargs(self, cls, names, na, kwargs) and atomic
        record_untrack(self, atomic)

    def __setattr__(self, name, value):
        kiln_setattr(self, name, value)
        record_retrack(self, value)

    def __delattr__(self, name):
        kiln_delattr(self, name, NULL)

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
        kiln_setattr(self, nm, v)
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
