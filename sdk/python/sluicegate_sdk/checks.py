"""What every client shares: validating checks, and what to answer when the service is unreachable.

Example:
    >>> normalize_checks(["alice", ("bob", 3)])
    [('alice', 1), ('bob', 3)]
    >>> OnError("deny").decide("alice").allowed
    False
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable

from sluicegate.codec import MAX_COST
from sluicegate.decision import Decision, fallback_decision
from sluicegate.rules import RuleError, validate_key

log = logging.getLogger("sluicegate_sdk")
LOG_EVERY_S = 60.0  # an outage is logged once a minute, not once per check


class CheckError(ValueError):
    """A check the service cannot take (bad key or cost); the message says what to fix."""


def validate_check(key: object, cost: object = 1) -> tuple[str, int]:
    """``(key, cost)`` if the service accepts them, else :class:`CheckError`."""
    try:
        valid_key = validate_key(key)
    except RuleError as exc:
        raise CheckError(str(exc)) from exc
    if isinstance(cost, bool) or not isinstance(cost, int):
        raise CheckError(f"cost must be a whole number, got {cost!r}")
    if not 1 <= cost <= MAX_COST:
        raise CheckError(f"cost must be from 1 to {MAX_COST}, got {cost}")
    return valid_key, cost


def normalize_checks(checks: Iterable[str | tuple[str, int]]) -> list[tuple[str, int]]:
    """Keys (cost 1) or ``(key, cost)`` pairs, validated, as ``(key, cost)`` pairs."""
    return [validate_check(item) if isinstance(item, str) else validate_check(*item) for item in checks]


class OnError:
    """The answer when the service cannot be reached: ``"allow"`` (fail open) or ``"deny"`` (fail closed).

    Counts the fallbacks and logs the first one of each minute as a warning.
    """

    def __init__(self, on_error: str) -> None:
        if on_error not in ("allow", "deny"):
            raise ValueError(f"on_error must be 'allow' or 'deny', got {on_error!r}")
        self.fail_open = on_error == "allow"
        self.count = 0
        self._logged_at = -LOG_EVERY_S
        self._lock = threading.Lock()  # clients are shared by threads

    def decide(self, key: str, reason: str = "the service did not answer") -> Decision:
        """The fallback decision for ``key``; ``reason`` goes to the log."""
        self.note(reason)
        return fallback_decision(key, fail_open=self.fail_open)

    def note(self, reason: str, count: int = 1) -> None:
        """Count ``count`` fallbacks decided elsewhere; log the first of each minute."""
        now = time.monotonic()
        with self._lock:
            self.count += count
            if now - self._logged_at < LOG_EVERY_S:
                return
            self._logged_at = now
            total = self.count
        verdict = "allowing" if self.fail_open else "denying"
        log.warning("sluicegate: %s; %s checks (fallbacks so far: %d)", reason, verdict, total)
