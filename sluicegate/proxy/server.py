"""The proxy's listening socket, its client connections and a clean shutdown.

Example::

    server = ProxyServer(policy=policy, admission=Admission(client), pool=UpstreamPool(upstream))
    await server.start("127.0.0.1", 8081)
    ...
    await server.shutdown(grace_s=5)   # stop accepting, let requests in flight finish, close the rest
"""

from __future__ import annotations

import asyncio
from collections import Counter

from sluicegate.proxy.admission import Admission
from sluicegate.proxy.http1 import MAX_HEAD_BYTES
from sluicegate.proxy.policy import Policy
from sluicegate.proxy.session import Session
from sluicegate.proxy.upstream import UpstreamPool

IDLE_TIMEOUT_S = 60.0  # a client connection with no request (or a stalled body) for this long is closed
UPSTREAM_TIMEOUT_S = 60.0  # the upstream's time to a response head, and between pieces of its body


class ProxyServer:
    """Accepts client connections and serves each with a :class:`Session`.

    ``stats`` counts requests, forwarded, refused (429/503), upstream_errors (502/504) and bad_requests (400s).
    """

    def __init__(
        self,
        *,
        policy: Policy,
        admission: Admission,
        pool: UpstreamPool,
        idle_timeout_s: float = IDLE_TIMEOUT_S,
        upstream_timeout_s: float = UPSTREAM_TIMEOUT_S,
    ) -> None:
        self.policy = policy
        self.admission = admission
        self.pool = pool
        self.idle_timeout_s = idle_timeout_s
        self.upstream_timeout_s = upstream_timeout_s
        self.closing = False
        self.stats: Counter[str] = Counter()
        self._sessions: dict[Session, asyncio.Task[None]] = {}
        self._server: asyncio.AbstractServer | None = None

    def count(self, name: str) -> None:
        self.stats[name] += 1

    @property
    def address(self) -> tuple[str, int]:
        assert self._server is not None
        return self._server.sockets[0].getsockname()[:2]

    async def start(self, host: str, port: int) -> None:
        self._server = await asyncio.start_server(
            self._accept, host, port, limit=MAX_HEAD_BYTES, reuse_address=True, backlog=1024
        )

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        session = Session(self, reader, writer)
        task = asyncio.current_task()
        assert task is not None
        self._sessions[session] = task
        try:
            await session.serve()
        finally:
            del self._sessions[session]

    async def shutdown(self, grace_s: float) -> None:
        """Stop accepting; close idle connections now, give the others ``grace_s`` to finish their exchange."""
        self.closing = True
        if self._server is not None:
            self._server.close()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace_s
        while self._sessions and loop.time() < deadline:
            for session in list(self._sessions):
                if session.idle:
                    session.writer.close()  # its read ends at once: the session returns
            await asyncio.sleep(0.02)
        for task in list(self._sessions.values()):
            task.cancel()
        await asyncio.gather(*self._sessions.values(), return_exceptions=True)
        self.pool.close()
