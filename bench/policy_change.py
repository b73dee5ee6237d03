#!/usr/bin/env python3
"""Policy change (QED Fig. 9/10): time from a rule write to its enforcement, with many rules stored.

``.venv/bin/python bench/policy_change.py [--sizes 100,10000,1000000] [--repeats 5]`` (``make bench-policy``)

For each size it bulk-loads that many rules into a fresh SQLite file with
:meth:`RuleStore.put_rules` (99 % exact keys, 1 % patterns, none covering the
probe keys; the 1,000,000 load takes about 30 s and prints progress), starts
one real ``python -m sluicegate.server`` on it (sync interval 1 s, the
default) and measures, ``--repeats`` times each:

* ``exact``: a held key (on the default rule) gets an exact rule written to
  the store, as ``sluicegate rules put`` does;
* ``pattern``: a held key gets a new pattern rule that covers it;
* ``exact+invalidate``: an exact rule written, then the partition told to
  reload the key (one INVALIDATE datagram), as the admin API does.

The time runs from just before the store write to the first check answer
(polled over UDP every 2 ms) that carries the new rule's capacity. Each write
waits a random part of the sync interval first, so the figures cover every
phase of the sync loop. It prints min/median/max per size and kind and
whether every sample stays within the sync interval + 0.5 s; it asserts
nothing. The server is stopped by its PID and the files are removed at the
end, also on failure; every wait is bounded.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script from anywhere, with or without an installed sluicegate

from sluicegate import codec  # noqa: E402
from sluicegate.rules import Rule  # noqa: E402
from sluicegate.store import RuleStore, open_store  # noqa: E402

SYNC_INTERVAL_S = 1.0
SLACK_S = 0.5  # the target: enforced within the sync interval + this
DEFAULT_CAPACITY = 100  # the held keys' rule before the change
POLL_S = 0.002
GIVE_UP_S = 10.0  # a change not seen by then is reported as "never"
SETTLE_S = 3.0  # after start: the first syncs read the tail of the bulk load
KINDS = ("exact", "pattern", "exact+invalidate")


def stored_rules(count: int) -> Iterator[Rule]:
    """``count`` rules shaped like tenants' users; every 100th is a tenant's pattern."""
    for i in range(count):
        if i % 100 == 0:
            yield Rule(f"tenant-{i:07}/*", 500, 50, precedence=i % 3)
        else:
            yield Rule(f"tenant-{i // 100:05}/user-{i:07}", 100 + i % 900, 1 + i % 50)


def bulk_load(store: RuleStore, count: int) -> float:
    """Store ``count`` rules in batches, printing progress; the seconds it took."""
    last = time.monotonic()

    def progress(done: int) -> None:
        nonlocal last
        if time.monotonic() - last >= 5:
            last = time.monotonic()
            print(f"    {done:,} of {count:,} rules stored", flush=True)

    start = time.perf_counter()
    store.put_rules(stored_rules(count), progress=progress)
    return time.perf_counter() - start


class Server:
    """One ``python -m sluicegate.server`` on a free UDP port of 127.0.0.1, stopped by its PID."""

    def __init__(self, db: Path, python: str) -> None:
        env = {name: value for name, value in os.environ.items() if not name.startswith("SLUICEGATE_")}
        env.update(
            SLUICEGATE_SYNC_INTERVAL_MS=str(int(SYNC_INTERVAL_S * 1000)),
            SLUICEGATE_DEFAULT_CAPACITY=str(DEFAULT_CAPACITY),
            SLUICEGATE_DEFAULT_RATE="10",
            PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])),
        )
        self.process = subprocess.Popen(
            [python, "-m", "sluicegate.server", "--listen", "127.0.0.1:0", "--db", str(db)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            text=True,
        )
        self.address = self._wait_for_address(timeout=60)
        # Keep draining its output so that a chatty server never blocks on a full pipe.
        threading.Thread(target=self._drain, daemon=True).start()

    def _wait_for_address(self, timeout: float) -> tuple[str, int]:
        assert self.process.stdout is not None
        timer = threading.Timer(timeout, self.process.kill)  # a server that never says where it listens
        timer.start()
        try:
            for line in self.process.stdout:
                if "listening on udp " in line:
                    host, port = line.rsplit(" ", 1)[1].strip().rsplit(":", 1)
                    return host, int(port)
        finally:
            timer.cancel()
        raise RuntimeError(f"the partition server exited (code {self.process.wait()}) before it listened")

    def _drain(self) -> None:
        assert self.process.stdout is not None
        for _ in self.process.stdout:
            pass

    def stop(self) -> None:
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                os.kill(self.process.pid, signal.SIGKILL)
                self.process.wait()


class Prober:
    """Checks and invalidations over one blocking UDP socket (the core's codec)."""

    def __init__(self, address: tuple[str, int]) -> None:
        self.address = address
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.settimeout(0.2)
        self.request_id = random.getrandbits(48)

    def _call(self, data: bytes) -> bytes | None:
        self.sock.sendto(data, self.address)
        deadline = time.monotonic() + 0.2
        while time.monotonic() < deadline:
            try:
                reply = self.sock.recv(65536)
            except TimeoutError:
                return None
            if codec.decode_header(reply)[1] == self.request_id:  # skip late replies to earlier requests
                return reply
        return None

    def capacity(self, key: str) -> int | None:
        """The capacity of the rule that decided one check of ``key`` (None: no answer in 200 ms)."""
        self.request_id += 1
        reply = self._call(codec.encode_check_request(self.request_id, [(key.encode(), 1)]))
        return None if reply is None else codec.decode_check_reply(reply)[1][0].capacity

    def invalidate(self, key: str) -> None:
        self.request_id += 1
        self._call(codec.encode_invalidate_request(self.request_id, [key.encode()]))

    def close(self) -> None:
        self.sock.close()


def wait_answering(prober: Prober, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while prober.capacity("warm-up") is None:
        if time.monotonic() > deadline:
            raise RuntimeError("the partition server does not answer checks")


def measure(store: RuleStore, prober: Prober, kind: str, key: str, capacity: int, rng: random.Random) -> float | None:
    """Seconds from the write of a rule giving ``key`` ``capacity`` to the first answer showing it."""
    held = prober.capacity(key)
    if held != DEFAULT_CAPACITY:
        raise RuntimeError(f"{key} should be on the default rule (capacity {DEFAULT_CAPACITY}), answered {held}")
    time.sleep(rng.uniform(0, SYNC_INTERVAL_S))  # a random phase of the partition's sync loop
    rule = Rule(f"{key.rsplit('/', 1)[0]}/*" if kind == "pattern" else key, capacity, 10)
    start = time.perf_counter()
    store.put_rule(rule)
    if kind == "exact+invalidate":
        prober.invalidate(key)
    while time.perf_counter() - start < GIVE_UP_S:
        if prober.capacity(key) == capacity:
            return time.perf_counter() - start
        time.sleep(POLL_S)
    return None


def run_size(count: int, repeats: int, python: str, workdir: Path, rng: random.Random) -> dict[str, list[float | None]]:
    print(f"\n{count:,} rules stored", flush=True)
    db = workdir / f"rules-{count}.db"
    store = open_store("sqlite", path=str(db))
    server = prober = None
    try:
        store.migrate()
        seconds = bulk_load(store, count)
        print(f"  bulk load: {seconds:.1f} s ({count / seconds:,.0f} rules/s)", flush=True)
        server = Server(db, python)
        prober = Prober(server.address)
        wait_answering(prober, timeout=30)
        time.sleep(SETTLE_S)
        samples: dict[str, list[float | None]] = {kind: [] for kind in KINDS}
        for repeat in range(repeats):
            for number, kind in enumerate(KINDS):
                key = f"probe-{count}-{repeat}-{number}/user"
                took = measure(store, prober, kind, key, 1000 + 10 * repeat + number, rng)
                samples[kind].append(took)
                shown = "never" if took is None else f"{took * 1000:.0f} ms"
                print(f"  {kind:<17} #{repeat + 1}: {shown}", flush=True)
        return samples
    finally:
        if prober is not None:
            prober.close()
        if server is not None:
            server.stop()
        store.close()
        for path in workdir.glob(f"rules-{count}.db*"):
            path.unlink()


def summary(results: dict[int, dict[str, list[float | None]]]) -> str:
    target = SYNC_INTERVAL_S + SLACK_S
    lines = [
        f"| rules stored | change | min | median | max | within {target:g} s |",
        "|---:|---|---:|---:|---:|---|",
    ]
    for count, kinds in results.items():
        for kind, samples in kinds.items():
            seen = sorted(sample for sample in samples if sample is not None)
            if not seen:
                lines.append(f"| {count:,} | {kind} | never | | | no (0 of {len(samples)} seen) |")
                continue
            within = sum(sample <= target for sample in seen)
            verdict = "yes" if within == len(samples) else f"no ({within} of {len(samples)})"
            figures = [seen[0], statistics.median(seen), seen[-1]]
            lines.append(
                f"| {count:,} | {kind} | " + " | ".join(f"{s * 1000:.0f} ms" for s in figures) + f" | {verdict} |"
            )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="100,10000,1000000", help="rules stored, comma-separated")
    parser.add_argument("--repeats", type=int, default=5, help="samples per size and kind of change")
    parser.add_argument("--python", default=sys.executable, help="interpreter that runs the partition server")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    try:
        sizes = [int(size.replace("_", "")) for size in args.sizes.split(",")]
    except ValueError:
        parser.error(f"--sizes must be whole numbers separated by commas, got {args.sizes!r}")
    if args.repeats < 1 or any(size < 1 for size in sizes):
        parser.error("--sizes and --repeats must be at least 1")
    rng = random.Random(args.seed)
    workdir = Path(tempfile.mkdtemp(prefix="sluicegate-policy-bench-"))
    try:
        results = {size: run_size(size, args.repeats, args.python, workdir, rng) for size in sizes}
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"\nTime from a rule write to its enforcement (sync interval {SYNC_INTERVAL_S:g} s):\n")
    print(summary(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
