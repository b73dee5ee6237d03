"""UDP client of the partitions: one datagram per partition, retries, fallback.

Checks submitted in the same event-loop tick for the same partition are
coalesced into one datagram. A datagram is retried with the *same* request id
(the server answers repeats from its reply cache, so nothing is charged
twice); when every attempt times out, each check gets the configured
fallback decision with ``fallback=True``.

Example::

    client = PartitionClient([("127.0.0.1", 7001), ("127.0.0.1", 7002)])
    await client.start()
    decision = await client.check("alice", cost=1)
"""

from __future__ import annotations

import asyncio
import random
import socket
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from sluicegate import codec, datagram
from sluicegate.routing import partition_for
from sluicegate.rules import NEVER_MS

Address = tuple[str, int]
Deliver = Callable[[bytes, Any], None]
FALLBACK_RETRY_MS = 1000


@dataclass(frozen=True, slots=True)
class Decision:
    """The answer to one check. ``remaining``/``retry_after_ms`` are None when unknown.

    ``retry_after_ms`` is None on a denial that no wait can fix (the cost
    exceeds the capacity, or the rule refills nothing).
    """

    key: str
    allowed: bool
    remaining: int | None
    retry_after_ms: int | None
    fallback: bool = False
    capacity: int | None = None
    window_ms: int | None = None
    default_rule: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "allowed": self.allowed,
            "remaining": self.remaining,
            "retry_after_ms": self.retry_after_ms,
            "fallback": self.fallback,
        }


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


_Item = tuple[bytes, str, int, "asyncio.Future[Decision]"]


class _InFlight:
    __slots__ = ("attempts_left", "data", "index", "items", "timer")

    def __init__(self, data: bytes, index: int, items: list[_Item], attempts_left: int) -> None:
        self.data = data
        self.index = index
        self.items = items
        self.attempts_left = attempts_left
        self.timer: asyncio.TimerHandle | None = None


class PartitionClient:
    """Sends checks to the partition that owns each key (``partition_of``)."""

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
        self.max_datagram = max_datagram
        self._partition_of = partition_of
        self._link_factory = link_factory
        self._link: Link | None = None
        self._next_id = random.getrandbits(64)
        # Checks submitted in one loop iteration for one partition share a datagram.
        self._queued: list[list[_Item]] = [[] for _ in self.addresses]
        self._inflight: dict[int, _InFlight] = {}
        self._waiters: dict[int, asyncio.Future[bytes]] = {}
        self.fallbacks = 0
        self.timeouts = 0

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
        future: asyncio.Future[Decision] = asyncio.get_running_loop().create_future()
        index = self.partition(key)
        queue = self._queued[index]
        if not queue:
            asyncio.get_running_loop().call_soon(self._flush, index)
        queue.append((key.encode("utf-8"), key, cost, future))
        return future

    async def check(self, key: str, cost: int = 1) -> Decision:
        return await self.submit(key, cost)

    async def check_many(self, checks: Sequence[tuple[str, int]]) -> list[Decision]:
        return list(await asyncio.gather(*(self.submit(key, cost) for key, cost in checks)))

    def _flush(self, index: int) -> None:
        items = self._queued[index]
        self._queued[index] = []
        chunk: list[_Item] = []
        request_bytes = reply_bytes = codec.HEADER_SIZE
        for item in items:
            grow_request = 6 + len(item[0])
            full = len(chunk) == codec.MAX_ITEMS
            if chunk and (
                full or max(request_bytes + grow_request, reply_bytes + codec.RESULT_ITEM.size) > self.max_datagram
            ):
                self._send_new(chunk, index)
                chunk, request_bytes, reply_bytes = [], codec.HEADER_SIZE, codec.HEADER_SIZE
            chunk.append(item)
            request_bytes += grow_request
            reply_bytes += codec.RESULT_ITEM.size
        self._send_new(chunk, index)

    def _new_id(self) -> int:
        self._next_id = (self._next_id + 1) & 0xFFFF_FFFF_FFFF_FFFF
        return self._next_id

    def _send_new(self, items: list[_Item], index: int) -> None:
        request_id = self._new_id()
        try:
            data = codec.encode_check_request(request_id, [(key, cost) for key, _, cost, _ in items])
        except ValueError:  # a check the API should have refused: answer, never leave a caller hanging
            self._fall_back(items)
            return
        flight = _InFlight(data, index, items, self.attempts)
        self._inflight[request_id] = flight
        self._transmit(request_id, flight)

    def _transmit(self, request_id: int, flight: _InFlight) -> None:
        flight.attempts_left -= 1
        loop = asyncio.get_running_loop()
        flight.timer = loop.call_later(self.timeout_s, self._on_timeout, request_id)
        self._link.send(flight.data, self.addresses[flight.index])  # type: ignore[union-attr]

    def _on_timeout(self, request_id: int) -> None:
        flight = self._inflight.get(request_id)
        if flight is None:
            return
        self.timeouts += 1
        if flight.attempts_left > 0:
            self._transmit(request_id, flight)
            return
        del self._inflight[request_id]
        self._fall_back(flight.items)

    def _fall_back(self, items: list[_Item]) -> None:
        self.fallbacks += len(items)
        for _, key, _, future in items:
            if not future.done():
                future.set_result(self.fallback_decision(key))

    def fallback_decision(self, key: str) -> Decision:
        """What a check gets when its partition cannot be reached."""
        if self.fail_open:
            return Decision(key, True, None, None, fallback=True)
        return Decision(key, False, 0, FALLBACK_RETRY_MS, fallback=True)

    def _on_datagram(self, data: bytes, addr: Any) -> None:
        try:
            op, request_id, _ = codec.decode_header(data)
        except codec.MalformedDatagram:
            return
        if op != codec.OP_CHECK | codec.REPLY_BIT:
            waiter = self._waiters.pop(request_id, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(data)
            return
        flight = self._inflight.get(request_id)
        if flight is None or addr[:2] != self.addresses[flight.index][:2]:
            return  # a late answer to a retried or abandoned request, or not from its partition
        try:
            _, results = codec.decode_check_reply(data)
        except codec.MalformedDatagram:
            return
        if len(results) != len(flight.items):
            return
        del self._inflight[request_id]
        if flight.timer is not None:
            flight.timer.cancel()
        for (_, key, _, future), result in zip(flight.items, results, strict=True):
            if not future.done():
                future.set_result(_decision(key, result))

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
        reply = await self.call(index, codec.encode_stats_request(self._new_id()))
        return None if reply is None else codec.decode_stats_reply(reply)[1]

    async def invalidate(self, keys: Sequence[str]) -> None:
        """Ask the owning partitions to reload these keys' rules (best effort)."""
        by_partition: dict[int, list[bytes]] = {}
        for key in keys:
            by_partition.setdefault(self.partition(key), []).append(key.encode("utf-8"))
        await asyncio.gather(
            *(
                self.call(index, codec.encode_invalidate_request(self._new_id(), chunk[i : i + 200]))
                for index, chunk in by_partition.items()
                for i in range(0, len(chunk), 200)
            )
        )


def _decision(key: str, result: codec.ItemResult) -> Decision:
    retry = result.retry_after_ms
    window = result.window_ms
    return Decision(
        key,
        result.allowed,
        result.remaining,
        None if retry == NEVER_MS else retry,
        capacity=result.capacity,
        window_ms=None if window == NEVER_MS else window,
        default_rule=result.default_rule,
    )
