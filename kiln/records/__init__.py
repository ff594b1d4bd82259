"""The record container: many framed Kiln values in one file, pipe or socket.

``RecordWriter`` writes one; ``RecordFile`` reads a file at random through
its index; ``iter_records`` and ``StreamDecoder`` read one as a stream.  The
layout is in ``spec/records.md``; ``_format`` holds its constants and the
checks of its fixed parts that every reader shares.
"""

from .writer import RecordWriter, unfinished
from .reader import RecordFile, Recovery
from .stream import StreamDecoder, iter_records

# tracebacks, reprs and the reference name the public module, where users import them from
for _cls in (RecordWriter, RecordFile, StreamDecoder):
    _cls.__module__ = "kiln"
del _cls

__all__ = ["RecordWriter", "RecordFile", "Recovery", "StreamDecoder", "iter_records",
           "unfinished"]
