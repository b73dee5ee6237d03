"""A small asyncio HTTP/1.1 server for the check API (keep-alive, pipelining).

Only what the API needs: requests with a Content-Length body (or none),
responses in request order. Bodies over 1 MiB get 413, header blocks over
16 KiB get 431, chunked request bodies get 411, and the connection closes
after any framing error. A connection that completes no request for
``IDLE_TIMEOUT_S`` (60 s) while owed no answer is closed (with a 408 if a
request was half sent), so a slow or silent client cannot hold it forever.
``HttpServer.shutdown`` stops accepting, closes idle connections at once and
gives requests in flight a grace period before closing the rest.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from http import HTTPStatus

from sluicegate.router.api import HttpRequest, HttpResponse, ascii_digits, error_response

MAX_HEADER_BYTES = 16 * 1024
MAX_BODY_BYTES = 1024 * 1024
MAX_PIPELINED = 128
IDLE_TIMEOUT_S = 60.0
Handler = Callable[[HttpRequest], "HttpResponse | Awaitable[HttpResponse]"]
_REASONS = {status.value: status.phrase for status in HTTPStatus}


class FramingError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def parse_request(buffer: bytearray) -> tuple[HttpRequest, bool] | None:
    """Take one request off ``buffer``: ``(request, keep_alive)``, or None if incomplete."""
    end = buffer.find(b"\r\n\r\n")
    if end < 0:
        if len(buffer) > MAX_HEADER_BYTES:
            raise FramingError(431, "request header block too large")
        return None
    if end > MAX_HEADER_BYTES:
        raise FramingError(431, "request header block too large")
    lines = bytes(buffer[:end]).decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise FramingError(400, "malformed request line")
    method, target, version = parts
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise FramingError(400, "malformed header line")
        name = name.lower()
        if name == "content-length" and name in headers:
            raise FramingError(400, "more than one Content-Length")  # request smuggling guard
        headers[name] = value.strip()
    if "chunked" in headers.get("transfer-encoding", "").lower():
        raise FramingError(411, "chunked request bodies are not supported: send Content-Length")
    length = ascii_digits(headers.get("content-length", "0"))
    if length is None:
        raise FramingError(400, "bad Content-Length")
    if length > MAX_BODY_BYTES:
        raise FramingError(413, "request body too large")
    start = end + 4
    if len(buffer) < start + length:
        return None
    body = bytes(buffer[start : start + length])
    del buffer[: start + length]
    path, _, query = target.partition("?")
    # Connection is a list of tokens, e.g. "TE, close".
    connection = {token.strip() for token in headers.get("connection", "").lower().split(",")}
    keep_alive = "close" not in connection if version == "HTTP/1.1" else "keep-alive" in connection
    return HttpRequest(method, path, query, headers, body), keep_alive


def encode_response(response: HttpResponse, keep_alive: bool, head: bool = False) -> bytes:
    lines = [f"HTTP/1.1 {response.status} {_REASONS.get(response.status, 'Unknown')}"]
    lines += [f"{name}: {value}" for name, value in response.headers]
    if response.status != 204:  # a 204 must not carry Content-Length (RFC 9110 8.6)
        lines.append(f"Content-Length: {len(response.body)}")
    if not keep_alive:
        lines.append("Connection: close")
    head_bytes = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head_bytes if head else head_bytes + response.body


class HttpProtocol(asyncio.Protocol):
    """One connection: parses requests, calls the handler, writes answers in order."""

    def __init__(
        self,
        handler: Handler,
        *,
        idle_timeout_s: float | None = IDLE_TIMEOUT_S,
        connections: set[HttpProtocol] | None = None,
    ) -> None:
        self.handler = handler
        self.buffer = bytearray()
        self.transport: asyncio.Transport | None = None
        # Each slot: [encoded response or None, keep_alive]; answered strictly in order.
        self.slots: deque[list] = deque()
        self.closing = False
        self.paused = False
        self.idle_timeout_s = idle_timeout_s
        self.connections = connections
        self.last_request = 0.0  # loop time of the last complete request (or of the connection)
        self._idle_timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        if self.connections is not None:
            self.connections.add(self)
        if self.idle_timeout_s is not None:
            self._loop = loop = asyncio.get_running_loop()
            self.last_request = loop.time()
            self._idle_timer = loop.call_later(self.idle_timeout_s, self._check_idle)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        if self._idle_timer is not None:
            self._idle_timer.cancel()
        if self.connections is not None:
            self.connections.discard(self)

    def _check_idle(self) -> None:
        # One timer per connection, re-armed lazily: cheaper than resetting it at every request.
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        loop = self._loop
        assert loop is not None and self.idle_timeout_s is not None
        if self.slots:  # the client is waiting for us, not idle
            self.last_request = loop.time()
        left = self.last_request + self.idle_timeout_s - loop.time()
        if left > 0:
            self._idle_timer = loop.call_later(left, self._check_idle)
            return
        if self.buffer and not self.closing:
            self.buffer.clear()
            message = f"no complete request within {self.idle_timeout_s:g}s"
            self._enqueue(error_response(408, message), keep_alive=False)
        else:
            transport.close()

    def drain(self) -> None:
        """Server shutdown: read nothing more, answer what is in flight, then close."""
        self.closing = True
        self.buffer.clear()
        if not self.slots:
            if self.transport is not None:
                self.transport.close()
        else:
            self.slots[-1][1] = False

    def eof_received(self) -> bool:
        # The client half-closed: answer what is still pending, then close.
        self.closing = True
        if not self.slots:
            return False
        self.slots[-1][1] = False
        return True

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return
        self.buffer += data
        completed = False
        while not self.closing:
            try:
                parsed = parse_request(self.buffer)
            except FramingError as exc:
                self._enqueue(error_response(exc.status, str(exc)), keep_alive=False)
                self.buffer.clear()
                break
            if parsed is None:
                break
            request, keep_alive = parsed
            completed = True
            try:
                result = self.handler(request)
            except Exception as exc:  # a bug must cost one request, not the connection
                result = error_response(500, f"internal error: {type(exc).__name__}")
            self._enqueue(result, keep_alive, head=request.method == "HEAD")
            if not keep_alive:
                break
        if completed and self._idle_timer is not None:
            self.last_request = self._loop.time()  # type: ignore[union-attr]
        if len(self.slots) > MAX_PIPELINED and not self.paused:
            self.paused = True
            self.transport.pause_reading()  # type: ignore[union-attr]

    def _enqueue(self, result: HttpResponse | Awaitable[HttpResponse], keep_alive: bool, head: bool = False) -> None:
        if not keep_alive:
            self.closing = True
        if isinstance(result, HttpResponse):
            self.slots.append([encode_response(result, keep_alive, head), keep_alive])
            self._write_ready()
            return
        slot: list = [None, keep_alive]
        self.slots.append(slot)
        future = asyncio.ensure_future(result)

        def done(finished: asyncio.Future[HttpResponse]) -> None:
            try:
                response = finished.result()
            except (Exception, asyncio.CancelledError) as exc:
                response = error_response(500, f"internal error: {type(exc).__name__}")
            slot[0] = encode_response(response, keep_alive, head)
            self._write_ready()

        future.add_done_callback(done)

    def _write_ready(self) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        out = []
        while self.slots and self.slots[0][0] is not None:
            data, keep_alive = self.slots.popleft()
            out.append(data)
            if not keep_alive:
                transport.write(b"".join(out))
                transport.close()
                return
        if out:
            transport.write(b"".join(out) if len(out) > 1 else out[0])
        if self.paused and len(self.slots) <= MAX_PIPELINED // 2:
            self.paused = False
            transport.resume_reading()


class HttpServer:
    """A listening HTTP server and its open connections."""

    def __init__(self, server: asyncio.AbstractServer, connections: set[HttpProtocol]) -> None:
        self.server = server
        self.connections = connections

    @property
    def sockets(self) -> tuple:
        return tuple(self.server.sockets)  # type: ignore[attr-defined]

    def close(self) -> None:
        """Stop accepting connections (open ones stay open: see :meth:`shutdown`)."""
        self.server.close()

    async def wait_closed(self) -> None:
        await self.server.wait_closed()

    async def shutdown(self, grace_s: float = 1.0, close_wait_s: float = 0.5) -> None:
        """Stop accepting, close idle connections now, give requests in flight ``grace_s``, close the rest."""
        loop = asyncio.get_running_loop()
        self.server.close()
        for connection in list(self.connections):
            connection.drain()
        deadline = loop.time() + grace_s
        while self.connections and loop.time() < deadline:
            await asyncio.sleep(0.01)
        for connection in list(self.connections):
            if connection.transport is not None:
                connection.transport.abort()
        # From Python 3.12 wait_closed also waits for every connection: bound it.
        try:
            await asyncio.wait_for(self.server.wait_closed(), close_wait_s)
        except TimeoutError:
            pass


async def serve_http(
    handler: Handler, host: str, port: int, *, idle_timeout_s: float | None = IDLE_TIMEOUT_S
) -> HttpServer:
    """Listen on ``host:port`` and answer every connection with ``handler``."""
    loop = asyncio.get_running_loop()
    connections: set[HttpProtocol] = set()

    def protocol() -> HttpProtocol:
        return HttpProtocol(handler, idle_timeout_s=idle_timeout_s, connections=connections)

    server = await loop.create_server(protocol, host, port, reuse_address=True, backlog=1024)
    return HttpServer(server, connections)
