"""asyncio adapter of the bucket server: a UDP socket, the store, a clock.

Run one per partition: ``python -m sluicegate.server --listen 127.0.0.1:7001``.
The event loop is single-threaded, so buckets need no locks; the only other
thread is the one that reads rules from the (blocking) store.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from sluicegate.server.partition import Address, Partition
from sluicegate.store import RuleStore, StoreError

log = logging.getLogger("sluicegate.server")
Clock = Callable[[], int]


class PartitionServer(asyncio.DatagramProtocol):
    """Feeds datagrams to a :class:`Partition` and loads rules it asks for."""

    def __init__(self, partition: Partition, store: RuleStore, *, clock: Clock = time.monotonic_ns) -> None:
        self.partition = partition
        self.store = store
        self.clock = clock
        self.transport: asyncio.DatagramTransport | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rule-loader")
        self._loader: asyncio.Task[None] | None = None
        self.store_errors = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: Address) -> None:
        partition = self.partition
        reply = partition.receive_datagram(data, addr, self.clock())
        if reply is not None:
            self.transport.sendto(reply, addr)  # type: ignore[union-attr]
        if partition.wants_rules and self._loader is None:
            self._loader = asyncio.ensure_future(self._load_rules())

    def error_received(self, exc: Exception) -> None:
        # ICMP errors from a vanished client: nothing to do but count them.
        log.debug("socket error: %s", exc)

    async def _load_rules(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while keys := self.partition.keys_to_load():
                names = {key.decode("utf-8"): key for key in keys}
                try:
                    found = await loop.run_in_executor(self._executor, self.store.get_rules, list(names))
                except StoreError as exc:
                    # Keep deciding: unseen keys get the default rule for now.
                    self.store_errors += 1
                    log.warning("rule load failed, using the default rule: %s", exc)
                    found = {}
                rules = {key: found.get(name) for name, key in names.items()}
                for reply, addr in self.partition.rules_loaded(rules, self.clock()):
                    self.transport.sendto(reply, addr)  # type: ignore[union-attr]
        finally:
            self._loader = None

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
        self._executor.shutdown(wait=False, cancel_futures=True)


async def serve_partition(
    partition: Partition,
    store: RuleStore,
    *,
    listen: tuple[str, int] | None = None,
    sock: object | None = None,
    clock: Clock = time.monotonic_ns,
) -> tuple[PartitionServer, tuple[str, int]]:
    """Start serving on ``listen`` (host, port) or an already bound ``sock``."""
    loop = asyncio.get_running_loop()
    server = PartitionServer(partition, store, clock=clock)
    if sock is not None:
        transport, _ = await loop.create_datagram_endpoint(lambda: server, sock=sock)  # type: ignore[arg-type]
    else:
        transport, _ = await loop.create_datagram_endpoint(lambda: server, local_addr=listen)
    return server, transport.get_extra_info("sockname")[:2]
