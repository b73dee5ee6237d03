"""The experiment's demo app and harness against a real `sluicegate local`, with Artillery for the harness."""

from __future__ import annotations

import http.client
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from sluicegate_sdk.keys import RequestInfo

from loadtest.experiment.demo_app import key_function
from loadtest.experiment.run import RunSpec, run_all
from tests.conftest import child_env, read_until, stop
from tests.loadtest.artillery import ROOT, sluicegate_local


def get(port: int, path: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", path, headers=headers or {})
    response = conn.getresponse()
    body = response.read()
    conn.close()
    return response.status, dict(response.getheaders()), body


def demo_app(sluicegate: str, *args: str) -> Iterator[int]:
    command = [sys.executable, "-m", "loadtest.experiment.demo_app", "--sluicegate", sluicegate, "--port", "0"]
    process = subprocess.Popen([*command, *args], stdout=subprocess.PIPE, text=True, env=child_env(), cwd=ROOT)
    try:
        match, _ = read_until(process, r"demo app: http://127\.0\.0\.1:(\d+)")
        yield int(match.group(1))
    finally:
        stop(process)


@pytest.fixture
def sluicegate(tmp_path: Path) -> Iterator[str]:
    # A default rule of 3 requests, refilled at 1 a second: throttled on the 4th request.
    with sluicegate_local(tmp_path, SLUICEGATE_DEFAULT_CAPACITY="3", SLUICEGATE_DEFAULT_RATE="1") as url:
        yield url


def test_pages_are_limited_per_client_ip_with_rate_limit_headers(sluicegate: str) -> None:
    for port in demo_app(sluicegate):
        status, headers, body = get(port, "/")
        assert status == 200 and b"<h1>Hello 127.0.0.1</h1>" in body
        assert headers["RateLimit-Policy"] == '"default";q=3;w=3' and headers["RateLimit"].startswith('"default";r=2;')
        assert re.fullmatch(r"app;dur=\d+\.\d{3}", headers["Server-Timing"])
        assert [get(port, "/")[0] for _ in range(2)] == [200, 200]
        status, headers, body = get(port, "/")
        assert status == 429 and headers["Retry-After"] == "1" and json.loads(body)["retry_after"] == 1
        # The health check is never limited, so a load balancer's probes spend nothing.
        assert [get(port, "/healthz")[0] for _ in range(5)] == [200] * 5


def test_pages_keyed_by_a_header_give_each_caller_its_own_bucket(sluicegate: str) -> None:
    for port in demo_app(sluicegate, "--key", "header:X-Client-Id"):
        assert [get(port, "/", {"X-Client-Id": "alice"})[0] for _ in range(4)] == [200, 200, 200, 429]
        assert get(port, "/", {"X-Client-Id": "bob"})[0] == 200
        assert get(port, "/")[0] == 200  # no header: not limited


def test_bad_key_option_is_refused() -> None:
    with pytest.raises(ValueError, match="'ip' or 'header:NAME'"):
        key_function("cookie:session")
    request = RequestInfo("GET", "/healthz", "10.0.0.1", {}, None, raw=None)
    assert key_function("ip")(request) is None


def test_a_short_experiment_run_counts_and_plots_what_artillery_saw(tmp_path: Path) -> None:
    # 20 requests/s for 5 s against a bucket of 10 refilled at 5/s: 10 at once, then about 5 a second.
    spec = RunSpec("tiny", "Tiny run", capacity=10, rate=5, custom_rule=True)
    [result] = run_all([spec], tmp_path, duration_s=5, rate=20)
    run = result.summary
    assert run.accepted + run.rejected == 100 and run.other == 0 and run.errors == 0
    assert 10 + 5 * 4 <= run.accepted <= 10 + 5 * 6  # the bucket plus about 5 s of refill; unlimited would be 100
    assert run.first_rejection_s is not None and run.first_rejection_s < 1.5
    assert run.app_latency["accepted"][50] is not None and run.app_latency["rejected"][50] is not None
    assert all(18 <= second.accepted + second.rejected <= 22 for second in run.seconds)  # arrivals jitter a little
    for name in ("tiny.csv", "tiny.png", "latency.png", "summary.md", "tiny.jsonl", "tiny.report.json"):
        assert (tmp_path / name).stat().st_size > 0
    assert "| Tiny run | capacity 10, refill 5/s | 20.0 req/s for 5 s |" in (tmp_path / "summary.md").read_text()
