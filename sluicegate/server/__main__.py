"""Entry point of one bucket-server process (one partition).

``python -m sluicegate.server --listen 127.0.0.1:7001`` or, under
``sluicegate local``, ``--fd N`` with a UDP socket the supervisor bound (so a
restarted partition keeps its address and queued datagrams). In a container,
``--listen 0.0.0.0`` takes the port from ``SLUICEGATE_PARTITION_PORT`` and the
partition index from ``SLUICEGATE_PARTITION``; ``--emf-interval 60`` prints the
partition's counters as CloudWatch EMF lines once a minute.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
import sys
import time

from sluicegate.config import Config, ConfigError
from sluicegate.server.emf import MAX_ADAPTIVE_LINES, adaptive_limits, encode_emf, partition_metrics
from sluicegate.server.partition import Partition
from sluicegate.server.udp import serve_partition
from sluicegate.store import store_from_config


def install_event_loop_policy() -> None:
    """Use uvloop when it is installed (it is a runtime dependency, but optional)."""
    try:
        import uvloop
    except ImportError:
        return
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


EMF_NAMESPACE = "Sluicegate"


def parse_address(text: str) -> tuple[str, int | None]:
    """``HOST:PORT``, or a bare IPv4 address or name whose port comes from the config."""
    host, colon, port = text.rpartition(":")
    if not colon:
        return text, None
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT or HOST, got {text!r}")
    return host, int(port)


async def run(args: argparse.Namespace, config: Config) -> None:
    # Under `sluicegate local` the supervisor bound the socket; otherwise bind it here.
    sock = socket.socket(fileno=args.fd) if args.fd is not None else None
    store = store_from_config(config, db=args.db)
    if config.store == "postgres":
        # In the cloud an Aurora database starts empty and no other step creates the tables (idempotent).
        await asyncio.get_running_loop().run_in_executor(None, store.migrate)
    partition = Partition(default_rule=config.default_rule, reply_cache_ns=config.reply_cache_ms * 1_000_000)
    listen = None
    if args.listen is not None:
        host, port = args.listen
        listen = (host, config.partition_port if port is None else port)
    server, address = await serve_partition(
        partition,
        store,
        listen=listen,
        sock=sock,
        sync_interval_s=config.sync_interval_ms / 1000,
        checkpoint_interval_s=config.checkpoint_interval_ms / 1000,
    )
    print(f"partition {args.partition} listening on udp {address[0]}:{address[1]}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if args.fd is not None:
        # Under a supervisor: leave when it is gone (even if it was SIGKILLed), not linger as an orphan.
        parent = os.getppid()
        watcher = asyncio.ensure_future(_stop_when_orphaned(parent, stop))
    if args.emf_interval:
        emitter = asyncio.ensure_future(_print_emf(partition, args.partition, args.emf_interval))
    await stop.wait()
    if args.fd is not None:
        watcher.cancel()
    if args.emf_interval:
        emitter.cancel()
    await server.stop()  # the final checkpoint
    store.close()


async def _stop_when_orphaned(parent: int, stop: asyncio.Event) -> None:
    while os.getppid() == parent:
        await asyncio.sleep(0.5)
    stop.set()


async def _print_emf(partition: Partition, index: int, interval_s: float) -> None:
    previous: dict[str, int] = {}
    while True:
        await asyncio.sleep(interval_s)
        counters = partition.counters()
        values = partition_metrics(counters, previous)
        previous = counters
        stamp = time.time_ns() // 1_000_000
        print(encode_emf(EMF_NAMESPACE, {"Partition": str(index)}, values, timestamp_ms=stamp), flush=True)
        # Adaptive concurrency limits, one line per key (a few keys have one; bounded all the same).
        for key, limit in adaptive_limits(partition.admission.adaptive, MAX_ADAPTIVE_LINES):
            dimensions = {"Partition": str(index), "Key": key}
            print(encode_emf(EMF_NAMESPACE, dimensions, {"ConcurrencyLimit": limit}, timestamp_ms=stamp), flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sluicegate.server", description=__doc__)
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--listen", type=parse_address, help="HOST:PORT (or HOST: SLUICEGATE_PARTITION_PORT) to bind")
    where.add_argument("--fd", type=int, help="an inherited, bound UDP socket")
    parser.add_argument("--partition", type=int, help="partition index (default: SLUICEGATE_PARTITION)")
    parser.add_argument("--db", help="SQLite file (default: SLUICEGATE_DB)")
    parser.add_argument(
        "--emf-interval", type=float, default=0, metavar="SECONDS", help="print counters as CloudWatch EMF lines"
    )
    args = parser.parse_args(argv)
    try:
        config = Config.from_env()
    except ConfigError as exc:
        parser.exit(2, f"python -m sluicegate.server: {exc}\n")
    if args.partition is None:
        args.partition = config.partition
    if args.emf_interval < 0:
        parser.error("--emf-interval must be >= 0")
    logging.basicConfig(level=logging.INFO, format=f"partition {args.partition}: %(levelname)s %(message)s")
    install_event_loop_policy()
    # The store thread's Python work (checkpoint rows) must not hold the GIL away from
    # the loop for the default 5 ms at a time.
    sys.setswitchinterval(0.001)
    asyncio.run(run(args, config))
    return 0


if __name__ == "__main__":
    sys.exit(main())
