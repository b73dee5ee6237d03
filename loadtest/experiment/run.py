"""``make experiment``: the Janus application-integration experiment (§V-D, Fig. 13) on one machine.

For each run: a fresh ``sluicegate local`` (2 partitions, its own SQLite file), the demo app
(:mod:`loadtest.experiment.demo_app`, keyed by client IP) in front of it, and Artillery's
``app-integration.yml`` at 130 requests/s for 60 s against the app. Run A gives the client's
key (127.0.0.1) a rule of capacity 1000, refill 100/s; run B leaves it on the default rule
(capacity 100, refill 10/s). Then the per-second counts (CSV), the plots (PNG) and a markdown
summary go to ``loadtest/experiment/results/``. About 2.5 minutes.

Example::

    python -m loadtest.experiment.run                          # both runs, as in the paper
    python -m loadtest.experiment.run --duration 20 --only a   # a quick look at run A
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from loadtest.experiment.analysis import Expectation, RunSummary, Sample, load_samples, summarize
from loadtest.experiment.plots import plot_latency, plot_throughput
from loadtest.experiment.report import print_summary, write_counts, write_summary

ROOT = Path(__file__).resolve().parents[2]
LOADTEST = ROOT / "loadtest"
RESULTS = LOADTEST / "experiment" / "results"
ARTILLERY = LOADTEST / "node_modules" / ".bin" / "artillery"
SCENARIO = LOADTEST / "app-integration.yml"
CLIENT_KEY = "127.0.0.1"  # the demo app keys requests by client IP; Artillery connects from here
DEFAULT_RULE = {"SLUICEGATE_DEFAULT_CAPACITY": "100", "SLUICEGATE_DEFAULT_RATE": "10"}
PARTITIONS = 2
START_TIMEOUT_S = 30.0


class ExperimentError(Exception):
    """A process of the experiment did not start or the load generator failed to run."""


@dataclass(frozen=True, slots=True)
class RunSpec:
    """One run: the rule the client's key gets (its own, or the default one)."""

    slug: str  # file names: results/<slug>.csv, .png, .jsonl
    name: str
    capacity: int
    rate: int
    custom_rule: bool  # True: a rule for the key; False: the key stays on the default rule


RUNS = (
    RunSpec("run-a", "Run A (custom rule)", capacity=1000, rate=100, custom_rule=True),
    RunSpec("run-b", "Run B (default rule)", capacity=100, rate=10, custom_rule=False),
)


@dataclass
class RunResult:
    spec: RunSpec
    summary: RunSummary
    samples: list[Sample]
    load: tuple[str, str]  # how busy the machine was before and after the run


def run_all(
    specs: Sequence[RunSpec],
    results: Path,
    *,
    duration_s: int = 60,
    rate: int = 130,
    work_ms: float = 2.0,
) -> list[RunResult]:
    """Run each spec in turn, then write CSVs, plots and ``summary.md`` into ``results``."""
    results.mkdir(parents=True, exist_ok=True)
    done = []
    for spec in specs:
        print(f"{spec.name}: {rate} requests/s for {duration_s} s ...", flush=True)
        done.append(run_one(spec, results, duration_s=duration_s, rate=rate, work_ms=work_ms))
    summaries = [result.summary for result in done]
    figures = [plot_throughput(r.summary, r.samples, results / f"{r.spec.slug}.png") for r in done]
    figures.append(plot_latency(summaries, [result.samples for result in done], results / "latency.png"))
    for result in done:
        write_counts(result.summary, results / f"{result.spec.slug}.csv")
    notes = conditions(done, rate=rate, work_ms=work_ms)
    write_summary(summaries, results / "summary.md", figures=figures, notes=notes)
    print_summary(summaries)
    print(f"results: {results}/summary.md", flush=True)
    return done


def run_one(spec: RunSpec, results: Path, *, duration_s: int, rate: int, work_ms: float) -> RunResult:
    """One run against fresh processes; the responses are logged to ``results/<slug>.jsonl``."""
    log = results / f"{spec.slug}.jsonl"
    log.unlink(missing_ok=True)
    env = {**DEFAULT_RULE}
    if not spec.custom_rule:
        env.update(SLUICEGATE_DEFAULT_CAPACITY=str(spec.capacity), SLUICEGATE_DEFAULT_RATE=str(spec.rate))
    with tempfile.TemporaryDirectory(prefix="sluicegate-experiment-") as work:
        command = [sys.executable, "-m", "sluicegate.cli", "local", "--port", "0", "--partitions", str(PARTITIONS)]
        command += ["--db", str(Path(work) / "local.db")]
        if spec.custom_rule:
            rules = Path(work) / "rules.csv"
            rules.write_text(f"key,capacity,rate\n{CLIENT_KEY},{spec.capacity},{spec.rate}\n", encoding="utf-8")
            command += ["--rules", str(rules)]
        local, url = start(command, results / f"{spec.slug}.local.log", r"(http://127\.0\.0\.1:\d+)", env)
        try:
            app_command = [sys.executable, "-m", "loadtest.experiment.demo_app", "--sluicegate", url, "--port", "0"]
            app_command += ["--work-ms", str(work_ms)]
            app, app_url = start(app_command, results / f"{spec.slug}.app.log", r"demo app: (http://\S+)", {})
            try:
                load_before = machine_load()
                report = run_artillery(app_url, results, spec.slug, log, duration_s=duration_s, rate=rate)
                load_after = machine_load()
            finally:
                stop(app)
        finally:
            stop(local)
    samples = load_samples(log) if log.exists() else []
    errors = sum(v for k, v in report.get("aggregate", {}).get("counters", {}).items() if k.startswith("errors."))
    expected = Expectation(capacity=spec.capacity, rate=spec.rate, offered=rate)
    summary = summarize(spec.name, samples, expected, duration_s=duration_s, errors=errors)
    return RunResult(spec, summary, samples, (load_before, load_after))


