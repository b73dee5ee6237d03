"""The bucket-server container's contract, without Docker: its Dockerfile and the command it runs.

The image's ``CMD`` is run as written (with loopback for ``0.0.0.0``, a free
port and a short metrics interval) against DynamoDB on a moto server, the way
the Fargate task runs it: settings from the environment, health check,
EMF metrics, final checkpoint on SIGTERM.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sluicegate.router.client import PartitionClient
from tests.conftest import child_env, read_until, stop
from tests.stores.dynamodb import ServerTables

FOLDER = Path(__file__).resolve().parents[2] / "functions" / "bucket_server"
ROOT = FOLDER.parents[1]


def stages(dockerfile: str) -> list[list[str]]:
    """The Dockerfile's instructions (continuations joined, comments dropped), split into stages."""
    text = re.sub(r"\\\n\s*", " ", dockerfile)
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    result: list[list[str]] = []
    for line in lines:
        if line.upper().startswith("FROM "):
            result.append([])
        result[-1].append(line)
    return result


def instruction(stage: list[str], name: str) -> list[str]:
    return [line[len(name) + 1 :].strip() for line in stage if line.upper().startswith(name + " ")]


def test_final_image_is_slim_non_root_and_without_build_tools() -> None:
    build, final = stages((FOLDER / "Dockerfile").read_text())
    assert re.fullmatch(r"python:3\.1[2-9]-slim", instruction(final, "FROM")[0])
    user = instruction(final, "USER")[-1]
    assert user not in ("root", "0") and user.split(":")[0] != "0"
    runs = " ".join(instruction(final, "RUN"))
    assert not re.search(r"apt-get|apk |gcc|build-essential|pip install", runs)
    # Dependencies come from wheels in the other stage; only their files are copied over.
    assert "--only-binary=:all:" in " ".join(instruction(build, "RUN"))
    assert any(line.startswith("--from=") for line in instruction(final, "COPY"))
    assert instruction(final, "EXPOSE") == ["7000/udp"]


def test_pins_match_the_core_requirements() -> None:
    def pins(path: Path) -> dict[str, str]:
        found = {}
        for line in path.read_text().splitlines():
            match = re.match(r"([A-Za-z0-9_.\-\[\]]+)==([^\s#]+)", line)
            if match:
                found[match.group(1).lower()] = match.group(2)
        return found

    image, core = pins(FOLDER / "requirements.txt"), pins(ROOT / "requirements.txt")
    assert image and all(core[name] == version for name, version in image.items())


def image_command(port: int) -> list[str]:
    final = stages((FOLDER / "Dockerfile").read_text())[-1]
    command = json.loads(instruction(final, "CMD")[-1])
    assert command[0] == "python"
    # The same command, on loopback and with a metrics line every 0.3 s instead of a minute.
    command = [sys.executable, *["127.0.0.1" if part == "0.0.0.0" else part for part in command[1:]]]
    command[command.index("--emf-interval") + 1] = "0.3"
    return command


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def healthcheck(port: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(FOLDER / "healthcheck.py")],
        env=child_env(SLUICEGATE_PARTITION_PORT=str(port), PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        timeout=10,
    )


@pytest.fixture
def container(dynamodb_server_tables: ServerTables) -> subprocess.Popen[str]:
    port = free_udp_port()
    env = {
        **dynamodb_server_tables.env(),
        "SLUICEGATE_STORE": "dynamodb",
        "SLUICEGATE_PARTITION": "2",
        "SLUICEGATE_PARTITIONS": "4",
        "SLUICEGATE_PARTITION_PORT": str(port),
        "SLUICEGATE_CHECKPOINT_INTERVAL_MS": "60000",  # only the final checkpoint on SIGTERM
    }
    process = subprocess.Popen(
        image_command(port), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=child_env(**env)
    )
    process.port = port  # type: ignore[attr-defined]
    yield process
    stop(process)


def check(port: int, keys: list[str]) -> list[bool]:
    async def run() -> list[bool]:
        client = PartitionClient([("127.0.0.1", port)], timeout_s=0.5)
        await client.start()
        try:
            return [decision.allowed for decision in await client.check_many([(key, 60) for key in keys])]
        finally:
            client.close()

    return asyncio.run(run())


def test_runs_from_the_environment_reports_health_metrics_and_checkpoints_on_sigterm(
    container: subprocess.Popen[str], dynamodb_server_tables: ServerTables
) -> None:
    port = container.port  # type: ignore[attr-defined]
    read_until(container, rf"partition 2 listening on udp 127\.0\.0\.1:{port}")
    assert healthcheck(port).returncode == 0
    assert check(port, ["alice", "bob", "alice"]) == [True, True, False]  # default rule: capacity 100

    # Every 0.3 s a CloudWatch EMF line with this partition's counters.
    match, _ = read_until(container, r'^\{"_aws".*"PartitionChecks":[1-9]')
    metrics = json.loads(match.string)
    assert metrics["Partition"] == "2" and metrics["Keys"] == 2 and metrics["PartitionChecks"] == 3
    directive = metrics["_aws"]["CloudWatchMetrics"][0]
    assert directive["Namespace"] == "Sluicegate" and directive["Dimensions"] == [["Partition"]]
    assert {m["Name"] for m in directive["Metrics"]} == {"PartitionChecks", "StoreErrors", "WouldDeny", "Keys"}

    started = time.monotonic()
    container.send_signal(signal.SIGTERM)
    assert container.wait(30) == 0
    assert time.monotonic() - started < 120  # within the task's stopTimeout
    saved = dynamodb_server_tables.open().get_checkpoints(["alice", "bob"], time.time_ns())
    assert set(saved) == {"alice", "bob"}
    assert healthcheck(port).returncode == 1


def test_healthcheck_fails_when_nothing_answers() -> None:
    result = healthcheck(free_udp_port())
    assert result.returncode == 1 and "did not answer" in result.stderr


def test_a_bad_setting_stops_the_container_with_a_message(tmp_path: Path) -> None:
    result = subprocess.run(
        image_command(free_udp_port()),
        env=child_env(SLUICEGATE_PARTITION="4", SLUICEGATE_PARTITIONS="4", SLUICEGATE_DB=str(tmp_path / "x.db")),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2 and "SLUICEGATE_PARTITION must be 0 to SLUICEGATE_PARTITIONS - 1" in result.stderr


def test_adaptive_concurrency_limits_are_published_per_key(
    container: subprocess.Popen[str], dynamodb_server_tables: ServerTables
) -> None:
    from sluicegate.rules import Rule

    adaptive = {"name": "db", "adaptive": {"min": 15, "kp": 15, "step": 5, "samples": 100}}
    dynamodb_server_tables.open().put_rule(
        Rule.from_dict({"key": "orders", "capacity": 100, "rate": 100, "limits": [adaptive]})
    )
    port = container.port  # type: ignore[attr-defined]
    read_until(container, r"listening on udp")

    async def acquire() -> int | None:
        client = PartitionClient([("127.0.0.1", port)], timeout_s=0.5)
        await client.start()
        try:
            decision = await client.acquire("orders")
            return decision.capacity
        finally:
            client.close()

    assert asyncio.run(acquire()) == 15  # L starts at L_min
    match, _ = read_until(container, r'"ConcurrencyLimit"')
    line = json.loads(match.string)
    assert (line["Key"], line["Partition"], line["ConcurrencyLimit"]) == ("orders", "2", 15)
    assert line["_aws"]["CloudWatchMetrics"][0]["Dimensions"] == [["Partition", "Key"]]
