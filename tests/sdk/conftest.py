"""One `sluicegate local` per test module (default rule: 3 credits, refilled at 0.05/s), and helpers."""

from __future__ import annotations

import http.client
import json
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import child_env, read_until, stop

TOKEN = "sdk-test-admin-token"
CAPACITY = 3
RATE = 0.05  # credits/s: nothing refills noticeably during a test (window 60 s, a denial waits 20 s)


@dataclass
class Service:
    """A running `sluicegate local`: its HTTP endpoint and its partitions' UDP addresses (in order)."""

    port: int
    partitions: list[tuple[str, int]]

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def put_rule(self, key: str, capacity: int, rate: float) -> None:
        self._call("PUT", f"/v1/rules/{key}", {"capacity": capacity, "rate": rate})

    def stats(self) -> list[dict[str, int]]:
        return self._call("GET", "/v1/stats")["partitions"]

    def _call(self, method: str, path: str, body: object = None) -> dict:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            data = None if body is None else json.dumps(body).encode()
            conn.request(method, path, data, {"Authorization": f"Bearer {TOKEN}"})
            response = conn.getresponse()
            payload = json.loads(response.read())
            assert response.status == 200, payload
            return payload
        finally:
            conn.close()


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    """`sluicegate local` with 3 partitions on free ports, shared by the tests of one module."""
    db: Path = tmp_path_factory.mktemp("sdk") / "sdk.db"
    process = subprocess.Popen(
        [sys.executable, "-m", "sluicegate.cli", "local", "--port", "0", "--partitions", "3", "--db", str(db)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=child_env(
            SLUICEGATE_ADMIN_TOKEN=TOKEN,
            SLUICEGATE_DEFAULT_CAPACITY=str(CAPACITY),
            SLUICEGATE_DEFAULT_RATE=str(RATE),
        ),
    )
    try:
        # "sluicegate local: http://127.0.0.1:PORT with 3 partitions (udp 127.0.0.1:P0, 127.0.0.1:P1, ...)"
        match, _ = read_until(process, r"http://127\.0\.0\.1:(\d+) with \d+ partitions \(udp ([^)]*)\)", timeout=60)
        partitions = [(host, int(port)) for host, port in re.findall(r"([\d.]+):(\d+)", match.group(2))]
        yield Service(int(match.group(1)), partitions)
    finally:
        stop(process)


@pytest.fixture
def key() -> str:
    """A key no other test uses (each test starts with a full bucket)."""
    return f"k-{uuid.uuid4().hex[:12]}"
