"""Leases and waiting requests of one partition: ACQUIRE, RELEASE and CHECK_WAIT. Sans-I/O.

* ``acquire`` takes a lease on a key's concurrency limit (and charges its
  rate limits like a check); ``release`` gives it back with the request's
  waiting and service times, which an ``adaptive`` limit learns from. A lease
  not released within its ttl is reclaimed by :meth:`Admission.tick`.
* A child (a rule with a ``parent``) whose parent has a concurrency limit
  gets a share of the parent's limit: weighted max-min (with the parent's
  priority mode) over the children's demand, that is their leases in flight
  plus what waits, recomputed at each acquire of the group; its own
  concurrency limit, if any, is its ceiling.
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
from sluicegate.rules import NEVER_MS, Rule
from sluicegate.shares import Claim, allocate

if TYPE_CHECKING:
    from sluicegate.adaptive import AdaptiveLimit
    from sluicegate.server.partition import Ident, Partition

ACQUIRE, CHECK = "acquire", "check"
MS = 1_000_000
# Each key's lease ids count up from its own start, a stride apart: ids stay unique per key (a release
# names its key), rarely repeat across keys, and stay below 2**53 (exact in JSON) for 8 billion keys.
LEASE_STRIDE = 2**20
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
        # A lease or a waiter was added, or a waiter's next look moved: the adapter's timer may be late.
        self.rearm = False
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
        self.rearm = True
        self._waiting.add(ident)
        return None

    def release(self, releases: list[tuple[bytes, int, int, int]], now_ns: int) -> list[tuple[int, int]]:
        """Give leases back; ``(status, limit now)`` per lease. Waiters they make room for are answered."""
        results = []
        for key, lease_id, wait_ms, service_ms in releases:
            state = self.states.get(key)
            if state is not None and service_ms and lease_id in state:
                state.record_service(service_ms * MS)  # before the release, which would count the hold time
            released = state.release(lease_id, now_ns) if state is not None else None
            if released is None:
                results.append((codec.UNKNOWN_LEASE, state.limit if state is not None else 0))
                continue
            self._learn(key, wait_ms, service_ms, now_ns)
            results.append((codec.RELEASED, state.limit))
            self._drain(key, now_ns)
        return results

    def _learn(self, key: bytes, wait_ms: int, service_ms: int, now_ns: int) -> None:
        """Feed a completed request to the adaptive limit it ran under (its own, or its parent's)."""
        policy = self.partition.book.policies.get(key)
        parent = self._parent_limit(policy.rule) if policy is not None else None
        for owner in (key, parent[0] if parent is not None else None):
            adaptive = self.adaptive.get(owner) if owner is not None else None
            if adaptive is not None and adaptive.record(wait_ms * MS, service_ms * MS, now_ns):
                self.states[owner].limit = adaptive.limit  # type: ignore[index]

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

    def _concurrency(self, key: bytes, cost: int = 0) -> tuple[Limit, ConcurrencyState] | None:
        """The key's concurrency limit and state (its share of a parent's limit applied), or None.

        ``cost``: what the request being decided asks, counted in the key's demand for its share.
        """
        policy = self.partition.book.policies.get(key)
        own = self._own_limit(policy.rule) if policy is not None else None
        parent = self._parent_limit(policy.rule) if policy is not None else None
        if parent is None:
            return None if own is None else self._state(key, own)
        parent_key, parent_limit = parent
        found = self._state(parent_key, parent_limit)
        share, free = self._share(key, parent_key, found[1].limit, cost)
        ceiling = own.concurrency if own is not None else share
        limit = own if own is not None else Limit(parent_limit.name, concurrency=max(1, share))
        state = self.states.get(key)
        if state is None:
            state = self.states[key] = ConcurrencyState(max(1, share), first_lease_id=self._next_lease)
            self._next_lease += LEASE_STRIDE
        # Never past the parent's limit in total, even while a sibling still holds more than its new share.
        state.limit = min(ceiling, share, state.in_flight + free)
        return limit, state

    @staticmethod
    def _own_limit(rule: Rule) -> Limit | None:
        return next((limit for limit in rule.limits if limit.is_concurrency), None)

    def _parent_limit(self, rule: Rule) -> tuple[bytes, Limit] | None:
        if rule.parent is None:
            return None
        parent_key = rule.parent.encode("utf-8")
        parent_policy = self.partition.book.policies.get(parent_key)
        limit = self._own_limit(parent_policy.rule) if parent_policy is not None else None
        return None if limit is None else (parent_key, limit)

    def _share(self, key: bytes, parent_key: bytes, parent_limit: int, cost: int) -> tuple[int, int]:
        """``key``'s whole number of leases out of ``parent_limit`` by demand (in flight + waiting + asked),
        and how much of the parent's limit the children leave free now."""
        book = self.partition.book
        parent_rule = book.policies[parent_key].rule
        claims = []
        in_flight = 0
        for child in {*book.children_of(parent_key), key}:
            child_policy = book.policies.get(child)
            if child_policy is None:
                continue
            state, queue = self.states.get(child), self.queues.get(child)
            held = state.in_flight if state else 0
            in_flight += held
            demand = held + (queue.queued_cost if queue else 0) + (cost if child == key else 0)
            claims.append(Claim(child, child_policy.rule.weight, child_policy.rule.priority, demand))
        shares = allocate(parent_limit, claims, mode=parent_rule.share, level_weights=dict(parent_rule.level_weights))
        return math.floor(shares.get(key, 0.0) + 1e-9), max(0, parent_limit - in_flight)

    def _state(self, key: bytes, limit: Limit) -> tuple[Limit, ConcurrencyState]:
        state = self.states.get(key)
        if state is None:
            state = self.states[key] = ConcurrencyState(limit.concurrency, first_lease_id=self._next_lease)
            self._next_lease += LEASE_STRIDE
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
        found = self._concurrency(key, cost) if kind == ACQUIRE else None
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
        self.rearm = True
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
                    self.rearm = True
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
