"""An upstream app with a knee: ``python tests/functional/knee_upstream.py [--base-ms 100] [--knee 30] ...``.

A threaded ``http.server`` (HTTP/1.1, keep-alive) that prints
``knee upstream listening on 127.0.0.1:PORT`` once it accepts connections.

* ``GET /work``: served in ``base-ms`` while at most ``knee`` requests are in
  service (itself included, counted when it starts), else in
  ``base-ms * (n / knee) ** exponent``, times a uniform jitter of
  +-``jitter``; the answer is ``{"in_service": n, "ms": ...}``. So its
  throughput n / s(n) peaks at the knee and falls past it, like the backend of
  ``bench/adaptive_limit.py``. Time is spent sleeping, not computing: the app
  costs little CPU on a busy machine.
* ``GET /stats``: requests served and the most ever in service at once;
  ``?reset=1`` starts the count of the most again (for the next run).

Example (the service time the app gives the n-th request in service)::

    >>> Knee(base_ms=100, knee=30, exponent=2.0, jitter=0.0).service_ms(60, random.Random(1))
    400.0
"""

from __future__ import annotations

import argparse
import json
import random
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit


@dataclass(frozen=True, slots=True)
class Knee:
    """Service time as a function of the number in service: flat to ``knee``, then growing as a power."""

    base_ms: float
    knee: int
    exponent: float
    jitter: float

    def service_ms(self, in_service: int, rng: random.Random) -> float:
        slowdown = 1.0 if in_service <= self.knee else (in_service / self.knee) ** self.exponent
        return self.base_ms * slowdown * rng.uniform(1 - self.jitter, 1 + self.jitter)


class Counters:
    """What is in service now, the most at once since the last reset, and requests served."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.in_service = 0
        self.most = 0
        self.served = 0

    def enter(self) -> int:
        with self.lock:
            self.in_service += 1
            self.most = max(self.most, self.in_service)
            return self.in_service

    def leave(self) -> None:
        with self.lock:
            self.in_service -= 1
            self.served += 1

    def snapshot(self, *, reset: bool) -> dict[str, int]:
        with self.lock:
            stats = {"served": self.served, "most_in_service": self.most}
            if reset:
                self.most = self.in_service
            return stats


def handler_for(knee: Knee, counters: Counters, seed: int) -> type[BaseHTTPRequestHandler]:
    rng = random.Random(seed)
    rng_lock = threading.Lock()  # random.Random is not meant to be shared by threads without one

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # Head and body go out in two writes: with Nagle the body would wait for the proxy's delayed ACK
        # of the head (40 ms on Linux), on top of every service time.
        disable_nagle_algorithm = True

        def log_message(self, format: str, *args: object) -> None:  # quiet: the tests read stdout
            pass

        def do_GET(self) -> None:
            url = urlsplit(self.path)
            if url.path == "/work":
                in_service = counters.enter()
                try:
                    with rng_lock:
                        ms = knee.service_ms(in_service, rng)
                    time.sleep(ms / 1000)
                finally:
                    counters.leave()
                self._send(200, {"in_service": in_service, "ms": round(ms, 1)})
            elif url.path == "/stats":
                self._send(200, counters.snapshot(reset="reset" in parse_qs(url.query)))
            else:
                self._send(404, {"error": f"no {url.path}"})

        def _send(self, status: int, payload: object) -> None:
            body = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    return Handler


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # the proxy opens dozens of connections at once: a backlog of 5 drops SYNs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--base-ms", type=float, default=100.0, help="service time up to the knee")
    parser.add_argument("--knee", type=int, default=30, help="requests in service before it slows down")
    parser.add_argument("--exponent", type=float, default=2.0, help="past the knee: base x (n/knee)^exponent")
    parser.add_argument("--jitter", type=float, default=0.1, help="uniform +- fraction of each service time")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    if args.base_ms <= 0 or args.knee < 1 or args.exponent < 0 or not 0 <= args.jitter < 1:
        parser.error("need --base-ms > 0, --knee >= 1, --exponent >= 0 and 0 <= --jitter < 1")
    knee = Knee(base_ms=args.base_ms, knee=args.knee, exponent=args.exponent, jitter=args.jitter)
    server = Server(("127.0.0.1", args.port), handler_for(knee, Counters(), args.seed))
    print(f"knee upstream listening on 127.0.0.1:{server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
