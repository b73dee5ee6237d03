"""A small asyncio HTTP/1.1 server for the check API (keep-alive, pipelining).

Only what the API needs: requests with a Content-Length body (or none),
responses in request order. Bodies over 1 MiB get 413, header blocks over
16 KiB get 431, chunked request bodies get 411, and the connection closes
after any framing error.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from http import HTTPStatus

from sluicegate.router.api import HttpRequest, HttpResponse, error_response

MAX_HEADER_BYTES = 16 * 1024
MAX_BODY_BYTES = 1024 * 1024
MAX_PIPELINED = 128
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
    length_text = headers.get("content-length", "0")
    if not (length_text.isascii() and length_text.isdigit()):  # "²".isdigit() is True
        raise FramingError(400, "bad Content-Length")
    length = int(length_text)
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

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.buffer = bytearray()
        self.transport: asyncio.Transport | None = None
        # Each slot: [encoded response or None, keep_alive]; answered strictly in order.
        self.slots: deque[list] = deque()
        self.closing = False
        self.paused = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True

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
            try:
                result = self.handler(request)
            except Exception as exc:  # a bug must cost one request, not the connection
                result = error_response(500, f"internal error: {type(exc).__name__}")
            self._enqueue(result, keep_alive, head=request.method == "HEAD")
            if not keep_alive:
                break
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


async def serve_http(handler: Handler, host: str, port: int) -> asyncio.Server:
    """Listen on ``host:port`` and answer every connection with ``handler``."""
    loop = asyncio.get_running_loop()
    return await loop.create_server(lambda: HttpProtocol(handler), host, port, reuse_address=True, backlog=1024)
