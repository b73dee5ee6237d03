"""The experiment's written results: a CSV of per-second counts per run and a markdown summary.

Example::

    write_counts(summary, Path("results/run-a.csv"))
    write_summary([summary_a, summary_b], Path("results/summary.md"), figures=[...], notes=[...])
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path

from loadtest.experiment.analysis import PERCENTILES, RunSummary, fmt_ms


def write_counts(run: RunSummary, path: Path) -> Path:
    """``second,accepted,rejected,other`` for every second of the run."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as out:
        writer = csv.writer(out)
        writer.writerow(["second", "accepted", "rejected", "other"])
        writer.writerows((s.second, s.accepted, s.rejected, s.other) for s in run.seconds)
    return path


def summary_markdown(runs: Sequence[RunSummary], *, figures: Sequence[Path] = (), notes: Sequence[str] = ()) -> str:
    """The summary: one table of the figures, the checks of each run, the plots, notes on the conditions."""
    lines = ["# Application-integration experiment (Janus §V-D, Fig. 13)", ""]
    lines += [
        "| run | rule | client | first rejection (expected) | accepted once empty (expected) "
        "| accepted | rejected | other | no answer |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        e = run.expected
        first = "never" if run.first_rejection_s is None else f"{run.first_rejection_s:.1f} s"
        steady = "-" if run.steady_rate is None else f"{run.steady_rate:.2f}/s"
        lines.append(
            f"| {run.name} | capacity {e.capacity:g}, refill {e.rate:g}/s | {run.offered_rate:.1f} req/s "
            f"for {run.duration_s} s | {first} ({e.burst_s:.1f} s) | {steady} ({e.rate:g}/s) "
            f"| {run.accepted} | {run.rejected} | {run.other} | {run.errors} |"
        )
    lines += [
        "",
        "Latency (ms). *client*: from sending the request to the whole response (a new connection each);",
        "*once empty*: only the seconds after the bucket emptied, where both outcomes are answered side by",
        "side; *in the app*: the app's own time (its `Server-Timing` header), the Sluicegate check included.",
        "",
    ]
    header = " | ".join(f"p{p}" for p in PERCENTILES)
    lines += [f"| run | outcome | measured | {header} |", "|---|---|---|" + "---|" * len(PERCENTILES)]
    for run in runs:
        tables = (("client, whole run", run.latency), ("client, once empty", run.steady_latency))
        tables += (("in the app, whole run", run.app_latency),)
        for outcome in ("accepted", "rejected"):
            for measured, table in tables:
                values = table[outcome]
                if all(value is None for value in values.values()):
                    continue
                cells = " | ".join("-" if values[p] is None else f"{values[p]:.2f}" for p in PERCENTILES)
                lines.append(f"| {run.name} | {outcome} | {measured} | {cells} |")
    lines += ["", "## Checks", ""]
    for run in runs:
        for check in run.checks:
            lines.append(f"* {run.name}: {'ok' if check.ok else 'NOT MET'}: {check.what}: {check.detail}")
    if figures:
        lines += ["", "## Figures", ""]
        lines += [f"![{path.stem}]({path.name})" for path in figures]
    if notes:
        lines += ["", "## Conditions", ""]
        lines += [f"* {note}" for note in notes]
    return "\n".join(lines) + "\n"


def write_summary(
    runs: Sequence[RunSummary], path: Path, *, figures: Sequence[Path] = (), notes: Sequence[str] = ()
) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(summary_markdown(runs, figures=figures, notes=notes), encoding="utf-8")
    return path


def print_summary(runs: Sequence[RunSummary]) -> None:
    """A few lines on the terminal: the figures and whether each check was met."""
    for run in runs:
        first = "never" if run.first_rejection_s is None else f"{run.first_rejection_s:.1f} s"
        steady = "-" if run.steady_rate is None else f"{run.steady_rate:.2f}/s"
        print(
            f"{run.name}: {run.accepted} accepted, {run.rejected} rejected, {run.other} other, {run.errors} "
            f"unanswered; first rejection {first}; accepted once empty {steady}"
        )
        for measured, table in (("whole run", run.latency), ("once empty", run.steady_latency)):
            acc, rej = table["accepted"], table["rejected"]
            print(
                f"  latency p50/p90 ({measured}): accepted {fmt_ms(acc[50])}/{fmt_ms(acc[90])}, "
                f"rejected {fmt_ms(rej[50])}/{fmt_ms(rej[90])}"
            )
        for check in run.checks:
            print(f"  {'ok' if check.ok else 'NOT MET'}: {check.what}: {check.detail}")
