"""``DirectClient``: checks straight to the partitions over UDP, skipping the router (thread-safe).

Keys are hashed as the router hashes them, datagrams use its codec, and a
datagram is retried with the same request id (the partition answers a repeat
from its reply cache, so nothing is charged twice); when every attempt timed
out, the check gets the ``on_error`` fallback. The protocol state is the
core's :class:`sluicegate.exchange.Exchange`; this module adds blocking I/O.

Concurrent checks from several threads are coalesced: one thread at a time
(the "pump") sends and receives for everyone, and checks queued meanwhile go
out together, one datagram per partition. A lone thread pays no hand-off.

Acquires, releases and waiting checks (which the partition may hold) are not
coalesced: each is one blocking call on a socket of its own, re-sending the
same datagram every ``timeout`` until the wait and the retry budget are over.
"""

from __future__ import annotations

import os
import selectors
import socket
import threading
import time
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from types import TracebackType
from typing import Any, TypeVar

from sluicegate import codec
from sluicegate import lease_calls as calls
from sluicegate.decision import Decision
from sluicegate.directory import UNREACHABLE
from sluicegate.exchange import Answer
from sluicegate_sdk.checks import normalize_checks, validate_check
from sluicegate_sdk.leases import DEFAULT_TTL_S, Lease, held_lease, hold, reported_ms, ttl_ms, wait_ms
from sluicegate_sdk.partitions import DirectBase

T = TypeVar("T")


class _Call:
    """One ``check``/``check_many`` call: how many of its checks are undecided, and where it waits."""

    __slots__ = ("left", "turn")

    def __init__(self, lock: threading.Lock, checks: int) -> None:
        self.left = checks
        self.turn = threading.Condition(lock)  # woken alone: when its checks are decided, or to pump


class _Slot:
    __slots__ = ("call", "decision")

    def __init__(self, call: _Call) -> None:
        self.call = call
        self.decision: Decision | None = None


