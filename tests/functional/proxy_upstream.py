"""A real upstream app for the proxy tests: ``python tests/functional/proxy_upstream.py`` (prints its port).

A threaded ``http.server`` speaking HTTP/1.1 with keep-alive:

* ``GET /headers``: the request as it arrived (method, target, header fields in order) as JSON;
  the response carries hop-by-hop fields the proxy must drop (``Connection: X-Private``, ``X-Private``).
* ``POST|PUT /echo``: the body (Content-Length or chunked) sent back chunked *while it is read*.
* ``GET /stream?gate=NAME``: a chunked answer: ``first\\n``, then waits until ``POST /open/NAME``
  (at most 20 s), then ``last\\n`` and a trailer ``X-Total: 2``.
* ``GET /big?mb=N``: N MiB of ``x`` with a Content-Length, written 64 KiB at a time.
* ``GET /slow?ms=N``: answers after N ms; ``/stats`` counts the most of them ever in flight.
* ``GET /stats``: connections accepted, requests served, most /slow requests in flight at once.
* anything else: 200 ``{"path": ...}``.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

PIECE = 64 * 1024


class State:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.connections = 0
        self.requests = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.gates: dict[str, threading.Event] = {}

    def gate(self, name: str) -> threading.Event:
        with self.lock:
            return self.gates.setdefault(name, threading.Event())


STATE = State()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:  # quiet: the tests read stdout
        pass

    def setup(self) -> None:
        super().setup()
        with STATE.lock:
            STATE.connections += 1

    def _count(self) -> None:
        with STATE.lock:
            STATE.requests += 1

    def _send_json(self, payload: object, extra: list[tuple[str, str]] = ()) -> None:
        body = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for name, value in extra:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _body_pieces(self):
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            while True:
                size = int(self.rfile.readline().split(b";")[0], 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b""):
                        pass
                    return
                left = size
                while left:
                    data = self.rfile.read(min(left, PIECE))
                    left -= len(data)
                    yield data
                self.rfile.readline()
        else:
            left = int(self.headers.get("Content-Length", "0"))
            while left:
                data = self.rfile.read1(min(left, PIECE))
                if not data:
                    return
                left -= len(data)
                yield data

    def do_GET(self) -> None:
        self._count()
        url = urlsplit(self.path)
        query = {name: values[0] for name, values in parse_qs(url.query).items()}
        if url.path == "/headers":
            fields = [[name, value] for name, value in self.headers.items()]
            self._send_json(
                {"method": self.command, "target": self.path, "headers": fields},
                [("Connection", "X-Private"), ("X-Private", "secret"), ("Keep-Alive", "timeout=5")],
            )
        elif url.path == "/stats":
            with STATE.lock:
                stats = {"connections": STATE.connections, "requests": STATE.requests, "max_slow": STATE.max_in_flight}
            self._send_json(stats)
        elif url.path == "/stream":
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.send_header("Trailer", "X-Total")
            self.end_headers()
            self._chunk(b"first\n")
            STATE.gate(query["gate"]).wait(20)
            self._chunk(b"last\n")
            self.wfile.write(b"0\r\nX-Total: 2\r\n\r\n")
        elif url.path == "/big":
            size = int(query["mb"]) * 1024 * 1024
            self.send_response(200)
            self.send_header("Content-Length", str(size))
            self.end_headers()
            piece = b"x" * PIECE
            for _ in range(size // PIECE):
                self.wfile.write(piece)
        elif url.path == "/slow":
            with STATE.lock:
                STATE.in_flight += 1
                STATE.max_in_flight = max(STATE.max_in_flight, STATE.in_flight)
            try:
                time.sleep(int(query["ms"]) / 1000)
            finally:
                with STATE.lock:
                    STATE.in_flight -= 1
            self._send_json({"slept_ms": int(query["ms"])})
        else:
            self._send_json({"path": self.path})

    def do_HEAD(self) -> None:
        self._count()
        self.send_response(200)
        self.send_header("Content-Length", "1234")
        self.end_headers()

    def do_POST(self) -> None:
        self._count()
        path = urlsplit(self.path).path
        if path.startswith("/open/"):
            STATE.gate(path.removeprefix("/open/")).set()
            self._send_json({"opened": path})
        elif path == "/echo":
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for piece in self._body_pieces():
                self._chunk(piece)
            self.wfile.write(b"0\r\n\r\n")
        else:
            size = sum(len(piece) for piece in self._body_pieces())
            self._send_json({"path": self.path, "received": size})

    do_PUT = do_POST
    do_DELETE = do_GET


def main() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1]) if len(sys.argv) > 1 else 0), Handler)
    server.daemon_threads = True
    print(f"upstream listening on 127.0.0.1:{server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
