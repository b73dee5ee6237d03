"""Rule model: a key's leaky-bucket parameters, and the default rule.

Pure module: standard library only.

Example:
    >>> rule = Rule("alice", capacity=1000, rate=100)
    >>> rule.window_ms  # time to refill from empty
    10000
    >>> DENY_ALL.admits_anything
    False
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

MAX_KEY_BYTES = 256
MAX_CAPACITY = 2**32 - 1  # the wire codec carries capacity as u32
MAX_RATE = 1e15  # credits/s; far above any use, and keeps refill arithmetic finite
#: Credit is kept in nano-units so integer costs and integer rates stay exact.
CREDIT_SCALE = 1_000_000_000
NEVER_MS = 2**32 - 1  # "never" on the wire (u32 max)
DEFAULT_RULE_KEY = "*default*"


class RuleError(ValueError):
    """A rule or key is invalid; the message says which field and why."""


def validate_key(key: object) -> str:
    """Return ``key`` if it is a usable QoS key, else raise :class:`RuleError`."""
    if not isinstance(key, str):
        raise RuleError("key must be a string")
    if not key:
        raise RuleError("key must not be empty")
    if "\x00" in key:
        raise RuleError("key must not contain NUL characters")
    if len(key.encode("utf-8", "surrogatepass")) > MAX_KEY_BYTES:
        raise RuleError(f"key is longer than {MAX_KEY_BYTES} UTF-8 bytes")
    try:
        key.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise RuleError("key is not valid Unicode text") from exc
    return key


def _number(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise RuleError(f"{name} must be a number")
    try:
        number = float(value)
    except (ValueError, OverflowError) as exc:  # OverflowError: an int too large for a float
        raise RuleError(f"{name} must be a number, got {value!r}") from exc
    if not math.isfinite(number) or number < 0:
        raise RuleError(f"{name} must be a finite number >= 0, got {value!r}")
    return number


@dataclass(frozen=True, slots=True)
class Rule:
    """Leaky bucket parameters for one key: ``capacity`` credits, refilled at ``rate``/s."""

    key: str
    capacity: int
    rate: float
    capacity_nano: int = field(init=False, repr=False, compare=False)
    window_ms: int = field(init=False, repr=False, compare=False)
    whole_rate: bool = field(init=False, repr=False, compare=False)  # refills are exact integers

    def __post_init__(self) -> None:
        if self.key != DEFAULT_RULE_KEY:
            validate_key(self.key)
        capacity = _number("capacity", self.capacity)
        if capacity != int(capacity) or capacity > MAX_CAPACITY:
            raise RuleError(f"capacity must be a whole number from 0 to {MAX_CAPACITY}")
        rate = _number("rate", self.rate)
        if rate > MAX_RATE:
            raise RuleError(f"rate must be at most {MAX_RATE:g} per second")
        object.__setattr__(self, "capacity", int(capacity))
        object.__setattr__(self, "rate", rate)
        object.__setattr__(self, "capacity_nano", int(capacity) * CREDIT_SCALE)
        object.__setattr__(self, "whole_rate", rate.is_integer())
        if rate > 0:
            # A tiny rate gives an infinite window: that is "never" on the wire.
            window = int(capacity) * 1000 / rate
            object.__setattr__(self, "window_ms", NEVER_MS if window >= NEVER_MS else math.ceil(window))
        else:
            object.__setattr__(self, "window_ms", NEVER_MS)

    @property
    def admits_anything(self) -> bool:
        """False for a deny-all rule (capacity 0, rate 0)."""
        return self.capacity > 0

    def with_key(self, key: str) -> Rule:
        return Rule(key, self.capacity, self.rate)

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "capacity": self.capacity, "rate": self.rate}

    @classmethod
    def from_dict(cls, data: object, *, key: str | None = None) -> Rule:
        """Build a rule from a mapping such as a JSON body; ``key`` overrides ``data["key"]``."""
        if not isinstance(data, dict):
            raise RuleError("a rule must be an object with key, capacity and rate")
        unknown = set(data) - {"key", "capacity", "rate"}
        if unknown:
            raise RuleError(f"unknown rule field(s): {', '.join(sorted(map(str, unknown)))}")
        for name in ("capacity", "rate"):
            if name not in data or data[name] in (None, ""):
                raise RuleError(f"{name} is required")
        return cls(key if key is not None else data.get("key"), data["capacity"], data["rate"])  # type: ignore[arg-type]


def default_rule(capacity: int, rate: float) -> Rule:
    """The rule unknown keys get; ``default_rule(0, 0)`` denies everything."""
    return Rule(DEFAULT_RULE_KEY, capacity, rate)


DENY_ALL = default_rule(0, 0)
