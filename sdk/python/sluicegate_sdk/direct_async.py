"""``AsyncDirectClient``: the direct UDP client for asyncio applications.

Checks made in the same event-loop iteration for one partition go out as one
datagram (as in the router); retries keep the request id; after the last
attempt the check gets the ``on_error`` fallback. Name lookups run in a
thread, so a slow DNS never blocks the loop. The socket belongs to the loop
that opened it: used from another loop, the client starts afresh there.
Acquires, releases and waiting checks go out alone (the partition may hold
them) and are re-sent every ``timeout`` until the wait and the retries are over.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable, Iterable
from contextlib import AbstractAsyncContextManager
from types import TracebackType
from typing import TypeVar

from sluicegate import codec
from sluicegate import lease_calls as calls
from sluicegate.decision import Decision
from sluicegate.directory import UNREACHABLE
from sluicegate.exchange import Answer, Flight
from sluicegate_sdk.checks import normalize_checks, validate_check
from sluicegate_sdk.leases import DEFAULT_TTL_S, Lease, held_lease, hold_async, reported_ms, ttl_ms, wait_ms
from sluicegate_sdk.partitions import DirectBase

T = TypeVar("T")

DRAIN_LIMIT = 256  # datagrams read per wake-up, so timers and other readers still run under load


class AsyncDirectClient(DirectBase):
    """Checks over UDP from asyncio: ``await check(key, cost=1)``, ``await check_many([...])``; leases:
    ``await acquire(...)``, ``await release(...)``, ``async with client.lease(key) as decision:``.

    Same options as :class:`sluicegate_sdk.DirectClient`.

    Example::

        client = AsyncDirectClient([("127.0.0.1", 7001), ("127.0.0.1", 7002)])
        decision = await client.check("alice")
    """

    def _start(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sockets: dict[int, socket.socket] = {}
        self._addresses: list[tuple[str, int]] = []
        self._refresh_at = float("-inf")
        self._refreshing: asyncio.Future[None] | None = None
        self._closed = False
        self._held: dict[int, asyncio.Future[bytes]] = {}  # request id -> its answer, for requests sent alone

    async def check(self, key: str, cost: int = 1, *, max_wait: float = 0) -> Decision:
        """Spend ``cost`` credits of ``key`` if it has them; raises :class:`CheckError` for a bad key or cost.

        ``max_wait`` (seconds, up to 60): the partition may hold the check until the credit is there.
        """
        key, cost = validate_check(key, cost)
        waiting = wait_ms(max_wait)
        await self._ready()
        if not waiting:
            return await self._submit(key, cost)
        data = calls.check_wait_request(self._exchange.new_id(), key, cost, max_wait_ms=waiting)
        decision = await self._call_held(key, data, waiting, lambda reply: calls.check_decision(key, reply))
        return self._held_decision(key, decision)

    async def acquire(self, key: str, cost: int = 1, *, ttl: float = DEFAULT_TTL_S, max_wait: float = 0) -> Decision:
        """Take a lease on the key's concurrency limit (``decision.lease``); see ``Client.acquire``."""
        key, cost = validate_check(key, cost)
        waiting = wait_ms(max_wait)
        lease_ms = ttl_ms(ttl)
        await self._ready()
        data = calls.acquire_request(self._exchange.new_id(), key, cost, ttl_ms=lease_ms, max_wait_ms=waiting)
        decision = await self._call_held(key, data, waiting, lambda reply: calls.acquire_decision(key, reply))
        return self._held_decision(key, decision)

    async def release(self, held: Decision | Lease, *, wait: float = 0, service: float = 0) -> bool:
        """Give a lease back; False when there was none or it was not confirmed (see ``Client.release``)."""
        found = held_lease(held)
        if found is None:
            return False
        key, lease = found
        times = {"wait_ms": reported_ms("wait", wait), "service_ms": reported_ms("service", service)}
        await self._ready()
        data = calls.release_request(self._exchange.new_id(), key, lease, **times)
        outcome = await self._call_held(key, data, 0, calls.release_outcome)
        if outcome is None:
            self._lost_release(key)
            self._refresh_at = float("-inf")
            return False
        return outcome.released

    def lease(
        self, key: str, cost: int = 1, *, ttl: float = DEFAULT_TTL_S, max_wait: float = 0
    ) -> AbstractAsyncContextManager[Decision]:
        """``async with client.lease(key) as decision:``: acquire, run the block, release with measured times."""
        return hold_async(self.acquire, self.release, key, cost, ttl=ttl, max_wait=max_wait)

    async def check_many(self, checks: Iterable[str | tuple[str, int]]) -> list[Decision]:
        """Several checks (keys, or ``(key, cost)`` pairs), decided in order, one datagram per partition."""
        items = normalize_checks(checks)
        await self._ready()
        return list(await asyncio.gather(*(self._submit(key, cost) for key, cost in items)))

    async def close(self) -> None:
        """Close the sockets; checks after this raise RuntimeError."""
        self._closed = True
        self._drop_sockets()

    async def __aenter__(self) -> AsyncDirectClient:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def _ready(self) -> None:
        """Bound to this loop, with addresses no older than the TTL (or than the last fallback)."""
        if self._closed:
            raise RuntimeError("this AsyncDirectClient is closed")
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._drop_sockets()
            self._loop = loop
            self._exchange = self._new_exchange()  # flights of another loop can never complete here
            self._refreshing = None
            self._refresh_at = float("-inf")
        if loop.time() >= self._refresh_at:
            if self._refreshing is None:
                self._refreshing = asyncio.ensure_future(self._refresh())
            await asyncio.shield(self._refreshing)

    async def _refresh(self) -> None:
        try:
            self._directory.expire()
            self._addresses = await asyncio.to_thread(self._directory.addresses)
            self._refresh_at = asyncio.get_running_loop().time() + self.dns_ttl
        finally:
            self._refreshing = None

    def _held_decision(self, key: str, decision: Decision | None) -> Decision:
        if decision is None:
            self._refresh_at = float("-inf")  # look the partitions up again before the next call
        return self._decided(key, decision)

    async def _call_held(self, key: str, data: bytes, max_wait_ms: int, read: Callable[[bytes], T]) -> T | None:
        """Send ``data`` to the key's partition until it answers (``read(reply)``) or the budget is spent."""
        address = self._addresses[self.partition(key)]
        if address == UNREACHABLE:
            return None
        loop = asyncio.get_running_loop()
        request_id = calls.request_id_of(data)
        give_up = loop.time() + calls.give_up_after_s(max_wait_ms, timeout_s=self.timeout, attempts=self.attempts)
        sock = self._socket(socket.AF_INET6 if ":" in address[0] else socket.AF_INET)
        answer: asyncio.Future[bytes] = loop.create_future()
        self._held[request_id] = answer
        try:
            while (left := give_up - loop.time()) > 0:
                try:
                    sock.sendto(data, address)
                except OSError:
                    pass  # buffer full: the next round sends it again
                try:
                    reply = await asyncio.wait_for(asyncio.shield(answer), min(self.timeout, left))
                except TimeoutError:
                    continue
                try:
                    return read(reply)
                except codec.MalformedDatagram:
                    return None
            return None
        finally:
            self._held.pop(request_id, None)
            answer.cancel()

    def _submit(self, key: str, cost: int) -> asyncio.Future[Decision]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Decision] = loop.create_future()
        index = self.partition(key)
        if self._exchange.queue(index, key, cost, future):
            loop.call_soon(self._flush, index)
        return future

    def _flush(self, index: int) -> None:
        address = self._addresses[index]
        if address == UNREACHABLE:  # its name never resolved: no use waiting for the timeouts
            self._answer(self._exchange.fail_queued(index))
            return
        flights, failed = self._exchange.flush(index, address, self._loop.time())  # type: ignore[union-attr]
        for flight in flights:
            self._transmit(flight)
        self._answer(failed)

    def _transmit(self, flight: Flight) -> None:
        loop = self._loop
        assert loop is not None
        flight.handle = loop.call_at(flight.deadline, self._on_timeout, flight.request_id)
        try:
            self._socket(socket.AF_INET6 if ":" in flight.address[0] else socket.AF_INET).sendto(
                flight.data, flight.address
            )
        except OSError:
            pass  # buffer full, or an error from a stopped partition: the retry timer handles it

    def _on_timeout(self, request_id: int) -> None:
        outcome = self._exchange.timed_out(request_id, self._loop.time())  # type: ignore[union-attr]
        if isinstance(outcome, Flight):
            self._transmit(outcome)
        else:
            self._answer(outcome)

    def _on_readable(self, sock: socket.socket) -> None:
        for _ in range(DRAIN_LIMIT):
            try:
                data, sender = sock.recvfrom(65535)
            except OSError:  # nothing more queued (BlockingIOError), or an ICMP error
                return
            flight, answers = self._exchange.receive(data, sender)
            if flight is not None:
                if flight.handle is not None:
                    flight.handle.cancel()
                self._answer(answers)
            elif self._held:
                self._answer_held(data)

    def _answer_held(self, data: bytes) -> None:
        try:
            request_id = calls.request_id_of(data)
        except codec.MalformedDatagram:
            return
        answer = self._held.pop(request_id, None)
        if answer is not None and not answer.done():
            answer.set_result(data)

    def _answer(self, answers: list[Answer]) -> None:
        if not answers:
            return
        for future, decision in answers:
            if not future.done():  # its caller may have been cancelled meanwhile
                future.set_result(decision)
        before = self.on_error.count
        self._note_fallbacks([decision for _, decision in answers])
        if self.on_error.count != before:
            self._refresh_at = float("-inf")  # look the partitions up again before the next check

    def _socket(self, family: int) -> socket.socket:
        sock = self._sockets.get(family)
        if sock is None:
            sock = socket.socket(family, socket.SOCK_DGRAM)
            sock.setblocking(False)
            sock.bind(("::" if family == socket.AF_INET6 else "0.0.0.0", 0))
            self._loop.add_reader(sock.fileno(), self._on_readable, sock)  # type: ignore[union-attr]
            self._sockets[family] = sock
        return sock

    def _drop_sockets(self) -> None:
        sockets, self._sockets = self._sockets, {}
        for sock in sockets.values():
            if self._loop is not None and not self._loop.is_closed():
                self._loop.remove_reader(sock.fileno())
            sock.close()
