"""Byte ranges of a remote object, each answer checked against its question.

``http://`` and ``https://`` URLs are read by kiln's own client on
``http.client``: one ``GET`` with a single ``Range`` per read, asking for the
identity encoding.  Before any of its body is read, an answer must be a
``206`` whose ``Content-Range`` names exactly the bytes asked for and the
object's size seen at open, with a ``Content-Length`` (when it sends one)
of that many bytes, no ``Content-Encoding`` other than ``identity``, and the
``ETag``/``Last-Modified`` seen at open; the body is then read into a
buffer of exactly that length, and one byte more is an error.  The one
``200`` taken is the first answer for a whole object that fits in the first
range asked for (a small file from a server without ranges).  So a server
that ignores ranges, compresses, sends another range or a short body makes
kiln read at most the bytes it asked for, never more.

Every other URL is read through fsspec (``s3://``, ``gs://``, ``memory://``,
...), whose filesystems read ranges their own way; the length of what they
return and the object's size and version after each read are checked.

Every transport fault (a refused or reset connection, a timeout, a body
shorter than announced, an exception of the filesystem's own library) and
every answer that does not match its question is :class:`RemoteError`, an
``OSError``; a change of the object is :class:`RemoteFileChanged`, a
``RemoteError``.  ``FileNotFoundError`` and ``PermissionError`` are passed
on as they are.
"""

import http.client
import re
import ssl
import threading
import urllib.parse
from typing import Any, Dict, Optional, Tuple

from .._errors import KilnError

_VERSION_KEYS = ("ETag", "etag", "VersionId", "version_id", "generation", "LastModified",
                 "Last-Modified", "last_modified", "mtime", "created", "Content-MD5", "md5Hash",
                 "Digest", "crc32c")
_CONTENT_RANGE = re.compile(r"^\s*bytes\s+(\d+)-(\d+)/(\d+)\s*$", re.I)
_UNSATISFIED = re.compile(r"^\s*bytes\s+\*/(\d+)\s*$", re.I)
_REDIRECTS = (301, 302, 303, 307, 308)
_MAX_REDIRECTS = 5
_STEP = 1 << 20                   # bytes read from the socket at a time
_PASS = (KilnError, FileNotFoundError, PermissionError, IsADirectoryError, MemoryError)

Version = Tuple[Any, ...]


class RemoteError(OSError):
    """A remote read failed: a transport fault (a connection refused or reset,
    a timeout, a body shorter than announced, an error of the filesystem's
    library) or an answer that does not match its question (another range,
    length or total size, an encoded body, a server that ignored the range)."""


class RemoteFileChanged(RemoteError):
    """The remote file changed after it was opened: its size or version differs."""


def is_http(url: str) -> bool:
    return url.split("://", 1)[0].lower() in ("http", "https")


def source(url: str, storage_options: Optional[Dict[str, Any]] = None,
           known: Optional[Version] = None) -> Any:
    """A reader of byte ranges of ``url``: :class:`HttpSource` for http(s),
    else :class:`FsspecSource`.  ``known``: the version seen at open (a
    reader made again elsewhere, e.g. on a Dask worker)."""
    if is_http(url):
        return HttpSource(url, storage_options, known)
    return FsspecSource(url, storage_options, known)


def show(version: Version) -> str:
    return ", ".join(["size %s" % version[0]] + ["%s %s" % kv for kv in version[1:]])


def changed(url: str, was: Version, now: Version) -> RemoteFileChanged:
    return RemoteFileChanged("%s changed after it was opened (was %s, now %s): reopen it"
                             % (url, show(was), show(now)))