class DirectClient(DirectBase):
    """Checks over UDP to the partitions: ``check(key, cost=1)``, ``check_many([...])``; leases:
    ``acquire``, ``release``, ``with client.lease(key) as decision:`` (as :class:`sluicegate_sdk.Client`).

    ``partitions=[(host, port), ...]`` in partition order, or
    ``namespace="sluicegate.internal", partition_count=N`` (names
    ``p<i>.<namespace>`` on ``port``, resolved again after ``dns_ttl``).
    ``timeout`` is per attempt (seconds), ``attempts`` how many; a check
    answers within about ``timeout * attempts`` even when nothing does.

    Example::

        client = DirectClient(namespace="sluicegate.internal", partition_count=4)
        client.check("alice").allowed
    """

    def _start(self) -> None:
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._waiting: dict[_Call, None] = {}  # calls blocked until their checks are decided (in order)
        self._pumping = False  # a thread is sending and receiving for everyone
        self._asleep = False  # ... and waits for datagrams: nudge it when queueing
        self._nudged = False
        self._io: _Io | None = None
        self._closed = False

    def check(self, key: str, cost: int = 1, *, max_wait: float = 0) -> Decision:
        """Spend ``cost`` credits of ``key`` if it has them; raises :class:`CheckError` for a bad key or cost.

        ``max_wait`` (seconds, up to 60): the partition may hold the check until the credit is there.
        """
        key, cost = validate_check(key, cost)
        waiting = wait_ms(max_wait)
        if not waiting:
            return self._run([(key, cost)])[0]
        data = calls.check_wait_request(self._new_id(), key, cost, max_wait_ms=waiting)
        return self._decided(key, self._call_held(key, data, waiting, lambda reply: calls.check_decision(key, reply)))

    def acquire(self, key: str, cost: int = 1, *, ttl: float = DEFAULT_TTL_S, max_wait: float = 0) -> Decision:
        """Take a lease on the key's concurrency limit (``decision.lease``); see ``Client.acquire``."""
        key, cost = validate_check(key, cost)
        waiting = wait_ms(max_wait)
        data = calls.acquire_request(self._new_id(), key, cost, ttl_ms=ttl_ms(ttl), max_wait_ms=waiting)
        return self._decided(key, self._call_held(key, data, waiting, lambda reply: calls.acquire_decision(key, reply)))

    def release(self, held: Decision | Lease, *, wait: float = 0, service: float = 0) -> bool:
        """Give a lease back; False when there was none or it was not confirmed (see ``Client.release``)."""
        found = held_lease(held)
        if found is None:
            return False
        key, lease = found
        data = calls.release_request(
            self._new_id(), key, lease, wait_ms=reported_ms("wait", wait), service_ms=reported_ms("service", service)
        )
        outcome = self._call_held(key, data, 0, calls.release_outcome)
        if outcome is None:
            self._lost_release(key)
            return False
        return outcome.released

    def lease(
        self, key: str, cost: int = 1, *, ttl: float = DEFAULT_TTL_S, max_wait: float = 0
    ) -> AbstractContextManager[Decision]:
        """``with client.lease(key) as decision:``: acquire, run the block, release with measured times."""
        return hold(self.acquire, self.release, key, cost, ttl=ttl, max_wait=max_wait)

    def check_many(self, checks: Iterable[str | tuple[str, int]]) -> list[Decision]:
        """Several checks (keys, or ``(key, cost)`` pairs), decided in order, one datagram per partition."""
        return self._run(normalize_checks(checks))

    def close(self) -> None:
        """Close the sockets (call it when no check is running); checks after this raise RuntimeError."""
        with self._lock:
            self._closed = True
            io, self._io = self._io, None
        if io is not None:
            io.close()

    def __enter__(self) -> DirectClient:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def _new_id(self) -> int:
        with self._lock:
            return self._exchange.new_id()

    def _call_held(self, key: str, data: bytes, max_wait_ms: int, read: Callable[[bytes], T]) -> T | None:
        """Send ``data`` to the key's partition until it answers (``read(reply)``) or the budget is spent."""
        address = self._directory.addresses()[self.partition(key)]
        if address == UNREACHABLE:
            return None
        wanted = calls.request_id_of(data)
        give_up = time.monotonic() + calls.give_up_after_s(max_wait_ms, timeout_s=self.timeout, attempts=self.attempts)
        with socket.socket(socket.AF_INET6 if ":" in address[0] else socket.AF_INET, socket.SOCK_DGRAM) as sock:
            while (now := time.monotonic()) < give_up:
                try:
                    sock.sendto(data, address)
                except OSError:
                    pass  # buffer full: the next round sends it again
                resend_at = min(give_up, now + self.timeout)
                while (left := resend_at - time.monotonic()) > 0:
                    sock.settimeout(left)
                    try:
                        reply, sender = sock.recvfrom(65535)
                    except TimeoutError:
                        break
                    except OSError:
                        time.sleep(left)  # an ICMP error: wait for the next round as if nothing came
                        break
                    try:
                        if sender[:2] == address[:2] and calls.request_id_of(reply) == wanted:
                            return read(reply)
                    except codec.MalformedDatagram:
                        continue  # not an answer: keep listening
        return None

    def _run(self, checks: list[tuple[str, int]]) -> list[Decision]:
        if self._pid != os.getpid():
            # Forked: the parent's sockets and datagrams in flight are not ours (replies could go to either).
            self._start()
            self._exchange = self._new_exchange()
        call = _Call(self._lock, len(checks))
        slots = [_Slot(call) for _ in checks]
        with self._lock:
            if self._closed:
                raise RuntimeError("this DirectClient is closed")
            if self._io is None:
                self._io = _Io()
            io = self._io
            for (key, cost), slot in zip(checks, slots, strict=True):
                self._exchange.queue(self.partition(key), key, cost, slot)
            while call.left:
                if not self._pumping:
                    self._pumping = True
                    break
                if self._asleep and not self._nudged:
                    self._nudged = True
                    io.nudge()  # the pump sends our checks at once instead of after its wait
                self._waiting[call] = None
                call.turn.wait()
                del self._waiting[call]
            else:
                return [slot.decision for slot in slots]  # type: ignore[misc]
        try:
            self._pump(io, call)
        finally:
            with self._lock:
                self._pumping = False
                # Hand over to one caller whose checks are still in flight (waking all would stampede).
                heir = next((waiting for waiting in self._waiting if waiting.left), None)
                if heir is not None:
                    heir.turn.notify()
        return [slot.decision for slot in slots]  # type: ignore[misc]

    def _pump(self, io: _Io, call: _Call) -> None:
        """Send what is queued, receive, retry and expire, until the checks of ``call`` are all decided."""
        exchange = self._exchange
        while True:
            addresses = self._directory.addresses()  # cheap unless the TTL ran out (then it resolves)
            with self._lock:
                now = time.monotonic()
                sends = []
                answers: list[Answer] = []
                for index in list(exchange.queued):
                    if addresses[index] == UNREACHABLE:  # its name never resolved: no use waiting for the timeouts
                        answers += exchange.fail_queued(index)
                        continue
                    flights, failed = exchange.flush(index, addresses[index], now)
                    sends += flights
                    answers += failed
                resend, expired = exchange.expire(now)
                sends += resend
                self._deliver(answers + expired)
                done = not call.left
                deadline = exchange.next_deadline()
                self._asleep, self._nudged = not done, False
            for flight in sends:  # flushed flights must go out even when ours are all decided
                io.send(flight.data, flight.address)
            if done:
                return
            received = io.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
            with self._lock:
                self._asleep = False
                answers = []
                for data, sender in received:
                    answers += exchange.receive(data, sender)[1]
                self._deliver(answers)

    def _deliver(self, answers: list[Answer]) -> None:
        """Hand decisions to their slots (the lock held) and wake the callers whose checks are all decided."""
        if not answers:
            return
        for slot, decision in answers:
            slot.decision = decision
            call = slot.call
            call.left -= 1
            if not call.left:
                call.turn.notify()
        self._note_fallbacks([decision for _, decision in answers])


