"""``AsyncClient``: the HTTP client for asyncio applications (streams, kept-alive connections).

Same surface as :class:`sluicegate_sdk.Client`, with ``await``. Connections
belong to the event loop that opened them: used from another loop (a test
client that runs each request on a new loop, say), the client starts a new pool.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Iterable, Mapping
from contextlib import AbstractAsyncContextManager
from types import TracebackType

from sluicegate.decision import Decision
from sluicegate_sdk.checks import normalize_checks, validate_check
from sluicegate_sdk.httpapi import (
    ClientOptions,
    Unavailable,
    acquire_body,
    batch_body,
    batches,
    decisions,
    release_body,
    released,
)
from sluicegate_sdk.leases import (
    DEFAULT_TTL_S,
    Lease,
    LostReleases,
    held_lease,
    hold_async,
    reported_ms,
    ttl_ms,
    wait_ms,
)

MAX_HEAD = 64 * 1024
MAX_BODY = 4 * 1024 * 1024
Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class AsyncClient:
    """Checks over HTTP from asyncio: ``await check(key, cost=1)``, ``await check_many([...])``;
    leases: ``await acquire(...)``, ``await release(...)``, ``async with client.lease(key) as decision:``.

    ``timeout`` bounds each HTTP request, in seconds; ``on_error`` is
    ``"allow"`` (fail open) or ``"deny"`` (fail closed); ``pool_size`` idle
    connections are kept.

    Example::

        async with AsyncClient("http://127.0.0.1:8080") as client:
            decision = await client.check("alice")
            async with client.lease("db", max_wait=0.25) as seat:
                if seat.allowed:
                    await run_query()
    """

    def __init__(
        self,
        endpoint: str = "http://127.0.0.1:8080",
        *,
        timeout: float = 1.0,
        on_error: str = "allow",
        pool_size: int = 8,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        options = ClientOptions.parse(
            endpoint, timeout=timeout, on_error=on_error, pool_size=pool_size, headers=headers
        )
        self.endpoint = options.endpoint
        self.timeout = timeout
        self.on_error = options.on_error
        self.pool_size = pool_size
        self._head_fields = "".join(f"{name}: {value}\r\n" for name, value in options.headers.items())
        self._idle: list[Connection] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        self.lost_releases = LostReleases()

    @property
    def fallbacks(self) -> int:
        """Checks (and acquires) answered with the ``on_error`` fallback so far."""
        return self.on_error.count

    async def check(self, key: str, cost: int = 1, *, max_wait: float = 0) -> Decision:
        """Spend ``cost`` credits of ``key`` if it has them; raises :class:`CheckError` for a bad key or cost.

        ``max_wait`` (seconds, up to 60): the service may hold the check until the credit is there.
        """
        key, cost = validate_check(key, cost)
        waiting = wait_ms(max_wait)
        try:
            status, body = await self._request("GET", self.endpoint.check_target(key, cost, waiting), b"", waiting)
            return decisions(status, body, 1)[0]
        except Unavailable as exc:
            return self.on_error.decide(key, f"{self.endpoint.host_header}: {exc}")

    async def acquire(self, key: str, cost: int = 1, *, ttl: float = DEFAULT_TTL_S, max_wait: float = 0) -> Decision:
        """Take a lease on the key's concurrency limit (``decision.lease``); see ``Client.acquire``."""
        key, cost = validate_check(key, cost)
        waiting = wait_ms(max_wait)
        body = acquire_body(key, cost, ttl_ms(ttl), waiting)
        try:
            status, data = await self._request("POST", self.endpoint.acquire_target, body, waiting)
            return decisions(status, data, 1)[0]
        except Unavailable as exc:
            return self.on_error.decide(key, f"{self.endpoint.host_header}: {exc}")

    async def release(self, held: Decision | Lease, *, wait: float = 0, service: float = 0) -> bool:
        """Give a lease back; False when there was none or it was not confirmed (see ``Client.release``)."""
        found = held_lease(held)
        if found is None:
            return False
        key, lease = found
        body = release_body(key, lease, reported_ms("wait", wait), reported_ms("service", service))
        try:
            return released(*await self._request("POST", self.endpoint.release_target, body))
        except Unavailable as exc:
            self.lost_releases.note(key, f"{self.endpoint.host_header}: {exc}")
            return False

    def lease(
        self, key: str, cost: int = 1, *, ttl: float = DEFAULT_TTL_S, max_wait: float = 0
    ) -> AbstractAsyncContextManager[Decision]:
        """``async with client.lease(key) as decision:``: acquire, run the block, release with measured times."""
        return hold_async(self.acquire, self.release, key, cost, ttl=ttl, max_wait=max_wait)

    async def check_many(self, checks: Iterable[str | tuple[str, int]]) -> list[Decision]:
        """Several checks (keys, or ``(key, cost)`` pairs), decided in order; 100 per request."""
        decided: list[Decision] = []
        for chunk in batches(normalize_checks(checks)):
            try:
                status, body = await self._request("POST", self.endpoint.batch_target, batch_body(chunk))
                decided += decisions(status, body, len(chunk))
            except Unavailable as exc:
                decided += [self.on_error.decide(key, f"{self.endpoint.host_header}: {exc}") for key, _ in chunk]
        return decided

    async def close(self) -> None:
        """Close the idle connections; checks after this raise RuntimeError."""
        self._closed = True
        idle, self._idle = self._idle, []
        for _, writer in idle:
            writer.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def _request(self, method: str, target: str, body: bytes, held_ms: int = 0) -> tuple[int, bytes]:
        """One request; the service may hold it ``held_ms`` longer than ``timeout``."""
        if self._closed:
            raise RuntimeError("this AsyncClient is closed")
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            # Streams are tied to the loop that opened them: start afresh on this one.
            self._loop, stale, self._idle = loop, self._idle, []
            for conn in stale:
                _discard(conn)
        head = f"{method} {target} HTTP/1.1\r\n{self._head_fields}"
        if method == "POST":
            head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        request = (head + "\r\n").encode("latin-1") + body
        try:
            async with asyncio.timeout(self.timeout + held_ms / 1000):
                return await self._send(request)
        except (OSError, TimeoutError, asyncio.IncompleteReadError, ValueError, ssl.SSLError) as exc:
            raise Unavailable(f"{type(exc).__name__}: {exc}") from exc

    async def _send(self, request: bytes) -> tuple[int, bytes]:
        reused = bool(self._idle)
        conn = self._idle.pop() if reused else await self._connect()
        while True:
            try:
                status, body, keep = await _round_trip(conn, request)
            except (ConnectionError, asyncio.IncompleteReadError) as exc:
                _discard(conn)
                # A kept-alive connection the server closed meanwhile fails like this: once more on a new one.
                if not reused or (isinstance(exc, asyncio.IncompleteReadError) and exc.partial):
                    raise
                conn, reused = await self._connect(), False
                continue
            except BaseException:  # timed out, cancelled, garbled: the connection is in an unknown state
                _discard(conn)
                raise
            if keep and not self._closed and len(self._idle) < self.pool_size:
                self._idle.append(conn)
            else:
                conn[1].close()
            return status, body

    async def _connect(self) -> Connection:
        endpoint = self.endpoint
        context = ssl.create_default_context() if endpoint.scheme == "https" else None
        return await asyncio.open_connection(endpoint.host, endpoint.port, ssl=context, limit=MAX_HEAD)


