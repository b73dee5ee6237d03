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
        if credit >= 1:
            credit -= 1
            samples.append(Sample(now, 200, accepted_ms + (i % 10) * 0.1))
        else:
            samples.append(Sample(now, 429, rejected_ms + (i % 10) * 0.1))
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
    rows = [(1_700_000_001_500, 429, 0.8), (1_700_000_000_000, 200, 4.25)]
    log.write_text("".join(json.dumps({"sent_ms": t, "status": s, "latency_ms": lat}) + "\n" for t, s, lat in rows))
    assert load_samples(log) == [Sample(0.0, 200, 4.25), Sample(1.5, 429, 0.8)]
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
        plot_throughput(run_a, tmp_path / "run-a.png"),
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
    assert f"| Run B | rejected | {p50:.2f} | {p90:.2f} |" in summary and 1.5 <= p50 < p90 <= 2.4

    unlimited = summarize("Run A", simulate(10**9, 100, 130, 60), RUN_A, duration_s=60)
    assert "Run A: NOT MET: all accepted until the bucket is empty" in summary_markdown([unlimited])
