"""UDP client of the partitions: one datagram per partition, retries, fallback.

Checks submitted in the same event-loop tick for the same partition are
coalesced into one datagram. A datagram is retried with the *same* request id
(the server answers repeats from its reply cache, so nothing is charged
twice); when every attempt times out, each check gets the configured
fallback decision with ``fallback=True``. The protocol state lives in the
pure :class:`sluicegate.exchange.Exchange` (the SDK's direct clients use it
too); this module adds the asyncio socket and timers.

Example::

    client = PartitionClient([("127.0.0.1", 7001), ("127.0.0.1", 7002)])
    await client.start()
    decision = await client.check("alice", cost=1)
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

from sluicegate import codec, datagram
from sluicegate import lease_calls as calls
from sluicegate.decision import Decision, fallback_decision
from sluicegate.exchange import Exchange, Flight
from sluicegate.routing import partition_for

__all__ = ["Decision", "Link", "PartitionClient", "UdpLink"]  # Decision: the router's callers import it from here

Address = tuple[str, int]
Deliver = Callable[[bytes, Any], None]


class Link(Protocol):
    """How the client sends datagrams; tests wrap it (e.g. to lose datagrams)."""

    def send(self, data: bytes, addr: Address) -> None: ...

    def close(self) -> None: ...


class UdpLink:
    """The real link: one unconnected, non-blocking UDP socket for all partitions."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.send_errors = 0

    @classmethod
    async def open(cls, deliver: Deliver, family: int = socket.AF_INET) -> UdpLink:
        sock = datagram.open_socket(family, ("::" if family == socket.AF_INET6 else "0.0.0.0", 0))
        datagram.watch(sock, deliver)
        return cls(sock)

    def send(self, data: bytes, addr: Address) -> None:
        try:
            self.sock.sendto(data, addr)
        except OSError:
            # Buffer full or an ICMP error from a stopped partition: the retry timer handles it.
            self.send_errors += 1

    def close(self) -> None:
        datagram.unwatch(self.sock)
        self.sock.close()


LinkFactory = Callable[[Deliver, int], Awaitable[Link]]


async def _resolve(address: Address) -> Address:
    host, port = address[0], address[1]
    try:
        socket.inet_pton(socket.AF_INET6 if ":" in host else socket.AF_INET, host)
        return (host, port)
    except OSError:
        pass
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_DGRAM)
    infos.sort(key=lambda info: info[0] != socket.AF_INET)  # IPv4 first, as servers bind it by default
    return infos[0][4][:2]


def _family(addresses: Sequence[Address]) -> int:
    return socket.AF_INET6 if any(":" in host for host, *_ in addresses) else socket.AF_INET


