"""`sluicegate local` as a user runs it: a real process tree on 127.0.0.1."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest

from tests.conftest import child_env, stop, wait_for_line

TOKEN = "s3cret-admin-token"


class Local:
    def __init__(self, process: subprocess.Popen[str], port: int) -> None:
        self.process = process
        self.port = port

    def request(
        self, method: str, path: str, body: object = None, headers: dict[str, str] | None = None
    ) -> tuple[int, dict[str, str], object]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
        conn.request(method, path, body=data, headers=headers or {})
        response = conn.getresponse()
        raw = response.read()
        conn.close()
        return response.status, dict(response.getheaders()), json.loads(raw) if raw else None

    def children(self) -> list[int]:
        pids = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    stat = Path(f"/proc/{entry}/stat").read_text()
                except OSError:
                    continue
                if int(stat.rsplit(")", 1)[1].split()[1]) == self.process.pid:
                    pids.append(int(entry))
        return pids


@pytest.fixture
def local(tmp_path: Path) -> Iterator[Local]:
    rules = tmp_path / "rules.csv"
    rules.write_text("key,capacity,rate\nvip,1000,100\nbroken,-1,1\n")
    command = [sys.executable, "-m", "sluicegate.cli", "local", "--port", "0", "--partitions", "3"]
    command += ["--db", str(tmp_path / "local.db"), "--rules", str(rules)]
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=child_env(SLUICEGATE_ADMIN_TOKEN=TOKEN, SLUICEGATE_DEFAULT_CAPACITY="5", SLUICEGATE_DEFAULT_RATE="1"),
    )
    match = wait_for_line(process, r"http://127\.0\.0\.1:(\d+)")
    yield Local(process, int(match.group(1)))
    stop(process)


def test_check_answers_json_with_rate_limit_headers(local: Local) -> None:
    status, headers, body = local.request("GET", "/v1/check/alice")
    assert status == 200
    assert body == {"key": "alice", "allowed": True, "remaining": 4, "retry_after_ms": 0, "fallback": False}
    assert headers["Content-Type"] == "application/json"
    assert headers["RateLimit-Policy"] == '"default";q=5;w=5'
    assert re.fullmatch(r'"default";r=4;t=\d+', headers["RateLimit"])
    status, headers, body = local.request("GET", "/v1/check/alice?cost=5")
    assert status == 429 and body["allowed"] is False and 0 < body["retry_after_ms"] <= 1000
    assert headers["Retry-After"] == "1"


def test_rules_file_loaded_at_start_and_batch_checks(local: Local) -> None:
    status, headers, body = local.request(
        "POST", "/v1/check", {"checks": [{"key": "vip", "cost": 600}, {"key": "{t}/a"}, {"key": "{t}/b", "cost": 9}]}
    )
    assert status == 200
    vip, a, b = body["results"]
    assert vip["allowed"] and vip["remaining"] == 400
    assert a["allowed"] and a["remaining"] == 4
    assert not b["allowed"] and b["retry_after_ms"] is None  # cost above capacity: never
    assert "Retry-After" not in headers and headers["RateLimit-Policy"] == '"default";q=5;w=5'
    # Same key twice in one batch: charged in order.
    status, _, body = local.request("POST", "/v1/check", {"checks": [{"key": "dup", "cost": 3}] * 2})
    assert [r["allowed"] for r in body["results"]] == [True, False]


@pytest.mark.parametrize(
    ("method", "path", "body", "message"),
    [
        ("GET", "/v1/check/", None, "key must not be empty"),
        ("GET", "/v1/check/" + "k" * 257, None, "longer than 256"),
        ("GET", "/v1/check/" + quote("é" * 129), None, "longer than 256"),
        ("GET", "/v1/check/alice?cost=0", None, "cost must be from 1"),
        ("GET", "/v1/check/alice?cost=-3", None, "positive whole number"),
        ("GET", "/v1/check/alice?cost=abc", None, "positive whole number"),
        ("GET", "/v1/check/alice?cost=%C2%B2", None, "positive whole number"),
        ("GET", "/v1/check/%ff%fe", None, "not valid UTF-8"),
        ("POST", "/v1/check", b"{not json", "not JSON"),
        ("POST", "/v1/check", {"checks": []}, "at least one check"),
        ("POST", "/v1/check", {"checks": [{"key": "a"}] * 101}, "at most 100"),
        ("POST", "/v1/check", {"checks": [{"key": "a", "cost": 1.5}]}, "checks[0]: cost"),
        ("POST", "/v1/check", {"checks": [{"cost": 1}]}, "checks[0]: key"),
    ],
)
def test_bad_input_gets_400_with_a_clear_message(
    local: Local, method: str, path: str, body: object, message: str
) -> None:
    status, _, payload = local.request(method, path, body)
    assert status == 400
    assert message in payload["error"]


def test_stats_count_decisions_per_partition(local: Local) -> None:
    local.request("POST", "/v1/check", {"checks": [{"key": f"s{i}", "cost": 2} for i in range(30)]})
    local.request("GET", "/v1/check/s0?cost=5")  # denied: only 3 left
    status, _, body = local.request("GET", "/v1/stats")
    assert status == 200 and len(body["partitions"]) == 3
    total = {name: sum(p[name] for p in body["partitions"]) for name in ("checks", "allowed", "denied", "keys")}
    assert total == {"checks": 31, "allowed": 30, "denied": 1, "keys": 30}
    assert sum(p["charged"] for p in body["partitions"]) == 60
    assert body["router"]["fallbacks"] == 0


def test_health_and_unknown_paths(local: Local) -> None:
    assert local.request("GET", "/healthz")[2] == {"status": "ok", "partitions": 3}
    assert local.request("GET", "/nope")[0] == 404
    assert local.request("DELETE", "/v1/check/alice")[0] == 405


def test_admin_api_needs_the_token_and_changes_apply_to_live_keys(local: Local) -> None:
    assert local.request("GET", "/v1/rules")[0] == 401
    assert local.request("PUT", "/v1/rules/bob", {"capacity": 2, "rate": 0}, {"Authorization": "Bearer nope"})[0] == 401
    auth = {"Authorization": f"Bearer {TOKEN}"}
    assert local.request("GET", "/v1/check/bob")[2]["remaining"] == 4  # default rule, now held by its partition
    status, _, body = local.request("PUT", "/v1/rules/bob", {"capacity": 2, "rate": 0}, auth)
    assert status == 200 and body == {"key": "bob", "capacity": 2, "rate": 0.0}
    assert local.request("GET", "/v1/check/bob")[2]["remaining"] == 1  # credit clamped to the new capacity
    assert local.request("GET", "/v1/check/bob")[2]["remaining"] == 0
    assert local.request("GET", "/v1/check/bob")[0] == 429  # rate 0: nothing refills
    assert local.request("DELETE", "/v1/rules/bob", headers=auth)[0] == 204
    keys = [rule["key"] for rule in local.request("GET", "/v1/rules", headers=auth)[2]["rules"]]
    assert keys == ["vip"]


def test_dead_partition_is_restarted_and_keeps_its_address(local: Local) -> None:
    children = local.children()
    assert len(children) == 3
    for pid in children:
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        alive = [pid for pid in local.children() if pid not in children]
        if len(alive) == 3:
            break
        time.sleep(0.1)
    assert len(alive) == 3
    keys = [f"user-{i}" for i in range(30)]
    while time.monotonic() < deadline:
        body = local.request("POST", "/v1/check", {"checks": [{"key": k} for k in keys]})[2]
        if not any(r["fallback"] for r in body["results"]):
            break
        time.sleep(0.2)
    assert not any(r["fallback"] for r in body["results"])


def test_sigterm_stops_everything(local: Local) -> None:
    children = local.children()
    assert stop(local.process) == 0
    for pid in children:
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]
