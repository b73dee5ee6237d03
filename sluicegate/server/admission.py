"""Leases and waiting requests of one partition: ACQUIRE, RELEASE and CHECK_WAIT. Sans-I/O.

* ``acquire`` takes a lease on a key's concurrency limit (and charges its
  rate limits like a check); ``release`` gives it back with the request's
  waiting and service times, which an ``adaptive`` limit learns from. A lease
  not released within its ttl is reclaimed by :meth:`Admission.tick`.
* A request with ``max_wait_ms`` that cannot be admitted now waits in its
  key's FIFO queue and is answered as soon as it can be admitted, or denied
  at its deadline at the latest; it is denied at once when the expected wait
  already exceeds the deadline. A plain check does not wait and does not
  queue: it takes what is there.
* Replies to requests that waited go out through the partition's outbox.

The adapter calls :meth:`Admission.tick` at :meth:`Admission.next_event_ns`.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from sluicegate import codec
from sluicegate import codec_leases as wire
from sluicegate.concurrency import ConcurrencyState, Waiter, WaitQueue
from sluicegate.limits import Limit
from sluicegate.rules import NEVER_MS

if TYPE_CHECKING:
    from sluicegate.adaptive import AdaptiveLimit
    from sluicegate.server.partition import Ident, Partition

ACQUIRE, CHECK = "acquire", "check"
MS = 1_000_000
Result = tuple[int, int, int, int, int, bytes]


class Admission:
    """The partition's concurrency states, adaptive limits and wait queues, by key."""

    def __init__(self, partition: Partition) -> None:
        self.partition = partition
        self.states: dict[bytes, ConcurrencyState] = {}
        self.adaptive: dict[bytes, AdaptiveLimit] = {}
        self.queues: dict[bytes, WaitQueue] = {}
        self._waiting: set[Ident] = set()
        self._next_lease = 1
        self.reclaimed = 0  # leases taken back after their ttl
        self.waited = 0  # requests that were held, then answered

    # -- requests -------------------------------------------------------------------------------

    def is_waiting(self, ident: Ident) -> bool:
        return ident in self._waiting

    def request(
        self, ident: Ident, kind: str, key: bytes, cost: int, ttl_ms: int, max_wait_ms: int, now_ns: int
    ) -> bytes | None:
        """Decide an acquire or a waiting check of a held key now, or queue it; the reply or None."""
        queue = self.queues.get(key)
        if queue is None or not len(queue):
            result, lease = self._try(kind, key, cost, ttl_ms, now_ns)
            if result[0] & codec.STATUS_MASK == codec.STATUS_ALLOWED or not max_wait_ms:
                return self._finish(ident, kind, result, lease, now_ns)
            expected_ns = self._expected_wait_ns(key, kind, 0, cost, result, now_ns)
        else:
            result = self._denial(key, kind, cost, queue, now_ns)
            expected_ns = self._expected_wait_ns(key, kind, queue.queued_cost, cost, result, now_ns)
        if expected_ns > max_wait_ms * MS:
            return self._finish(ident, kind, result, 0, now_ns)  # cannot make it: say so at once
        if queue is None or not len(queue):
            self.partition.denied -= 1  # not an answer: it waits
        waiter = Waiter(ident, cost, now_ns + max_wait_ms * MS, now_ns, ttl_ms * MS, {"kind": kind, "key": key})
        if expected_ns:  # look again when it should fit (a release also looks at once)
            waiter.data["ready_ns"] = now_ns + expected_ns
        self.queues.setdefault(key, WaitQueue()).push(waiter)
        self._waiting.add(ident)
        return None

    def release(self, releases: list[tuple[bytes, int, int, int]], now_ns: int) -> list[tuple[int, int]]:
        """Give leases back; ``(status, limit now)`` per lease. Waiters they make room for are answered."""
        results = []
        for key, lease_id, wait_ms, service_ms in releases:
            state = self.states.get(key)
            released = state.release(lease_id, now_ns) if state is not None else None
            if released is None:
                results.append((codec.UNKNOWN_LEASE, state.limit if state is not None else 0))
                continue
            if service_ms:
                state.record_service(service_ms * MS)
            adaptive = self.adaptive.get(key)
            if adaptive is not None and adaptive.record(wait_ms * MS, service_ms * MS, now_ns):
                state.limit = adaptive.limit
            results.append((codec.RELEASED, state.limit))
            self._drain(key, now_ns)
        return results

    def tick(self, now_ns: int) -> None:
        """Reclaim leases past their ttl, admit waiters that now fit, deny those at their deadline."""
        for key in {*self.queues, *self.states}:
            state = self.states.get(key)
            if state is not None:
                self.reclaimed += len(state.reclaim(now_ns))
            self._drain(key, now_ns)
            queue = self.queues.get(key)
            if queue is None:
                continue
            for waiter in queue.expire(now_ns):
                kind = waiter.data["kind"]
                self._waiting.discard(waiter.ident)
                self.partition.denied += 1
                denial = self._denial(key, kind, waiter.cost, queue, now_ns)
                self._finish(waiter.ident, kind, denial, 0, now_ns, waited=True)
            if not len(queue):
                del self.queues[key]

    def next_event_ns(self) -> int | None:
        """When :meth:`tick` has work: a deadline, a lease's expiry, or a waiter's expected turn."""
        times = []
        for queue in self.queues.values():
            deadline = queue.next_deadline_ns()
            if deadline is not None:
                times.append(deadline)
            head = queue.peek()
            if head is not None and "ready_ns" in head.data:
                times.append(head.data["ready_ns"])
        for state in self.states.values():
            expiry = state.next_expiry_ns()
            if expiry is not None:
                times.append(expiry)
        return min(times) if times else None

    def limit_of(self, key: bytes) -> int | None:
        """The key's concurrency limit now (an adaptive one moves), or None."""
        state = self.states.get(key)
        return None if state is None else state.limit

    # -- deciding -------------------------------------------------------------------------------

    def _concurrency(self, key: bytes) -> tuple[Limit, ConcurrencyState] | None:
        policy = self.partition.book.policies.get(key)
        limit = next((limit for limit in policy.rule.limits if limit.is_concurrency), None) if policy else None
        if limit is None:
            return None
        state = self.states.get(key)
        if state is None:
            state = self.states[key] = ConcurrencyState(limit.concurrency, first_lease_id=self._next_lease)
            self._next_lease += 2**32  # lease ids of different keys never collide
        if limit.adaptive is None:
            state.limit = limit.concurrency  # follows rule changes
            self.adaptive.pop(key, None)
        elif key not in self.adaptive:
            from sluicegate.adaptive import AdaptiveLimit

            minimum, kp, step, samples = limit.adaptive
            self.adaptive[key] = AdaptiveLimit(minimum=minimum, kp=kp, step=step, samples=samples, initial=state.limit)
        return limit, state

    def _try(self, kind: str, key: bytes, cost: int, ttl_ms: int, now_ns: int) -> tuple[Result, int]:
        """Admit now if everything has room: ``(reply item, lease id or 0)``; counts the decision."""
        partition = self.partition
        found = self._concurrency(key) if kind == ACQUIRE else None
        if found is not None:
            limit, state = found
            if state.in_flight + cost > state.limit and not limit.shadow:
                partition.denied += 1
                retry = _ms(state.expected_wait_ns(0, cost, now_ns))
                left = max(0, state.limit - state.in_flight)
                return (codec.STATUS_DENIED, left, retry, state.limit, 0, limit.name.encode()), 0
        result = partition.charge(key, cost, now_ns)
        if result[0] & codec.STATUS_MASK != codec.STATUS_ALLOWED or found is None:
            return result, 0
        limit, state = found
        lease = state.try_acquire(cost, ttl_ms * MS, now_ns)
        if lease is None:  # shadow concurrency limit without room: admitted, reported
            return (result[0] | codec.FLAG_WOULD_DENY, 0, 0, state.limit, 0, limit.name.encode()), 0
        return (result[0], state.limit - state.in_flight, 0, state.limit, 0, result[5]), lease.lease_id

    def _denial(self, key: bytes, kind: str, cost: int, queue: WaitQueue, now_ns: int) -> Result:
        """What a request behind ``queue`` is told when it is refused (nothing charged)."""
        found = self._concurrency(key) if kind == ACQUIRE else None
        if found is not None:
            limit, state = found
            retry = _ms(state.expected_wait_ns(queue.queued_cost, cost, now_ns))
            return (codec.STATUS_DENIED, 0, retry, state.limit, 0, limit.name.encode())
        bucket = self.partition.buckets[key]
        rule = bucket.rule
        wait_ms = bucket.retry_after_ms(cost, now_ns)
        if wait_ms != NEVER_MS and rule.rate > 0:
            wait_ms = min(NEVER_MS - 1, wait_ms + math.ceil(queue.queued_cost * 1000 / rule.rate))
        return (codec.STATUS_DENIED, bucket.remaining, wait_ms, rule.capacity, rule.window_ms, b"rate")

    def _expected_wait_ns(self, key: bytes, kind: str, ahead: int, cost: int, denial: Result, now_ns: int) -> int:
        found = self._concurrency(key) if kind == ACQUIRE else None
        if found is not None and denial[5] == found[0].name.encode():
            return found[1].expected_wait_ns(ahead, cost, now_ns)
        retry = denial[2]
        if retry >= NEVER_MS:
            return 2**63
        rule = self.partition.buckets[key].rule
        queued_ms = ahead * 1000 / rule.rate if rule.rate > 0 else 0
        return int((retry + queued_ms) * MS)

    def _drain(self, key: bytes, now_ns: int) -> None:
        """Admit the waiters at the head of ``key``'s queue while they fit (FIFO: the head blocks)."""
        queue = self.queues.get(key)
        partition = self.partition
        while queue is not None and len(queue):
            head = queue.peek()
            assert head is not None
            kind = head.data["kind"]
            result, lease = self._try(kind, key, head.cost, head.ttl_ns // MS, now_ns)
            if result[0] & codec.STATUS_MASK != codec.STATUS_ALLOWED:
                partition.denied -= 1  # not an answer yet: it keeps waiting
                if result[2] < NEVER_MS and result[5] == b"rate":
                    head.data["ready_ns"] = now_ns + result[2] * MS
                return
            queue.pop()
            self._waiting.discard(head.ident)
            self.waited += 1
            self._finish(head.ident, kind, result, lease, now_ns, waited=True)

    def _finish(
        self, ident: Ident, kind: str, result: Result, lease: int, now_ns: int, *, waited: bool = False
    ) -> bytes:
        """The reply (cached for retries); a request that waited gets it through the outbox."""
        partition = self.partition
        partition.checks += 1
        if kind == ACQUIRE:
            reply = wire.encode_acquire_reply(ident[1], result, lease)
        else:
            reply = codec.encode_check_reply(ident[1], [result])
        partition.remember(ident, reply, now_ns)
        if waited:
            partition.outbox.append((reply, ident[0]))
        return reply


def _ms(ns: int) -> int:
    return min(NEVER_MS, math.ceil(ns / MS))