class PartitionClient:
    """Sends checks to the partition that owns each key (``partition_of``).

    ``addresses`` may be replaced in place (``client.addresses[:] = ...``) between
    checks, e.g. after resolving the partitions' names again.
    """

    def __init__(
        self,
        addresses: Sequence[Address],
        *,
        timeout_s: float = 0.05,
        attempts: int = 3,
        fail_open: bool = True,
        max_datagram: int = 8192,
        partition_of: Callable[[str, int], int] = partition_for,
        link_factory: LinkFactory = UdpLink.open,
    ) -> None:
        if not addresses:
            raise ValueError("at least one partition address is needed")
        self.addresses = list(addresses)
        self.timeout_s = timeout_s
        self.attempts = attempts
        self.fail_open = fail_open
        self._partition_of = partition_of
        self._link_factory = link_factory
        self._link: Link | None = None
        # Checks submitted in one loop iteration for one partition share a datagram.
        self._exchange = Exchange(
            attempts=attempts, timeout_s=timeout_s, fail_open=fail_open, max_datagram=max_datagram
        )
        self._waiters: dict[int, asyncio.Future[bytes]] = {}

    @property
    def fallbacks(self) -> int:
        """Checks answered with the fallback decision so far."""
        return self._exchange.fallbacks

    @property
    def timeouts(self) -> int:
        """Datagrams that got no reply in time so far (each attempt counts)."""
        return self._exchange.timeouts

    async def start(self) -> None:
        # Numeric addresses: replies are matched against them.
        self.addresses = [await _resolve(address) for address in self.addresses]
        self._link = await self._link_factory(self._on_datagram, _family(self.addresses))

    def close(self) -> None:
        if self._link is not None:
            self._link.close()

    def partition(self, key: str) -> int:
        return self._partition_of(key, len(self.addresses))

    def submit(self, key: str, cost: int = 1) -> asyncio.Future[Decision]:
        """Queue one check (validated by the caller); resolve when its partition answers."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Decision] = loop.create_future()
        index = self.partition(key)
        if self._exchange.queue(index, key, cost, future):
            loop.call_soon(self._flush, index)
        return future

    async def check(self, key: str, cost: int = 1, *, max_wait_ms: int = 0) -> Decision:
        """Decide a check; with ``max_wait_ms`` the partition may hold it until it fits (FIFO per key)."""
        if not max_wait_ms:
            return await self.submit(key, cost)
        data = calls.check_wait_request(self._exchange.new_id(), key, cost, max_wait_ms=max_wait_ms)
        reply = await self._call_waiting(self.partition(key), data, max_wait_ms)
        return self.fallback_decision(key) if reply is None else calls.check_decision(key, reply)

    async def acquire(self, key: str, cost: int = 1, *, ttl_ms: int = 30_000, max_wait_ms: int = 0) -> Decision:
        """Take a lease of ``cost`` on the key's concurrency limit (``decision.lease``), held at most ``ttl_ms``.

        A key without a concurrency limit is decided like a check (``lease`` None: nothing to release).
        """
        data = calls.acquire_request(self._exchange.new_id(), key, cost, ttl_ms=ttl_ms, max_wait_ms=max_wait_ms)
        reply = await self._call_waiting(self.partition(key), data, max_wait_ms)
        return self.fallback_decision(key) if reply is None else calls.acquire_decision(key, reply)

    async def release(self, key: str, lease: int, *, wait_ms: int = 0, service_ms: int = 0) -> bool:
        """Give a lease back with the request's waiting and service times; False if it was unknown or lost."""
        outcome = await self.release_outcome(key, lease, wait_ms=wait_ms, service_ms=service_ms)
        return outcome is not None and outcome.released

    async def release_outcome(
        self, key: str, lease: int, *, wait_ms: int = 0, service_ms: int = 0
    ) -> calls.Released | None:
        """Like :meth:`release`, telling an unknown lease (``released`` False) from no answer (None)."""
        data = calls.release_request(self._exchange.new_id(), key, lease, wait_ms=wait_ms, service_ms=service_ms)
        reply = await self.call(self.partition(key), data)
        return None if reply is None else calls.release_outcome(reply)

    async def _call_waiting(self, index: int, data: bytes, max_wait_ms: int) -> bytes | None:
        """Like :meth:`call`, but the partition may hold the request ``max_wait_ms``: keep re-sending
        (same request id: it is queued once, and a lost answer comes back from the reply cache)."""
        request_id = calls.request_id_of(data)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + calls.give_up_after_s(max_wait_ms, timeout_s=self.timeout_s, attempts=self.attempts)
        waiter: asyncio.Future[bytes] = loop.create_future()
        self._waiters[request_id] = waiter
        try:
            while True:
                self._link.send(data, self.addresses[index])  # type: ignore[union-attr]
                left = deadline - loop.time()
                if left <= 0:
                    return None
                try:
                    return await asyncio.wait_for(asyncio.shield(waiter), min(self.timeout_s, left))
                except TimeoutError:
                    continue
        finally:
            self._waiters.pop(request_id, None)
            waiter.cancel()

    async def check_many(self, checks: Sequence[tuple[str, int]]) -> list[Decision]:
        return list(await asyncio.gather(*(self.submit(key, cost) for key, cost in checks)))

    def fallback_decision(self, key: str) -> Decision:
        """What a check gets when its partition cannot be reached."""
        return fallback_decision(key, fail_open=self.fail_open)

    def _flush(self, index: int) -> None:
        flights, answers = self._exchange.flush(index, self.addresses[index], asyncio.get_running_loop().time())
        for flight in flights:
            self._transmit(flight)
        _answer(answers)

    def _transmit(self, flight: Flight) -> None:
        loop = asyncio.get_running_loop()
        flight.handle = loop.call_at(flight.deadline, self._on_timeout, flight.request_id)
        self._link.send(flight.data, flight.address)  # type: ignore[union-attr]

    def _on_timeout(self, request_id: int) -> None:
        outcome = self._exchange.timed_out(request_id, asyncio.get_running_loop().time())
        if isinstance(outcome, Flight):
            self._transmit(outcome)
        else:
            _answer(outcome)

    def _on_datagram(self, data: bytes, addr: Any) -> None:
        flight, answers = self._exchange.receive(data, addr)
        if flight is not None:
            if flight.handle is not None:
                flight.handle.cancel()
            _answer(answers)
            return
        try:
            _, request_id, _ = codec.decode_header(data)
        except codec.MalformedDatagram:
            return
        # Control replies, and CHECK replies to waiting checks (sent apart from the coalesced ones).
        waiter = self._waiters.pop(request_id, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(data)

    async def call(self, index: int, data: bytes) -> bytes | None:
        """Send a control datagram (stats, invalidate) to one partition, with retries."""
        request_id = codec.decode_header(data)[1]
        loop = asyncio.get_running_loop()
        for _ in range(self.attempts):
            waiter: asyncio.Future[bytes] = loop.create_future()
            self._waiters[request_id] = waiter
            self._link.send(data, self.addresses[index])  # type: ignore[union-attr]
            try:
                return await asyncio.wait_for(waiter, self.timeout_s)
            except TimeoutError:
                continue
            finally:
                self._waiters.pop(request_id, None)
        return None

    async def stats(self, index: int) -> dict[str, int] | None:
        """Counters of one partition, or None if it does not answer."""
        reply = await self.call(index, codec.encode_stats_request(self._exchange.new_id()))
        return None if reply is None else codec.decode_stats_reply(reply)[1]

    async def invalidate(self, keys: Sequence[str]) -> None:
        """Ask the owning partitions to reload these keys' rules (best effort)."""
        by_partition: dict[int, list[bytes]] = {}
        for key in keys:
            by_partition.setdefault(self.partition(key), []).append(key.encode("utf-8"))
        await asyncio.gather(
            *(
                self.call(index, codec.encode_invalidate_request(self._exchange.new_id(), chunk[i : i + 200]))
                for index, chunk in by_partition.items()
                for i in range(0, len(chunk), 200)
            )
        )


def _answer(answers: list[tuple[asyncio.Future[Decision], Decision]]) -> None:
    for future, decision in answers:
        if not future.done():  # a caller may have given up (cancelled) meanwhile
            future.set_result(decision)
