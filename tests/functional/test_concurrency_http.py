"""Concurrency quotas and waiting over HTTP: `sluicegate local` as a user runs it, on 127.0.0.1."""

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
from typing import Any

import pytest

from sluicegate.routing import partition_for
from tests.conftest import child_env, children_of, read_until, stop
from tests.functional.test_cli_rules import sluicegate

BIG = 10**6  # a rate that never denies: only the concurrency limit decides
RULES = [
    {"key": "db", "capacity": BIG, "rate": BIG, "limits": [{"name": "inflight", "concurrency": 2}]},
    {"key": "pool", "capacity": BIG, "rate": BIG, "limits": [{"name": "workers", "concurrency": 1}]},
    {"key": "gate:*", "capacity": BIG, "rate": BIG, "limits": [{"name": "seats", "concurrency": 1}]},
    {"key": "slow", "capacity": 5, "rate": 20},  # empty, it has 5 credits again after 250 ms
    {"key": "tick", "capacity": 5, "rate": 20},
]
PARTITIONS = 3


class Local:
    def __init__(self, process: subprocess.Popen[str], port: int) -> None:
        self.process = process
        self.port = port

    def request(self, method: str, path: str, body: object = None) -> tuple[int, dict[str, str], Any]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
        conn.request(method, path, body=data)
        response = conn.getresponse()
        raw = response.read()
        conn.close()
        return response.status, dict(response.getheaders()), json.loads(raw) if raw else None

    def acquire(self, key: str, **fields: object) -> tuple[int, dict[str, str], Any]:
        return self.request("POST", "/v1/acquire", {"key": key, **fields})

    def release(self, key: str, lease: object, **fields: object) -> tuple[int, dict[str, str], Any]:
        return self.request("POST", "/v1/release", {"key": key, "lease": lease, **fields})

    def partition_pid(self, key: str) -> int:
        index = partition_for(key, PARTITIONS)
        for pid in children_of(self.process.pid):
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if b"--partition" in argv and argv[argv.index(b"--partition") + 1] == str(index).encode():
                return pid
        raise AssertionError(f"partition {index} is not running")


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Local]:
    folder = tmp_path_factory.mktemp("concurrency-http")
    (folder / "rules.json").write_text(json.dumps(RULES))
    command = [sys.executable, "-m", "sluicegate.cli", "local", "--port", "0", "--partitions", str(PARTITIONS)]
    command += ["--db", str(folder / "local.db"), "--rules", str(folder / "rules.json")]
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=child_env(SLUICEGATE_DEFAULT_CAPACITY="5", SLUICEGATE_DEFAULT_RATE="1"),
    )
    try:
        match, _ = read_until(process, r"http://127\.0\.0\.1:(\d+) with")
        yield Local(process, int(match.group(1)))
    finally:
        stop(process)


def test_acquire_and_release_round_trip(local: Local) -> None:
    status, headers, first = local.acquire("db", ttl_ms=10_000)
    assert status == 200 and first["allowed"] is True and first["limit"] is None
    assert isinstance(first["lease"], int) and first["capacity"] == 2 and first["remaining"] == 1
    assert (headers["RateLimit-Policy"], headers["RateLimit"]) == ('"key";q=2', '"key";r=1')  # no window
    status, _, second = local.acquire("db")
    assert status == 200 and second["remaining"] == 0 and second["lease"] != first["lease"]

    status, _, body = local.release("db", first["lease"], wait_ms=0, service_ms=12)
    assert status == 200 and body == {"key": "db", "lease": first["lease"], "released": True, "concurrency": 2}
    status, _, body = local.release("db", first["lease"])  # given back already
    assert status == 409 and body["released"] is False and "no such lease" in body["error"]
    status, _, body = local.release("db", str(second["lease"]))  # a lease as a string of digits works too
    assert status == 200 and body["released"] is True
    status, _, body = local.release("pool", second["lease"])  # another key's lease
    assert status == 409 and body["released"] is False


def test_limit_reached_is_429_naming_the_concurrency_limit_until_a_lease_is_released(local: Local) -> None:
    held = [local.acquire("pool")[2]]
    status, headers, body = local.acquire("pool")
    assert status == 429 and body["allowed"] is False and body["limit"] == "workers"
    assert "lease" not in body and body["capacity"] == 1 and body["remaining"] == 0
    assert int(headers["Retry-After"]) >= 1
    assert local.release("pool", held[0]["lease"])[0] == 200
    status, _, body = local.acquire("pool")
    assert status == 200 and body["lease"]
    local.release("pool", body["lease"])


def test_a_waiting_acquire_gets_the_lease_when_one_is_released(local: Local) -> None:
    holder = local.acquire("gate:a")[2]
    answers: list[tuple[int, Any, float]] = []

    def wait_for_a_seat() -> None:
        status, _, body = local.acquire("gate:a", max_wait_ms=5_000)
        answers.append((status, body, time.monotonic()))

    waiter = threading.Thread(target=wait_for_a_seat)
    waiter.start()
    time.sleep(0.3)
    assert answers == []  # held by the partition: no seat yet
    released_at = time.monotonic()
    assert local.release("gate:a", holder["lease"], wait_ms=0, service_ms=300)[2]["released"]
    waiter.join(10)
    (status, body, answered_at), *_ = answers
    assert status == 200 and body["lease"] and answered_at >= released_at
    local.release("gate:a", body["lease"])


