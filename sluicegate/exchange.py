"""Checks on their way to the partitions, without I/O: coalescing, request ids, retries, fallback. Pure module.

The router's asyncio client and the SDK's direct clients own a socket and a
clock; this class owns the protocol state between them. Checks queued for one
partition go out together as few datagrams as fit (:meth:`Exchange.flush`);
a datagram is resent with the *same* request id when it times out (the
server answers a repeat from its reply cache, so nothing is charged twice);
when every attempt timed out, its checks get the fallback decision. Each
queued check carries a ``waiter`` the caller chooses (a future, a slot):
the exchange hands it back with its decision.

Example:
    >>> from sluicegate import codec
    >>> ex = Exchange(attempts=2, timeout_s=0.05, first_id=41)
    >>> ex.queue(0, "alice", 1, "waiter-a")
    True
    >>> [flight], [] = ex.flush(0, ("127.0.0.1", 7000), now=10.0)
    >>> flight.request_id, flight.deadline
    (42, 10.05)
    >>> reply = codec.encode_check_reply(42, [(codec.STATUS_ALLOWED, 9, 0, 10, 1000, b"")])
    >>> flight, [(waiter, decision)] = ex.receive(reply, ("127.0.0.1", 7000))
    >>> waiter, decision.allowed, decision.remaining
    ('waiter-a', True, 9)
"""

from __future__ import annotations

import random
from typing import Any

from sluicegate import codec
from sluicegate.decision import Decision, fallback_decision, from_item

Address = tuple[Any, ...]  # (host, port) or an IPv6 (host, port, flow, scope) as sockets report it
Item = tuple[bytes, str, int, Any]  # key bytes, key, cost, the caller's waiter
Answer = tuple[Any, Decision]  # a waiter and its decision


class Flight:
    """One datagram sent and not yet answered."""

    __slots__ = ("address", "attempts_left", "data", "deadline", "handle", "items", "request_id")

    def __init__(self, request_id: int, data: bytes, items: list[Item], address: Address, attempts: int) -> None:
        self.request_id = request_id
        self.data = data
        self.items = items
        self.address = address  # where it went: only a reply from there counts
        self.attempts_left = attempts
        self.deadline = 0.0
        self.handle: Any = None  # free for the caller (e.g. its retry timer)


