"""The Artillery smoke scenario (loadtest/smoke.yml) against a real `sluicegate local`."""

from __future__ import annotations

import json
from pathlib import Path

from tests.loadtest.artillery import run_artillery, sluicegate_local

VUSERS = 50  # smoke.yml: arrivalCount
REQUESTS_PER_VUSER = 5  # healthz, fresh check, spend the rest, throttled check, batch


def test_smoke_passes_with_every_answer_as_documented(tmp_path: Path) -> None:
    with sluicegate_local(tmp_path) as url:
        run = run_artillery("smoke.yml", url, tmp_path / "report.json")
    assert run.returncode == 0, run.output
    counters = run.counters
    assert counters["http.requests"] == VUSERS * REQUESTS_PER_VUSER
    assert counters["http.codes.200"] == VUSERS * 4
    assert counters["http.codes.429"] == VUSERS  # one throttled check per user, after spending its bucket
    assert counters["vusers.completed"] == VUSERS and counters["vusers.failed"] == 0
    assert not [name for name in counters if name.startswith(("errors.", "plugins.expect.failed"))]
    for check in ("ok: maxErrorRate", "ok: http.response_time.p99", "ok: http.codes.429 > 0"):
        assert check in run.output


def test_smoke_fails_against_a_service_that_throttles_everything(tmp_path: Path) -> None:
    # A default rule of 0/0 denies every key: the first check's expectation (200) fails.
    few = json.dumps({"config": {"phases": [{"duration": 1, "arrivalCount": 2}]}})
    with sluicegate_local(tmp_path, SLUICEGATE_DEFAULT_CAPACITY="0", SLUICEGATE_DEFAULT_RATE="0") as url:
        run = run_artillery("smoke.yml", url, tmp_path / "report.json", "--overrides", few)
    assert run.returncode != 0, run.output
    assert run.counters["vusers.failed"] == 2
    assert "fail: maxErrorRate" in run.output


def test_scale_scenario_runs_in_brief_with_its_checks_passing(tmp_path: Path) -> None:
    # The same file, its phases cut to 3 s at 10 new users a second (the full run takes a minute), without
    # its latency threshold (a test asserts behaviour, not speed); the error and 429 conditions stay.
    brief = json.dumps({"config": {"phases": [{"duration": 3, "arrivalRate": 10}], "ensure": {"thresholds": []}}})
    with sluicegate_local(tmp_path) as url:
        run = run_artillery("scale.yml", url, tmp_path / "report.json", "--overrides", brief)
    assert run.returncode == 0, run.output
    counters = run.counters
    assert counters["vusers.created"] == 30 and counters["vusers.failed"] == 0
    # 5 single checks or 1 batch per user: every request answered 200 (random keys are never throttled).
    assert counters["http.requests"] == counters["http.codes.200"] > 30
    assert "ok: maxErrorRate < 1" in run.output and "ok: http.codes.200 > 50 *" in run.output
    assert "ok: http.response_time.p99" not in run.output  # the threshold was dropped
