"""What a run of the application-integration experiment shows: pure functions over its responses.

A run is the list of responses Artillery logged (``app-integration.js``): when each request was
sent, its status and latency. From it: accepted (200) and rejected (429) requests per second,
latency percentiles of each, and the checks of the Janus paper's Fig. 13: all requests accepted
until the bucket is empty (capacity / (offered - refill) seconds), then accepted at the refill
rate; rejections answered faster than accepted pages.

Example:
    >>> samples = [Sample(0.0, 200, 5.0), Sample(0.5, 200, 4.0), Sample(1.2, 429, 1.0)]
    >>> [(s.second, s.accepted, s.rejected) for s in per_second(samples)]
    [(0, 2, 0), (1, 0, 1)]
    >>> percentile([1.0, 2.0, 3.0, 4.0], 50)
    2.0
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ACCEPTED, REJECTED = 200, 429
PERCENTILES = (50, 90, 99)
SETTLE_S = 2  # seconds after the first rejection before the steady state is measured


LatencyTable = dict[str, dict[int, "float | None"]]  # "accepted"/"rejected" -> percentile -> ms


@dataclass(frozen=True, slots=True)
class Sample:
    """One response: sent ``at_s`` seconds after the run's first request."""

    at_s: float
    status: int
    latency_ms: float  # as the client saw it
    app_ms: float | None = None  # time spent in the app (its Server-Timing header), check included


@dataclass(frozen=True, slots=True)
class Second:
    """Responses to the requests sent during one second of the run."""

    second: int
    accepted: int
    rejected: int
    other: int  # neither 200 nor 429: errors of the app or of Sluicegate


@dataclass(frozen=True, slots=True)
class Expectation:
    """The bucket a run exercises and the client's rate: what the paper predicts."""

    capacity: float
    rate: float  # refill, credits per second
    offered: float  # requests per second

    @property
    def burst_s(self) -> float:
        """Seconds until the bucket is empty: capacity / (offered - refill); inf if it never empties."""
        return self.capacity / (self.offered - self.rate) if self.offered > self.rate else math.inf


@dataclass(frozen=True, slots=True)
class Check:
    """One acceptance item of the experiment, met or not, with the figures behind it."""

    what: str
    ok: bool
    detail: str


@dataclass
class RunSummary:
    name: str
    expected: Expectation
    duration_s: int
    seconds: list[Second]
    accepted: int
    rejected: int
    other: int
    errors: int  # requests that got no answer (timeouts, refused connections), from Artillery's report
    first_rejection_s: float | None
    steady_from_s: int | None
    steady_rate: float | None  # accepted per second once the bucket is empty
    latency: LatencyTable  # as the client saw it, whole run
    steady_latency: LatencyTable  # as the client saw it, the same seconds for both: once the bucket is empty
    app_latency: LatencyTable  # time in the app, whole run
    checks: list[Check] = field(default_factory=list)

    @property
    def offered_rate(self) -> float:
        return (self.accepted + self.rejected + self.other + self.errors) / self.duration_s if self.duration_s else 0.0

    @property
    def ok(self) -> bool:
        return all(check.ok for check in self.checks)


def load_samples(path: Path) -> list[Sample]:
    """Read the JSON lines of ``app-integration.js`` (``sent_ms``, ``status``, ``latency_ms``, ``app_ms``)."""
    rows: list[tuple[float, int, float, float | None]] = []
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                data = json.loads(line)
                app_ms = None if data.get("app_ms") is None else float(data["app_ms"])
                rows.append((float(data["sent_ms"]), int(data["status"]), float(data["latency_ms"]), app_ms))
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"{path}:{number}: not a response line ({exc}): {line.strip()[:80]}") from exc
    if not rows:
        return []
    start = min(row[0] for row in rows)
    samples = [Sample((sent - start) / 1000, status, latency, app) for sent, status, latency, app in rows]
    return sorted(samples, key=lambda sample: sample.at_s)


def per_second(samples: Iterable[Sample], duration_s: int | None = None) -> list[Second]:
    """Accepted/rejected/other counts for each whole second (every second up to the last, empty ones too)."""
    counts: dict[int, list[int]] = {}
    for sample in samples:
        row = counts.setdefault(int(sample.at_s), [0, 0, 0])
        row[0 if sample.status == ACCEPTED else 1 if sample.status == REJECTED else 2] += 1
    last = max(counts, default=-1) + 1 if duration_s is None else duration_s
    return [Second(s, *counts.get(s, (0, 0, 0))) for s in range(last)]


