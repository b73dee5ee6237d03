"""Leaky-bucket semantics of the Janus paper, driven by the time argument (no sleeps)."""

from __future__ import annotations

from sluicegate.bucket import Bucket, check
from sluicegate.rules import DENY_ALL, NEVER_MS, Rule

SECOND = 1_000_000_000


def test_burst_then_sustained_rate_falls_to_refill_rate() -> None:
    """A = 100/s, C = 1000: a 500-check burst in one second passes; 130/s settles at 100/s."""
    rule = Rule("api", capacity=1000, rate=100)
    bucket = Bucket(rule, now_ns=0)  # a new bucket starts full
    burst = [bucket.take(1, i * SECOND // 500) for i in range(500)]
    assert all(burst)

    admitted_per_second = []
    start = SECOND
    for second in range(60):
        admitted = 0
        for i in range(130):
            admitted += bucket.take(1, start + second * SECOND + i * SECOND // 130)
        admitted_per_second.append(admitted)
    # ~600 credits left after the burst drain at 30/s: everything passes for the first ~20 s ...
    assert admitted_per_second[:19] == [130] * 19
    # ... then the admitted rate is the refill rate.
    assert all(99 <= n <= 101 for n in admitted_per_second[25:]), admitted_per_second[25:]
    assert sum(admitted_per_second[25:]) == 100 * 35


def test_admitted_total_never_exceeds_capacity_plus_refill() -> None:
    rule = Rule("k", capacity=50, rate=7)
    bucket = Bucket(rule, 0)
    admitted = sum(bucket.take(3, t * SECOND // 20) for t in range(20 * 30))  # 20 checks/s for 30 s
    assert admitted * 3 <= 50 + 7 * 30
    assert admitted * 3 >= 50 + 7 * 30 - 3  # and it wastes less than one check's cost


def test_credit_is_exact_over_many_small_refills() -> None:
    bucket = Bucket(Rule("k", capacity=10, rate=1000), 0)
    for _ in range(10):
        assert bucket.take(1, 0)
    assert not bucket.take(1, 0)
    for ms in range(1, 10_001):  # 10,000 refills of exactly one credit each
        assert bucket.take(1, ms * 1_000_000), ms
        assert bucket.remaining == 0


def test_denied_check_is_not_charged_and_says_when_to_retry() -> None:
    bucket = Bucket(Rule("k", capacity=10, rate=2), 0)
    assert bucket.take(8, 0)
    verdict = check(bucket, 5, 0)
    assert not verdict.allowed
    assert verdict.remaining == 2
    assert verdict.retry_after_ms == 1500  # 3 missing credits at 2/s
    assert not bucket.take(5, 1_499_000_000)
    assert bucket.take(5, 1_500_000_000)


def test_cost_above_capacity_can_never_pass() -> None:
    bucket = Bucket(Rule("k", capacity=10, rate=1), 0)
    verdict = check(bucket, 11, 0)
    assert not verdict.allowed and verdict.retry_after_ms == NEVER_MS and verdict.remaining == 10


def test_deny_all_rule_denies_forever() -> None:
    bucket = Bucket(DENY_ALL, 0)
    for t in (0, SECOND, 3600 * SECOND):
        verdict = check(bucket, 1, t)
        assert not verdict.allowed and verdict.retry_after_ms == NEVER_MS


def test_credit_never_exceeds_capacity_and_clock_going_back_refills_nothing() -> None:
    bucket = Bucket(Rule("k", capacity=5, rate=100), 0)
    bucket.refill(3600 * SECOND)
    assert bucket.remaining == 5
    assert bucket.take(5, 3600 * SECOND)
    bucket.refill(0)
    assert bucket.remaining == 0


def test_rule_change_keeps_credit_clamped_to_new_capacity() -> None:
    bucket = Bucket(Rule("k", capacity=100, rate=1), 0)
    assert bucket.take(10, 0)
    bucket.set_rule(Rule("k", capacity=50, rate=1), 0)
    assert bucket.remaining == 50
    bucket.set_rule(Rule("k", capacity=500, rate=1), 0)
    assert bucket.remaining == 50


def test_fractional_rate_refills_proportionally() -> None:
    bucket = Bucket(Rule("k", capacity=1, rate=0.5), 0)
    assert bucket.take(1, 0)
    assert check(bucket, 1, 0).retry_after_ms == 2000
    assert not bucket.take(1, 1_999_000_000)
    assert bucket.take(1, 2 * SECOND)


def test_tiny_rate_retry_after_is_never_not_an_overflow() -> None:
    bucket = Bucket(Rule("k", capacity=1, rate=1e-310), 0)
    assert bucket.take(1, 0)
    assert check(bucket, 1, 0).retry_after_ms == NEVER_MS


def test_very_low_rate_refills_even_when_checked_constantly() -> None:
    bucket = Bucket(Rule("k", capacity=1, rate=1 / 86400), 0)  # one credit a day
    assert bucket.take(1, 0)
    for step in range(1, 200_001):  # a check every 50 µs for 10 s
        bucket.refill(step * 50_000)
    assert bucket.credit >= 115_740  # 10 s of 1/86400 credit/s in nano-credits, none lost
    assert not bucket.take(1, 86_399 * SECOND)
    assert bucket.take(1, 86_400 * SECOND)


def test_absurd_rate_is_refused() -> None:
    import pytest

    from sluicegate.rules import RuleError

    with pytest.raises(RuleError, match="rate must be at most"):
        Rule("k", capacity=10, rate=1e300)
