"""Crash and graceful restart of partitions under `sluicegate local`, under load.

Keys get a rule that never refills, so every admission spends credit for good
and a restart that forgot spending would show up as admissions beyond the
capacity.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import child_env, children_of, stop, wait_for_line

CAPACITY = 200
KEYS = [f"acct-{i}" for i in range(6)]
CHECKPOINT_S = 1.0
RATE_PER_KEY = 50  # checks/s


class Local:
    def __init__(self, process: subprocess.Popen[str], port: int) -> None:
        self.process = process
        self.port = port

    def children(self) -> list[int]:
        return children_of(self.process.pid)


@pytest.fixture
def local(tmp_path: Path) -> Iterator[Local]:
    rules = tmp_path / "rules.csv"
    rules.write_text("key,capacity,rate\n" + "".join(f"{key},{CAPACITY},0\n" for key in KEYS))
    command = [sys.executable, "-m", "sluicegate.cli", "local", "--port", "0", "--partitions", "2"]
    command += ["--db", str(tmp_path / "local.db"), "--rules", str(rules)]
    env = child_env(SLUICEGATE_FALLBACK="deny", SLUICEGATE_CHECKPOINT_INTERVAL_MS=str(int(CHECKPOINT_S * 1000)))
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    match = wait_for_line(process, r"http://127\.0\.0\.1:(\d+)")
    yield Local(process, int(match.group(1)))
    stop(process)


class Load:
    """Checks every key at RATE_PER_KEY per second; records (time, key, admitted) per answer."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.answers: list[tuple[float, str, bool]] = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
        period = 1 / RATE_PER_KEY
        next_at = time.monotonic()
        while not self.stopping.is_set():
            body = json.dumps({"checks": [{"key": key} for key in KEYS]})
            conn.request("POST", "/v1/check", body=body, headers={"Content-Type": "application/json"})
            results = json.loads(conn.getresponse().read())["results"]
            now = time.monotonic()
            # A fallback (partition restarting) is a denial here: SLUICEGATE_FALLBACK=deny.
            self.answers += [(now, r["key"], r["allowed"] and not r["fallback"]) for r in results]
            next_at += period
            time.sleep(max(0.0, next_at - time.monotonic()))
        conn.close()

    def __enter__(self) -> Load:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self.thread.join(10)

    def admitted(self, key: str, since: float = 0.0, until: float = float("inf")) -> int:
        return sum(1 for at, k, ok in self.answers if k == key and ok and since < at <= until)


def restart_partitions_under_load(local: Local, sig: signal.Signals) -> tuple[Load, float]:
    with Load(local.port) as load:
        time.sleep(2.5)  # about 125 of each key's 200 credits spent
        children = local.children()
        assert len(children) == 2
        hit_at = time.monotonic()
        for pid in children:
            os.kill(pid, sig)
        deadline = time.monotonic() + 15
        while any(load.admitted(key, since=time.monotonic() - 0.5) for key in KEYS) or time.monotonic() < hit_at + 5:
            assert time.monotonic() < deadline, "keys never ran out of credit"
            time.sleep(0.1)
    assert len([pid for pid in local.children() if pid not in children]) == 2  # restarted
    return load, hit_at


def test_kill_9_over_admits_at_most_one_checkpoint_interval_of_spending(local: Local) -> None:
    load, killed_at = restart_partitions_under_load(local, signal.SIGKILL)
    for key in KEYS:
        extra = load.admitted(key) - CAPACITY
        # The last checkpoint was taken at most one interval (plus the time to write it) before the kill.
        spent_last_interval = load.admitted(key, since=killed_at - CHECKPOINT_S - 0.7, until=killed_at)
        assert extra <= spent_last_interval, (key, extra, spent_last_interval)
        assert load.admitted(key, until=killed_at) < CAPACITY  # the kill came before the key ran out


def test_sigterm_restart_admits_nothing_extra(local: Local) -> None:
    load, stopped_at = restart_partitions_under_load(local, signal.SIGTERM)
    for key in KEYS:
        admitted = load.admitted(key)
        assert admitted <= CAPACITY, (key, admitted)
        # Checks in flight during the restart may be charged after their caller gave up, never twice.
        assert admitted >= CAPACITY - 2 * RATE_PER_KEY, (key, admitted)
        assert load.admitted(key, until=stopped_at) < CAPACITY
