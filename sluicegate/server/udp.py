"""asyncio adapter of the bucket server: a UDP socket, a clock, and a store keeper.

Run one per partition: ``python -m sluicegate.server --listen 127.0.0.1:7001``.
The event loop is single-threaded, so buckets need no locks; the store is
read and written on one worker thread (see :mod:`sluicegate.server.keeper`).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from typing import Any

from sluicegate import datagram
from sluicegate.server.keeper import Clock, StoreKeeper
from sluicegate.server.partition import Address, Partition
from sluicegate.store import RuleStore

log = logging.getLogger("sluicegate.server")


class PartitionServer:
    """Feeds datagrams from ``sock`` to a :class:`Partition`; its keeper does the store work."""

    def __init__(
        self,
        partition: Partition,
        store: RuleStore,
        sock: socket.socket,
        *,
        clock: Clock = time.monotonic_ns,
        **keeper_options: Any,
    ) -> None:
        """``keeper_options``: see :class:`StoreKeeper` (wall_clock, sync_interval_s, checkpoint_interval_s)."""
        self.partition = partition
        self.sock = sock
        self.clock = clock
        self.keeper = StoreKeeper(partition, store, self._send, clock=clock, **keeper_options)
        self.keeper.after_load = self._after
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0
        datagram.prepare(sock)

    @property
    def address(self) -> tuple[str, int]:
        return self.sock.getsockname()[:2]

    def start(self) -> None:
        datagram.watch(self.sock, self._receive)
        self.keeper.start()

    def _receive(self, data: bytes, addr: Address) -> None:
        partition = self.partition
        reply = partition.receive_datagram(data, addr, self.clock())
        if reply is not None:
            self._send(reply, addr)
        if partition.wants_rules:
            self.keeper.need_rules()
        if partition.outbox or partition.admission.rearm:
            self._after()

    def _after(self) -> None:
        """Send replies that requests which waited are due, and wake up for the next timed event."""
        for reply, addr in self.partition.take_outbox():
            self._send(reply, addr)
        self.partition.admission.rearm = False
        event = self.partition.next_event_ns()
        if event is None or (self._timer is not None and self._timer_at <= event):
            return
        if self._timer is not None:
            self._timer.cancel()
        delay = max(0.0, (event - self.clock()) / 1e9)
        self._timer_at = event
        self._timer = asyncio.get_running_loop().call_later(delay, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self.partition.tick(self.clock())
        self._after()

    def _send(self, reply: bytes, addr: Address) -> None:
        try:
            self.sock.sendto(reply, addr)
        except OSError:
            self.partition.send_errors += 1  # e.g. send buffer full; the client retries

    async def stop(self) -> None:
        """Stop receiving, write the final checkpoints, close (what SIGTERM does)."""
        datagram.unwatch(self.sock)
        await self.keeper.flush()
        self.close()

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        datagram.unwatch(self.sock)
        self.keeper.close()
        self.sock.close()


async def serve_partition(
    partition: Partition,
    store: RuleStore,
    *,
    listen: tuple[str, int] | None = None,
    sock: socket.socket | None = None,
    **options: Any,
) -> tuple[PartitionServer, tuple[str, int]]:
    """Start serving on ``listen`` (host, port) or an already bound ``sock``; ``options`` as for PartitionServer."""
    if sock is None:
        if listen is None:
            raise ValueError("give listen=(host, port) or a bound sock")
        sock = datagram.open_socket(socket.AF_INET6 if ":" in listen[0] else socket.AF_INET, listen)
    server = PartitionServer(partition, store, sock, **options)
    # Patterns first: a key resolved before them would get the default rule until the next sync.
    # A store that is down now is retried by every sync until it answers.
    await server.keeper.load_patterns()
    server.start()
    return server, server.address