def test_a_waiting_acquire_is_denied_at_its_deadline_or_at_once_when_it_cannot_make_it(local: Local) -> None:
    holder = local.acquire("gate:b")[2]
    asked = time.monotonic()
    status, headers, body = local.acquire("gate:b", max_wait_ms=200)  # no service time known yet: it waits
    waited = time.monotonic() - asked
    assert status == 429 and body["limit"] == "seats" and "Retry-After" in headers
    assert waited >= 0.19  # held until its deadline, not refused at once
    local.release("gate:b", holder["lease"], service_ms=5000)  # the partition learns: a seat is held long

    holder = local.acquire("gate:b")[2]
    asked = time.monotonic()
    status, _, body = local.acquire("gate:b", max_wait_ms=400)
    waited = time.monotonic() - asked
    assert status == 429 and body["retry_after_ms"] > 400
    assert waited < 0.4  # the expected wait is longer than the deadline: refused before it
    local.release("gate:b", holder["lease"])


def test_a_check_may_wait_for_credit_and_a_plain_check_does_not(local: Local) -> None:
    assert local.request("GET", "/v1/check/slow?cost=5")[0] == 200  # the bucket is empty now
    status, _, body = local.request("GET", "/v1/check/slow?cost=5")
    assert status == 429 and body["limit"] == "rate"  # without max_wait_ms: denied, not queued
    asked = time.monotonic()
    status, headers, body = local.request("GET", "/v1/check/slow?cost=5&max_wait_ms=2000")
    waited = time.monotonic() - asked
    assert status == 200 and body["allowed"] is True and body["remaining"] == 0
    assert waited >= 0.1  # answered when the credit was there, not at once
    assert headers["RateLimit-Policy"] == '"key";q=5;w=1'
    status, _, body = local.request("GET", "/v1/check/slow?cost=5&max_wait_ms=20")  # needs ~250 ms
    assert status == 429 and body["retry_after_ms"] > 20


def test_sluicegate_check_can_wait(local: Local, tmp_path: Path) -> None:
    endpoint = f"http://127.0.0.1:{local.port}"
    assert sluicegate("check", "tick", "--cost", "5", "--endpoint", endpoint, cwd=tmp_path).returncode == 0
    denied = sluicegate("check", "tick", "--cost", "5", "--endpoint", endpoint, cwd=tmp_path)
    assert denied.returncode == 1 and "denied by the 'rate' limit" in denied.stderr
    waited = sluicegate("check", "tick", "--cost", "5", "--max-wait-ms", "2000", "--endpoint", endpoint, cwd=tmp_path)
    assert waited.returncode == 0 and json.loads(waited.stdout)["allowed"] is True
    bad = sluicegate("check", "tick", "--max-wait-ms", "70000", "--endpoint", endpoint, cwd=tmp_path)
    assert bad.returncode == 2 and "max_wait_ms must be from 0 to 60000" in bad.stderr


def test_a_key_without_a_concurrency_limit_is_acquired_like_a_check(local: Local) -> None:
    status, _, body = local.acquire("plain", cost=2)
    assert status == 200 and "lease" not in body and body["remaining"] == 3  # the default rule: 5 credits
    assert local.release("plain", 1)[0] == 409  # nothing to give back


def test_a_release_the_partition_does_not_answer_is_503(local: Local) -> None:
    lease = local.acquire("db")[2]["lease"]
    pid = local.partition_pid("db")
    os.kill(pid, signal.SIGSTOP)
    try:
        status, _, body = local.release("db", lease)
    finally:
        os.kill(pid, signal.SIGCONT)
    assert status == 503 and body["released"] is False and body["fallback"] is True
    # The release was not confirmed, but it reached the partition once it ran again: the seat is free.
    assert local.release("db", lease)[0] == 409
    taken = [local.acquire("db")[2] for _ in range(2)]
    assert all(body["allowed"] for body in taken)
    for body in taken:
        local.release("db", body["lease"])


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "message"),
    [
        ("GET", "/v1/check/slow?max_wait_ms=60001", None, 400, "max_wait_ms must be from 0 to 60000"),
        ("GET", "/v1/check/slow?max_wait_ms=soon", None, 400, "max_wait_ms must be a whole number"),
        ("POST", "/v1/acquire", b"{not json", 400, "not JSON"),
        ("POST", "/v1/acquire", [], 400, "body must be a JSON object"),
        ("POST", "/v1/acquire", {}, 400, "key"),
        ("POST", "/v1/acquire", {"key": "db", "ttl_ms": 0}, 400, "ttl_ms must be from 1 to 3600000"),
        ("POST", "/v1/acquire", {"key": "db", "ttl_ms": 3_600_001}, 400, "ttl_ms must be from 1 to 3600000"),
        ("POST", "/v1/acquire", {"key": "db", "max_wait_ms": 90_000}, 400, "max_wait_ms must be from 0 to 60000"),
        ("POST", "/v1/acquire", {"key": "db", "max_wait_ms": 1.5}, 400, "max_wait_ms must be a whole number"),
        ("POST", "/v1/acquire", {"key": "db", "cost": 0}, 400, "cost must be from 1"),
        ("POST", "/v1/acquire", {"key": "db", "max_wait": 100}, 400, "unknown field 'max_wait'"),
        ("POST", "/v1/release", {"key": "db"}, 400, "lease is required"),
        ("POST", "/v1/release", {"key": "db", "lease": 0}, 400, "lease must be from 1"),
        ("POST", "/v1/release", {"key": "db", "lease": "abc"}, 400, "lease must be a whole number"),
        ("POST", "/v1/release", {"key": "db", "lease": 1, "service_ms": -1}, 400, "service_ms must be from 0"),
        ("GET", "/v1/acquire", None, 405, "use POST /v1/acquire"),
        ("PUT", "/v1/release", None, 405, "use POST /v1/release"),
    ],
)
def test_bad_input_gets_a_clear_message(
    local: Local, method: str, path: str, body: object, status: int, message: str
) -> None:
    got, _, payload = local.request(method, path, body)
    assert got == status
    assert message in payload["error"]
