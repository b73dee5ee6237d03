#!/usr/bin/env python3
"""Pattern resolution: mean PatternIndex.match time with 10, 1,000 and 100,000 patterns (``make bench-patterns``).

``python bench/patterns.py [--keys N] [--seconds S]``. Pure CPU, no processes,
no network. It prints figures and asserts nothing about timings.

Patterns have realistic shapes: per tenant ``tenant:<id>:*`` and (for most
tenants) ``tenant:<id>:user:*``, plus a few globs that every key must test
(they start with a glob character, so they hang at the trie's root):
``*:admin`` (precedence 1), ``tenant:*:export:*`` and ``tenant:[0-9]*:batch``.
Keys have the same shapes (users, admins, exports, unknown tenants) over the
tenants of the set. A linear scan over every pattern (``fnmatchcase`` each,
best kept) is timed next to it for 10 and 1,000 patterns, for scale.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Callable
from fnmatch import fnmatchcase
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from anywhere

from sluicegate.patterns import PatternIndex, literal_length
from sluicegate.rules import Rule

GLOBS = [Rule("*:admin", 10, 1, precedence=1), Rule("tenant:*:export:*", 10, 1), Rule("tenant:[0-9]*:batch", 10, 1)]


def pattern_set(count: int) -> list[Rule]:
    """``count`` rules: the globs, then tenants' prefix patterns (two per tenant, one for every 10th)."""
    rules = list(GLOBS)
    tenant = 0
    while len(rules) < count:
        rules.append(Rule(f"tenant:{tenant}:*", 100, 10))
        if tenant % 10 and len(rules) < count:
            rules.append(Rule(f"tenant:{tenant}:user:*", 20, 2))
        tenant += 1
    return rules[:count]


def key_set(tenants: int, count: int, rng: random.Random) -> list[str]:
    shapes = [
        "tenant:{t}:user:u{n}",
        "tenant:{t}:user:u{n}",
        "tenant:{t}:order:{n}",
        "tenant:{t}:user:admin",
        "tenant:{t}:export:{n}",
        "tenant:{u}:user:u{n}",  # a tenant without patterns
    ]
    return [
        rng.choice(shapes).format(
            t=rng.randrange(max(tenants, 1)), u=10**7 + rng.randrange(1000), n=rng.randrange(10**6)
        )
        for _ in range(count)
    ]


def linear_match(rules: list[Rule], key: str) -> Rule | None:
    """The baseline: test every pattern, keep the best by the same order as the index."""
    best = None
    best_rank = None
    for rule in rules:
        if fnmatchcase(key, rule.key):
            rank = (-rule.precedence, -literal_length(rule.key), rule.key)
            if best_rank is None or rank < best_rank:
                best, best_rank = rule, rank
    return best


def mean_us(match: Callable[[str], object], keys: list[str], seconds: float) -> tuple[float, int]:
    """Mean µs per call over repeated passes of ``keys``, for about ``seconds`` (at least one pass)."""
    calls = 0
    start = time.perf_counter()
    deadline = start + seconds
    while True:
        for key in keys:
            match(key)
        calls += len(keys)
        now = time.perf_counter()
        if now >= deadline:
            return (now - start) / calls * 1e6, calls


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keys", type=int, default=10_000, help="distinct keys per set (default 10,000)")
    parser.add_argument("--seconds", type=float, default=1.0, help="timing per measurement (default 1 s)")
    args = parser.parse_args()
    rng = random.Random(6)
    print(f"PatternIndex.match, {args.keys:,} keys of realistic shapes, ~{args.seconds:g} s per figure")
    print(f"{'patterns':>9}  {'build s':>8}  {'match µs':>9}  {'linear scan µs':>15}  {'matched':>8}")
    figures = {}
    for count in (10, 1_000, 100_000):
        rules = pattern_set(count)
        tenants = (
            sum(rule.key.startswith("tenant:") and rule.key.count(":") == 2 for rule in rules) - 1
        )  # the batch glob
        keys = key_set(tenants, args.keys, rng)
        started = time.perf_counter()
        index = PatternIndex()
        for rule in rules:
            index.put(rule)
        build = time.perf_counter() - started
        if count <= 1_000:  # the index and the scan agree (a check of the bench itself; tests cover 100,000)
            for key in keys[:200]:
                assert index.match(key) is linear_match(rules, key), key
        matched = sum(index.match(key) is not None for key in keys) / len(keys)
        index_us, _ = mean_us(index.match, keys, args.seconds)
        scan = "-"
        if count <= 1_000:
            scan_us, _ = mean_us(lambda key, rules=rules: linear_match(rules, key), keys[:2000], args.seconds)
            scan = f"{scan_us:.2f}"
        figures[count] = index_us
        print(f"{count:>9,}  {build:>8.2f}  {index_us:>9.2f}  {scan:>15}  {matched:>8.0%}")
    print(f"100,000 patterns vs 10: {figures[100_000] / figures[10]:.2f}x the time per match")
    return 0


if __name__ == "__main__":
    sys.exit(main())