def _discard(conn: Connection) -> None:
    """Drop a connection at once (no goodbye): its state is unknown, or its loop is gone."""
    transport = conn[1].transport
    try:
        transport.abort()
    except RuntimeError:  # its event loop is closed: at least tell the server we are gone
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


async def _round_trip(conn: Connection, request: bytes) -> tuple[int, bytes, bool]:
    """Write one request, read its answer: ``(status, body, keep the connection)``."""
    reader, writer = conn
    writer.write(request)
    await writer.drain()
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
    status_line, *lines = head[:-4].split("\r\n")
    version, _, rest = status_line.partition(" ")
    status_text = rest[:3]
    if not version.startswith("HTTP/1.") or not status_text.isdigit():
        raise ValueError(f"not an HTTP/1.x status line: {status_line[:80]!r}")
    headers: dict[str, str] = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    connection = headers.get("connection", "").lower()
    keep = version == "HTTP/1.1" and "close" not in connection
    if "chunked" in headers.get("transfer-encoding", "").lower():
        body = await _read_chunked(reader)
    elif "content-length" in headers:
        length = int(headers["content-length"])
        if not 0 <= length <= MAX_BODY:
            raise ValueError(f"answer body of {length} bytes")
        body = await reader.readexactly(length)
    else:  # the body runs to the end of the connection
        body, keep = await reader.read(MAX_BODY), False
    return int(status_text), body, keep


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    parts = []
    total = 0
    while True:
        size = int((await reader.readline()).split(b";")[0].strip() or b"x", 16)
        if size == 0:
            while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                pass  # trailer fields
            return b"".join(parts)
        total += size
        if total > MAX_BODY:
            raise ValueError("answer body too large")
        parts.append(await reader.readexactly(size))
        await reader.readexactly(2)
