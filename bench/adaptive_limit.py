#!/usr/bin/env python3
"""Algorithm 1 against a simulated backend: where the adaptive limit settles, and the best fixed limit.

``.venv/bin/python bench/adaptive_limit.py [--clients 200] [--think-ms 60] [--seconds 30] [--seed 1]``
(``make bench-adaptive``; about 5 s of CPU, no sleeps, nothing started)

A discrete-event simulation, seeded:

* the backend: a request's service time is set when it starts, from the
  number in service then (itself included): 20 ms up to the knee (40), then
  20 ms x (n / 40)^2, with +-10 % uniform jitter; so throughput n / s(n)
  peaks at the knee and falls past it;
* the clients: a closed population, each thinking (exponential, mean
  ``--think-ms``) then sending one request and waiting for its answer;
* admission: a FIFO queue in front admits while fewer than L are in service;
  a request's waiting time is its time in that queue. L is fixed (the sweep)
  or a :class:`sluicegate.adaptive.AdaptiveLimit` fed every completion's
  waiting and service times (L_min = 15, K_p = 15, u = 5, N = 100).

It prints the sweep of fixed limits (the optimum is the one with the least
mean total response time = waiting + service), then the adaptive run's trace
of L with the mean total response time of the requests completed while each L
was in force, then, for other client populations, where L ends against that
population's optimum. Algorithm 1 steers towards p95 waiting ~ p95 service
(it only moves when one is at least twice the other); in a closed loop that is
about L = clients / (2 + think / service), which is the knee for 200 clients
thinking 60 ms, and past it for larger or faster populations.

The unit test ``tests/unit/test_adaptive.py`` runs the same simulation.
"""

from __future__ import annotations

import argparse
import heapq
import math
import random
import sys
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script from anywhere, with or without an installed sluicegate

from sluicegate.adaptive import AdaptiveLimit, percentile95  # noqa: E402

MS = 1_000_000
SECOND = 1_000 * MS
SWEEP = range(15, 105, 5)  # fixed limits tried: the adaptive limit's own grid (u = 5 from L_min = 15)
_ARRIVE, _DONE = 0, 1


@dataclass(frozen=True, slots=True)
class Backend:
    """Service time as a function of the number in service: flat to ``knee``, then growing as a power."""

    base_ns: int = 20 * MS
    knee: int = 40
    exponent: float = 2.0
    jitter: float = 0.1

    def service_ns(self, in_service: int, rng: random.Random) -> int:
        slowdown = 1.0 if in_service <= self.knee else (in_service / self.knee) ** self.exponent
        return round(self.base_ns * slowdown * rng.uniform(1 - self.jitter, 1 + self.jitter))


@dataclass(frozen=True, slots=True)
class Workload:
    """A closed population of ``clients`` thinking ``think_ns`` on average between requests."""

    clients: int = 200
    think_ns: int = 60 * MS
    backend: Backend = field(default_factory=Backend)


@dataclass(slots=True)
class Run:
    """One simulation's completions ``(done_ns, wait_ns, service_ns, limit then)`` and the adaptive trace."""

    completions: list[tuple[int, int, int, int]]
    trace: list[tuple[int, int]]
    final_limit: int


@dataclass(frozen=True, slots=True)
class Stats:
    """Completions after a warm-up: per second, mean waiting/service/total and p95 total, in ms."""

    throughput: float
    wait_ms: float
    service_ms: float
    response_ms: float
    p95_response_ms: float


def simulate(limit: int | AdaptiveLimit, workload: Workload, *, seconds: float, seed: int) -> Run:
    """Run ``seconds`` of simulated time with a fixed limit or an adaptive one (updated in place)."""
    rng = random.Random(seed)
    backend, think = workload.backend, workload.think_ns
    end_ns = round(seconds * SECOND)
    events: list[tuple[int, int, int, int, int, int]] = []  # (time, seq, kind, client, wait, service)
    seq = 0
    for client in range(workload.clients):
        events.append((round(rng.expovariate(1 / think)), seq, _ARRIVE, client, 0, 0))
        seq += 1
    heapq.heapify(events)
    adaptive = limit if isinstance(limit, AdaptiveLimit) else None
    queue: deque[tuple[int, int]] = deque()  # (client, arrived_ns)
    in_service = 0
    completions: list[tuple[int, int, int, int]] = []
    while events and events[0][0] <= end_ns:
        now, _, kind, client, wait, service = heapq.heappop(events)
        if kind == _ARRIVE:
            queue.append((client, now))
        else:
            in_service -= 1
            completions.append((now, wait, service, adaptive.limit if adaptive else limit))
            if adaptive is not None:
                adaptive.record(wait, service, now)
            heapq.heappush(events, (now + round(rng.expovariate(1 / think)), seq, _ARRIVE, client, 0, 0))
            seq += 1
        window = adaptive.limit if adaptive is not None else limit
        while queue and in_service < window:
            waiting, arrived = queue.popleft()
            in_service += 1
            service = backend.service_ns(in_service, rng)
            heapq.heappush(events, (now + service, seq, _DONE, waiting, now - arrived, service))
            seq += 1
    if adaptive is not None:
        return Run(completions, list(adaptive.trace), adaptive.limit)
    return Run(completions, [], limit)


