"""``sluicegate local``: the whole service on one machine.

The supervisor binds one UDP socket per partition and hands each to a
partition process (so a restarted partition keeps its address and the
datagrams queued meanwhile), serves the HTTP front itself, restarts a
partition process that dies, and on Ctrl-C/SIGTERM stops everything.
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
from sluicegate.importer import read_rules
from sluicegate.router.admin import RulesAdmin
from sluicegate.router.api import CheckApi
from sluicegate.router.client import PartitionClient
from sluicegate.router.http import serve_http
from sluicegate.rules import Rule, RuleError
from sluicegate.store import RuleStore, store_from_config

log = logging.getLogger("sluicegate.local")
RESTART_BACKOFF_S = (0.0, 0.5, 1.0, 2.0, 5.0)
STOP_GRACE_S = 5.0


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

    @property
    def address(self) -> tuple[str, int]:
        return self.sock.getsockname()[:2]

    def start(self) -> None:
        fd = self.sock.fileno()
        command = [
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
        self.process = subprocess.Popen(command, pass_fds=[fd], stdout=subprocess.DEVNULL)
        self.started_at = time.monotonic()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()

    def wait(self, timeout: float) -> None:
        if self.process is None:
            return
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def import_rules_file(store: RuleStore, path: Path) -> tuple[int, list[tuple[int, RuleError]]]:
    """Store the good rows of ``path``; return (rules stored, bad rows with line numbers)."""
    good: list[Rule] = []
    bad: list[tuple[int, RuleError]] = []
    for line, row in read_rules(path):
        if isinstance(row, RuleError):
            bad.append((line, row))
        else:
            good.append(row)
    return store.put_rules(good), bad


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


async def wait_until_ready(client: PartitionClient, timeout_s: float = 30.0) -> None:
    """Wait until every partition answers a STATS datagram (its process is serving)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    for index in range(len(client.addresses)):
        while await client.stats(index) is None:
            if loop.time() > deadline:
                raise RuntimeError(f"partition {index} did not start within {timeout_s:.0f}s")


async def run_local(config: Config, *, rules_file: Path | None = None) -> None:
    store = store_from_config(config)
    if rules_file is not None:
        stored, bad = import_rules_file(store, rules_file)
        for line, error in bad:
            log.error("%s line %d: %s", rules_file, line, error)
        print(f"loaded {stored} rules from {rules_file}" + (f" ({len(bad)} bad rows skipped)" if bad else ""))
    sockets = bind_partition_sockets(config.partitions)
    partitions = [PartitionProcess(i, sock, config.db) for i, sock in enumerate(sockets)]
    for part in partitions:
        part.start()
    client = PartitionClient(
        [part.address for part in partitions],
        timeout_s=config.timeout_ms / 1000,
        attempts=config.attempts,
        fail_open=config.fail_open,
        max_datagram=config.max_datagram,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await client.start()
        await wait_until_ready(client)
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
        await supervise(partitions, stop)
        server.close()
    finally:
        for part in partitions:
            part.stop()
        for part in partitions:
            part.wait(STOP_GRACE_S)
        client.close()
        store.close()
        for sock in sockets:
            sock.close()
        print("sluicegate local: stopped", flush=True)