class Exchange:
    """Queued checks per partition and datagrams in flight; see the module docstring."""

    def __init__(
        self,
        *,
        attempts: int = 3,
        timeout_s: float = 0.05,
        fail_open: bool = True,
        max_datagram: int = 8192,
        first_id: int | None = None,
    ) -> None:
        if attempts < 1:
            raise ValueError("attempts must be at least 1")
        if not timeout_s > 0:
            raise ValueError("timeout_s must be positive")
        self.attempts = attempts
        self.timeout_s = timeout_s
        self.fail_open = fail_open
        self.max_datagram = max_datagram
        self._next_id = random.getrandbits(64) if first_id is None else first_id
        self.queued: dict[int, list[Item]] = {}
        self.inflight: dict[int, Flight] = {}
        self.fallbacks = 0  # checks answered with the fallback decision
        self.timeouts = 0  # attempts that got no reply in time

    def new_id(self) -> int:
        self._next_id = (self._next_id + 1) & 0xFFFF_FFFF_FFFF_FFFF
        return self._next_id

    def queue(self, index: int, key: str, cost: int, waiter: Any) -> bool:
        """Queue one (already validated) check for partition ``index``; True if its queue was empty."""
        queue = self.queued.get(index)
        if queue is None:
            self.queued[index] = [(key.encode("utf-8"), key, cost, waiter)]
            return True
        queue.append((key.encode("utf-8"), key, cost, waiter))
        return False

    def flush(self, index: int, address: Address, now: float) -> tuple[list[Flight], list[Answer]]:
        """Take partition ``index``'s queue and pack it into datagrams bound for ``address``.

        Returns the flights (the caller sends each one's ``data`` to
        ``flight.address``; they are in flight from ``now``, their first
        attempt spent) and the fallback answers of checks that could not be
        encoded (the caller should have refused them; they never hang).
        """
        items = self.queued.pop(index, [])
        flights: list[Flight] = []
        answers: list[Answer] = []
        chunk: list[Item] = []
        request_bytes = reply_bytes = codec.HEADER_SIZE
        for item in items:
            grow_request = 6 + len(item[0])
            full = len(chunk) == codec.MAX_ITEMS
            if chunk and (
                full or max(request_bytes + grow_request, reply_bytes + codec.RESULT_ITEM.size) > self.max_datagram
            ):
                self._launch(chunk, address, now, flights, answers)
                chunk, request_bytes, reply_bytes = [], codec.HEADER_SIZE, codec.HEADER_SIZE
            chunk.append(item)
            request_bytes += grow_request
            reply_bytes += codec.RESULT_ITEM.size
        if chunk:
            self._launch(chunk, address, now, flights, answers)
        return flights, answers

    def _launch(
        self, items: list[Item], address: Address, now: float, flights: list[Flight], answers: list[Answer]
    ) -> None:
        request_id = self.new_id()
        try:
            data = codec.encode_check_request(request_id, [(key, cost) for key, _, cost, _ in items])
        except ValueError:
            answers += self._fall_back(items)
            return
        flight = Flight(request_id, data, items, address, self.attempts - 1)
        flight.deadline = now + self.timeout_s
        self.inflight[request_id] = flight
        flights.append(flight)

    def fail_queued(self, index: int) -> list[Answer]:
        """Answer partition ``index``'s queued checks with the fallback (e.g. its address is unknown)."""
        return self._fall_back(self.queued.pop(index, []))

    def receive(self, data: bytes, sender: Address) -> tuple[Flight | None, list[Answer]]:
        """The flight a datagram from ``sender`` completes, and its answers.

        ``(None, [])`` for a stray, late or malformed datagram, or one from
        another address than the flight was sent to.
        """
        try:
            op, request_id, _ = codec.decode_header(data)
        except codec.MalformedDatagram:
            return None, []
        flight = self.inflight.get(request_id)
        if op != codec.OP_CHECK | codec.REPLY_BIT or flight is None or sender[:2] != flight.address[:2]:
            return None, []
        try:
            _, results = codec.decode_check_reply(data)
        except codec.MalformedDatagram:
            return None, []
        if len(results) != len(flight.items):
            return None, []
        del self.inflight[request_id]
        items = flight.items
        return flight, [(item[3], from_item(item[1], result)) for item, result in zip(items, results, strict=True)]

    def timed_out(self, request_id: int, now: float) -> Flight | list[Answer]:
        """A flight's deadline passed: the flight to send again, or its checks' fallback answers."""
        flight = self.inflight.get(request_id)
        if flight is None:
            return []
        self.timeouts += 1
        if flight.attempts_left > 0:
            flight.attempts_left -= 1
            flight.deadline = now + self.timeout_s
            return flight
        del self.inflight[request_id]
        return self._fall_back(flight.items)

    def expire(self, now: float) -> tuple[list[Flight], list[Answer]]:
        """Every flight whose deadline has passed: those to send again, and fallback answers."""
        resend: list[Flight] = []
        answers: list[Answer] = []
        for request_id in [rid for rid, flight in self.inflight.items() if flight.deadline <= now]:
            outcome = self.timed_out(request_id, now)
            if isinstance(outcome, Flight):
                resend.append(outcome)
            else:
                answers += outcome
        return resend, answers

    def next_deadline(self) -> float | None:
        """The earliest deadline in flight, None when nothing is."""
        return min((flight.deadline for flight in self.inflight.values()), default=None)

    def _fall_back(self, items: list[Item]) -> list[Answer]:
        self.fallbacks += len(items)
        return [(waiter, fallback_decision(key, fail_open=self.fail_open)) for _, key, _, waiter in items]