class HttpSource:
    """Range reads of one http(s) URL over one kept-alive connection.

    ``storage_options`` may hold ``headers`` (a dict of request headers, e.g.
    ``Authorization``) and ``timeout`` (seconds per socket operation, default
    60); anything else is a ``TypeError``.
    """

    def __init__(self, url: str, storage_options: Optional[Dict[str, Any]] = None,
                 known: Optional[Version] = None) -> None:
        opts = dict(storage_options or {})
        headers = opts.pop("headers", None) or {}
        self.timeout = float(opts.pop("timeout", 60.0))
        if opts:
            raise TypeError("storage_options of an http(s) URL take 'headers' and 'timeout' "
                            "only, not %s" % ", ".join(sorted(map(repr, opts))))
        self.headers = {str(k): str(v) for k, v in dict(headers).items()}
        self.url = url
        self.version = known
        self.size: Optional[int] = None if known is None else known[0]
        self._conn: Any = None
        self._lock = threading.Lock()
        self.whole = False   # the first answer was the whole object (a server without ranges)

    # --- the two reads ----------------------------------------------------------

    def first(self, n: int) -> bytes:
        """Bytes [0, n) or the whole object when it is shorter; learns its size
        and version from the answer."""
        with self._lock:
            return self._get(0, n, "the header", True)

    def read(self, start: int, end: int, what: str) -> bytes:
        """Bytes [start, end) (inside the object), of the version seen at open."""
        if end <= start:
            return b""
        with self._lock:
            return self._get(start, end, what, False)

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    # --- one exchange -----------------------------------------------------------

    def _get(self, start: int, end: int, what: str, first: bool) -> bytes:
        url = self.url
        question = "bytes %d..%d (%s)" % (start, end, what)
        try:
            for _ in range(_MAX_REDIRECTS + 1):
                resp = self._request(url, start, end)
                if resp.status not in _REDIRECTS:
                    return self._answer(resp, start, end, first, question)
                where = resp.getheader("Location")
                self.close()
                if not where:
                    raise RemoteError("%s: a redirect (%d) without a Location, for %s"
                                      % (self.url, resp.status, question))
                url = urllib.parse.urljoin(url, where)
                if not is_http(url):
                    raise RemoteError("%s: redirected to %r, which is not http(s)"
                                      % (self.url, url))
            raise RemoteError("%s: more than %d redirects" % (self.url, _MAX_REDIRECTS))
        except _PASS + (RemoteError,):
            self.close()
            raise
        except Exception as e:   # http.client's, ssl's and the socket's faults
            self.close()
            raise RemoteError("%s: transport fault while reading %s: %s: %s"
                              % (self.url, question, type(e).__name__, e)) from None

    def _request(self, url: str, start: int, end: int) -> Any:
        parts = urllib.parse.urlsplit(url)
        path = parts.path or "/"
        if parts.query:
            path += "?" + parts.query
        headers = dict(self.headers)
        headers.update({"Range": "bytes=%d-%d" % (start, end - 1),
                        "Accept-Encoding": "identity", "Connection": "close"})
        self.close()   # one connection per request: a kept-alive one was seen to stall
        for attempt in (0, 1):
            reused = self._conn is not None and url == self.url
            if not reused:
                self.close()
                self._conn = self._connect(parts)
            try:
                self._conn.request("GET", path, headers=headers)
                return self._conn.getresponse()
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                self.close()
                if not reused or attempt:
                    raise   # a fresh connection failed: a transport fault
                # a kept-alive connection the server had closed: once more, afresh
        raise AssertionError("unreachable")  # pragma: no cover

    def _connect(self, parts: Any) -> Any:
        host, port = parts.hostname, parts.port
        if not host:
            raise RemoteError("%s: no host in the URL" % self.url)
        if parts.scheme.lower() == "https":
            return http.client.HTTPSConnection(host, port, timeout=self.timeout,
                                               context=ssl.create_default_context())
        return http.client.HTTPConnection(host, port, timeout=self.timeout)

    def _answer(self, resp: Any, start: int, end: int, first: bool, question: str) -> bytes:
        status = resp.status
        if status in (404, 410):
            raise FileNotFoundError("%s: not found (HTTP %d)" % (self.url, status))
        if status in (401, 403):
            raise PermissionError("%s: HTTP %d" % (self.url, status))
        encoding = (resp.getheader("Content-Encoding") or "identity").strip().lower()
        length = resp.getheader("Content-Length")
        if status == 416 and first and start == 0:
            m = _UNSATISFIED.match(resp.getheader("Content-Range") or "")
            if m and int(m.group(1)) == 0:
                self._learn(resp, 0)
                self.close()
                return b""    # an empty object: the caller says so
        if status == 200:
            # a server without ranges: taken only when the whole object fits the question
            if first and start == 0 and length is not None and length.strip().isdigit() \
                    and int(length) <= end - start and encoding == "identity":
                n = int(length)
                self._learn(resp, n)
                self.whole = True
                return self._body(resp, n, question)
            raise RemoteError("%s: the server answered 200 with the whole object (%s bytes) "
                              "for %s: it ignored the range request"
                              % (self.url, length if length is not None else "an unknown number of",
                                 question))
        if status != 206:
            raise RemoteError("%s: HTTP %d %s for %s" % (self.url, status, resp.reason, question))
        if encoding != "identity":
            raise RemoteError("%s: the answer for %s is %s-encoded; kiln asked for the identity "
                              "encoding and does not inflate" % (self.url, question, encoding))
        got = resp.getheader("Content-Range") or ""
        m = _CONTENT_RANGE.match(got)
        if m is None:
            raise RemoteError("%s: Content-Range %r of the answer for %s is not one byte range "
                              "of a known size" % (self.url, got, question))
        lo, hi, total = (int(x) for x in m.groups())
        if self.size is not None and total != self.size:
            raise changed(self.url, self.version or (self.size,), (total,))
        last = (min(end, total) if first else end) - 1
        if lo != start or hi != last or hi < lo:
            raise RemoteError("%s: the server answered bytes %d-%d/%d for bytes %d-%d: not the "
                              "range asked for" % (self.url, lo, hi, total, start, last))
        n = hi - lo + 1
        if length is not None and (not length.strip().isdigit() or int(length) != n):
            raise RemoteError("%s: Content-Length %s of the answer for %s is not the %d bytes "
                              "of its Content-Range" % (self.url, length, question, n))
        self._learn(resp, total)
        return self._body(resp, n, question)

    def _learn(self, resp: Any, total: int) -> None:
        """The version this answer is of; a change from the one seen at open is
        :class:`RemoteFileChanged` (before its body is read)."""
        now: Version = (total,) + tuple((k, resp.getheader(k)) for k in ("ETag", "Last-Modified")
                                        if resp.getheader(k) is not None)
        if self.version is None:
            self.version, self.size = now, total
        elif now != self.version:
            raise changed(self.url, self.version, now)

    def _body(self, resp: Any, n: int, question: str) -> bytes:
        """Exactly ``n`` bytes of body, read a step at a time; fewer, or more,
        is a RemoteError."""
        out = bytearray(n)
        view = memoryview(out)
        got = 0
        while got < n:
            k = resp.readinto(view[got:got + _STEP])
            if not k:
                raise RemoteError("%s: the body for %s ended after %d of its %d bytes"
                                  % (self.url, question, got, n))
            got += k
        view.release()
        if resp.read(1):
            raise RemoteError("%s: the body for %s is longer than the %d bytes asked for"
                              % (self.url, question, n))
        if resp.will_close:
            self.close()
        return bytes(out)


