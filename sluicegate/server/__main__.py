"""Entry point of one bucket-server process (one partition).

``python -m sluicegate.server --listen 127.0.0.1:7001`` or, under
``sluicegate local``, ``--fd N`` with a UDP socket the supervisor bound (so a
restarted partition keeps its address and queued datagrams).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
import sys

from sluicegate.config import Config
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


def parse_address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host, int(port)


async def run(args: argparse.Namespace, config: Config) -> None:
    # Under `sluicegate local` the supervisor bound the socket; otherwise bind it here.
    sock = socket.socket(fileno=args.fd) if args.fd is not None else None
    store = store_from_config(config, db=args.db)
    partition = Partition(default_rule=config.default_rule, reply_cache_ns=config.reply_cache_ms * 1_000_000)
    server, address = await serve_partition(
        partition,
        store,
        listen=args.listen,
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
    await stop.wait()
    if args.fd is not None:
        watcher.cancel()
    await server.stop()  # the final checkpoint
    store.close()


async def _stop_when_orphaned(parent: int, stop: asyncio.Event) -> None:
    while os.getppid() == parent:
        await asyncio.sleep(0.5)
    stop.set()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sluicegate.server", description=__doc__)
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--listen", type=parse_address, help="HOST:PORT to bind (UDP)")
    where.add_argument("--fd", type=int, help="an inherited, bound UDP socket")
    parser.add_argument("--partition", type=int, default=0, help="partition index (for logs)")
    parser.add_argument("--db", help="SQLite file (default: SLUICEGATE_DB)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format=f"partition {args.partition}: %(levelname)s %(message)s")
    config = Config.from_env()
    install_event_loop_policy()
    # The store thread's Python work (checkpoint rows) must not hold the GIL away from
    # the loop for the default 5 ms at a time.
    sys.setswitchinterval(0.001)
    asyncio.run(run(args, config))
    return 0


if __name__ == "__main__":
    sys.exit(main())
