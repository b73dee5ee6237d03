#!/usr/bin/env python3
"""Load generator for the SDK paths: the Python SDK itself in a closed loop, one JSON line of results.

``python bench/sdkload.py MODE --http URL --partitions H:P,H:P --duration S --warmup S --keys N --concurrency C``

Modes (``sluicegate_sdk`` clients, random keys ``k<0..N-1>``, cost 1):

* ``direct-sync``: one thread, ``DirectClient.check`` after ``check``;
* ``direct-threads``: C threads sharing one ``DirectClient`` (their checks are coalesced);
* ``direct-async``: one coroutine, ``await AsyncDirectClient.check`` after another;
* ``direct-async-many``: C coroutines sharing one ``AsyncDirectClient`` (coalesced per loop iteration);
* ``http-sync``: one thread, ``Client.check`` (HTTP, kept-alive connection);
* ``http-async``: C coroutines sharing one ``AsyncClient``.

Latency is measured per check (``perf_counter_ns``); the first ``warmup`` seconds are not counted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import threading
import time
from collections.abc import Awaitable, Callable

from sluicegate_sdk import AsyncClient, AsyncDirectClient, Client, Decision, DirectClient


class Tally:
    """Latencies (ns) and outcomes of the checks that finished inside the measured window."""

    def __init__(self, start: float, deadline: float) -> None:
        self.start = start
        self.deadline = deadline
        self.latencies: list[int] = []
        self.denied = 0
        self.fallbacks = 0

    def add(self, began: float, elapsed_ns: int, decision: Decision) -> None:
        if began >= self.start:
            self.latencies.append(elapsed_ns)
            self.denied += not decision.allowed
            self.fallbacks += decision.fallback


def sync_loop(check: Callable[[str], Decision], tally: Tally, keys: int) -> None:
    randrange, clock, clock_ns = random.randrange, time.perf_counter, time.perf_counter_ns
    while True:
        began = clock()
        if began >= tally.deadline:
            return
        t0 = clock_ns()
        decision = check(f"k{randrange(keys)}")
        tally.add(began, clock_ns() - t0, decision)


async def async_loop(check: Callable[[str], Awaitable[Decision]], tally: Tally, keys: int) -> None:
    randrange, clock, clock_ns = random.randrange, time.perf_counter, time.perf_counter_ns
    while True:
        began = clock()
        if began >= tally.deadline:
            return
        t0 = clock_ns()
        decision = await check(f"k{randrange(keys)}")
        tally.add(began, clock_ns() - t0, decision)


def run_threads(check: Callable[[str], Decision], tally: Tally, keys: int, threads: int) -> None:
    pool = [threading.Thread(target=sync_loop, args=(check, tally, keys)) for _ in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()


async def run_coroutines(client: AsyncClient | AsyncDirectClient, tally: Tally, keys: int, tasks: int) -> None:
    await asyncio.gather(*(async_loop(client.check, tally, keys) for _ in range(tasks)))
    await client.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    modes = ["direct-sync", "direct-threads", "direct-async", "direct-async-many", "http-sync", "http-async"]
    parser.add_argument("mode", choices=modes)
    parser.add_argument("--http", required=True)
    parser.add_argument("--partitions", required=True, help="host:port,host:port in partition order")
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--keys", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=32)
    args = parser.parse_args()
    partitions = [(host, int(port)) for host, port in (item.rsplit(":", 1) for item in args.partitions.split(","))]
    start = time.perf_counter() + args.warmup
    tally = Tally(start, start + args.duration)
    mode = args.mode
    if mode in ("direct-sync", "direct-threads"):
        with DirectClient(partitions) as direct:
            run_threads(direct.check, tally, args.keys, 1 if mode == "direct-sync" else args.concurrency)
    elif mode == "http-sync":
        with Client(args.http) as client:
            sync_loop(client.check, tally, args.keys)
    else:
        many = mode.endswith("-many") or mode == "http-async"
        if mode == "http-async":
            client: AsyncClient | AsyncDirectClient = AsyncClient(args.http, pool_size=args.concurrency)
        else:
            client = AsyncDirectClient(partitions)
        asyncio.run(run_coroutines(client, tally, args.keys, args.concurrency if many else 1))
    latencies = sorted(tally.latencies)
    count = len(latencies)

    def pct(q: float) -> float:
        return latencies[min(count - 1, int(q * count))] / 1000 if count else 0.0

    print(
        json.dumps(
            {
                "mode": mode,
                "checks": count,
                "seconds": args.duration,
                "rate": count / args.duration,
                "p50_us": pct(0.50),
                "p99_us": pct(0.99),
                "denied": tally.denied,
                "fallbacks": tally.fallbacks,
                "concurrency": args.concurrency if mode in ("direct-threads", "direct-async-many", "http-async") else 1,
            }
        ),
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