class FsspecSource:
    """Range reads of one fsspec URL; the size and version read again after
    each read and compared with those seen at open."""

    def __init__(self, url: str, storage_options: Optional[Dict[str, Any]] = None,
                 known: Optional[Version] = None) -> None:
        try:
            import fsspec
        except ImportError as e:  # pragma: no cover - depends on the environment
            raise ImportError("kiln.open of a %s URL needs fsspec: pip install fsspec"
                              % url.split("://", 1)[0]) from e
        self.url = url
        self.fs, self.key = self._call("opening it", fsspec.core.url_to_fs, url,
                                       **dict(storage_options or {}))
        self.version = known
        self.size: Optional[int] = None if known is None else known[0]
        self.whole = False

    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except _PASS + (RemoteError, TypeError):
            raise
        except Exception as e:   # the filesystem library's own faults
            raise RemoteError("%s: transport fault while %s: %s: %s"
                              % (self.url, what, type(e).__name__, e)) from None

    def info(self) -> Version:
        info = self._call("asking for its size", self.fs.info, self.key)
        if info.get("type") == "directory":
            raise IsADirectoryError("%s is a directory" % self.url)
        size = info.get("size")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise RemoteError("%s: the store does not report the object's size" % self.url)
        return (size,) + tuple((k, str(info[k])) for k in _VERSION_KEYS
                               if info.get(k) is not None)

    def first(self, n: int) -> bytes:
        now = self.info()
        if self.version is not None and now != self.version:
            raise changed(self.url, self.version, now)   # not the version it was opened at
        self.version = now
        self.size = self.version[0]
        return self.read(0, min(n, self.size), "the header")

    def read(self, start: int, end: int, what: str) -> bytes:
        if end <= start:
            return b""
        data = self._call("reading %s" % what, self.fs.cat_file, self.key, start=start, end=end)
        now = self.info()
        if now != self.version:
            raise changed(self.url, self.version or (), now)
        if len(data) > end - start:
            raise RemoteError("%s: the store sent %d bytes for bytes %d..%d (%s): it ignored "
                              "the range request" % (self.url, len(data), start, end, what))
        if len(data) != end - start:   # inside the size it reported: a short answer
            raise RemoteError("%s: the store sent %d bytes for bytes %d..%d (%s) of its %d"
                              % (self.url, len(data), start, end, what, self.size))
        return bytes(data)

    def close(self) -> None:
        pass
