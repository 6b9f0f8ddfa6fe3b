"""Local HTTP servers for the tests, on free loopback ports, as the other SDKs' tests have.

``LimitedServer``: ``/limited`` enforces a token bucket (sluice-core's ``Limiter``) and
answers with header lines written out here (X-RateLimit-*, IETF ``RateLimit`` and
``RateLimit-Policy``, ``Retry-After`` on a 429), not by Sluice's formatter;
``/deny-first`` refuses the first ``deny_first`` requests with ``Retry-After: 1``;
``/gate`` holds each request until the test releases it.

``ScriptedServer`` answers its n-th request with the n-th answer given: a status line and
header lines exactly as written in the test.
"""

from __future__ import annotations

import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import List, Optional, Sequence, Tuple

from sluice_client import Limiter


def _ms(started: float) -> float:
    return (time.monotonic() - started) * 1000


class LimitedServer:
    def __init__(self, limit: int = 20, burst: int = 10, deny_first: int = 0) -> None:
        self.limit = limit
        self.burst = burst
        self.deny_first = deny_first
        self.limiter = Limiter("token_bucket", limit, 1000, burst)
        self.started = time.monotonic()
        self.lock = threading.Lock()
        self.hits = 0
        self.denials = 0
        #: (ms since start, status, path) of each request to a limited route, in order.
        self.log: List[Tuple[float, int, str]] = []
        self.gate = threading.Semaphore(0)
        self.gated = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers and body go in two writes

            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                if length:
                    self.rfile.read(length)
                server.handle(self)

            do_POST = do_GET

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def handle(self, h: BaseHTTPRequestHandler) -> None:
        path = h.path.split("?")[0]
        if path == "/limited":
            with self.lock:
                self.hits += 1
                now = _ms(self.started)
                d = self.limiter.decide(int(now))
                status = 200 if d.allowed else 429
                if not d.allowed:
                    self.denials += 1
                self.log.append((now, status, path))
            reset_s = -(-d.reset_after_ms // 1000)
            lines = [
                ("X-RateLimit-Limit", str(d.limit)),
                ("X-RateLimit-Remaining", str(d.remaining)),
                ("X-RateLimit-Reset", str(reset_s)),
                ("RateLimit-Policy", f'"test";q={self.limit};w=1'),
                ("RateLimit", f'"test";r={d.remaining};t={reset_s}'),
            ]
            if not d.allowed:
                lines.append(("Retry-After", str(max(1, -(-d.retry_after_ms // 1000)))))
            return self.reply(h, status, lines)
        if path == "/silent":
            # `/limited`'s bucket, saying nothing of it: a bare 429 or 200.
            with self.lock:
                self.hits += 1
                now = _ms(self.started)
                allowed = self.limiter.decide(int(now)).allowed
                status = 200 if allowed else 429
                if not allowed:
                    self.denials += 1
                self.log.append((now, status, path))
            return self.reply(h, status, [])
        if path == "/deny-first":
            with self.lock:
                denied = self.hits < self.deny_first
                self.hits += 1
                if denied:
                    self.denials += 1
                status = 429 if denied else 200
                self.log.append((_ms(self.started), status, path))
            lines = [("RateLimit-Policy", '"deny_first";q=100;w=1'), ("RateLimit", f'"deny_first";r={0 if denied else 50};t=1')]
            if denied:
                lines.append(("Retry-After", "1"))
            return self.reply(h, status, lines)
        if path == "/gate":
            with self.lock:
                self.hits += 1
                self.gated += 1
            self.gate.acquire(timeout=30)
            return self.reply(h, 200, [])
        self.reply(h, 404, [])

    def reply(self, h: BaseHTTPRequestHandler, status: int, lines: Sequence[Tuple[str, str]]) -> None:
        body = b"ok" if status == 200 else b"slow down"
        h.send_response(status)
        for name, value in lines:
            h.send_header(name, value)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    def release(self, n: int = 1000) -> None:
        for _ in range(n):
            self.gate.release()

    def admitted_ratio(self) -> float:
        """The requests ``/limited`` admitted, over the most its token bucket can admit from
        the first of them to the last (``burst + limit * span``): at most 1, and 1 for a
        client that used the whole quota. Both from the server's clock, in this run."""
        admitted = [ms for ms, status, path in self.log if path == "/limited" and status == 200]
        if not admitted:
            return 0.0
        span_s = (admitted[-1] - admitted[0]) / 1000
        return len(admitted) / (self.burst + self.limit * span_s)

    def close(self) -> None:
        self.release()
        self.httpd.shutdown()
        self.httpd.server_close()


class ScriptedServer:
    def __init__(self, answers: Sequence[Sequence[str]]) -> None:
        self.answers = answers
        #: When each request's head had arrived (time.monotonic(), seconds), in order.
        self.arrivals: List[float] = []
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.closed = False
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.closed:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                head = b""
                while b"\r\n\r\n" not in head:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    head += chunk
                if b"\r\n\r\n" not in head:
                    continue
                self.arrivals.append(time.monotonic())
                lines = self.answers[min(len(self.arrivals), len(self.answers)) - 1]
                text = "\r\n".join(lines) + "\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                conn.sendall(text.encode("latin-1"))

    def gap_ms(self, i: int) -> float:
        """Milliseconds from the arrival of request ``i`` to that of request ``i + 1``."""
        return (self.arrivals[i + 1] - self.arrivals[i]) * 1000

    def close(self) -> None:
        self.closed = True
        self.sock.close()


def free_port() -> int:
    """A loopback port nothing listens on."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def eventually(what: str, check, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.01)
    raise AssertionError(f"timed out waiting until {what}")


