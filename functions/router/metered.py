"""A partition client that tallies what it decided (checks and acquires), for the router's metrics."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from sluicegate.router.client import Decision, PartitionClient


@dataclass
class Tally:
    """Decisions since the last :meth:`MeteredClient.take_tally`."""

    checks: int = 0
    allowed: int = 0
    denied: int = 0
    fallbacks: int = 0
    would_deny: int = 0  # admitted, but a shadow limit would have denied
    partition_errors: int = 0  # attempts that timed out


class MeteredClient(PartitionClient):
    """Counts every decision as it resolves; one tally per Lambda invocation."""

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self._tally = Tally()
        self._timeouts_seen = 0

    def submit(self, key: str, cost: int = 1) -> asyncio.Future[Decision]:
        future = super().submit(key, cost)
        future.add_done_callback(self._count)
        return future

    async def check(self, key: str, cost: int = 1, *, max_wait_ms: int = 0) -> Decision:
        decision = await super().check(key, cost, max_wait_ms=max_wait_ms)
        if max_wait_ms:  # a check that does not wait went through submit, and is counted there
            self._record(decision)
        return decision

    async def acquire(self, key: str, cost: int = 1, *, ttl_ms: int = 30_000, max_wait_ms: int = 0) -> Decision:
        decision = await super().acquire(key, cost, ttl_ms=ttl_ms, max_wait_ms=max_wait_ms)
        self._record(decision)
        return decision

    def _count(self, future: asyncio.Future[Decision]) -> None:
        if future.cancelled() or future.exception() is not None:
            return
        self._record(future.result())

    def _record(self, decision: Decision) -> None:
        tally = self._tally
        tally.checks += 1
        if decision.allowed:
            tally.allowed += 1
        else:
            tally.denied += 1
        if decision.fallback:
            tally.fallbacks += 1
        if decision.would_deny:
            tally.would_deny += 1

    def take_tally(self) -> Tally:
        tally, self._tally = self._tally, Tally()
        tally.partition_errors = self.timeouts - self._timeouts_seen
        self._timeouts_seen = self.timeouts
        return tally