def percentile(values: Sequence[float], p: float) -> float | None:
    """The ``p``-th percentile by nearest rank (a value that occurred); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def latency_table(samples: Iterable[Sample], *, in_app: bool = False) -> LatencyTable:
    """Percentiles of accepted and rejected requests: as the client saw them, or (``in_app``) in the app."""
    table: LatencyTable = {}
    for outcome, status in (("accepted", ACCEPTED), ("rejected", REJECTED)):
        chosen = [s for s in samples if s.status == status]
        values = [s.app_ms for s in chosen if s.app_ms is not None] if in_app else [s.latency_ms for s in chosen]
        table[outcome] = {p: percentile(values, p) for p in PERCENTILES}
    return table


def per_second_percentile(samples: Iterable[Sample], status: int, p: float, duration_s: int) -> list[float | None]:
    """The ``p``-th latency percentile of the requests with ``status`` sent in each second (None: there were none)."""
    by_second: list[list[float]] = [[] for _ in range(duration_s)]
    for sample in samples:
        if sample.status == status and 0 <= sample.at_s < duration_s:
            by_second[int(sample.at_s)].append(sample.latency_ms)
    return [percentile(values, p) for values in by_second]


def summarize(
    name: str,
    samples: list[Sample],
    expected: Expectation,
    *,
    duration_s: int,
    errors: int = 0,
    tolerance: float = 0.05,
) -> RunSummary:
    """Counts, rates, percentiles and the acceptance checks of one run lasting ``duration_s``."""
    seconds = per_second([s for s in samples if s.at_s < duration_s], duration_s)
    rejections = [s.at_s for s in samples if s.status == REJECTED]
    first_rejection = min(rejections, default=None)
    steady_from = steady_rate = None
    if first_rejection is not None and math.ceil(first_rejection) + SETTLE_S < duration_s:
        steady_from = math.ceil(first_rejection) + SETTLE_S
        steady = seconds[steady_from:]
        steady_rate = sum(s.accepted for s in steady) / len(steady)
    summary = RunSummary(
        name=name,
        expected=expected,
        duration_s=duration_s,
        seconds=seconds,
        accepted=sum(s.accepted for s in seconds),
        rejected=sum(s.rejected for s in seconds),
        other=sum(s.other for s in seconds),
        errors=errors,
        first_rejection_s=first_rejection,
        steady_from_s=steady_from,
        steady_rate=steady_rate,
        latency=latency_table(samples),
        steady_latency=latency_table([s for s in samples if steady_from is not None and s.at_s >= steady_from]),
        app_latency=latency_table(samples, in_app=True),
    )
    summary.checks = acceptance_checks(summary, tolerance=tolerance)
    return summary


def acceptance_checks(run: RunSummary, *, tolerance: float) -> list[Check]:
    """The paper's Fig. 13 behaviour: a burst of ``burst_s`` all accepted, then the refill rate, fast 429s."""
    expected = run.expected
    checks = [
        Check(
            "every request answered with a 200 or a 429",
            run.other == 0 and run.errors == 0,
            f"{run.other} other answers, {run.errors} without an answer",
        )
    ]
    if math.isinf(expected.burst_s):
        checks.append(Check("never throttled", run.rejected == 0, f"{run.rejected} rejected"))
        return checks
    first = run.first_rejection_s
    # The burst ends when the bucket is empty; a second either side is jitter of the client's arrivals.
    slack = max(1.0, 0.1 * expected.burst_s)
    checks.append(
        Check(
            f"all accepted until the bucket is empty (≈ {expected.burst_s:.1f} s)",
            first is not None and abs(first - expected.burst_s) <= slack,
            "never rejected" if first is None else f"first rejection at {first:.1f} s",
        )
    )
    rate = run.steady_rate
    checks.append(
        Check(
            f"then accepted at the refill rate {expected.rate:g}/s (±{tolerance:.0%})",
            rate is not None and abs(rate - expected.rate) <= tolerance * expected.rate,
            "no steady state" if rate is None else f"{rate:.2f}/s from {run.steady_from_s} s to the end",
        )
    )
    # Compared over the same seconds (once the bucket is empty, both kinds are answered side by side),
    # so a slow spell of a shared machine weighs on both alike.
    accepted_p90, rejected_p90 = run.steady_latency["accepted"][90], run.steady_latency["rejected"][90]
    checks.append(
        Check(
            "rejected answered faster than accepted at p90 (same seconds: once the bucket is empty)",
            accepted_p90 is not None and rejected_p90 is not None and rejected_p90 < accepted_p90,
            f"p90 rejected {fmt_ms(rejected_p90)} vs accepted {fmt_ms(accepted_p90)}",
        )
    )
    return checks


def fmt_ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} ms"
