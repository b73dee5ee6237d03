"""PNG figures of the application-integration experiment (matplotlib, no display needed).

* :func:`plot_throughput`: accepted and rejected requests per second of one run, with the refill
  rate, the client's rate and the moment the bucket should be empty (the paper's Fig. 13), and
  below it their latency (p50, p90) second by second.
* :func:`plot_latency`: the latency distribution of accepted vs rejected requests of each run.

Example::

    plot_throughput(summary, samples, Path("results/run-a.png"))
    plot_latency([summary_a, summary_b], Path("results/latency.png"))
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display on a server or in CI

import matplotlib.pyplot as plt  # after choosing the backend
from matplotlib.ticker import FuncFormatter

from loadtest.experiment.analysis import ACCEPTED, REJECTED, RunSummary, Sample, per_second_percentile

ACCEPTED_COLOR, REJECTED_COLOR = "#2e7d32", "#c62828"


def plot_throughput(run: RunSummary, samples: Sequence[Sample], path: Path) -> Path:
    """Stacked bars of accepted/rejected requests for each second of ``run``; below, their latency per second."""
    seconds = [s.second for s in run.seconds]
    accepted = [s.accepted for s in run.seconds]
    rejected = [s.rejected for s in run.seconds]
    figure, (axes, lower) = plt.subplots(
        2, 1, figsize=(9, 6.5), dpi=110, sharex=True, gridspec_kw={"height_ratios": [2, 1]}
    )
    axes.bar(seconds, accepted, width=1.0, align="edge", color=ACCEPTED_COLOR, label="accepted (200)")
    axes.bar(seconds, rejected, width=1.0, align="edge", bottom=accepted, color=REJECTED_COLOR, label="rejected (429)")
    expected = run.expected
    axes.axhline(expected.rate, color="black", linestyle="--", linewidth=1, label=f"refill {expected.rate:g}/s")
    axes.axhline(expected.offered, color="grey", linestyle=":", linewidth=1, label=f"client {expected.offered:g}/s")
    if not math.isinf(expected.burst_s) and expected.burst_s < run.duration_s:
        axes.axvline(expected.burst_s, color="black", linestyle="-.", linewidth=1, label="bucket empty (expected)")
    axes.set_xlim(0, run.duration_s)
    # Head room above the bars for the legend.
    axes.set_ylim(0, max([expected.offered, *(a + r for a, r in zip(accepted, rejected, strict=True))]) * 1.4)
    axes.set_ylabel("requests per second")
    axes.set_title(f"{run.name}: capacity {expected.capacity:g}, refill {expected.rate:g}/s")
    axes.legend(loc="upper center", fontsize="small", ncols=3)
    axes.grid(axis="y", alpha=0.3)
    # Latency over time shows slow spells (e.g. other work on a shared machine) next to the counts.
    middle = [second + 0.5 for second in seconds]
    for label, status, color in (("accepted", ACCEPTED, ACCEPTED_COLOR), ("rejected", REJECTED, REJECTED_COLOR)):
        for p, style in ((50, "-"), (90, ":")):
            values = per_second_percentile(samples, status, p, run.duration_s)
            points = [(x, y) for x, y in zip(middle, values, strict=True) if y is not None]
            if points:
                xs, ys = zip(*points, strict=True)
                lower.plot(xs, ys, style, color=color, linewidth=1, label=f"{label} p{p}")
    lower.set_yscale("log")
    plain = FuncFormatter(lambda value, _: f"{value:g}")  # "4", not "4 times 10 to the 0"
    lower.yaxis.set_major_formatter(plain)
    lower.yaxis.set_minor_formatter(plain)
    lower.set_ylabel("latency (ms)")
    lower.set_xlabel("time since the first request (s)")
    lower.legend(loc="upper left", fontsize="x-small", ncols=4)
    lower.grid(alpha=0.3)
    return _save(figure, path)


def plot_latency(runs: Sequence[RunSummary], samples: Sequence[Sequence[Sample]], path: Path) -> Path:
    """One panel per run: cumulative distribution of latency, accepted vs rejected, with the p90s marked."""
    figure, panels = plt.subplots(1, len(runs), figsize=(5 * len(runs), 4), dpi=110, squeeze=False)
    for axes, run, run_samples in zip(panels[0], runs, samples, strict=True):
        outcomes = (("accepted", ACCEPTED, ACCEPTED_COLOR, 0.5), ("rejected", REJECTED, REJECTED_COLOR, 0.4))
        for label, status, color, label_y in outcomes:
            values = sorted(s.latency_ms for s in run_samples if s.status == status)
            if not values:
                continue
            fractions = [(i + 1) / len(values) for i in range(len(values))]
            axes.step(values, fractions, where="post", color=color, label=f"{label} ({len(values)})")
            p90 = run.latency[label][90]
            if p90 is not None:
                axes.axvline(p90, color=color, linestyle=":", linewidth=1)
                axes.annotate(f" p90 {p90:.1f} ms", (p90, label_y), color=color, fontsize="small", ha="left")
        axes.set_xscale("log")
        axes.set_ylim(0, 1.02)
        axes.set_xlabel("latency (ms, log scale)")
        axes.set_ylabel("fraction of requests")
        axes.set_title(run.name)
        axes.legend(loc="lower right", fontsize="small")
        axes.grid(alpha=0.3)
    return _save(figure, path)


def _save(figure: plt.Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.tight_layout()
    figure.savefig(path, format="png")
    plt.close(figure)
    return path
