#!/usr/bin/env python3
"""Bulk import of generated rules into SQLite and PostgreSQL: time and peak memory of each.

``.venv/bin/python bench/import_rules.py [--count 1000000] [--backends sqlite,postgres]``

Every import goes through :meth:`RuleStore.put_rules` with its default batch,
the path ``sluicegate rules import`` takes, from a generator (as the file
reader yields rows), in a child process of its own so that each backend's
peak resident memory (``ru_maxrss`` from ``wait4``) is its own. PostgreSQL is
a throwaway server (``tests/pgserver.py``) with its durable defaults (fsync
on, like the SQLite file in WAL mode); its memory is the server's, not in the
figure, which is the importing client's. Prints figures, asserts nothing;
every child has a time limit, and the server and temp files are removed at
the end, also on failure.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # for tests.pgserver (the test suite's server helper) and an uninstalled sluicegate

from tests.pgserver import PostgresServer  # noqa: E402

CHILD_TIMEOUT_S = 900


def child(backend: str, target: str, count: int) -> None:
    """Import ``count`` rules into one store and print the figures as one JSON line (runs in its own process)."""
    import resource

    from sluicegate.rules import Rule
    from sluicegate.store import open_store

    store = open_store("sqlite", path=target) if backend == "sqlite" else open_store("postgres", dsn=target)
    store.migrate()
    baseline_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    last = time.monotonic()

    def progress(done: int) -> None:
        nonlocal last
        if time.monotonic() - last >= 5:
            last = time.monotonic()
            print(f"  {backend}: {done:,} rules", file=sys.stderr, flush=True)

    rules = (Rule(f"tenant-{i % 1000:03}/user-{i:07}", 100 + i % 900, 1 + i % 50) for i in range(count))
    start = time.perf_counter()
    stored = store.put_rules(rules, progress=progress)
    elapsed = time.perf_counter() - start
    # A spot check that the last batch landed.
    last_key = f"tenant-{(count - 1) % 1000:03}/user-{count - 1:07}"
    found = store.get_rule(last_key) is not None
    store.close()
    print(json.dumps({"stored": stored, "seconds": elapsed, "baseline_kb": baseline_kb, "last_found": found}))


def run_child(backend: str, target: str, count: int) -> dict[str, float]:
    """Run one import in a child; its figures plus its peak RSS (KiB) from wait4."""
    process = subprocess.Popen(
        [sys.executable, __file__, "--child", backend, "--target", target, "--count", str(count)],
        stdout=subprocess.PIPE,
        text=True,
    )
    # Killed if it runs too long; reaped with wait4 (not Popen.wait) to get its rusage.
    timer = threading.Timer(CHILD_TIMEOUT_S, process.kill)
    timer.start()
    assert process.stdout is not None
    try:
        output = process.stdout.read()  # the child prints its one line at the end
        _, status, usage = os.wait4(process.pid, 0)
    except BaseException:
        process.kill()
        os.wait4(process.pid, 0)
        raise
    finally:
        timer.cancel()
    process.returncode = os.waitstatus_to_exitcode(status)  # reaped here: keep Popen from waiting again
    if process.returncode != 0:
        why = f"killed after {CHILD_TIMEOUT_S}s" if not timer.is_alive() and process.returncode < 0 else "failed"
        raise RuntimeError(f"{backend} import {why} (exit code {process.returncode})")
    figures = json.loads(output.strip().splitlines()[-1])
    figures["peak_kb"] = usage.ru_maxrss
    return figures


def size_of(paths: list[Path]) -> int:
    return sum(path.stat().st_size for path in paths if path.exists())


def psql(server: PostgresServer, sql: str) -> str:
    done = subprocess.run(
        [str(server.bin_dir / "psql"), "-Atc", sql, server.dsn()], capture_output=True, text=True, timeout=60
    )
    return done.stdout.strip() or done.stderr.strip()


def report(backend: str, count: int, figures: dict[str, float], size: str) -> None:
    rate = figures["stored"] / figures["seconds"] if figures["seconds"] else 0
    print(
        f"{backend:<10} {int(figures['stored']):>10,} rules  {figures['seconds']:8.1f} s  {rate:>9,.0f} rules/s  "
        f"peak RSS {figures['peak_kb'] / 1024:6.1f} MiB (of which {figures['baseline_kb'] / 1024:.1f} MiB "
        f"before the import)  on disk {size}  last batch stored: {bool(figures['last_found'])}",
        flush=True,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=1_000_000, help="rules to import into each backend")
    parser.add_argument("--backends", default="sqlite,postgres", help="comma-separated: sqlite, postgres")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--target", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.target, args.count)
        return 0

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # run the finally blocks below on SIGTERM too
    backends = [name.strip() for name in args.backends.split(",") if name.strip()]
    print(f"importing {args.count:,} generated rules through RuleStore.put_rules, one child process per backend")
    work = Path(tempfile.mkdtemp(prefix="sluicegate-import-"))
    try:
        if "sqlite" in backends:
            db = work / "rules.db"
            figures = run_child("sqlite", str(db), args.count)
            mib = size_of([db, Path(f"{db}-wal"), Path(f"{db}-shm")]) / 2**20
            report("sqlite", args.count, figures, f"{mib:.0f} MiB")
        if "postgres" in backends:
            with PostgresServer(fast=False) as server:
                figures = run_child("postgres", server.dsn(), args.count)
                size = psql(server, "SELECT pg_size_pretty(pg_total_relation_size('rules'))")
                report("postgres", args.count, figures, size)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
