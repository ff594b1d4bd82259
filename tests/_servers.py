"""Servers the tests start on 127.0.0.1: an HTTP server with range requests."""

import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class _Counting:
    def __init__(self, raw, server):
        self.raw, self.server = raw, server

    def write(self, data):
        with self.server.lock:
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
        path = os.path.join(self.server.root, self.path.lstrip("/").split("?")[0])
        try:
            st = os.stat(path)
        except OSError:
            self.send_error(404)
            return
        size = st.st_size
        a, b, status = 0, size - 1, 200
        rng = self.headers.get("Range")
        if rng and rng.startswith("bytes=") and self.server.ranges:
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
        self.send_response(status)
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("ETag", '"%x-%x"' % (st.st_mtime_ns, size))
        self.send_header("Content-Length", str(b - a + 1))
        if status == 206:
            self.send_header("Content-Range", "bytes %d-%d/%d" % (a, b, size))
        self.end_headers()
        if body:
            with open(path, "rb") as f:
                self.wfile.write(os.pread(f.fileno(), b - a + 1, a))



class RangeServer(ThreadingHTTPServer):
    """Serves the files under ``root`` with single byte ranges, ETags from the
    file's mtime and size, and ``sent``: the bytes written to clients."""

    daemon_threads = True

    def __init__(self, root):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.root, self.sent, self.lock = str(root), 0, threading.Lock()
        self.ranges = True   # False: ignore Range headers, as some servers do (200, the whole file)
        self.url = "http://127.0.0.1:%d/" % self.server_address[1]
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self.shutdown()
        self.server_close()
        self._thread.join(10)