def run_artillery(target: str, results: Path, slug: str, log: Path, *, duration_s: int, rate: int) -> dict:
    """Artillery's app-integration scenario at ``rate`` for ``duration_s``; its JSON report."""
    if not ARTILLERY.exists():
        raise ExperimentError(f"{ARTILLERY} missing: run `make loadtest-deps` first")
    report = results / f"{slug}.report.json"
    overrides = {"config": {"phases": [{"name": f"{rate} requests/s", "duration": duration_s, "arrivalRate": rate}]}}
    command = [str(ARTILLERY), "run", "--target", target, "--output", str(report)]
    command += ["--overrides", json.dumps(overrides), str(SCENARIO)]
    env = {**os.environ, "APP_INTEGRATION_LOG": str(log), "ARTILLERY_DISABLE_TELEMETRY": "true", "NO_COLOR": "1"}
    with (results / f"{slug}.artillery.log").open("w", encoding="utf-8") as output:
        try:
            done = subprocess.run(
                command, stdout=output, stderr=subprocess.STDOUT, env=env, cwd=LOADTEST, timeout=duration_s + 90
            )
        except subprocess.TimeoutExpired as exc:
            raise ExperimentError(f"artillery did not finish within {duration_s + 90} s") from exc
    if not report.exists():
        raise ExperimentError(f"artillery exited {done.returncode} without a report: see {output.name}")
    if done.returncode != 0:
        print(f"  artillery exited {done.returncode} (an ensure threshold failed): see {output.name}", flush=True)
    return json.loads(report.read_text(encoding="utf-8"))


def start(command: list[str], log: Path, ready: str, env: dict[str, str]) -> tuple[subprocess.Popen[bytes], str]:
    """Start ``command`` with its output in ``log``; wait for a line matching ``ready``; (process, group 1)."""
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICEGATE_")}
    child_env.update(env)
    with log.open("wb") as output:
        process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, env=child_env, cwd=ROOT)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        match = re.search(ready, log.read_text(encoding="utf-8", errors="replace"))
        if match:
            return process, match.group(1)
        if process.poll() is not None:
            break
        time.sleep(0.05)
    stop(process)
    raise ExperimentError(f"{' '.join(command[:4])} did not start: see {log}")


def stop(process: subprocess.Popen[bytes], timeout_s: float = 10.0) -> None:
    """SIGTERM, then SIGKILL if it is still running after ``timeout_s``."""
    if process.poll() is None:
        process.terminate()
    try:
        process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def machine_load() -> str:
    """The 1-minute load average, and the share of the last minute some task waited for a CPU (Linux PSI)."""
    text = f"load average {os.getloadavg()[0]:.2f}"
    try:
        some = Path("/proc/pressure/cpu").read_text(encoding="ascii").splitlines()[0]
    except (OSError, IndexError):
        return text
    match = re.search(r"avg60=([\d.]+)", some)
    return f"{text}, CPU pressure {match.group(1)} %" if match else text


def conditions(done: Sequence[RunResult], *, rate: int, work_ms: float) -> list[str]:
    """What the figures were measured under (the machine is shared, so latencies vary between runs)."""
    notes = [
        f"{time.strftime('%Y-%m-%d %H:%M %Z')}, {os.cpu_count()} CPUs shared with other work (how busy "
        "below: CPU pressure is the share of the last minute in which some task waited for a CPU); "
        "Artillery, the demo app, the HTTP front and the partitions all on this machine.",
        f"`sluicegate local` with {PARTITIONS} partitions (SQLite), fresh for each run; the demo app "
        f"(wsgiref, a thread per connection, {work_ms:g} ms of CPU per page) checks each request with "
        "`sluicegate_sdk.Client` through `RateLimitMiddleware`, keyed by client IP, failing open.",
        f"Artillery (`app-integration.yml`): {rate} new virtual users a second, one GET / each (a new "
        "connection per request); per-request status and latency logged by `app-integration.js`.",
    ]
    for result in done:
        before, after = result.load
        notes.append(f"{result.spec.name}: before, {before}; after, {after}.")
    return notes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=RESULTS, help="output folder (default %(default)s)")
    parser.add_argument("--duration", type=int, default=60, help="seconds per run (default %(default)s)")
    parser.add_argument("--rate", type=int, default=130, help="client requests per second (default %(default)s)")
    parser.add_argument("--work-ms", type=float, default=2.0, help="CPU per page in the demo app (default 2)")
    parser.add_argument("--only", choices=("a", "b"), help="one run instead of both")
    args = parser.parse_args(argv)
    if args.duration < 1 or args.rate < 1:
        parser.error("--duration and --rate must be at least 1")
    specs = [spec for spec in RUNS if args.only is None or spec.slug == f"run-{args.only}"]
    try:
        done = run_all(specs, args.results, duration_s=args.duration, rate=args.rate, work_ms=args.work_ms)
    except ExperimentError as exc:
        print(f"experiment failed: {exc}", file=sys.stderr)
        return 2
    return 0 if all(result.summary.ok for result in done) else 1


if __name__ == "__main__":
    sys.exit(main())
