"""Errors raised by kiln.

Every fault found in a buffer is a :class:`KilnError` carrying one of the
closed set of codes and the absolute byte offset where the fault was found.
Faults found while encoding a Python value are :class:`EncodeError` (a
subclass), whose offset is the position in the output being written.
"""

CODES = ("FRAME", "LIMIT", "EOF", "TYPE", "UTF8", "TRAILING", "SCHEMA", "DEPTH")


class KilnError(ValueError):
    """A buffer (or a value being encoded) broke a Kiln rule.

    Attributes:
        code: one of ``FRAME LIMIT EOF TYPE UTF8 TRAILING SCHEMA DEPTH``.
        offset: the byte offset at which the fault was found.
        reason: a human readable explanation.
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

    ``path`` names the place in the value (``$.tags[2]``); ``offset`` is the
    position in the output where the value would have been written.
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


def frame_hint(e):
    """Say so when a buffer decoded without ``frame=True`` starts with a frame."""
    if e.code != "SCHEMA":
        e.reason += " (the buffer starts with a Kiln frame: decode it with frame=True)"
    return e


# tracebacks and reprs name the public module, where users import them from
KilnError.__module__ = "kiln"
EncodeError.__module__ = "kiln"
