"""Admitting one request through the partitions: a rate check, or a concurrency lease released afterwards.

``mode: check`` asks :meth:`PartitionClient.check` (with ``max_wait_ms`` the
partition may hold the request until it fits). ``mode: acquire`` takes a lease
with :meth:`PartitionClient.acquire` and, once the upstream has served the
request, gives it back with :meth:`PartitionClient.release` together with the
request's waiting time (arrival at the proxy to admission) and service time
(upstream exchange to the end of the response): the inputs of an adaptive
concurrency limit. A release is sent in the background, so a client that goes
away mid-response still returns its lease; a lost release is reclaimed by the
partition after the lease's ``ttl_ms``.

Example::

    admission = Admission(client)
    ticket = await admission.admit(qos_class, "tenant:acme", arrived=loop.time())
    if ticket.decision.allowed:
        ...                                      # forward to the upstream
        admission.finish(ticket, service_ms=42)  # releases the lease, if any
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from sluicegate.decision import Decision
from sluicegate.proxy.policy import QosClass
from sluicegate.router.client import PartitionClient

log = logging.getLogger("sluicegate.proxy")


@dataclass(slots=True)
class Ticket:
    """One admission: the key, the decision and how long the request waited for it."""

    key: str
    decision: Decision
    wait_ms: int


class Admission:
    """Admits requests as their class says; counts releases that did not reach a partition."""

    def __init__(self, client: PartitionClient) -> None:
        self.client = client
        self.releases = 0
        self.lost_releases = 0  # unknown lease or no answer: the partition reclaims it after its ttl
        self._pending: set[asyncio.Task[None]] = set()

    async def admit(self, qos: QosClass, key: str, *, arrived: float) -> Ticket:
        """Decide ``key`` under ``qos``; ``arrived`` is the loop time the request's head was read."""
        if qos.mode == "acquire":
            decision = await self.client.acquire(key, qos.cost, ttl_ms=qos.ttl_ms, max_wait_ms=qos.max_wait_ms)
        elif qos.max_wait_ms:
            decision = await self.client.check(key, qos.cost, max_wait_ms=qos.max_wait_ms)
        else:
            decision = await self.client.check(key, qos.cost)
        waited = asyncio.get_running_loop().time() - arrived
        return Ticket(key, decision, max(0, round(waited * 1000)))

    def finish(self, ticket: Ticket, *, service_ms: float) -> None:
        """The upstream is done with the request: give its lease back (if it holds one) in the background."""
        lease = ticket.decision.lease
        if lease is None:
            return
        task = asyncio.ensure_future(self._release(ticket.key, lease, ticket.wait_ms, max(0, round(service_ms))))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _release(self, key: str, lease: int, wait_ms: int, service_ms: int) -> None:
        self.releases += 1
        try:
            released = await self.client.release(key, lease, wait_ms=wait_ms, service_ms=service_ms)
        except Exception as exc:  # a bug or a closed socket must not go unnoticed, nor kill the proxy
            log.warning("release of %r lease %d failed: %r", key, lease, exc)
            released = False
        if not released:
            self.lost_releases += 1

    async def drain(self, timeout_s: float) -> None:
        """Wait (at most ``timeout_s``) for the releases still in flight, e.g. before the proxy exits."""
        if self._pending:
            await asyncio.wait(set(self._pending), timeout=timeout_s)
