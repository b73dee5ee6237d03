"""The experiment's analysis, report and plots on synthetic runs (no processes, no Artillery)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from loadtest.experiment.analysis import (
    Expectation,
    Sample,
    load_samples,
    per_second,
    percentile,
    summarize,
)
from loadtest.experiment.plots import plot_latency, plot_throughput
from loadtest.experiment.report import summary_markdown, write_counts, write_summary

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def simulate(
    capacity: float,
    rate: float,
    offered: int,
    duration_s: int,
    *,
    accepted_ms: float = 6.0,
    rejected_ms: float = 1.5,
) -> list[Sample]:
    """A client at ``offered`` requests/s against a leaky bucket that starts full (what Sluicegate does)."""
    samples, credit, last = [], capacity, 0.0
    for i in range(offered * duration_s):
        now = i / offered
        credit = min(capacity, credit + (now - last) * rate)
        last = now
        # The app's own time is most of what the client sees (plus ~0.5 ms of network).
        latency = (accepted_ms if credit >= 1 else rejected_ms) + (i % 10) * 0.1
        status = 200 if credit >= 1 else 429
        credit -= 1 if status == 200 else 0
        samples.append(Sample(now, status, latency, latency - 0.5))
    return samples


RUN_A = Expectation(capacity=1000, rate=100, offered=130)
RUN_B = Expectation(capacity=100, rate=10, offered=130)


def test_run_a_is_all_accepted_for_a_third_of_a_minute_then_at_the_refill_rate() -> None:
    run = summarize("A", simulate(1000, 100, 130, 60), RUN_A, duration_s=60)
    assert RUN_A.burst_s == pytest.approx(33.33, abs=0.01)
    assert run.first_rejection_s == pytest.approx(33.3, abs=0.2)
    assert all(second.rejected == 0 for second in run.seconds[:33])
    assert run.steady_from_s == 36 and run.steady_rate == pytest.approx(100, abs=1)
    assert [second.accepted + second.rejected for second in run.seconds] == [130] * 60
    assert run.accepted + run.rejected == 7800 and run.offered_rate == 130
    assert run.ok, run.checks


def test_run_b_settles_at_ten_a_second_after_about_a_second() -> None:
    run = summarize("B", simulate(100, 10, 130, 60), RUN_B, duration_s=60)
    assert run.first_rejection_s == pytest.approx(0.83, abs=0.05)
    assert run.steady_rate == pytest.approx(10, abs=0.2)
    assert run.latency["rejected"][90] < run.latency["accepted"][90]
    assert run.app_latency["accepted"][50] == pytest.approx(run.latency["accepted"][50] - 0.5)
    assert run.ok, run.checks


def test_checks_fail_when_the_limit_is_not_enforced_or_rejections_are_slow() -> None:
    unlimited = summarize("A", simulate(10**9, 100, 130, 60), RUN_A, duration_s=60)
    assert unlimited.first_rejection_s is None and not unlimited.ok
    failed = [check.what for check in unlimited.checks if not check.ok]
    assert any("bucket is empty" in what for what in failed) and any("refill rate" in what for what in failed)

    too_generous = summarize("B", simulate(100, 12, 130, 60), RUN_B, duration_s=60)  # 20 % over the rule
    assert [check.ok for check in too_generous.checks if "refill rate" in check.what] == [False]

    slow_429 = summarize("B", simulate(100, 10, 130, 60, rejected_ms=50), RUN_B, duration_s=60)
    assert [check.ok for check in slow_429.checks if "p90" in check.what] == [False]


def test_latencies_are_compared_over_the_seconds_where_both_outcomes_occur() -> None:
    # Fast pages while the bucket is full (a quiet machine), slower ones later, rejections in between:
    # over the whole run the rejections look slow; over the same seconds they are faster.
    samples = [
        Sample(s.at_s, s.status, 1.0 if s.at_s < 33 else s.latency_ms)
        for s in simulate(1000, 100, 130, 60, accepted_ms=9.0, rejected_ms=4.0)
    ]
    run = summarize("A", samples, RUN_A, duration_s=60)
    assert run.latency["accepted"][50] == 1.0 and run.latency["rejected"][50] > 1.0
    assert run.steady_latency["rejected"][90] < run.steady_latency["accepted"][90]
    assert [check.ok for check in run.checks if "p90" in check.what] == [True]

    errors = summarize("B", [*simulate(100, 10, 130, 5), Sample(4.5, 502, 3.0)], RUN_B, duration_s=5, errors=2)
    assert errors.other == 1 and errors.errors == 2
    assert [check.ok for check in errors.checks if "answered with" in check.what] == [False]


def test_per_second_counts_include_empty_seconds_and_other_statuses() -> None:
    samples = [Sample(0.1, 200, 1), Sample(0.9, 429, 1), Sample(2.5, 503, 1)]
    assert [(s.second, s.accepted, s.rejected, s.other) for s in per_second(samples)] == [
        (0, 1, 1, 0),
        (1, 0, 0, 0),
        (2, 0, 0, 1),
    ]
    assert len(per_second(samples, duration_s=5)) == 5


@pytest.mark.parametrize(("p", "expected"), [(50, 5), (90, 9), (99, 10), (100, 10), (1, 1)])
def test_percentile_is_the_nearest_rank(p: float, expected: float) -> None:
    assert percentile([float(v) for v in range(10, 0, -1)], p) == expected


def test_percentile_of_nothing_is_none() -> None:
    assert percentile([], 90) is None


def test_load_samples_reads_artillery_lines_relative_to_the_first_request(tmp_path: Path) -> None:
    log = tmp_path / "run.jsonl"
    rows = [(1_700_000_001_500, 429, 0.8, None), (1_700_000_000_000, 200, 4.25, 3.5)]
    lines = [{"sent_ms": t, "status": s, "latency_ms": lat, "app_ms": app} for t, s, lat, app in rows]
    log.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert load_samples(log) == [Sample(0.0, 200, 4.25, 3.5), Sample(1.5, 429, 0.8, None)]
    log.write_text(log.read_text() + '{"status": 200}\n')
    with pytest.raises(ValueError, match=r"run\.jsonl:3: not a response line"):
        load_samples(log)


def test_results_are_written_as_csv_markdown_and_png(tmp_path: Path) -> None:
    samples_a, samples_b = simulate(1000, 100, 130, 60), simulate(100, 10, 130, 60)
    run_a = summarize("Run A", samples_a, RUN_A, duration_s=60)
    run_b = summarize("Run B", samples_b, RUN_B, duration_s=60)

    with write_counts(run_a, tmp_path / "run-a.csv").open() as counts:
        rows = list(csv.DictReader(counts))
    assert len(rows) == 60 and rows[0] == {"second": "0", "accepted": "130", "rejected": "0", "other": "0"}
    assert rows[-1]["accepted"] in {"99", "100", "101"}

    figures = [
        plot_throughput(run_a, samples_a, tmp_path / "run-a.png"),
        plot_latency([run_a, run_b], [samples_a, samples_b], tmp_path / "latency.png"),
    ]
    for figure in figures:
        assert figure.read_bytes()[:8] == PNG_MAGIC and figure.stat().st_size > 10_000

    summary = write_summary([run_a, run_b], tmp_path / "summary.md", figures=figures, notes=["shared CPUs"]).read_text()
    assert (
        "| Run A | capacity 1000, refill 100/s | 130.0 req/s for 60 s | 33.3 s (33.3 s) | 100.00/s (100/s)" in summary
    )
    assert "![run-a](run-a.png)" in summary and "![latency](latency.png)" in summary
    assert "NOT MET" not in summary and "* shared CPUs" in summary
    p50, p90 = run_b.latency["rejected"][50], run_b.latency["rejected"][90]
    assert f"| Run B | rejected | client, whole run | {p50:.2f} | {p90:.2f} |" in summary and 1.5 <= p50 < p90 <= 2.4
    assert "| Run B | accepted | in the app, whole run | 5.90 | 6.30 | 6.40 |" in summary

    unlimited = summarize("Run A", simulate(10**9, 100, 130, 60), RUN_A, duration_s=60)
    assert "Run A: NOT MET: all accepted until the bucket is empty" in summary_markdown([unlimited])
