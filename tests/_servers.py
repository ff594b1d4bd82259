"""Servers the tests start on 127.0.0.1: an HTTP server with range requests,
and the ways real servers get them wrong.

``RangeServer.behave`` picks how the server answers a ``GET`` with a
``Range``:

* ``"ranges"`` (the default): ``206`` with the range asked for.
* ``"ignore-range"``: ``200`` and the whole file, as servers without range
  support do (streamed 64 KiB at a time, so the server itself stays small).
* ``"shift"``: ``206`` with the bytes ``shift`` past those asked for, and a
  ``Content-Range`` that names them (another range than the question).
* ``"bad-total"``: ``206`` with the range asked for, but a total size one more
  than the file's.
* ``"bad-length"``: ``206`` with the range asked for, but a ``Content-Length``
  (and a body) one byte short of it.
* ``"gzip"``: ``206`` with the range gzip-compressed and ``Content-Encoding:
  gzip`` (what a compressing proxy does, whatever the client asked for).
* ``"short"``: a ``Content-Length`` of the range, half of it sent, then the
  connection closed.
* ``"reset"``: the headers, then the connection reset (``SO_LINGER`` 0).
* ``"chunked-long"``: ``206`` without ``Content-Length``, chunked, with 4 KiB
  more than the range.
* ``"flood"``: the range ignored: ``200`` without ``Content-Length`` (the
  body ends when the connection closes), the file and then zero bytes up to
  ``flood`` bytes in all, streamed 64 KiB at a time; a ``HEAD`` still says
  the file's size (a server that streams far more than the object).

``start_at``: the first ``start_at`` requests are answered right, so a
behaviour can hit a tensor's read instead of the open.  ``sent`` counts the
bytes written to clients; ``requests`` holds each request's ``Range`` and
``Accept-Encoding`` headers.
"""

import gzip
import os
import socket
import struct
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

_STEP = 64 << 10


class _Counting:
    def __init__(self, raw, server):
        self.raw, self.server = raw, server

    def write(self, data):
        with self.server.lock:           # counted before the client can see them
            self.server.sent += len(data)
        return self.raw.write(data)

    def __getattr__(self, name):
        return getattr(self.raw, name)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def setup(self):
        super().setup()
        self.wfile = _Counting(self.wfile, self.server)

    def log_message(self, *args):
        pass

    def do_HEAD(self):
        self._serve(False)

    def do_GET(self):
        self._serve(True)

    def _serve(self, body):
        server = self.server
        path = os.path.join(server.root, self.path.lstrip("/").split("?")[0])
        with server.lock:
            server.requests.append((self.headers.get("Range"),
                                    self.headers.get("Accept-Encoding")))
            nth = len(server.requests)
        try:
            st = os.stat(path)
        except OSError:
            self.send_error(404)
            return
        size = st.st_size
        behave = server.behave if nth > server.start_at else "ranges"
        if behave == "flood":
            self._flood(path, size, body)
            return
        a, b, status = 0, size - 1, 200
        rng = self.headers.get("Range")
        if rng and rng.startswith("bytes=") and behave != "ignore-range":
            lo, _, hi = rng[6:].partition("-")
            a = int(lo)
            b = min(int(hi), size - 1) if hi else size - 1
            if a >= size:
                self.send_response(416)
                self.send_header("Content-Range", "bytes */%d" % size)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            status = 206
        total = size
        if status == 206 and behave == "shift":
            a, b = a + server.shift, min(b + server.shift, size - 1)
        if status == 206 and behave == "bad-total":
            total = size + 1
        with open(path, "rb") as f:
            data = os.pread(f.fileno(), b - a + 1, a) if status == 206 else None
            if status == 206 and behave == "bad-length":
                data = data[:-1]
            if status == 206 and behave == "gzip":
                data = gzip.compress(data)
            self.send_response(status)
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("ETag", '"%x-%x"' % (st.st_mtime_ns, size))
            if behave == "chunked-long" and status == 206:
                self.send_header("Transfer-Encoding", "chunked")
            else:
                self.send_header("Content-Length", str(len(data) if data is not None
                                                       else size))
            if behave == "gzip":
                self.send_header("Content-Encoding", "gzip")
            if status == 206:
                self.send_header("Content-Range", "bytes %d-%d/%d" % (a, b, total))
            self.end_headers()
            if not body:
                return
            if behave == "reset":
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                           struct.pack("ii", 1, 0))
                self.close_connection = True
                return
            if status == 200:            # the whole file, a step at a time
                for at in range(0, size, _STEP):
                    self.wfile.write(os.pread(f.fileno(), _STEP, at))
                return
            if behave == "short":
                self.wfile.write(data[:len(data) // 2])
                self.close_connection = True
                return
            if behave == "chunked-long":
                extra = data + bytes(4096)
                for at in range(0, len(extra), _STEP):
                    piece = extra[at:at + _STEP]
                    self.wfile.write(b"%x\r\n" % len(piece) + piece + b"\r\n")
                self.wfile.write(b"0\r\n\r\n")
                return
            self.wfile.write(data)


    def _flood(self, path, size, body):
        self.send_response(200)
        self.send_header("ETag", '"flood-%x"' % size)
        if not body:
            self.send_header("Content-Length", str(size))
            self.end_headers()
            return
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        with open(path, "rb") as f:
            data = f.read()
        self.wfile.write(data)
        zeros = bytes(_STEP)
        for at in range(len(data), self.server.flood, _STEP):
            self.wfile.write(zeros[:min(_STEP, self.server.flood - at)])


class RangeServer(ThreadingHTTPServer):
    """Serves the files under ``root`` with single byte ranges, ETags from the
    file's mtime and size, and ``sent``: the bytes written to clients (see the
    module doc for ``behave``)."""

    daemon_threads = True

    def __init__(self, root, behave="ranges", shift=64, start_at=0, flood=256 << 20):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.root, self.sent, self.lock = str(root), 0, threading.Lock()
        self.behave, self.shift, self.start_at = behave, shift, start_at
        self.flood = flood
        self.requests = []
        self.url = "http://127.0.0.1:%d/" % self.server_address[1]
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)

    @property
    def ranges(self):
        return self.behave != "ignore-range"

    @ranges.setter
    def ranges(self, on):
        self.behave = "ranges" if on else "ignore-range"

    def handle_error(self, request, client_address):
        pass   # a client that hangs up on a bad answer is what the tests want

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self.shutdown()
        self.server_close()
        self._thread.join(10)
