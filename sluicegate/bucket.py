"""Leaky bucket with lazy refill (Janus eq. 1-2). Pure: time is an argument.

Credit f(t) = C + (A - B)·t clamped to [0, C]: capacity C, refill rate A per
second, B the spending. Refill happens lazily at each access from the time
passed in, so no housekeeping sweep is needed. Time is integer nanoseconds and
credit integer nano-credits, so integer costs and rates are exact.

Example:
    >>> from sluicegate.rules import Rule
    >>> b = Bucket(Rule("k", capacity=2, rate=1), now_ns=0)
    >>> [b.take(1, 0) for _ in range(3)]
    [True, True, False]
    >>> b.retry_after_ms(1, 0)
    1000
    >>> b.take(1, 1_000_000_000)
    True
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sluicegate.rules import CREDIT_SCALE, NEVER_MS, Rule


class Bucket:
    """One key's credit. ``stamp`` is the time (ns) the credit was last refilled to."""

    __slots__ = ("credit", "rule", "stamp")

    def __init__(self, rule: Rule, now_ns: int, credit_nano: int | None = None) -> None:
        self.rule = rule
        self.stamp = now_ns
        self.credit = rule.capacity_nano if credit_nano is None else min(credit_nano, rule.capacity_nano)

    def refill(self, now_ns: int) -> None:
        """Bring credit up to date; a clock that goes backwards refills nothing."""
        elapsed = now_ns - self.stamp
        if elapsed > 0:
            rule = self.rule
            gain = int(elapsed * rule.rate)
            if gain == 0:
                return  # keep the time: at very low rates many accesses add up to a credit
            credit = self.credit + gain
            if credit >= rule.capacity_nano:
                self.credit = rule.capacity_nano
                self.stamp = now_ns
            elif rule.whole_rate:
                self.credit = credit
                self.stamp = now_ns
            else:
                # Advance only by the time that was credited, so truncated fractions are not lost.
                self.credit = credit
                self.stamp += min(elapsed, math.ceil(gain / rule.rate))

    def take(self, cost: int, now_ns: int) -> bool:
        """Admit and charge ``cost`` if the credit covers it; else charge nothing."""
        self.refill(now_ns)
        need = cost * CREDIT_SCALE
        if self.credit >= need:
            self.credit -= need
            return True
        return False

    @property
    def remaining(self) -> int:
        """Whole credits left (as of the last refill)."""
        return self.credit // CREDIT_SCALE

    def retry_after_ms(self, cost: int, now_ns: int) -> int:
        """Milliseconds until ``cost`` credit will be there; ``NEVER_MS`` if never."""
        self.refill(now_ns)
        missing = cost * CREDIT_SCALE - self.credit
        if missing <= 0:
            return 0
        rule = self.rule
        if rule.rate <= 0 or cost > rule.capacity:
            return NEVER_MS
        wait_ms = missing / rule.rate / 1_000_000
        return NEVER_MS if wait_ms >= NEVER_MS else math.ceil(wait_ms)

    def set_rule(self, rule: Rule, now_ns: int) -> None:
        """Switch to a new rule, keeping the credit (clamped to the new capacity)."""
        self.refill(now_ns)
        self.rule = rule
        self.credit = min(self.credit, rule.capacity_nano)


@dataclass(frozen=True, slots=True)
class Verdict:
    """The answer to one check: what a caller of the pure model sees."""

    allowed: bool
    remaining: int
    retry_after_ms: int
    capacity: int
    window_ms: int


def check(bucket: Bucket, cost: int, now_ns: int) -> Verdict:
    """Charge ``cost`` against ``bucket`` at ``now_ns`` and describe the outcome."""
    allowed = bucket.take(cost, now_ns)
    retry = 0 if allowed else bucket.retry_after_ms(cost, now_ns)
    rule = bucket.rule
    return Verdict(allowed, bucket.remaining, retry, rule.capacity, rule.window_ms)
