"""Kiln tensor files on web servers and in object stores, read lazily.

``kiln.open("https://host/model.kiln")`` or ``kiln.open("s3://bucket/model.kiln")``
(any fsspec URL: ``s3://``, ``gs://``, ``memory://``...) returns a
:class:`RemoteFile`.  Opening costs one range request for the first 64 KiB
(for an fsspec URL also a metadata request for the size and version), whose
header is checked before anything more is asked for, and, when the table is
longer, one more request for the rest of the table; the table is then
checked by the same kernel that checks a local file.  A tensor's bytes are
fetched when it is first accessed, and a leading-axis slice
(:meth:`RemoteFile.rows`) fetches only its rows.

``http(s)://`` URLs are read by kiln's own client (``kiln._files.fetch``): every
answer is compared with its question (status, ``Content-Range``,
``Content-Length``, ``Content-Encoding``, size and version) before its body
is read, and no more than the bytes asked for are ever read.  Other URLs are
read through fsspec and its filesystem's package (``s3fs``, ``gcsfs``...).

How it works: the table is checked inside a private anonymous mapping the
size of the remote file, whose untouched pages cost no memory.  The open
checks everything the table decides, not the payload contents.  Fetched
payloads are checked by the kernel's ``check_payload`` (bool bytes 0 or 1,
an odd 4-bit tail's high nibble 0, the alignment gap after a payload all
zeros), the check a lazily opened local file runs when a tensor is read, and
then written into that mapping once, before any view of them is handed
out, so tensors are the same zero-copy views a local file gives and keep
the mapping alive the same way.  Bytes of tensors never accessed are never
fetched, never checked and never touched.

A remote file that changes after it was opened is detected: each answer's
size and version (for HTTP the ``Content-Range`` total, ``ETag`` and
``Last-Modified``; for fsspec the size and whatever version the store
reports, read again after each fetch) are compared with those seen at open,
and a difference is :class:`RemoteFileChanged`, never bytes of two versions
decoded together.  An object shorter than its table claims is a
``KilnError`` ``EOF``, as for a local file.  Every transport fault, and
every answer that does not match its question, is :class:`RemoteError`.
"""

from ._files.fetch import RemoteError, RemoteFileChanged
from ._files.remote import RemoteFile, RowSource, head, is_url

__all__ = ["RemoteFile", "RemoteFileChanged", "RemoteError", "RowSource", "is_url", "head"]
