"""A local HTTP server that serves files with Range requests and counts the requests in flight (downloads' retries
and resumes)."""

from __future__ import annotations

import http.server
import threading
import time


class _Handler(http.server.SimpleHTTPRequestHandler):
    requests: list[str] = []
    ranges: list = []  # the Range header of each request for /resumable.bin
    in_flight = max_in_flight = 0  # concurrent requests under /slow/
    lock = threading.Lock()

    def log_message(self, *args):
        pass

    def do_GET(self):
        cls = type(self)
        cls.requests.append(self.path)
        if self.path.startswith("/slow/"):  # held open a while, so overlapping requests can be counted
            with cls.lock:
                cls.in_flight += 1
                cls.max_in_flight = max(cls.max_in_flight, cls.in_flight)
            time.sleep(0.3)
            with cls.lock:
                cls.in_flight -= 1
        if self.path == "/truncated.bin":  # promises 100 bytes, sends 10, hangs up
            self.send_response(200)
            self.send_header("Content-Length", "100")
            self.end_headers()
            self.wfile.write(b"0123456789")
            self.close_connection = True
        elif self.path == "/resumable.bin":  # the first answer stops after 10 of 100 bytes; a Range request continues
            self._resumable(bytes(range(100)))
        elif self.path == "/flaky.txt" and self.requests.count("/flaky.txt") == 1:
            self.send_error(503)
        else:
            super().do_GET()

    def _resumable(self, body: bytes) -> None:
        """Serve ``body`` (ETag "v1"): cut after 10 bytes, unless asked for a range of this version (HTTP 206)."""
        type(self).ranges.append(self.headers.get("Range"))
        ranged = self.headers.get("Range", "").startswith("bytes=") and self.headers.get("If-Range") == '"v1"'
        start = int(self.headers["Range"][len("bytes="):].rstrip("-")) if ranged else 0
        self.send_response(206 if ranged else 200)
        self.send_header("ETag", '"v1"')
        self.send_header("Content-Length", str(len(body) - start))
        if ranged:
            self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
        self.end_headers()
        self.wfile.write(body[start:] if ranged else body[:10])
        self.close_connection = True


def server_ranges() -> list:
    """The Range header (None: none) of each request the `server` fixture answered for /resumable.bin."""
    return list(_Handler.ranges)


def server_max_in_flight() -> int:
    """The most requests under /slow/ that the `server` fixture served at the same time."""
    return _Handler.max_in_flight
