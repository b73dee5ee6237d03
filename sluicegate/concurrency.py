"""Concurrency limits: leases with a ttl, and a FIFO of waiters with deadlines. Pure: time is an argument.

A :class:`ConcurrencyState` is one key's limit on work in flight: an acquire
of ``cost`` is admitted while the live leases' costs plus ``cost`` fit the
limit, and gets a :class:`Lease` with a new id. A lease ends when it is
released, or at its expiry, when it is reclaimed: a client that crashed while
holding it cannot leak capacity. A :class:`WaitQueue` parks the requests that
cannot be admitted now (Quorum's selective dropping): first in, first out,
each with a deadline at which it is answered "denied" at the latest.
Times are integer nanoseconds on a monotonic clock, passed in.

Example:
    >>> state = ConcurrencyState(2, first_lease_id=1)
    >>> a = state.try_acquire(1, ttl_ns=10, now_ns=0)
    >>> b = state.try_acquire(1, ttl_ns=10, now_ns=0)
    >>> a.lease_id, b.lease_id, state.try_acquire(1, ttl_ns=10, now_ns=0)
    (1, 2, None)
    >>> state.release(1, now_ns=4).lease_id, state.in_flight
    (1, 1)
    >>> [lease.lease_id for lease in state.reclaim(10)]  # b was never released: gone at its expiry
    [2]
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Hashable, Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

#: What :meth:`ConcurrencyState.expected_wait_ns` answers for a cost that can never fit.
NEVER_NS = 2**63 - 1
#: The weight of a new sample in the smoothed service time (1/8, as TCP's smoothed round-trip time).
SMOOTHING = 8
#: A lazily cleaned heap is rebuilt when it holds this many more entries than live ones (bounded memory).
_COMPACT_SLACK = 64


def _whole(name: str, value: object, minimum: int) -> int:
    """``value`` if it is an int >= ``minimum`` (not a bool), else ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


class Lease(NamedTuple):
    """A granted acquire: live from ``acquired_ns`` until released or until ``expires_ns`` (excluded)."""

    lease_id: int
    cost: int
    acquired_ns: int
    expires_ns: int


