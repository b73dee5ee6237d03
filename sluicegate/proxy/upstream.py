"""The upstream service: its URL, and a pool of kept-alive connections to it.

A connection goes back to the pool after a complete exchange that left it
usable (both bodies delimited and read whole, no ``Connection: close``), and
is taken again newest first; one idle longer than ``idle_s`` (servers close
idle connections after a few seconds) or closed by the server meanwhile is
dropped instead of reused.

Example::

    pool = UpstreamPool(Upstream.parse("http://127.0.0.1:9000/app"))
    conn = await pool.get()
    ...                   # one exchange on conn.reader / conn.writer
    pool.put(conn)        # or conn.close() when it is no longer usable
"""

from __future__ import annotations

import asyncio
import socket
from collections import deque
from dataclasses import dataclass
from urllib.parse import urlsplit

from sluicegate.proxy.http1 import MAX_HEAD_BYTES

CONNECT_TIMEOUT_S = 5.0
IDLE_S = 4.0
MAX_IDLE = 256


class UpstreamError(Exception):
    """The upstream could not serve the request; ``status`` is 502 (unreachable, broken) or 504 (too slow)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class Upstream:
    """Where requests go: ``http://host:port`` and an optional base path put before every request's path.

    Example:
        >>> Upstream.parse("http://127.0.0.1:9000/app/")
        Upstream(host='127.0.0.1', port=9000, base_path='/app')
    """

    host: str
    port: int
    base_path: str = ""

    @property
    def authority(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == 80 else f"{host}:{self.port}"

    @classmethod
    def parse(cls, url: str) -> Upstream:
        parts = urlsplit(url)
        if parts.scheme != "http":
            raise ValueError(f"--upstream must be an http:// URL (TLS to the upstream is not supported), got {url!r}")
        if parts.query or parts.fragment or parts.username or parts.password:
            raise ValueError(f"--upstream takes http://host:port[/base path] only, got {url!r}")
        try:
            port = parts.port or 80
        except ValueError as exc:
            raise ValueError(f"--upstream has a bad port: {url!r}") from exc
        if not parts.hostname:
            raise ValueError(f"--upstream has no host: {url!r}")
        return cls(parts.hostname, port, parts.path.rstrip("/"))


class Connection:
    """One TCP connection to the upstream."""

    __slots__ = ("idle_since", "reader", "reused", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.reused = False
        self.idle_since = 0.0

    @property
    def usable(self) -> bool:
        return not (self.reader.at_eof() or self.writer.transport.is_closing())

    def close(self) -> None:
        self.writer.transport.abort()  # never linger: an unusable connection has nothing left to say


class UpstreamPool:
    """Kept-alive connections to one upstream; :attr:`opened` counts the connections made."""

    def __init__(
        self,
        upstream: Upstream,
        *,
        idle_s: float = IDLE_S,
        max_idle: int = MAX_IDLE,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
    ) -> None:
        self.upstream = upstream
        self.idle_s = idle_s
        self.max_idle = max_idle
        self.connect_timeout_s = connect_timeout_s
        self.opened = 0
        self._idle: deque[Connection] = deque()
        self._closed = False

    async def get(self) -> Connection:
        """A pooled connection (``reused`` set) if one is still good, else a new one."""
        now = asyncio.get_running_loop().time()
        while self._idle:
            conn = self._idle.pop()
            if conn.usable and now - conn.idle_since < self.idle_s:
                conn.reused = True
                return conn
            conn.close()
        return await self.connect()

    async def connect(self) -> Connection:
        """A new connection; :class:`UpstreamError` 502 if refused, 504 if it takes too long."""
        host, port = self.upstream.host, self.upstream.port
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                reader, writer = await asyncio.open_connection(host, port, limit=MAX_HEAD_BYTES)
        except TimeoutError as exc:
            raise UpstreamError(504, f"upstream {host}:{port} did not accept a connection in time") from exc
        except OSError as exc:
            raise UpstreamError(502, f"upstream {host}:{port} unreachable: {exc.strerror or exc}") from exc
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.opened += 1
        return Connection(reader, writer)

    def put(self, conn: Connection) -> None:
        """Give back a connection whose exchange ended cleanly."""
        if self._closed or len(self._idle) >= self.max_idle or not conn.usable:
            conn.close()
            return
        conn.idle_since = asyncio.get_running_loop().time()
        self._idle.append(conn)

    def close(self) -> None:
        self._closed = True
        while self._idle:
            self._idle.pop().close()
