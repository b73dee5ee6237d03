"""``sluicegate local``: the whole service on one machine.

The supervisor binds one UDP socket per partition and hands each to a
partition process (so a restarted partition keeps its address and the
datagrams queued meanwhile), serves the HTTP front itself, restarts a
partition process that dies (from the start, also while waiting for the
partitions to answer), and on Ctrl-C/SIGTERM stops everything, also during
startup. Shutdown order: stop accepting HTTP connections and close idle ones,
give requests in flight ``HTTP_GRACE_S``, then SIGTERM every partition and
SIGKILL those still running after ``STOP_GRACE_S`` (one deadline for all).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from sluicegate.config import Config
from sluicegate.importer import import_rules
from sluicegate.router.admin import RulesAdmin
from sluicegate.router.api import CheckApi
from sluicegate.router.client import PartitionClient
from sluicegate.router.http import HttpServer, serve_http
from sluicegate.store import store_from_config

log = logging.getLogger("sluicegate.local")
RESTART_BACKOFF_S = (0.0, 0.5, 1.0, 2.0, 5.0)
READY_TIMEOUT_S = 30.0  # every partition must answer within this at start
HTTP_GRACE_S = 1.0  # requests in flight at shutdown get this long to be answered
STOP_GRACE_S = 5.0  # partitions get this long (all together) to exit after SIGTERM


class StartupError(Exception):
    """The service could not start (a partition never answered)."""


@dataclass
class PartitionProcess:
    """One child process and the socket it serves."""

    index: int
    sock: socket.socket
    db: str
    process: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    quick_deaths: int = 0
    restarts: int = 0
    last_exit: int | None = None

    @property
    def address(self) -> tuple[str, int]:
        return self.sock.getsockname()[:2]

    def command(self) -> list[str]:
        fd = self.sock.fileno()
        return [
            sys.executable,
            "-m",
            "sluicegate.server",
            "--fd",
            str(fd),
            "--partition",
            str(self.index),
            "--db",
            self.db,
        ]

    def start(self) -> None:
        # Started from the event loop's (main) thread, never from a worker thread, so a
        # child that asks to die with its parent (PR_SET_PDEATHSIG) is tied to the process.
        fd = self.sock.fileno()
        self.process = subprocess.Popen(self.command(), pass_fds=[fd], stdout=subprocess.DEVNULL)
        self.started_at = time.monotonic()

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None


def bind_partition_sockets(count: int, host: str = "127.0.0.1") -> list[socket.socket]:
    sockets = []
    for _ in range(count):
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind((host, 0))
        sock.set_inheritable(True)
        sockets.append(sock)
    return sockets


async def supervise(partitions: list[PartitionProcess], stop: asyncio.Event) -> None:
    """Restart partition processes that die, backing off if one keeps dying."""
    while not stop.is_set():
        for part in partitions:
            code = part.process.poll() if part.process else None
            if code is None:
                continue
            quick = time.monotonic() - part.started_at < 5.0
            part.quick_deaths = part.quick_deaths + 1 if quick else 0
            part.last_exit = code
            delay = RESTART_BACKOFF_S[min(part.quick_deaths, len(RESTART_BACKOFF_S) - 1)]
            log.warning("partition %d exited with code %s; restarting in %.1fs", part.index, code, delay)
            part.process = None
            asyncio.get_running_loop().call_later(delay, _restart, part, stop)
        try:
            await asyncio.wait_for(stop.wait(), 0.2)
        except TimeoutError:
            pass


def _restart(part: PartitionProcess, stop: asyncio.Event) -> None:
    if not stop.is_set() and part.process is None:
        part.start()
        part.restarts += 1


async def wait_until_ready(
    client: PartitionClient, partitions: list[PartitionProcess] | None = None, timeout_s: float = READY_TIMEOUT_S
) -> None:
    """Wait until every partition answers a STATS datagram (its process is serving)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    for index in range(len(client.addresses)):
        while await client.stats(index) is None:
            if loop.time() > deadline:
                message = f"partition {index} did not answer within {timeout_s:g}s"
                part = partitions[index] if partitions else None
                if part is not None and part.last_exit is not None:
                    message += f" (its process exited {part.restarts + 1} times, last with code {part.last_exit})"
                raise StartupError(message)


