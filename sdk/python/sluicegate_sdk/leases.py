"""What every client shares for concurrency quotas: leases, their options, and holding one for a block.

An ``acquire`` takes a lease on a key's concurrency limit (``decision.lease``);
``release`` gives it back with the time the request waited and the time it
was served (adaptive limits learn from them). A lease not released within its
``ttl`` is reclaimed by the partition. Times are seconds in the SDK and
milliseconds on the wire and in the HTTP API.

Example:
    >>> wait_ms(0.25), ttl_ms(30)
    (250, 30000)
    >>> held_lease(Lease("db", 4294967297))
    ('db', 4294967297)
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import NamedTuple

from sluicegate.decision import Decision
from sluicegate_sdk.checks import CheckError

log = logging.getLogger("sluicegate_sdk")
MAX_WAIT_S = 60.0  # the HTTP API's limit: a longer wait is a job queue, not admission control
DEFAULT_TTL_S = 30.0
MAX_TTL_S = 3600.0
MAX_REPORTED_MS = 2**32 - 1
MAX_LEASE = 2**64 - 1
LOG_EVERY_S = 60.0


class Lease(NamedTuple):
    """A lease to give back: its key and its id (``decision.key``, ``decision.lease``), e.g. kept elsewhere."""

    key: str
    lease: int


def _seconds(name: str, value: object, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise CheckError(f"{name} must be a number of seconds, got {value!r}")
    if not 0 <= value <= high:
        raise CheckError(f"{name} must be from 0 to {high:g} seconds, got {value!r}")
    return float(value)


def wait_ms(max_wait: object) -> int:
    """``max_wait`` (seconds, 0 to 60) in whole milliseconds; :class:`CheckError` if out of range."""
    return round(_seconds("max_wait", max_wait, MAX_WAIT_S) * 1000)


def ttl_ms(ttl: object) -> int:
    """A lease's ``ttl`` (seconds, above 0 up to an hour) in whole milliseconds, at least 1."""
    seconds = _seconds("ttl", ttl, MAX_TTL_S)
    if seconds <= 0:
        raise CheckError(f"ttl must be above 0 seconds, got {ttl!r}")
    return max(1, round(seconds * 1000))


def reported_ms(name: str, seconds: object) -> int:
    """A waiting or service time to report (seconds >= 0), in milliseconds (capped at the wire's 2**32 - 1)."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not seconds >= 0:
        raise CheckError(f"{name} must be a number of seconds >= 0, got {seconds!r}")
    return min(MAX_REPORTED_MS, round(seconds * 1000)) if math.isfinite(seconds) else MAX_REPORTED_MS


def held_lease(held: Decision | Lease) -> tuple[str, int] | None:
    """``(key, lease id)`` to release, or None when ``held`` holds no lease (denied, a fallback, no limit)."""
    if isinstance(held, Lease):
        key, lease = held
    elif isinstance(held, Decision):
        key, lease = held.key, held.lease
    else:
        raise CheckError(f"release takes the Decision of an acquire or a Lease(key, lease), got {held!r}")
    if lease is None:
        return None
    if isinstance(lease, bool) or not isinstance(lease, int) or not 1 <= lease <= MAX_LEASE:
        raise CheckError(f"a lease id is a whole number from 1 to {MAX_LEASE}, got {lease!r}")
    return key, lease


class LostReleases:
    """Releases that got no answer (the lease ends at its ttl then): counted, logged once a minute."""

    def __init__(self) -> None:
        self.count = 0
        self._logged_at = -LOG_EVERY_S
        self._lock = threading.Lock()

    def note(self, key: str, reason: str) -> None:
        now = time.monotonic()
        with self._lock:
            self.count += 1
            if now - self._logged_at < LOG_EVERY_S:
                return
            self._logged_at = now
        log.warning("sluicegate: release of a lease of %r not confirmed (%s); it ends at its ttl", key, reason)


Acquire = Callable[..., Decision]
Release = Callable[..., bool]


@contextmanager
def hold(acquire: Acquire, release: Release, key: str, cost: int, *, ttl: float, max_wait: float) -> Iterator[Decision]:
    """Acquire, run the block, release with the measured waiting and service times (see ``Client.lease``)."""
    asked = time.monotonic()
    decision = acquire(key, cost, ttl=ttl, max_wait=max_wait)
    started = time.monotonic()
    try:
        yield decision
    finally:
        if decision.lease is not None:
            release(decision, wait=started - asked, service=time.monotonic() - started)


@asynccontextmanager
async def hold_async(
    acquire: Callable[..., Awaitable[Decision]],
    release: Callable[..., Awaitable[bool]],
    key: str,
    cost: int,
    *,
    ttl: float,
    max_wait: float,
) -> AsyncIterator[Decision]:
    """The asyncio form of :func:`hold`."""
    asked = time.monotonic()
    decision = await acquire(key, cost, ttl=ttl, max_wait=max_wait)
    started = time.monotonic()
    try:
        yield decision
    finally:
        if decision.lease is not None:
            await release(decision, wait=started - asked, service=time.monotonic() - started)
