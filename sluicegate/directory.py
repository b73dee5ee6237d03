"""Where the partitions are: names (Cloud Map ``p<i>.<namespace>``) resolved with a short TTL.

A partition's Fargate task can be replaced and come back on a new address,
so a long-lived router (a warm Lambda) re-resolves the names after ``ttl_s``
and at once after a partition failed to answer. A name that does not resolve
keeps its last good address; one never resolved gets :data:`UNREACHABLE`
(checks to it fall back after the timeout budget, they never hang).

Example::

    directory = PartitionDirectory([("p0.sluicegate.internal", 7000)], ttl_s=10)
    client = PartitionClient(directory.addresses())
    ...
    client.addresses[:] = directory.addresses()  # before each invocation: cheap unless the TTL ran out
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable, Sequence

Address = tuple[str, int]
Resolve = Callable[[str, int], Address]
# The discard port on loopback: nothing answers, so a never-resolved partition falls back.
UNREACHABLE: Address = ("127.0.0.1", 9)

log = logging.getLogger(__name__)


def resolve_udp(host: str, port: int) -> Address:
    """The first IPv4 address of ``host`` (partitions bind IPv4), else the first address."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)
    infos.sort(key=lambda info: info[0] != socket.AF_INET)
    address = infos[0][4]
    return address[0], address[1]


class PartitionDirectory:
    """The partitions' numeric addresses, in partition order, refreshed after ``ttl_s``."""

    def __init__(
        self,
        endpoints: Sequence[Address],
        *,
        ttl_s: float = 10.0,
        resolve: Resolve = resolve_udp,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not endpoints:
            raise ValueError("at least one partition endpoint is needed")
        self.endpoints = list(endpoints)
        self.ttl_s = ttl_s
        self._resolve = resolve
        self._clock = clock
        self._addresses: list[Address | None] = [None] * len(self.endpoints)
        self._expires = float("-inf")
        self.failures = 0  # names that did not resolve, over all refreshes

    def addresses(self) -> list[Address]:
        """Every partition's address, resolving again first if the TTL ran out."""
        if self._clock() >= self._expires:
            self.refresh()
        return [UNREACHABLE if address is None else address for address in self._addresses]

    def unresolved(self) -> int:
        """How many partitions have never resolved."""
        return sum(address is None for address in self._addresses)

    def expire(self) -> None:
        """Resolve again at the next :meth:`addresses` (e.g. after a partition did not answer)."""
        self._expires = float("-inf")

    def refresh(self) -> None:
        for index, (host, port) in enumerate(self.endpoints):
            try:
                self._addresses[index] = self._resolve(host, port)
            except OSError as exc:
                self.failures += 1
                kept = self._addresses[index]
                log.warning("partition %d: cannot resolve %s (%s); keeping %s", index, host, exc, kept)
        self._expires = self._clock() + self.ttl_s
