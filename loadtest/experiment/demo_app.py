"""A small web application rate-limited by Sluicegate through the SDK's WSGI middleware.

``GET /`` renders a little page after about ``--work-ms`` of CPU (the paper's "any page that does
a little work"); ``GET /healthz`` answers at once and is not limited. Requests are keyed by the
client's IP address (the paper's choice) or by a header. Served by a threaded ``wsgiref`` server.

Example::

    python -m loadtest.experiment.demo_app --sluicegate http://127.0.0.1:8080 --port 8000
    python -m loadtest.experiment.demo_app --sluicegate http://127.0.0.1:8080 --key header:X-Api-Key
"""

from __future__ import annotations

import argparse
import hashlib
import html
import signal
import sys
import time
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from sluicegate_sdk import Client
from sluicegate_sdk.keys import KeyFunc, RequestInfo, client_ip, header
from sluicegate_sdk.wsgi import RateLimitMiddleware

UNLIMITED_PATHS = frozenset({"/healthz"})
WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def busy(cpu_seconds: float) -> int:
    """Hash until this thread has used ``cpu_seconds`` of CPU: the page's "work". Returns the rounds done."""
    deadline = time.thread_time() + cpu_seconds
    digest, rounds = b"sluicegate", 0
    while time.thread_time() < deadline:
        for _ in range(64):
            digest = hashlib.sha256(digest).digest()
        rounds += 64
    return rounds


def page_app(*, work_s: float) -> WsgiApp:
    """The application being protected: a page after ``work_s`` of CPU, and a health check."""

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO") == "/healthz":
            body = b'{"status":"ok"}'
            start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
            return [body]
        rounds = busy(work_s)
        client = html.escape(environ.get("REMOTE_ADDR") or "?")
        body = (
            "<!doctype html><title>Sluicegate demo</title>"
            f"<h1>Hello {client}</h1><p>This page took {rounds} hash rounds to make.</p>"
        ).encode()
        start_response("200 OK", [("Content-Type", "text/html; charset=utf-8"), ("Content-Length", str(len(body)))])
        return [body]

    return app


def key_function(spec: str) -> KeyFunc:
    """``ip`` (the client address) or ``header:NAME``; health checks are never limited."""
    if spec == "ip":
        base = client_ip
    elif spec.startswith("header:") and spec[len("header:") :]:
        base = header(spec[len("header:") :])
    else:
        raise ValueError(f"--key must be 'ip' or 'header:NAME', got {spec!r}")

    def key(request: RequestInfo) -> str | None:
        return None if request.path in UNLIMITED_PATHS else base(request)

    return key


class ThreadingServer(ThreadingMixIn, WSGIServer):
    """One thread per connection, so a slow request never holds up the others."""

    daemon_threads = True
    request_queue_size = 256  # the experiment opens a connection per request, 130 a second


class QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # one line per request would cost more than the page
        pass


def server_timing(app: WsgiApp) -> WsgiApp:
    """Add ``Server-Timing: app;dur=<ms>``: the time from the request reaching the app to its status line.

    The experiment logs it next to the latency the client sees, to tell time spent in the app
    (the check and the page) from time spent before it (the client, the network, the accept queue).
    """

    def timed(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        started = time.perf_counter()

        def start_timed(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            elapsed_ms = (time.perf_counter() - started) * 1000
            return start_response(status, [*headers, ("Server-Timing", f"app;dur={elapsed_ms:.3f}")], exc_info)

        return app(environ, start_timed)

    return timed


def build(sluicegate: str, *, key: str = "ip", work_ms: float = 2.0, timeout_s: float = 0.5) -> WsgiApp:
    """The page app behind the SDK's middleware (fail open: a Sluicegate outage must not take the page down)."""
    client = Client(sluicegate, timeout=timeout_s, on_error="allow", pool_size=32)
    return server_timing(RateLimitMiddleware(page_app(work_s=work_ms / 1000), client, key=key_function(key)))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sluicegate", required=True, help="the check API's base URL, e.g. http://127.0.0.1:8080")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000, help="0 = any free port (default %(default)s)")
    parser.add_argument("--key", default="ip", help="'ip' (default) or 'header:NAME'")
    parser.add_argument("--work-ms", type=float, default=2.0, help="CPU time per page (default %(default)s)")
    args = parser.parse_args(argv)
    try:
        app = build(args.sluicegate, key=args.key, work_ms=args.work_ms)
    except ValueError as exc:
        parser.error(str(exc))
    server = make_server(args.host, args.port, app, server_class=ThreadingServer, handler_class=QuietHandler)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # SIGTERM exits like Ctrl-C
    print(f"demo app: http://{args.host}:{server.server_port} (Sluicegate {args.sluicegate})", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