class ConcurrencyState:
    """One key's concurrency limit: the live leases, their total cost and how long leases are held.

    ``limit`` may be changed at any time (an adaptive limit does): lowering it
    revokes no lease, it only stops new ones until enough have ended. Lease ids
    count up from ``first_lease_id`` and are never reused by this state.
    Expired leases are reclaimed lazily by :meth:`try_acquire` and
    :meth:`release` too, so no capacity is withheld by a dead lease whether
    or not the caller runs :meth:`reclaim` on a timer; ``reclaimed`` counts
    every lease reclaimed either way.

    ``mean_service_ns`` is a smoothed (EWMA, weight 1/8) estimate of how long a
    lease is held: from the service times clients report
    (:meth:`record_service`), or, as long as none has been reported, from the
    hold times seen at release. ``None`` until the first sample, unless seeded.

    Example:
        >>> state = ConcurrencyState(1, first_lease_id=100)
        >>> lease = state.try_acquire(1, ttl_ns=1_000, now_ns=0)
        >>> state.expected_wait_ns(0, 1, now_ns=0)  # nothing known about service times yet
        0
        >>> state.release(lease.lease_id, now_ns=100).lease_id, state.mean_service_ns
        (100, 100)
        >>> lease = state.try_acquire(1, ttl_ns=1_000, now_ns=200)
        >>> state.expected_wait_ns(0, 1, now_ns=230), state.expected_wait_ns(2, 1, now_ns=230)
        (70, 270)
    """

    __slots__ = (
        "_expiries",
        "_leases",
        "_limit",
        "_next_id",
        "_now_ns",
        "_reported",
        "_service",
        "in_flight",
        "reclaimed",
    )

    def __init__(self, limit: int, *, first_lease_id: int, mean_service_ns: int | None = None) -> None:
        self._limit = _whole("limit", limit, 0)
        self._next_id = _whole("first_lease_id", first_lease_id, 0)
        self._leases: dict[int, Lease] = {}  # insertion order is acquisition order
        self._expiries: list[tuple[int, int]] = []  # (expires_ns, lease_id); released ones are dropped lazily
        self._service: float | None = None
        if mean_service_ns is not None:
            self._service = float(_whole("mean_service_ns", mean_service_ns, 0))
        self._reported = False  # a client reported a service time: hold times no longer count
        self._now_ns = 0  # the latest time passed in: expected_wait_ns's default
        self.in_flight = 0
        self.reclaimed = 0

    def __repr__(self) -> str:
        return f"ConcurrencyState(limit={self._limit}, in_flight={self.in_flight}, leases={len(self._leases)})"

    def __len__(self) -> int:
        """The number of live leases (not yet released or reclaimed)."""
        return len(self._leases)

    def __contains__(self, lease_id: object) -> bool:
        return lease_id in self._leases

    @property
    def limit(self) -> int:
        return self._limit

    @limit.setter
    def limit(self, limit: int) -> None:
        self._limit = _whole("limit", limit, 0)

    @property
    def mean_service_ns(self) -> int | None:
        """The smoothed time a lease is held (ns), or None before any sample."""
        return None if self._service is None else round(self._service)

    def try_acquire(self, cost: int, ttl_ns: int, now_ns: int) -> Lease | None:
        """A new lease of ``cost`` for ``ttl_ns`` if it fits the limit now; else None and nothing changes."""
        _whole("cost", cost, 1)
        _whole("ttl_ns", ttl_ns, 1)
        self._now_ns = now_ns
        self._drop_expired(now_ns)
        if self.in_flight + cost > self._limit:
            return None
        lease = Lease(self._next_id, cost, now_ns, now_ns + ttl_ns)
        self._next_id += 1
        self._leases[lease.lease_id] = lease
        heapq.heappush(self._expiries, (lease.expires_ns, lease.lease_id))
        self.in_flight += cost
        return lease

    def release(self, lease_id: int, now_ns: int) -> Lease | None:
        """End a lease and return it; None if it is unknown, released, or expired (reclaimed)."""
        self._now_ns = now_ns
        lease = self._leases.get(lease_id)
        if lease is None:
            return None
        if now_ns >= lease.expires_ns:
            self._drop_expired(now_ns)  # too late: its capacity is (or is about to be) someone else's
            return None
        del self._leases[lease_id]
        self.in_flight -= lease.cost
        if not self._reported:
            self._observe(max(0, now_ns - lease.acquired_ns))
        self._compact()
        return lease

    def reclaim(self, now_ns: int) -> list[Lease]:
        """Remove and return the leases whose expiry is at or before ``now_ns``, earliest expiry first."""
        self._now_ns = now_ns
        return self._drop_expired(now_ns)

    def next_expiry_ns(self) -> int | None:
        """When the next live lease expires (a timer for :meth:`reclaim`), or None without leases."""
        expiries, leases = self._expiries, self._leases
        while expiries and expiries[0][1] not in leases:
            heapq.heappop(expiries)
        return expiries[0][0] if expiries else None

    def record_service(self, service_ns: int) -> None:
        """A service time a client reported at release; from the first one on, hold times are ignored."""
        self._reported = True
        self._observe(_whole("service_ns", service_ns, 0))

    def expected_wait_ns(self, queued_cost_ahead: int, cost: int, now_ns: int | None = None) -> int:
        """How long a request of ``cost`` with ``queued_cost_ahead`` waiting before it would wait for room.

        0 when the free capacity covers everyone ahead and this request, or
        when nothing is known about service times yet (then only the deadline
        decides); ``NEVER_NS`` when ``cost`` exceeds the limit. Otherwise a
        fluid estimate with S = ``mean_service_ns``: each live lease is expected
        to end at ``acquired + S`` (at its expiry if sooner, now if overdue);
        capacity that frees up goes at once to the requests ahead, in order,
        and each of those holds it for S, so the capacity freed in the next S
        repeats every S after. The answer is when the capacity freed since now
        first covers everyone ahead and then ``cost``. A request ahead is not
        split in reality, so this may be optimistic when costs differ.
        ``now_ns`` defaults to the latest time passed to this state.
        O(n log n) in the live leases (they are almost sorted already).
        """
        _whole("queued_cost_ahead", queued_cost_ahead, 0)
        _whole("cost", cost, 1)
        limit, in_flight = self._limit, self.in_flight
        if cost > limit:
            return NEVER_NS
        free = max(0, limit - in_flight)
        need = queued_cost_ahead + cost
        if need <= free:
            return 0
        service = self.mean_service_ns
        if service is None:
            return 0
        now = self._now_ns if now_ns is None else now_ns
        # Within one period S the live leases free all the usable capacity: `free` now, and what each ending
        # lease frees beyond the excess of a lowered limit. The same amounts free up again each S after.
        periods, residual = divmod(need - 1, limit)
        residual += 1  # what the last period must free: 1 to limit
        usable, excess, offset = free, max(0, in_flight - limit), 0
        if usable < residual:
            ends = sorted(
                (min(service, max(0, min(lease.acquired_ns + service, lease.expires_ns) - now)), lease.cost)
                for lease in self._leases.values()
            )
            for offset, amount in ends:  # noqa: B007 - the offset that covers `residual` is the answer
                absorbed = min(excess, amount)
                excess -= absorbed
                usable += amount - absorbed
                if usable >= residual:
                    break
        return min(NEVER_NS, periods * service + offset)

    def _observe(self, sample: int) -> None:
        if self._service is None:
            self._service = float(sample)
        else:
            self._service += (sample - self._service) / SMOOTHING

    def _drop_expired(self, now_ns: int) -> list[Lease]:
        expired: list[Lease] = []
        expiries, leases = self._expiries, self._leases
        while expiries and expiries[0][0] <= now_ns:
            lease = leases.pop(heapq.heappop(expiries)[1], None)
            if lease is not None:  # else released before its expiry
                expired.append(lease)
                self.in_flight -= lease.cost
        self.reclaimed += len(expired)
        return expired

    def _compact(self) -> None:
        # Released leases stay in the expiry heap until their expiry; with long ttls that would grow it.
        if len(self._expiries) > 2 * len(self._leases) + _COMPACT_SLACK:
            self._expiries = [(lease.expires_ns, lease.lease_id) for lease in self._leases.values()]
            heapq.heapify(self._expiries)