class _Io:
    """The client's UDP sockets (one per address family, opened on first use) and a waker."""

    def __init__(self) -> None:
        self.selector = selectors.DefaultSelector()
        self.sockets: dict[int, socket.socket] = {}
        self.waker, self._nudger = socket.socketpair()
        for sock in (self.waker, self._nudger):
            sock.setblocking(False)
        self.selector.register(self.waker, selectors.EVENT_READ)

    def send(self, data: bytes, address: tuple[Any, ...]) -> None:
        family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        sock = self.sockets.get(family)
        if sock is None:
            sock = socket.socket(family, socket.SOCK_DGRAM)
            sock.setblocking(False)
            sock.bind(("::" if family == socket.AF_INET6 else "0.0.0.0", 0))
            self.sockets[family] = sock
            self.selector.register(sock, selectors.EVENT_READ)
        try:
            sock.sendto(data, address)
        except OSError:
            pass  # buffer full, or an error from a stopped partition: the retry timer handles it

    def nudge(self) -> None:
        try:
            self._nudger.send(b"\0")
        except OSError:
            pass  # already nudged (buffer full)

    def wait(self, timeout: float | None) -> list[tuple[bytes, Any]]:
        """The datagrams that arrive within ``timeout``, one per ready socket; [] on a nudge or a timeout.

        One read per wake-up: a read that finds nothing raises, which costs more than
        asking the selector again when several datagrams are queued.
        """
        received = []
        for key, _ in self.selector.select(timeout):
            sock = key.fileobj
            try:
                data, sender = sock.recvfrom(65535)  # type: ignore[union-attr]
            except OSError:  # an ICMP error from a stopped partition
                continue
            if sock is not self.waker:
                received.append((data, sender))
        return received

    def close(self) -> None:
        self.selector.close()
        for sock in (*self.sockets.values(), self.waker, self._nudger):
            sock.close()
