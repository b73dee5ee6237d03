#!/usr/bin/env python3
"""Sluicegate benchmark: ours against Redis and nginx, measured in the same run.

``python3 bench/run.py [--quick] [--python PATH]`` (``make bench``). Standard
library only. It measures and prints; it asserts nothing about timings and
exits 0 unless something crashed. Results go to stdout and bench/results.md.

Scenarios (all traffic to 127.0.0.1, every load loop bounded in time):

1. partition server over UDP, 1 check per datagram, 50 closed-loop clients,
   random keys among 100,000  vs  Redis + Lua token bucket (EVALSHA) driven by
   ``redis-benchmark -c 50 -r 100000``;
2. the same with 16 checks per datagram  vs  Redis pipelined 16 deep (-P 16);
3. HTTP front end to end (``sluicegate local``)  vs  nginx ``return 200``,
   both driven by ``wrk -t1 -c50`` with random keys;
4. decision latency at half of the peak of (1), open loop (paced);
5. resident memory of one partition holding 1,000,000 keys;
6. CPU% of every server and load generator, and the ceiling of our UDP load
   generator against a trivial C reflector.
7. the Python SDK end to end (``sdk_paths.py``, ``sdkload.py``): direct UDP sync and
   async, one caller and many (coalesced), and over HTTP, with the Redis figure
   of (1) for scale.

Every process started here is stopped by its PID in a ``finally``.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

# bench/ is a folder of scripts, not a package: make its modules importable when run as ``python bench/run.py``.
sys.path.insert(0, str(Path(__file__).resolve().parent))

import baselines
import front
import report
import sdk_paths
import udp
from context import Context
from procs import machine_user_sys, stop_all


def run(ctx: Context) -> None:
    """Every scenario in turn (a failure is noted and the next one runs), then the report."""
    steps: list[tuple[str, Callable[[Context], None]]] = [
        ("build", lambda _ctx: udp.build()),
        ("UDP partition server (1, 2, 4) and the latency floor", udp.scenarios),
        ("Redis baseline (1, 2)", baselines.redis),
        ("load generator ceiling (6)", udp.echo_ceiling),
        ("HTTP front (3)", front.http_front),
        ("nginx baseline (3)", baselines.nginx),
        ("Python SDK paths (7)", sdk_paths.scenarios),
        ("memory (5)", udp.memory),
    ]
    t0 = time.monotonic()
    before = machine_user_sys()
    time.sleep(1.0)
    ctx.background = 100.0 * (machine_user_sys() - before)
    ctx.log(f"machine activity before the bench (1 s sample): {ctx.background:.0f}% of one core")
    for title, step in steps:
        ctx.log(f"== {title}")
        try:
            step(ctx)
        except Exception as exc:
            if title == "build":
                raise
            ctx.notes.append(f"{title} failed: {exc}")
            ctx.log(f"!! {title} failed: {exc}")
        finally:
            stop_all()
    report.write(ctx, t0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="short durations (smoke run)")
    parser.add_argument("--python", default=sys.executable, help="interpreter that runs the server (default: this one)")
    args = parser.parse_args()
    ctx = Context(quick=args.quick, python=args.python)
    # Stop our children on SIGTERM too (finally blocks run on SystemExit).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        run(ctx)
    finally:
        stop_all()
        shutil.rmtree(ctx.tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
