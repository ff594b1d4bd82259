"""Errors raised by kiln.

Every fault found in a buffer is a :class:`KilnError` carrying one of the
closed set of codes and the absolute byte offset where the fault was found.
Faults found while encoding a Python value are :class:`EncodeError` (a
subclass), whose offset is the position in the output being written.
"""

CODES = ("FRAME", "LIMIT", "EOF", "TYPE", "UTF8", "TRAILING", "SCHEMA", "DEPTH", "CHECKSUM")


class KilnError(ValueError):
    """A buffer (or a value being encoded) broke a Kiln rule.

    A subclass of ``ValueError``; it pickles with its fields.  ``str(e)`` is
    ``"CODE at byte N: reason"``.

    Attributes:
        code: one of ``FRAME LIMIT EOF TYPE UTF8 TRAILING SCHEMA DEPTH``, or
            ``CHECKSUM`` (a tensor file's payload differs from the digest its
            metadata records, found only when asked: ``verify=True``, ``kiln
            check``; or a record container's head, record, index or trailer
            CRC-32 does not match).
        offset: the byte offset at which the fault was found.
        reason: a human readable explanation.

    Example:
        >>> try:
        ...     kiln.decode(b"\\x02", "bool")
        ... except kiln.KilnError as e:
        ...     print(e.code, e.offset, e.reason)
        TYPE 0 bool byte is 2, not 0 or 1
    """

    def __init__(self, code, offset, reason=""):
        if code not in CODES:
            raise AssertionError("unknown kiln error code %r" % (code,))
        self.code = code
        self.offset = offset
        self.reason = reason
        ValueError.__init__(self, code, offset, reason)

    def __str__(self):
        if self.reason:
            return "%s at byte %d: %s" % (self.code, self.offset, self.reason)
        return "%s at byte %d" % (self.code, self.offset)

    def __reduce__(self):
        return (type(self), (self.code, self.offset, self.reason))


class EncodeError(KilnError):
    """A Python value cannot be encoded as the requested Kiln type.

    A subclass of :class:`KilnError` (so of ``ValueError``).  ``code`` is
    ``TYPE``, ``UTF8`` or ``LIMIT``; ``path`` names the place in the value
    (``.tags[2]``; the message writes it ``$.tags[2]``); ``offset`` is the
    position in the output where the value would have been written.

    Example:
        >>> t = "struct{rows:list<struct{x:i32,}>,}"
        >>> try:
        ...     kiln.encode({"rows": [{"x": 1}, {"x": "a"}]}, t)
        ... except kiln.EncodeError as e:
        ...     print(e.code, e.path)
        ...     print(e)
        TYPE .rows[1].x
        TYPE at byte 8 ($.rows[1].x): expected an integer for i32, got str
    """

    def __init__(self, code, offset, reason="", path=""):
        self.path = path
        KilnError.__init__(self, code, offset, reason)

    def add_path(self, segment):
        self.path = segment + self.path

    def __str__(self):
        where = "$" + self.path
        return "%s at byte %d (%s): %s" % (self.code, self.offset, where, self.reason)

    def __reduce__(self):
        return (type(self), (self.code, self.offset, self.reason, self.path))


class SchemaError(KilnError):
    """A JSON Schema document (or JSON text) kiln cannot read, or a type it
    cannot write as one.

    A subclass of :class:`KilnError` (so of ``ValueError``).  ``code`` is
    ``TYPE`` (not JSON, or outside the subset), ``DEPTH`` (more than 64
    nested containers, or JSON text nested deeper than a schema of 64 can
    be) or ``LIMIT`` (a type of more than 1,000,000 tokens or 16,000,000
    characters).  ``str(e)`` is ``"CODE at POINTER: reason"``, with the
    character offset added for faults found in JSON text.

    Attributes:
        pointer: the JSON pointer of the offending node (``#/properties/a``).
        reason: what is wrong there.
        offset: the character offset in the JSON text for a fault found
            while reading the text, else 0.

    Example:
        >>> try:
        ...     kiln.schema_from_json({"type": "integer", "minimum": 0})
        ... except kiln.SchemaError as e:
        ...     print(e.code, e.pointer)
        TYPE #
    """

    def __init__(self, pointer, reason, code="TYPE", offset=0, in_text=False):
        self.pointer = str(pointer) if pointer else "#"   # (a lazily written pointer too)
        self.in_text = in_text
        KilnError.__init__(self, code, offset, reason)

    def __str__(self):
        if self.in_text:
            return "%s at %s (character %d): %s" % (self.code, self.pointer, self.offset,
                                                    self.reason)
        return "%s at %s: %s" % (self.code, self.pointer, self.reason)

    def __reduce__(self):
        return (type(self), (self.pointer, self.reason, self.code, self.offset, self.in_text))


def frame_hint(e):
    """Say so when a buffer decoded without ``frame=True`` starts with a frame."""
    if e.code != "SCHEMA":
        e.reason += " (the buffer starts with a Kiln frame: decode it with frame=True)"
    return e


# tracebacks and reprs name the public module, where users import them from
KilnError.__module__ = "kiln"
EncodeError.__module__ = "kiln"
SchemaError.__module__ = "kiln"
