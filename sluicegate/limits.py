"""The extra limits a rule may hold besides its main leaky bucket. Pure.

A limit is a leaky bucket (``capacity`` credits refilled at ``rate``/s), a
calendar quota (``quota`` checks per minute/hour/day/week/month, counted in
UTC or at a fixed UTC offset, reset at the window's edge) or a concurrency
limit (``concurrency`` leases in flight, taken by ``acquire`` and given back by
``release``; ``adaptive`` tunes it from reported waiting and service times,
OpenStack's Algorithm 1). Any may be ``shadow``: evaluated and reported
(``would_deny``), never enforced. Checks are decided by buckets and quotas;
acquires by all three.

JSON forms (the admin API, rule files)::

    {"name": "burst", "capacity": 20, "rate": 5}
    {"name": "daily", "quota": 250, "per": "day", "offset": "+02:00", "shadow": true}
    {"name": "inflight", "concurrency": 10}
    {"name": "db", "adaptive": {"min": 15, "kp": 15, "step": 5, "samples": 100}}

Example:
    >>> Limit.from_dict({"quota": 250, "per": "day"}).name
    'day'
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

PERIODS = ("minute", "hour", "day", "week", "month")
MAX_LIMITS = 8
MAX_QUOTA = 2**32 - 1
MAX_CONCURRENCY = 1_000_000
ADAPTIVE_DEFAULTS = {"min": 15, "kp": 15.0, "step": 5, "samples": 100}  # the paper's settings
MAX_OFFSET_MINUTES = 14 * 60  # UTC-14:00 .. UTC+14:00, the range of real time zones
_OFFSET = re.compile(r"([+-])(\d{2}):(\d{2})")


class LimitError(ValueError):
    """A limit is invalid; the message says which field and why."""


def parse_offset(value: object) -> int:
    """A UTC offset as minutes: ``"+05:30"``, ``"-08:00"``, ``"Z"``/``"UTC"`` or whole minutes."""
    if isinstance(value, bool):
        raise LimitError("offset must be like +02:00 or a number of minutes")
    if isinstance(value, int):
        minutes = value
    elif isinstance(value, str) and value.upper() in ("Z", "UTC", ""):
        minutes = 0
    elif isinstance(value, str) and (match := _OFFSET.fullmatch(value)):
        sign, hours, mins = match.groups()
        if int(mins) >= 60:
            raise LimitError(f"offset minutes must be below 60, got {value!r}")
        minutes = (int(hours) * 60 + int(mins)) * (-1 if sign == "-" else 1)
    else:
        raise LimitError(f"offset must be like +02:00 or a number of minutes, got {value!r}")
    if abs(minutes) > MAX_OFFSET_MINUTES:
        raise LimitError("offset must be within -14:00 and +14:00")
    return minutes


def format_offset(minutes: int) -> str:
    sign = "-" if minutes < 0 else "+"
    return f"{sign}{abs(minutes) // 60:02d}:{abs(minutes) % 60:02d}"


def _whole(name: str, value: object, maximum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise LimitError(f"{name} must be a whole number")
    if isinstance(value, float) and not value.is_integer():
        raise LimitError(f"{name} must be a whole number, got {value!r}")
    if not 0 <= value <= maximum:
        raise LimitError(f"{name} must be from 0 to {maximum}")
    return int(value)


@dataclass(frozen=True, slots=True)
class Limit:
    """One limit: a bucket (``capacity``, ``rate``) or a quota (``quota`` per ``per``)."""

    name: str
    capacity: int = 0  # bucket
    rate: float = 0.0  # bucket, credits per second
    quota: int = 0  # quota: checks' cost per window
    per: str = ""  # quota: minute | hour | day | week | month ("" for a bucket)
    offset_minutes: int = 0  # quota: the window's clock is UTC + this
    shadow: bool = False
    concurrency: int = 0  # concurrency: leases in flight (the start value of an adaptive limit)
    adaptive: tuple[int, float, int, int] | None = None  # (L_min, K_p, u, N) of Algorithm 1

    @property
    def is_quota(self) -> bool:
        return bool(self.per)

    @property
    def is_concurrency(self) -> bool:
        return self.concurrency > 0 or self.adaptive is not None

    def __post_init__(self) -> None:
        # The name travels in every reply that a limit decided (16 bytes on the wire).
        if not isinstance(self.name, str) or not 1 <= len(self.name.encode("utf-8", "replace")) <= 16:
            raise LimitError("a limit's name must be 1 to 16 UTF-8 bytes")
        if self.concurrency or self.adaptive is not None:
            self._check_concurrency()
        elif self.per:
            if self.per not in PERIODS:
                raise LimitError(f"per must be one of {', '.join(PERIODS)}, got {self.per!r}")
            object.__setattr__(self, "quota", _whole("quota", self.quota, MAX_QUOTA))
            if abs(self.offset_minutes) > MAX_OFFSET_MINUTES:
                raise LimitError("offset must be within -14:00 and +14:00")
        else:
            # Same bounds as a rule's main bucket.
            from sluicegate.rules import MAX_CAPACITY, MAX_RATE

            object.__setattr__(self, "capacity", _whole("capacity", self.capacity, MAX_CAPACITY))
            rate = self.rate
            if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not math.isfinite(rate) or rate < 0:
                raise LimitError(f"rate must be a finite number >= 0, got {rate!r}")
            if rate > MAX_RATE:
                raise LimitError(f"rate must be at most {MAX_RATE:g} per second")
            object.__setattr__(self, "rate", float(rate))

    def _check_concurrency(self) -> None:
        if self.adaptive is not None:
            minimum, kp, step, samples = self.adaptive
            for name, value, low in (("min", minimum, 1), ("step", step, 1), ("samples", samples, 1)):
                if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= MAX_CONCURRENCY:
                    raise LimitError(f"adaptive.{name} must be a whole number from {low} to {MAX_CONCURRENCY}")
            if isinstance(kp, bool) or not isinstance(kp, (int, float)) or not (math.isfinite(kp) and kp > 0):
                raise LimitError("adaptive.kp must be a number above 0")
            object.__setattr__(self, "adaptive", (minimum, float(kp), step, samples))
            if not self.concurrency:
                object.__setattr__(self, "concurrency", minimum)
        concurrency = _whole("concurrency", self.concurrency, MAX_CONCURRENCY)
        if concurrency < 1:
            raise LimitError("concurrency must be at least 1")
        object.__setattr__(self, "concurrency", concurrency)

    def to_dict(self) -> dict[str, Any]:
        if self.is_concurrency:
            data: dict[str, Any] = {"name": self.name, "concurrency": self.concurrency}
            if self.adaptive is not None:
                minimum, kp, step, samples = self.adaptive
                data["adaptive"] = {"min": minimum, "kp": kp, "step": step, "samples": samples}
        elif self.per:
            data = {"name": self.name, "quota": self.quota, "per": self.per}
            if self.offset_minutes:
                data["offset"] = format_offset(self.offset_minutes)
        else:
            data = {"name": self.name, "capacity": self.capacity, "rate": self.rate}
        if self.shadow:
            data["shadow"] = True
        return data

    @classmethod
    def from_dict(cls, data: object, *, index: int = 0) -> Limit:
        """A limit from its JSON form; ``index`` names an unnamed bucket (``limit<index>``)."""
        if not isinstance(data, dict):
            raise LimitError("a limit must be an object")
        if "concurrency" in data or "adaptive" in data:
            return cls._concurrency_from_dict(data, index)
        is_quota = "quota" in data or "per" in data
        if is_quota and ("capacity" in data or "rate" in data):
            raise LimitError("a limit is a bucket (capacity, rate) or a quota (quota, per), not both")
        allowed = {"name", "shadow", *(("quota", "per", "offset") if is_quota else ("capacity", "rate"))}
        unknown = set(data) - allowed
        if unknown:
            raise LimitError(f"unknown limit field(s): {', '.join(sorted(map(str, unknown)))}")
        shadow = data.get("shadow", False)
        if not isinstance(shadow, bool):
            raise LimitError("shadow must be true or false")
        if is_quota:
            for field in ("quota", "per"):
                if field not in data:
                    raise LimitError(f"a quota limit needs {field}")
            return cls(
                name=data.get("name", data["per"]),
                quota=data["quota"],
                per=data["per"],
                offset_minutes=parse_offset(data.get("offset", 0)),
                shadow=shadow,
            )
        for field in ("capacity", "rate"):
            if field not in data:
                raise LimitError(f"a bucket limit needs {field}")
        return cls(name=data.get("name", f"limit{index}"), capacity=data["capacity"], rate=data["rate"], shadow=shadow)

    @classmethod
    def _concurrency_from_dict(cls, data: dict[str, Any], index: int) -> Limit:
        unknown = set(data) - {"name", "shadow", "concurrency", "adaptive"}
        if unknown:
            raise LimitError(f"a concurrency limit has no field(s): {', '.join(sorted(map(str, unknown)))}")
        shadow = data.get("shadow", False)
        if not isinstance(shadow, bool):
            raise LimitError("shadow must be true or false")
        adaptive = data.get("adaptive")
        parsed = None
        if adaptive is not None:
            if adaptive is True:
                adaptive = {}
            if not isinstance(adaptive, dict) or set(adaptive) - set(ADAPTIVE_DEFAULTS):
                raise LimitError("adaptive must be true or an object with min, kp, step, samples")
            settings = {**ADAPTIVE_DEFAULTS, **adaptive}
            parsed = (settings["min"], settings["kp"], settings["step"], settings["samples"])
        concurrency = data.get("concurrency", 0)
        if parsed is None and (isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1):
            raise LimitError(f"concurrency must be a whole number of at least 1, got {concurrency!r}")
        return cls(
            name=data.get("name", f"limit{index}"),
            concurrency=concurrency,
            adaptive=parsed,
            shadow=shadow,
        )