def stats(completions: list[tuple[int, int, int, int]], *, span_ns: int) -> Stats:
    """Figures of ``completions`` (not empty) spread over ``span_ns``."""
    count = len(completions)
    totals = [wait + service for _, wait, service, _ in completions]
    return Stats(
        throughput=count * SECOND / span_ns,
        wait_ms=sum(wait for _, wait, _, _ in completions) / count / MS,
        service_ms=sum(service for _, _, service, _ in completions) / count / MS,
        response_ms=sum(totals) / count / MS,
        p95_response_ms=percentile95(totals) / MS,
    )


def sweep(
    workload: Workload, limits: range = SWEEP, *, seconds: float = 6.0, warm_up: float = 1.0, seed: int = 1
) -> dict[int, Stats]:
    """Stats of each fixed limit, measured after ``warm_up`` seconds."""
    start = round(warm_up * SECOND)
    result = {}
    for limit in limits:
        run = simulate(limit, workload, seconds=seconds, seed=seed)
        measured = [c for c in run.completions if c[0] >= start]
        result[limit] = stats(measured, span_ns=round(seconds * SECOND) - start)
    return result


def optimum(figures: dict[int, Stats]) -> int:
    """The limit with the least mean total response time."""
    return min(figures, key=lambda limit: figures[limit].response_ms)


def adaptive_run(workload: Workload, *, seconds: float = 30.0, seed: int = 1) -> Run:
    """The paper's settings from L_min: L_min = 15, K_p = 15, u = 5, N = 100."""
    return simulate(AdaptiveLimit(minimum=15, kp=15.0, step=5, samples=100), workload, seconds=seconds, seed=seed)


def per_limit(run: Run) -> dict[int, Stats]:
    """Stats of the requests completed while each L was in force (in order of first appearance)."""
    groups: dict[int, list[tuple[int, int, int, int]]] = {}
    spans: dict[int, int] = {}
    changes = [(0, 15), *run.trace]
    end = run.completions[-1][0] if run.completions else 0
    for (start, limit), (stop, _) in zip(changes, [*changes[1:], (end, 0)], strict=True):
        spans[limit] = spans.get(limit, 0) + max(1, stop - start)
    for completion in run.completions:
        groups.setdefault(completion[3], []).append(completion)
    return {limit: stats(done, span_ns=spans.get(limit, 1)) for limit, done in groups.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--think-ms", type=float, default=60.0)
    parser.add_argument("--seconds", type=float, default=30.0, help="simulated time of the adaptive run")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--populations", default="100,150,300,400", help="other client counts ('' for none)")
    args = parser.parse_args()
    workload = Workload(clients=args.clients, think_ns=round(args.think_ms * MS))
    backend = workload.backend
    print(
        f"backend: {backend.base_ns / MS:g} ms to {backend.knee} in service, then x (n/{backend.knee})^"
        f"{backend.exponent:g}, +-{backend.jitter:.0%}; {workload.clients} clients, think {args.think_ms:g} ms"
    )
    figures = sweep(workload, seed=args.seed)
    best = optimum(figures)
    print("\nfixed limits (6 s simulated, first second dropped)")
    print(f"{'L':>5} {'req/s':>7} {'wait ms':>8} {'svc ms':>7} {'total ms':>9} {'p95 ms':>7}")
    for limit, row in figures.items():
        mark = "  <- optimum" if limit == best else ""
        print(
            f"{limit:>5} {row.throughput:>7.0f} {row.wait_ms:>8.1f} {row.service_ms:>7.1f} "
            f"{row.response_ms:>9.1f} {row.p95_response_ms:>7.1f}{mark}"
        )
    run = adaptive_run(workload, seconds=args.seconds, seed=args.seed)
    print(f"\nadaptive (L_min 15, K_p 15, u 5, N 100), {args.seconds:g} s simulated: trace of L")
    print(f"{'t s':>7} {'L':>5}")
    for at, limit in [(0, 15), *run.trace]:
        print(f"{at / SECOND:>7.2f} {limit:>5}")
    print("\nmean total response time of the requests completed while each L was in force")
    print(f"{'L':>5} {'done':>6} {'total ms':>9} {'fixed-L sweep ms':>17}")
    for limit, row in per_limit(run).items():
        done = sum(1 for c in run.completions if c[3] == limit)
        fixed = f"{figures[limit].response_ms:>17.1f}" if limit in figures else f"{'-':>17}"
        print(f"{limit:>5} {done:>6} {row.response_ms:>9.1f} {fixed}")
    gap = (run.final_limit - best) / best
    print(f"\nsettled at L = {run.final_limit}; optimum of the sweep L = {best} ({gap:+.0%})")
    populations = [int(part) for part in args.populations.split(",") if part.strip()]
    if populations:
        print("\nother populations (think time as above): where L ends against the optimum")
        print(f"{'clients':>8} {'optimum':>8} {'ends at':>8} {'gap':>6} {'clients/(2+think/20ms)':>23}")
        for clients in populations:
            other = Workload(clients=clients, think_ns=workload.think_ns, backend=backend)
            other_best = optimum(sweep(other, seed=args.seed))
            ended = adaptive_run(other, seconds=args.seconds, seed=args.seed).final_limit
            estimate = clients / (2 + workload.think_ns / backend.base_ns)
            print(
                f"{clients:>8} {other_best:>8} {ended:>8} {(ended - other_best) / other_best:>+6.0%} "
                f"{math.floor(estimate):>23}"
            )


if __name__ == "__main__":
    main()
