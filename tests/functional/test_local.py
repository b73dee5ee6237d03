"""`sluicegate local` as a user runs it: a real process tree on 127.0.0.1.

The startup/shutdown tests at the end run the supervisor in this process
(with stand-in partition commands) to control what the partitions do.
"""

from __future__ import annotations

import asyncio
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
from typing import Any
from urllib.parse import quote

import pytest

from sluicegate import cli
from sluicegate import local as supervisor
from sluicegate.config import Config
from tests.conftest import child_env, children_of, read_until, stop

TOKEN = "s3cret-admin-token"


class Local:
    def __init__(self, process: subprocess.Popen[str], port: int, output: list[str], rules: Path) -> None:
        self.process = process
        self.port = port
        self.output = output
        self.rules = rules

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
        return children_of(self.process.pid)


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
    match, output = read_until(process, r"http://127\.0\.0\.1:(\d+)")
    yield Local(process, int(match.group(1)), output, rules)
    stop(process)


def test_bad_rows_of_the_rules_file_are_reported_like_rules_import(local: Local) -> None:
    errors = [line for line in local.output if line.startswith(f"{local.rules}:")]
    assert len(errors) == 1
    assert errors[0].startswith(f"{local.rules}:3: capacity")
    assert any(line.startswith(f"loaded 1 rules from {local.rules} (1 bad rows skipped)") for line in local.output)


def test_check_answers_json_with_rate_limit_headers(local: Local) -> None:
    status, headers, body = local.request("GET", "/v1/check/alice")
    assert status == 200
    assert body == {
        "key": "alice",
        "allowed": True,
        "remaining": 4,
        "retry_after_ms": 0,
        "fallback": False,
        "capacity": 5,
        "window_ms": 5000,
        "policy": "default",
        "limit": None,
        "would_deny": False,
    }
    assert headers["Content-Type"] == "application/json"
    assert headers["RateLimit-Policy"] == '"default";q=5;w=5'
    assert re.fullmatch(r'"default";r=4;t=\d+', headers["RateLimit"])
    status, headers, body = local.request("GET", "/v1/check/alice?cost=5")
    assert status == 429 and body["allowed"] is False and 0 < body["retry_after_ms"] <= 1000
    assert body["limit"] == "rate"  # the rule's main bucket denied it
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


# ---------------------------------------------------------------------------- startup and shutdown, in process

PYTHON = sys.executable
EXITS_AT_ONCE = [PYTHON, "-c", "import sys; sys.exit(3)"]
NEVER_ANSWERS = [PYTHON, "-c", "import time; time.sleep(60)"]
IGNORES_SIGTERM = [
    PYTHON,
    "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(60)",
]