@dataclass(slots=True)
class Waiter:
    """A parked request: ``ident`` (e.g. the request id), its cost, deadline, arrival and the caller's ``data``.

    ``ttl_ns`` is the lease ttl of a parked acquire (0 for a rate check).
    """

    ident: Hashable
    cost: int
    deadline_ns: int
    enqueued_ns: int
    ttl_ns: int = 0
    data: Any = None


class WaitQueue:
    """A FIFO of waiters with deadlines, for one key: rate checks and acquires alike.

    The head is served first (:meth:`peek`, :meth:`pop`); a waiter whose
    deadline has come is removed by :meth:`expire` wherever it is in the line.
    An ident may wait once: a retried request is found with ``in`` and not
    parked twice. ``queued_cost`` is the sum of the waiters' costs: the cost
    ahead of a newcomer.

    Example:
        >>> queue = WaitQueue()
        >>> queue.push(Waiter("a", 1, deadline_ns=50, enqueued_ns=0))
        >>> queue.push(Waiter("b", 2, deadline_ns=20, enqueued_ns=1))
        >>> len(queue), queue.queued_cost, queue.next_deadline_ns()
        (2, 3, 20)
        >>> [waiter.ident for waiter in queue.expire(20)], queue.pop().ident, len(queue)
        (['b'], 'a', 0)
    """

    __slots__ = ("_deadlines", "_seq", "_waiters", "queued_cost")

    def __init__(self) -> None:
        self._waiters: OrderedDict[Hashable, tuple[int, Waiter]] = OrderedDict()  # O(1) pop at the front
        self._deadlines: list[tuple[int, int, Hashable]] = []  # (deadline, seq, ident); stale ones dropped lazily
        self._seq = 0
        self.queued_cost = 0

    def __repr__(self) -> str:
        return f"WaitQueue(waiters={len(self._waiters)}, queued_cost={self.queued_cost})"

    def __len__(self) -> int:
        return len(self._waiters)

    def __contains__(self, ident: object) -> bool:
        return ident in self._waiters

    def __iter__(self) -> Iterator[Waiter]:
        """The waiters, first in line first."""
        return (waiter for _, waiter in self._waiters.values())

    def push(self, waiter: Waiter) -> None:
        """Join the end of the line; ValueError if ``waiter.ident`` is already waiting or the cost is not >= 1."""
        _whole("cost", waiter.cost, 1)
        if waiter.ident in self._waiters:
            raise ValueError(f"{waiter.ident!r} is already waiting")
        seq = self._seq
        self._seq += 1
        self._waiters[waiter.ident] = (seq, waiter)
        heapq.heappush(self._deadlines, (waiter.deadline_ns, seq, waiter.ident))
        self.queued_cost += waiter.cost

    def peek(self) -> Waiter | None:
        """The first in line, left in place; None when nobody waits."""
        for _, waiter in self._waiters.values():
            return waiter
        return None

    def pop(self) -> Waiter:
        """Remove and return the first in line; IndexError when nobody waits."""
        if not self._waiters:
            raise IndexError("pop from an empty WaitQueue")
        _, (_, waiter) = self._waiters.popitem(last=False)
        self.queued_cost -= waiter.cost
        self._compact()
        return waiter

    def remove(self, ident: Hashable) -> Waiter | None:
        """Take ``ident`` out of the line wherever it is; None if it is not waiting."""
        entry = self._waiters.pop(ident, None)
        if entry is None:
            return None
        self.queued_cost -= entry[1].cost
        self._compact()
        return entry[1]

    def expire(self, now_ns: int) -> list[Waiter]:
        """Remove and return the waiters whose deadline is at or before ``now_ns``, in their order in line."""
        expired: list[tuple[int, Waiter]] = []
        deadlines, waiters = self._deadlines, self._waiters
        while deadlines and deadlines[0][0] <= now_ns:
            _, seq, ident = heapq.heappop(deadlines)
            entry = waiters.get(ident)
            if entry is not None and entry[0] == seq:  # else it left the line (and maybe came back later)
                del waiters[ident]
                self.queued_cost -= entry[1].cost
                expired.append(entry)
        expired.sort(key=lambda entry: entry[0])
        return [waiter for _, waiter in expired]

    def next_deadline_ns(self) -> int | None:
        """The earliest deadline of anyone waiting (a timer for :meth:`expire`), or None."""
        deadlines, waiters = self._deadlines, self._waiters
        while deadlines:
            _, seq, ident = deadlines[0]
            entry = waiters.get(ident)
            if entry is not None and entry[0] == seq:
                return deadlines[0][0]
            heapq.heappop(deadlines)
        return None

    def _compact(self) -> None:
        if len(self._deadlines) > 2 * len(self._waiters) + _COMPACT_SLACK:
            self._deadlines = [(w.deadline_ns, seq, ident) for ident, (seq, w) in self._waiters.items()]
            heapq.heapify(self._deadlines)
