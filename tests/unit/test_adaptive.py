"""OpenStack's Algorithm 1: its arithmetic on hand-made samples, and where it settles in a simulation.

The simulation is ``bench/adaptive_limit.py`` (a script, loaded here by path):
a backend whose service time is 20 ms up to 40 requests at once and grows as
the square of the number in service past that, 200 clients thinking 60 ms on
average, a FIFO admission queue with the limit as its window.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sluicegate.adaptive import AdaptiveLimit, percentile95
from tests.conftest import script_module

MS = 1_000_000
SECOND = 1_000 * MS
BENCH_SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "adaptive_limit.py"


def feed(limit: AdaptiveLimit, waits: list[int], services: list[int], now_ns: int = 0) -> list[bool]:
    return [limit.record(w, s, now_ns) for w, s in zip(waits, services, strict=True)]


# -- the arithmetic -----------------------------------------------------------------------------


def test_the_95th_percentile_is_the_nearest_rank_one() -> None:
    assert percentile95(list(range(100, 0, -1))) == 95
    assert percentile95([7]) == 7
    assert percentile95([1, 2, 3, 4, 5, 6, 7, 8, 9, 10]) == 10  # ceil(9.5) = the 10th
    assert percentile95(list(range(1, 21))) == 19


def test_nothing_changes_before_n_completions() -> None:
    limit = AdaptiveLimit()
    assert feed(limit, [500 * MS] * 99, [10 * MS] * 99) == [False] * 99
    assert limit.limit == 15 and limit.trace == []
    assert limit.record(500 * MS, 10 * MS, 7) is True  # the 100th: error 0.96, floor(14.4) = 14, dL = 10
    assert limit.limit == 25 and limit.trace == [(7, 25)]


@pytest.mark.parametrize(
    ("wait", "service", "start", "expected"),
    [
        (300, 100, 15, 20),  # error +0.5: floor(7.5) = 7, dL = 5
        (100, 0, 15, 30),  # error +1: dL = 15
        (0, 100, 50, 35),  # error -1: dL = 15
        (100, 300, 50, 45),  # error -0.5: dL = 5
        (0, 100, 20, 15),  # error -1 would take 20 to 5: L_min is the floor
        (130, 70, 40, 40),  # error +0.3: floor(4.5) = 4, dL = 4 - 4 mod 5 = 0 (the dead band)
        (200, 100, 40, 45),  # error +1/3: exactly 5
        (100, 100, 40, 40),  # balanced: dL = 0
    ],
)
def test_one_step_of_algorithm_1(wait: int, service: int, start: int, expected: int) -> None:
    limit = AdaptiveLimit(samples=10, initial=start)
    changed = feed(limit, [wait * MS] * 10, [service * MS] * 10)[-1]
    assert limit.limit == expected
    assert changed is (expected != start)
    assert limit.trace == ([(0, expected)] if changed else [])


def test_the_step_uses_the_95th_percentiles_not_the_means() -> None:
    limit = AdaptiveLimit(samples=100)
    waits = [0] * 94 + [400 * MS] * 6  # mean wait 24 ms, but its 95th percentile is 400 ms
    feed(limit, waits, [100 * MS] * 100)
    assert limit.limit == 20  # error (400 - 100) / 500 = 0.6: floor(9) = 9, dL = 5
    limit = AdaptiveLimit(samples=100)
    feed(limit, [0] * 95 + [400 * MS] * 5, [100 * MS] * 100)  # the 95th is still 0: error -1, already at L_min
    assert limit.limit == 15 and limit.trace == []


def test_kp_and_u_scale_the_step() -> None:
    limit = AdaptiveLimit(samples=1, kp=40, step=1)
    limit.record(300 * MS, 100 * MS, 0)  # error 0.5: floor(20) = 20, u = 1
    assert limit.limit == 35
    limit = AdaptiveLimit(samples=1, kp=40, step=8)
    limit.record(300 * MS, 100 * MS, 0)  # 20 - 20 mod 8 = 16
    assert limit.limit == 31


def test_after_a_step_it_holds_for_twice_the_smaller_percentile_then_collects_a_fresh_batch() -> None:
    limit = AdaptiveLimit(samples=10)
    feed(limit, [300 * MS] * 10, [100 * MS] * 10, now_ns=SECOND)  # +5, hold 200 ms
    assert limit.limit == 20
    hold_end = SECOND + 200 * MS
    # During the hold even extreme samples are ignored: 10 of them would otherwise be a whole batch (-15).
    assert feed(limit, [0] * 10, [900 * MS] * 10, now_ns=hold_end - 1) == [False] * 10
    assert limit.limit == 20
    # From the hold's end a new batch is collected: 9 balanced ones do nothing yet, the 10th decides.
    assert feed(limit, [100 * MS] * 9, [100 * MS] * 9, now_ns=hold_end) == [False] * 9
    assert limit.record(0, 100 * MS, hold_end + 1) is False  # error: p95s 100 and 100 -> 0
    assert limit.limit == 20 and limit.trace == [(SECOND, 20)]


def test_a_batch_without_a_change_holds_too() -> None:
    limit = AdaptiveLimit(samples=2)
    feed(limit, [100, 100], [100, 100], now_ns=0)  # balanced: no change, hold 200 ns
    assert limit.record(0, 900, 199) is False and limit.record(0, 900, 199) is False  # held: not a batch
    assert limit.limit == 15
    limit = AdaptiveLimit(samples=2, initial=50)
    feed(limit, [100, 100], [100, 100], now_ns=0)
    feed(limit, [0, 0], [900, 900], now_ns=200)  # after the hold: error -1
    assert limit.limit == 35


def test_all_zero_times_change_nothing_and_hold_nothing() -> None:
    limit = AdaptiveLimit(samples=3, initial=30)
    assert feed(limit, [0, 0, 0], [0, 0, 0]) == [False] * 3
    assert feed(limit, [0, 0, 0], [9, 9, 9]) == [False, False, True]  # the very next batch counts: -15
    assert limit.limit == 15


def test_the_limit_stays_within_its_bounds() -> None:
    limit = AdaptiveLimit(samples=1, maximum=22)
    for t in range(10):
        limit.record(1_000, 0, t)  # error +1 each time, no hold (min is 0)
    assert limit.limit == 22
    assert [entry[1] for entry in limit.trace] == [22]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"minimum": 0}, "minimum must be an integer >= 1"),
        ({"step": 0}, "step must be an integer >= 1"),
        ({"samples": 2.5}, "samples must be an integer >= 1"),
        ({"kp": 0}, "kp must be a finite number > 0"),
        ({"kp": float("nan")}, "kp must be a finite number > 0"),
        ({"maximum": 10}, "maximum must be an integer >= 15"),
        ({"initial": 14}, "initial must be an integer >= 15"),
        ({"initial": 200, "maximum": 100}, "initial must be at most maximum"),
    ],
)
def test_bad_settings_are_refused_with_a_clear_message(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        AdaptiveLimit(**kwargs)


def test_negative_times_are_refused() -> None:
    with pytest.raises(ValueError, match="must be >= 0"):
        AdaptiveLimit().record(-1, 5, 0)


# -- the simulation -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sim():
    with script_module(BENCH_SCRIPT, "adaptive_limit_bench") as module:
        yield module


@pytest.fixture(scope="module")
def swept(sim):
    workload = sim.Workload()
    figures = sim.sweep(workload)
    return workload, figures, sim.optimum(figures)


def test_the_simulated_backend_is_best_at_its_knee(sim, swept) -> None:
    """The sweep of fixed limits finds the knee: fewer waste capacity, more slow every request down."""
    _, figures, best = swept
    assert best == sim.Backend().knee == 40
    assert figures[40].throughput == max(row.throughput for row in figures.values())
    assert figures[20].response_ms > 2 * figures[40].response_ms
    assert figures[80].response_ms > 2 * figures[40].response_ms


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_adaptive_limit_settles_near_the_best_fixed_limit_and_stays(sim, swept, seed: int) -> None:
    workload, figures, best = swept
    run = sim.adaptive_run(workload, seconds=20.0, seed=seed)
    low, high = 0.7 * best, 1.3 * best
    assert run.trace and run.trace[0][1] > 15  # it started at L_min and rose
    settled = [limit for at, limit in run.trace if at >= 2 * SECOND]
    assert all(low <= limit <= high for limit in settled), run.trace
    assert low <= run.final_limit <= high, run.trace
    late = [c for c in run.completions if c[0] >= 5 * SECOND]
    assert {c[3] for c in late} == {run.final_limit}
    # The requests served at the settled limit see about the optimum's response time.
    achieved = sim.stats(late, span_ns=15 * SECOND).response_ms
    assert achieved <= 1.3 * figures[best].response_ms
