"""Algorithm 1 in front of a real upstream app: the adaptive limit rises from L_min and settles at the knee.

The stack is ``bench/adaptive_upstream.py``'s (a script, loaded here by path):
``tests/functional/knee_upstream.py`` serves a request in 100 ms up to 30 in
service at once and in 100 ms x (n / 30)^2 past that, behind `sluicegate
proxy` (``mode: acquire``, ``max_wait_ms``: requests over the limit wait in the
partition's FIFO, releases report waiting and service times) and `sluicegate
local`; 100 closed-loop clients think 100 ms (exponential) between requests,
which puts Algorithm 1's balance (p95 waiting ~ p95 service, about
clients / (2 + think / service) = 33) at the knee. L is read from each answer's
``RateLimit-Policy`` q (the limit in force when it was admitted).

First short runs at fixed limits below, at and past the knee show where the
mean response time is least in this run; then the adaptive key, with the
paper's settings (L_min 15, K_p 15, u 5, N 100), must start at 15, rise, and
stay within 30 % of that limit for the second half of an 8 s run, serving
about as fast as the best fixed limit did. A failure prints the trace of L.
About 18 s.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import script_module

BENCH_SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "adaptive_upstream.py"
FIXED = (15, 30, 60)  # below, at and past the app's knee
FIXED_S, WARM_UP_S = 2.0, 1.0  # each fixed run; answers before WARM_UP_S are dropped (the queue is filling)
ADAPTIVE_S, SETTLED_FROM_S = 8.0, 4.0  # the simulation reaches the knee in about 2 s


@dataclass(frozen=True)
class Fixed:
    """One fixed limit's run: its answers after the warm-up, and the most the app had in service."""

    answers: list
    most_in_service: int
    mean_ms: float


@pytest.fixture(scope="module")
def bench() -> Iterator[ModuleType]:
    with script_module(BENCH_SCRIPT, "adaptive_upstream_bench") as module:
        yield module


@pytest.fixture(scope="module")
def stack(bench: ModuleType, tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    with bench.Stack(tmp_path_factory.mktemp("adaptive_upstream"), fixed=FIXED) as started:
        yield started


@pytest.fixture(scope="module")
def fixed(bench: ModuleType, stack) -> dict[int, Fixed]:
    runs = {}
    for limit in FIXED:
        stack.most_in_service()  # resets the app's count for this run
        answers = bench.run(stack.proxy.port, str(limit), seconds=FIXED_S)
        assert {answer.status for answer in answers} == {200}, f"L = {limit}: every request waits, none is refused"
        measured = bench.between(answers, WARM_UP_S, FIXED_S)
        runs[limit] = Fixed(measured, stack.most_in_service(), bench.mean_ms(measured))
    return runs


@pytest.fixture(scope="module")
def adaptive(bench: ModuleType, stack, fixed: dict[int, Fixed]) -> list:
    """The adaptive key's answers, run after the fixed ones (so it meets the same warm stack)."""
    return bench.run(stack.proxy.port, bench.ADAPTIVE, seconds=ADAPTIVE_S)


def _figures(fixed: dict[int, Fixed]) -> str:
    return ", ".join(
        f"L={limit}: {run.mean_ms:.0f} ms (most in service {run.most_in_service})" for limit, run in fixed.items()
    )


def test_the_upstream_app_is_fastest_at_its_knee_and_the_proxy_holds_each_fixed_limit(
    bench: ModuleType, fixed: dict[int, Fixed]
) -> None:
    """The premise of the adaptive test, measured: fewer in service waste the app, more slow every request."""
    for limit, run in fixed.items():
        assert run.answers and all(answer.limit == limit for answer in run.answers), _figures(fixed)
        assert run.most_in_service <= limit, _figures(fixed)  # leases are held while the app serves
    best = min(fixed, key=lambda limit: fixed[limit].mean_ms)
    assert best == bench.KNEE, _figures(fixed)
    # Expected (queueing arithmetic, like the simulation): about 570, 230 and 570 ms.
    assert fixed[bench.KNEE].mean_ms < 0.7 * fixed[15].mean_ms, _figures(fixed)
    assert fixed[bench.KNEE].mean_ms < 0.7 * fixed[60].mean_ms, _figures(fixed)


def test_the_adaptive_limit_rises_from_l_min_and_settles_at_the_fastest_fixed_limit(
    bench: ModuleType, fixed: dict[int, Fixed], adaptive: list
) -> None:
    best = min(fixed, key=lambda limit: fixed[limit].mean_ms)
    trace = f"\n{bench.trace_table(adaptive)}\nfixed limits: {_figures(fixed)}"
    assert {answer.status for answer in adaptive} == {200}, trace
    assert adaptive[0].limit == bench.SETTINGS["min"] == min(answer.limit for answer in adaptive), trace
    settled = bench.between(adaptive, SETTLED_FROM_S)
    low, high = 0.7 * best, 1.3 * best
    assert len(settled) > 500, trace  # ~290 a second at the knee: it did run at speed
    assert all(low <= answer.limit <= high for answer in settled), trace
    # Near the best limit is also about as fast: the requests served then see close to its response time.
    assert bench.mean_ms(settled) < 1.5 * fixed[best].mean_ms, trace
