"""Rule model: a key's leaky bucket and policy, and the default rule.

Pure module: standard library only.

A rule is a main leaky bucket (``capacity``, ``rate``: every rule has one,
and old rules are only that) plus, optionally:

* ``limits``: more buckets or calendar quotas (:mod:`sluicegate.limits`);
  a check must fit every one;
* ``shadow``: the whole rule only reports what it would deny;
* a pattern key (``*``, ``?`` or ``[...]`` in the key: a glob) with a
  ``precedence`` among overlapping patterns;
* ``parent`` and ``weight``/``priority``: a share of the parent's rate
  (weighted max-min over recent demand); a parent's ``share`` mode
  (``weighted`` or ``strict`` priorities) and ``level_weights``.

Example:
    >>> rule = Rule("alice", capacity=1000, rate=100)
    >>> rule.window_ms  # time to refill from empty
    10000
    >>> DENY_ALL.admits_anything
    False
    >>> Rule.from_dict({"key": "tenant:*", "capacity": 10, "rate": 1, "precedence": 2}).is_pattern
    True
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import KW_ONLY, dataclass, field, replace
from typing import Any

from sluicegate.limits import MAX_LIMITS, Limit, LimitError
from sluicegate.routing import routing_key

MAX_KEY_BYTES = 256
MAX_CAPACITY = 2**32 - 1  # the wire codec carries capacity as u32
MAX_RATE = 1e15  # credits/s; far above any use, and keeps refill arithmetic finite
#: Credit is kept in nano-units so integer costs and integer rates stay exact.
CREDIT_SCALE = 1_000_000_000
NEVER_MS = 2**32 - 1  # "never" on the wire (u32 max)
DEFAULT_RULE_KEY = "*default*"
PATTERN_CHARS = frozenset("*?[")
MAIN_LIMIT = "rate"  # the name of a rule's main bucket in answers
SHARE_MODES = ("weighted", "strict")
MAX_PRIORITY = 255
MAX_WEIGHT = 1e6
MAX_PRECEDENCE = 2**31 - 1
#: The rule fields beyond the main bucket, as stored in a store's policy column.
POLICY_FIELDS = ("limits", "shadow", "precedence", "parent", "weight", "priority", "share", "level_weights")


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


def is_pattern_key(key: str) -> bool:
    """Whether a rule key is a glob pattern (``*``, ``?`` or ``[``) rather than one exact key."""
    return key != DEFAULT_RULE_KEY and not PATTERN_CHARS.isdisjoint(key)


@dataclass(frozen=True, slots=True)
class Rule:
    """A key's (or a pattern's) main bucket, ``capacity`` credits refilled at ``rate``/s, and its policy."""

    key: str
    capacity: int
    rate: float
    _: KW_ONLY
    limits: tuple[Limit, ...] = ()
    shadow: bool = False
    precedence: int = 0
    parent: str | None = None
    weight: float = 1.0
    priority: int = 0
    share: str = "weighted"
    level_weights: tuple[tuple[int, float], ...] = ()
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
        if (
            self.limits
            or self.shadow
            or self.precedence
            or self.parent is not None
            or self.weight != 1.0
            or self.priority
            or self.share != "weighted"
            or self.level_weights
        ):
            self._validate_policy()  # plain rules (most of them) skip it: bulk imports build millions

    def _validate_policy(self) -> None:
        if not isinstance(self.limits, tuple) or not all(isinstance(limit, Limit) for limit in self.limits):
            raise RuleError("limits must be a tuple of Limit")
        if len(self.limits) > MAX_LIMITS:
            raise RuleError(f"a rule holds at most {MAX_LIMITS} limits besides its main bucket")
        if sum(limit.is_concurrency for limit in self.limits) > 1:
            raise RuleError("a rule holds at most one concurrency limit")
        names = [MAIN_LIMIT, *(limit.name for limit in self.limits)]
        if len(set(names)) != len(names):
            raise RuleError("limit names must differ from each other and from 'rate' (the main bucket)")
        if not isinstance(self.shadow, bool):
            raise RuleError("shadow must be true or false")
        if isinstance(self.precedence, bool) or not isinstance(self.precedence, int):
            raise RuleError("precedence must be a whole number")
        if abs(self.precedence) > MAX_PRECEDENCE:
            raise RuleError(f"precedence must be within ±{MAX_PRECEDENCE}")
        if self.parent is not None:
            validate_key(self.parent)
            if is_pattern_key(self.parent):
                raise RuleError("parent must be an exact key, not a pattern")
            if self.parent == self.key:
                raise RuleError("a rule cannot be its own parent")
            if routing_key(self.parent) != routing_key(self.key):
                raise RuleError(
                    "parent and child must share a routing key (the part in {...}), so that one partition holds both"
                )
        weight = _number("weight", self.weight)
        if not 0 < weight <= MAX_WEIGHT:
            raise RuleError(f"weight must be above 0 and at most {MAX_WEIGHT:g}")
        object.__setattr__(self, "weight", weight)
        if (
            isinstance(self.priority, bool)
            or not isinstance(self.priority, int)
            or not 0 <= self.priority <= MAX_PRIORITY
        ):
            raise RuleError(f"priority must be a whole number from 0 to {MAX_PRIORITY}")
        if self.share not in SHARE_MODES:
            raise RuleError(f"share must be one of {', '.join(SHARE_MODES)}, got {self.share!r}")
        levels = []
        for level, level_weight in self.level_weights:
            if isinstance(level, bool) or not isinstance(level, int) or not 0 <= level <= MAX_PRIORITY:
                raise RuleError(f"level_weights: priorities must be whole numbers from 0 to {MAX_PRIORITY}")
            value = _number(f"level_weights[{level}]", level_weight)
            if not 0 < value <= MAX_WEIGHT:
                raise RuleError(f"level_weights: weights must be above 0 and at most {MAX_WEIGHT:g}")
            levels.append((level, value))
        if len({level for level, _ in levels}) != len(levels):
            raise RuleError("level_weights: each priority once")
        object.__setattr__(self, "level_weights", tuple(sorted(levels)))

    @property
    def is_pattern(self) -> bool:
        return is_pattern_key(self.key)

    @property
    def is_plain(self) -> bool:
        """Only a main bucket, enforced: the partition's fast path."""
        return not (self.limits or self.shadow or self.parent is not None)

    @property
    def admits_anything(self) -> bool:
        """False for a deny-all rule (capacity 0, rate 0)."""
        return self.capacity > 0

    def with_key(self, key: str) -> Rule:
        return replace(self, key=key)

    def policy_dict(self) -> dict[str, Any]:
        """The fields beyond the main bucket that differ from their defaults (JSON-ready; empty for old rules)."""
        data: dict[str, Any] = {}
        if self.limits:
            data["limits"] = [limit.to_dict() for limit in self.limits]
        if self.shadow:
            data["shadow"] = True
        if self.precedence:
            data["precedence"] = self.precedence
        if self.parent is not None:
            data["parent"] = self.parent
        if self.weight != 1.0:
            data["weight"] = self.weight
        if self.priority:
            data["priority"] = self.priority
        if self.share != "weighted":
            data["share"] = self.share
        if self.level_weights:
            data["level_weights"] = {str(level): weight for level, weight in self.level_weights}
        return data

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "capacity": self.capacity, "rate": self.rate, **self.policy_dict()}

    @classmethod
    def from_parts(cls, key: str, capacity: int, rate: float, policy: Mapping[str, Any] | None = None) -> Rule:
        """A rule from a store row: the main bucket's columns and the policy column (``policy_dict``)."""
        if not policy:
            return cls(key, capacity, rate)
        return cls.from_dict({**policy, "key": key, "capacity": capacity, "rate": rate})

    @classmethod
    def from_dict(cls, data: object, *, key: str | None = None) -> Rule:
        """Build a rule from a mapping such as a JSON body; ``key`` overrides ``data["key"]``."""
        if not isinstance(data, dict):
            raise RuleError("a rule must be an object with key, capacity and rate")
        unknown = set(data) - {"key", "capacity", "rate", *POLICY_FIELDS}
        if unknown:
            raise RuleError(f"unknown rule field(s): {', '.join(sorted(map(str, unknown)))}")
        for name in ("capacity", "rate"):
            if name not in data or data[name] in (None, ""):
                raise RuleError(f"{name} is required")
        options: dict[str, Any] = {name: data[name] for name in POLICY_FIELDS if name in data}
        if "limits" in options:
            limits = options["limits"]
            if not isinstance(limits, list):
                raise RuleError("limits must be a list of limits")
            try:
                options["limits"] = tuple(Limit.from_dict(item, index=i + 1) for i, item in enumerate(limits))
            except LimitError as exc:
                raise RuleError(f"limits: {exc}") from exc
        if "level_weights" in options:
            levels = options["level_weights"]
            if not isinstance(levels, dict):
                raise RuleError('level_weights must be an object like {"2": 4, "1": 2, "0": 1}')
            parsed = []
            for level, weight in levels.items():
                if not (isinstance(level, int) or (isinstance(level, str) and level.isascii() and level.isdigit())):
                    raise RuleError(f"level_weights: {level!r} is not a priority (a whole number)")
                parsed.append((int(level), weight))
            options["level_weights"] = tuple(parsed)
        return cls(key if key is not None else data.get("key"), data["capacity"], data["rate"], **options)  # type: ignore[arg-type]


def default_rule(capacity: int, rate: float) -> Rule:
    """The rule unknown keys get; ``default_rule(0, 0)`` denies everything."""
    return Rule(DEFAULT_RULE_KEY, capacity, rate)


DENY_ALL = default_rule(0, 0)