async def until_ready_or_stopped(
    client: PartitionClient,
    stop: asyncio.Event,
    partitions: list[PartitionProcess] | None = None,
    timeout_s: float = READY_TIMEOUT_S,
) -> bool:
    """True once every partition answers; False as soon as ``stop`` is set; StartupError on timeout."""
    ready = asyncio.ensure_future(wait_until_ready(client, partitions, timeout_s))
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({ready, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (ready, stopped):
            task.cancel()
        await asyncio.gather(ready, stopped, return_exceptions=True)
    if stop.is_set():
        return False
    ready.result()  # raises StartupError
    return True


async def stop_partitions(partitions: list[PartitionProcess], grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM every partition, give them ``grace_s`` together, SIGKILL the rest; never blocks the loop."""
    loop = asyncio.get_running_loop()
    for part in partitions:
        if part.running():
            part.process.terminate()  # type: ignore[union-attr]
    deadline = loop.time() + grace_s
    while any(part.running() for part in partitions):
        if loop.time() >= deadline:
            for part in partitions:
                if part.running():
                    log.warning("partition %d did not stop within %.1fs; killing it", part.index, grace_s)
                    part.process.kill()  # type: ignore[union-attr]
            deadline = float("inf")
        await asyncio.sleep(0.02)


async def run_local(config: Config, *, rules_file: Path | None = None) -> None:
    store = store_from_config(config)
    try:
        store.migrate()  # one command on a laptop: create the tables of whichever store is configured
        if rules_file is not None:
            summary = import_rules(store, rules_file, on_bad=lambda message: print(message, file=sys.stderr))
            skipped = f" ({summary.bad} bad rows skipped)" if summary.bad else ""
            print(f"loaded {summary.stored} rules from {rules_file}{skipped}", flush=True)
    except BaseException:
        store.close()
        raise
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    signals = (signal.SIGINT, signal.SIGTERM)
    for sig in signals:
        loop.add_signal_handler(sig, stop.set)
    sockets = bind_partition_sockets(config.partitions)
    partitions = [PartitionProcess(i, sock, config.db) for i, sock in enumerate(sockets)]
    client = PartitionClient(
        [part.address for part in partitions],
        timeout_s=config.timeout_ms / 1000,
        attempts=config.attempts,
        fail_open=config.fail_open,
        max_datagram=config.max_datagram,
    )
    server: HttpServer | None = None
    supervisor: asyncio.Task[None] | None = None
    try:
        for part in partitions:
            part.start()
        # Supervise from the start: a partition that dies while starting is restarted too.
        supervisor = asyncio.create_task(supervise(partitions, stop))
        await client.start()
        if await until_ready_or_stopped(client, stop, partitions, READY_TIMEOUT_S):
            admin = RulesAdmin(store, config.admin_token, on_change=client.invalidate)
            api = CheckApi(client, admin=admin)
            server = await serve_http(api.handle, config.host, config.port)
            port = server.sockets[0].getsockname()[1]
            print(
                f"sluicegate local: http://{config.host}:{port} with {config.partitions} partitions "
                f"(udp {', '.join(f'{h}:{p}' for h, p in client.addresses)}), store {config.db}",
                flush=True,
            )
            if not config.admin_token:
                print("rules admin API disabled: set SLUICEGATE_ADMIN_TOKEN to enable /v1/rules", flush=True)
            await stop.wait()
    finally:
        # The HTTP front first (requests in flight still reach live partitions), then the partitions.
        if server is not None:
            await server.shutdown(HTTP_GRACE_S)
        stop.set()
        if supervisor is not None:
            for error in await asyncio.gather(supervisor, return_exceptions=True):
                if error is not None:
                    log.error("partition supervisor failed: %r", error)
        await stop_partitions(partitions, STOP_GRACE_S)
        client.close()
        store.close()
        for sock in sockets:
            sock.close()
        for sig in signals:
            loop.remove_signal_handler(sig)
        print("sluicegate local: stopped", flush=True)
