"""asyncio adapter of the bucket server: a UDP socket, the store, a clock.

Run one per partition: ``python -m sluicegate.server --listen 127.0.0.1:7001``.
The event loop is single-threaded, so buckets need no locks; the only other
thread is the one that reads rules from the (blocking) store.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import socket
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from sluicegate import datagram
from sluicegate.server.partition import Address, Partition
from sluicegate.store import RuleStore, StoreError

log = logging.getLogger("sluicegate.server")
Clock = Callable[[], int]


class PartitionServer:
    """Feeds datagrams from ``sock`` to a :class:`Partition` and loads rules it asks for."""

    def __init__(
        self, partition: Partition, store: RuleStore, sock: socket.socket, *, clock: Clock = time.monotonic_ns
    ) -> None:
        self.partition = partition
        self.store = store
        self.sock = sock
        self.clock = clock
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rule-loader")
        self._loader: asyncio.Future[None] | None = None
        self.store_errors = 0
        self.send_drops = 0  # replies the kernel refused (send buffer full); the client retries
        datagram.prepare(sock)

    @property
    def address(self) -> tuple[str, int]:
        return self.sock.getsockname()[:2]

    def start(self) -> None:
        datagram.watch(self.sock, self._receive)

    def _receive(self, data: bytes, addr: Address) -> None:
        reply = self.partition.receive_datagram(data, addr, self.clock())
        if reply is not None:
            self._send(reply, addr)
        if self.partition.wants_rules and self._loader is None:
            self._loader = asyncio.ensure_future(self._load_rules())

    def _send(self, reply: bytes, addr: Address) -> None:
        try:
            self.sock.sendto(reply, addr)
        except OSError:
            self.send_drops += 1

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
                    self._send(reply, addr)
                # Buckets live as long as the process and never form cycles: move them out
                # of the cycle collector's reach (O(1)), or its full passes over every
                # bucket stall the loop for tens of milliseconds as keys arrive.
                gc.freeze()
        finally:
            self._loader = None

    def close(self) -> None:
        datagram.unwatch(self.sock)
        self.sock.close()
        self._executor.shutdown(wait=False, cancel_futures=True)


async def serve_partition(
    partition: Partition,
    store: RuleStore,
    *,
    listen: tuple[str, int] | None = None,
    sock: socket.socket | None = None,
    clock: Clock = time.monotonic_ns,
) -> tuple[PartitionServer, tuple[str, int]]:
    """Start serving on ``listen`` (host, port) or an already bound ``sock``."""
    if sock is None:
        if listen is None:
            raise ValueError("give listen=(host, port) or a bound sock")
        sock = datagram.open_socket(socket.AF_INET6 if ":" in listen[0] else socket.AF_INET, listen)
    server = PartitionServer(partition, store, sock, clock=clock)
    server.start()
    return server, server.address
