"""The answer to one check, as the router, the HTTP API and the SDK see it. Pure module.

Example:
    >>> d = Decision("alice", False, 0, 1500, capacity=10, window_ms=10_000)
    >>> d.retry_after, d.window, d.policy
    (1.5, 10.0, 'key')
    >>> Decision.from_json(d.to_json()) == d
    True
    >>> fallback_decision("alice", fail_open=False).retry_after_ms
    1000
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sluicegate import codec
from sluicegate.rules import NEVER_MS

FALLBACK_RETRY_MS = 1000  # what a fail-closed fallback tells the caller to wait


@dataclass(frozen=True, slots=True)
class Decision:
    """The answer to one check. ``remaining``/``retry_after_ms`` are None when unknown.

    ``retry_after_ms`` is None on a denial that no wait can fix (the cost
    exceeds the capacity, or the rule refills nothing). ``capacity`` and
    ``window_ms`` (the time to refill from empty) describe the rule that
    decided; they are None on a fallback, when no partition answered.
    ``limit`` names the limit that denied the check (``"rate"``: the rule's
    main bucket), or, with ``would_deny``, the shadow limit that would have.
    ``lease`` is set on an admitted acquire of a key with a concurrency limit.
    """

    key: str
    allowed: bool
    remaining: int | None
    retry_after_ms: int | None
    fallback: bool = False
    capacity: int | None = None
    window_ms: int | None = None
    default_rule: bool = False
    limit: str | None = None
    would_deny: bool = False
    lease: int | None = None  # an acquire's lease, to give back with release

    @property
    def retry_after(self) -> float | None:
        """Seconds to wait before this check can pass (0 when allowed, None when no wait helps)."""
        return None if self.retry_after_ms is None else self.retry_after_ms / 1000

    @property
    def window(self) -> float | None:
        """Seconds the bucket takes to refill from empty (None: it never refills, or unknown)."""
        return None if self.window_ms is None else self.window_ms / 1000

    @property
    def policy(self) -> str | None:
        """``"default"`` (the key has no rule of its own) or ``"key"``; None on a fallback."""
        if self.capacity is None:
            return None
        return "default" if self.default_rule else "key"

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "allowed": self.allowed,
            "remaining": self.remaining,
            "retry_after_ms": self.retry_after_ms,
            "fallback": self.fallback,
            "capacity": self.capacity,
            "window_ms": self.window_ms,
            "policy": self.policy,
            "limit": self.limit,
            "would_deny": self.would_deny,
            **({"lease": self.lease} if self.lease is not None else {}),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Decision:
        """The inverse of :meth:`to_json`; fields an older router leaves out are None."""
        return cls(
            str(data["key"]),
            bool(data["allowed"]),
            data.get("remaining"),
            data.get("retry_after_ms"),
            fallback=bool(data.get("fallback", False)),
            capacity=data.get("capacity"),
            window_ms=data.get("window_ms"),
            default_rule=data.get("policy") == "default",
            limit=data.get("limit"),
            would_deny=bool(data.get("would_deny", False)),
            lease=data.get("lease"),
        )


def fallback_decision(key: str, *, fail_open: bool) -> Decision:
    """What a check gets when its partition (or the service) cannot be reached."""
    if fail_open:
        return Decision(key, True, None, None, fallback=True)
    return Decision(key, False, 0, FALLBACK_RETRY_MS, fallback=True)


def from_item(key: str, result: codec.ItemResult) -> Decision:
    """The decision a partition's reply item carries (the wire's "never" becomes None)."""
    retry = result.retry_after_ms
    window = result.window_ms
    return Decision(
        key,
        result.allowed,
        result.remaining,
        None if retry == NEVER_MS else retry,
        capacity=result.capacity,
        window_ms=None if window == NEVER_MS else window,
        default_rule=result.default_rule,
        limit=result.limit_name,
        would_deny=result.would_deny,
    )
