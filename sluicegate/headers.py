"""RateLimit header fields (IETF httpapi draft 08+) for a decision. Pure module.

The router's HTTP API and the SDK's middleware send the same headers.

``RateLimit-Policy: "default";q=100;w=10`` names the policy, its quota and
the window (seconds to refill from empty); ``RateLimit: "default";r=42;t=6``
gives what remains and the seconds until the quota is whole again.

Example:
    >>> from sluicegate.decision import Decision
    >>> d = Decision("k", False, 0, 1500, capacity=10, window_ms=10_000)
    >>> rate_limit_headers(d)
    [('RateLimit-Policy', '"key";q=10;w=10'), ('RateLimit', '"key";r=0;t=10'), ('Retry-After', '2')]
"""

from __future__ import annotations

import math

from sluicegate.decision import Decision


def rate_limit_headers(decision: Decision) -> list[tuple[str, str]]:
    """The headers to send with ``decision`` (none of the policy ones for a fallback)."""
    headers = []
    if decision.capacity is not None and decision.remaining is not None:
        name = decision.policy
        policy = f'"{name}";q={decision.capacity}'
        state = f'"{name}";r={decision.remaining}'
        if decision.window_ms is not None:
            policy += f";w={math.ceil(decision.window_ms / 1000)}"
            if decision.capacity > 0:
                missing = decision.capacity - decision.remaining
                state += f";t={math.ceil(missing * decision.window_ms / decision.capacity / 1000)}"
        headers += [("RateLimit-Policy", policy), ("RateLimit", state)]
    if not decision.allowed and decision.retry_after_ms is not None:
        headers.append(("Retry-After", str(max(1, math.ceil(decision.retry_after_ms / 1000)))))
    return headers


def most_restrictive(decisions: list[Decision]) -> Decision:
    """The decision whose headers speak for a batch: the longest denial, else the least left."""
    denied = [d for d in decisions if not d.allowed]
    if denied:
        return max(denied, key=lambda d: math.inf if d.retry_after_ms is None else d.retry_after_ms)
    return min(decisions, key=lambda d: math.inf if d.remaining is None else d.remaining)
