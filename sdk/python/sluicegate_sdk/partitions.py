"""What both direct clients share: where the partitions are, and the protocol options.

Partitions are given as addresses (``partitions=[(host, port), ...]``, in
partition order) or found by name as ``p<i>.<namespace>`` (the deployed
stack registers them so in a Cloud Map private DNS namespace, UDP port 7000).
Names are resolved again after ``dns_ttl`` seconds and as soon as a
partition failed to answer (its task may have moved); a name that does not
resolve keeps its last address, and checks for a partition whose name never
resolved fall back at once (see :class:`sluicegate.directory.PartitionDirectory`).

Example:
    >>> partition_endpoints(namespace="sluicegate.internal", partition_count=2)
    [('p0.sluicegate.internal', 7000), ('p1.sluicegate.internal', 7000)]
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from sluicegate.decision import Decision
from sluicegate.directory import PartitionDirectory
from sluicegate.exchange import Exchange
from sluicegate.routing import partition_for
from sluicegate_sdk.checks import OnError
from sluicegate_sdk.leases import LostReleases

Address = tuple[str, int]
DEFAULT_PORT = 7000


def partition_endpoints(
    partitions: Sequence[Address] | None = None,
    *,
    namespace: str | None = None,
    partition_count: int | None = None,
    port: int = DEFAULT_PORT,
) -> list[Address]:
    """The partitions' ``(host, port)`` in partition order, from addresses or from a namespace."""
    if (partitions is None) == (namespace is None):
        raise ValueError("give either partitions=[(host, port), ...] or namespace='...' with partition_count=N")
    if partitions is not None:
        endpoints = [(str(host), int(number)) for host, number in partitions]
        if not endpoints:
            raise ValueError("partitions must list at least one (host, port)")
        if partition_count is not None and partition_count != len(endpoints):
            raise ValueError(f"partition_count={partition_count} but {len(endpoints)} partitions given")
    else:
        if not namespace or not isinstance(partition_count, int) or partition_count < 1:
            raise ValueError("namespace=... needs partition_count=N (the number of partitions, N >= 1)")
        endpoints = [(f"p{index}.{namespace}", port) for index in range(partition_count)]
    for host, number in endpoints:
        if not host or not 1 <= number <= 65535:
            raise ValueError(f"bad partition address {host}:{number}")
    return endpoints


class DirectBase:
    """Options, the partition directory and the protocol state of a direct client."""

    def __init__(
        self,
        partitions: Sequence[Address] | None = None,
        *,
        namespace: str | None = None,
        partition_count: int | None = None,
        port: int = DEFAULT_PORT,
        timeout: float = 0.05,
        attempts: int = 3,
        on_error: str = "allow",
        dns_ttl: float = 10.0,
        max_datagram: int = 8192,
    ) -> None:
        self.endpoints = partition_endpoints(
            partitions, namespace=namespace, partition_count=partition_count, port=port
        )
        if not (isinstance(timeout, (int, float)) and math.isfinite(timeout) and timeout > 0):
            raise ValueError(f"timeout must be a positive number of seconds (per attempt), got {timeout!r}")
        if not (isinstance(attempts, int) and attempts >= 1):
            raise ValueError(f"attempts must be a whole number >= 1, got {attempts!r}")
        if not (isinstance(dns_ttl, (int, float)) and dns_ttl >= 0):
            raise ValueError(f"dns_ttl must be a number of seconds >= 0, got {dns_ttl!r}")
        if not 512 <= max_datagram <= 65507:
            raise ValueError(f"max_datagram must be 512 to 65507, got {max_datagram!r}")
        self.timeout = float(timeout)
        self.attempts = attempts
        self.max_datagram = max_datagram
        self.dns_ttl = float(dns_ttl)
        self.on_error = OnError(on_error)
        self.lost_releases = LostReleases()
        self._directory = PartitionDirectory(self.endpoints, ttl_s=self.dns_ttl)
        self._exchange = self._new_exchange()
        self._start()

    def _start(self) -> None:
        """Set up the I/O state of the concrete client (its sockets are opened on first use)."""
        raise NotImplementedError

    @property
    def fallbacks(self) -> int:
        """Checks answered with the ``on_error`` fallback so far."""
        return self.on_error.count

    def partition(self, key: str) -> int:
        """The partition that owns ``key`` (the router's hash)."""
        return partition_for(key, len(self.endpoints))

    def _new_exchange(self) -> Exchange:
        return Exchange(
            attempts=self.attempts,
            timeout_s=self.timeout,
            fail_open=self.on_error.fail_open,
            max_datagram=self.max_datagram,
        )

    def _decided(self, key: str, decision: Decision | None) -> Decision:
        """``decision``, or the fallback when the partition did not answer an acquire or a waiting check."""
        if decision is None:
            decision = self.on_error.decide(key, f"a partition did not answer ({self._budget()})")
            self._directory.expire()
        return decision

    def _lost_release(self, key: str) -> None:
        self.lost_releases.note(key, f"a partition did not answer ({self._budget()})")
        self._directory.expire()

    def _budget(self) -> str:
        return f"{self.attempts} x {self.timeout:g}s"

    def _note_fallbacks(self, decisions: Sequence[Decision]) -> None:
        """Log and count fallbacks among ``decisions``; look the partitions up again before the next check."""
        count = sum(decision.fallback for decision in decisions)
        if count:
            self.on_error.note(f"a partition did not answer ({self._budget()}) or its name did not resolve", count)
            self._directory.expire()