class Started:
    """Every process PartitionProcess.start launched during a test (with the commands given)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, command: Any) -> None:
        self.processes: list[subprocess.Popen[bytes]] = []
        real_start = supervisor.PartitionProcess.start
        real_command = supervisor.PartitionProcess.command
        started = self

        def patched_command(part: supervisor.PartitionProcess) -> list[str]:
            return command(part, real_command(part))

        def patched_start(part: supervisor.PartitionProcess) -> None:
            real_start(part)
            started.processes.append(part.process)  # type: ignore[arg-type]

        monkeypatch.setattr(supervisor.PartitionProcess, "command", patched_command)
        monkeypatch.setattr(supervisor.PartitionProcess, "start", patched_start)

    def all_reaped(self) -> bool:
        return all(process.returncode is not None for process in self.processes)


def local_config(tmp_path: Path, partitions: int = 2) -> Config:
    return Config(port=0, partitions=partitions, db=str(tmp_path / "supervisor.db"))


def test_sigterm_during_startup_stops_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    started = Started(monkeypatch, lambda part, real: NEVER_ANSWERS)

    async def main() -> float:
        # run_local installs its SIGTERM handler before it first waits, so this stops it cleanly.
        asyncio.get_running_loop().call_later(1.0, os.kill, os.getpid(), signal.SIGTERM)
        began = time.monotonic()
        await asyncio.wait_for(supervisor.run_local(local_config(tmp_path)), 10)
        return time.monotonic() - began

    elapsed = asyncio.run(main())
    assert elapsed < 3, f"took {elapsed:.1f}s to stop"
    assert len(started.processes) == 2
    assert started.all_reaped()


def test_partition_dying_during_startup_is_restarted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    first_start: set[int] = set()

    def command(part: supervisor.PartitionProcess, real: list[str]) -> list[str]:
        if part.index in first_start:
            return real
        first_start.add(part.index)
        return EXITS_AT_ONCE

    started = Started(monkeypatch, command)
    monkeypatch.setattr(supervisor, "READY_TIMEOUT_S", 20.0)

    async def main() -> None:
        service = asyncio.ensure_future(supervisor.run_local(local_config(tmp_path)))
        output = ""
        while "http://" not in output:
            assert not service.done(), service.result()
            await asyncio.sleep(0.05)
            output += capsys.readouterr().out
        port = int(re.search(r"http://127\.0\.0\.1:(\d+)", output).group(1))  # type: ignore[union-attr]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /v1/check/alice HTTP/1.1\r\n\r\n")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert head.startswith(b"HTTP/1.1 200 ")
        length = int(re.search(rb"Content-Length: (\d+)", head).group(1))  # type: ignore[union-attr]
        assert json.loads(await reader.readexactly(length))["fallback"] is False
        # The connection stays open (keep-alive) and idle: shutdown must close it, not wait for it.
        began = time.monotonic()
        os.kill(os.getpid(), signal.SIGTERM)
        assert await asyncio.wait_for(reader.read(), 5) == b""
        await asyncio.wait_for(service, 10)
        assert time.monotonic() - began < 5
        writer.close()

    asyncio.run(asyncio.wait_for(main(), 25))
    assert len(started.processes) == 4  # two that died while starting, two restarted
    assert started.all_reaped()


def test_cli_reports_a_startup_failure_without_a_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    started = Started(monkeypatch, lambda part, real: EXITS_AT_ONCE)
    monkeypatch.setattr(supervisor, "READY_TIMEOUT_S", 1.5)
    monkeypatch.setattr("sluicegate.server.__main__.install_event_loop_policy", lambda: None)
    for name in [name for name in os.environ if name.startswith("SLUICEGATE_")]:
        monkeypatch.delenv(name)
    code = cli.main(["local", "--port", "0", "--partitions", "2", "--db", str(tmp_path / "supervisor.db")])
    err = capsys.readouterr().err
    assert code == 2
    assert "Traceback" not in err
    assert "sluicegate: could not start: partition 0 did not answer within 1.5s" in err
    assert "last with code 3" in err
    assert started.all_reaped()


def test_partitions_are_stopped_together_without_blocking_the_loop(tmp_path: Path) -> None:
    async def main() -> None:
        sockets = supervisor.bind_partition_sockets(3)
        partitions = [supervisor.PartitionProcess(i, sock, "unused.db") for i, sock in enumerate(sockets)]
        for part in partitions:
            process = subprocess.Popen(IGNORES_SIGTERM, stdout=subprocess.PIPE)
            assert process.stdout is not None and process.stdout.readline() == b"ready\n"
            part.process = process  # type: ignore[assignment]
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.05)
                ticks += 1

        ticker = asyncio.ensure_future(tick())
        began = time.monotonic()
        await supervisor.stop_partitions(partitions, grace_s=0.6)
        elapsed = time.monotonic() - began
        ticker.cancel()
        assert 0.55 < elapsed < 1.5, f"{elapsed:.2f}s: the grace period is shared, not one per partition"
        assert ticks >= 8, "the event loop was blocked while waiting"
        assert all(part.process.returncode == -signal.SIGKILL for part in partitions)  # type: ignore[union-attr]
        for part in partitions:
            part.process.stdout.close()  # type: ignore[union-attr]
        for sock in sockets:
            sock.close()

    asyncio.run(main())
