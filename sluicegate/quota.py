"""Calendar quotas: a count per minute/hour/day/week/month, reset at the window's edge. Pure.

A quota window is a calendar unit on the clock UTC + ``offset_minutes``: a
minute, an hour, a day, an ISO week (Monday 00:00 to Monday 00:00) or a
month (28 to 31 days, leap years included). Windows are computed from the
wall clock (epoch nanoseconds, passed in), not the monotonic clock buckets
use, because their edges are dates. Fixed offsets only: no daylight saving.

Example:
    >>> from sluicegate.limits import Limit
    >>> day = 86_400 * 10**9
    >>> window_bounds(day + 5, "day", 0) == (day, 2 * day)
    True
    >>> counter = QuotaCounter(Limit("daily", quota=2, per="day"), wall_ns=day)
    >>> for _ in range(2):
    ...     counter.charge(1)
    >>> counter.has_room(1, day + 1), counter.retry_after_ms(1, day + 1)
    (False, 86400000)
    >>> counter.has_room(1, 2 * day)  # the next day starts empty
    True
"""

from __future__ import annotations

import math
from datetime import date

from sluicegate.limits import PERIODS, Limit
from sluicegate.rules import NEVER_MS

MINUTE_NS = 60 * 1_000_000_000
HOUR_NS = 60 * MINUTE_NS
DAY_NS = 24 * HOUR_NS
WEEK_NS = 7 * DAY_NS
_FIXED_NS = {"minute": MINUTE_NS, "hour": HOUR_NS, "day": DAY_NS}
_EPOCH_ORDINAL = date(1970, 1, 1).toordinal()
_EPOCH_WEEKDAY = date(1970, 1, 1).weekday()  # 3: a Thursday (Monday is 0)


def window_bounds(wall_ns: int, per: str, offset_minutes: int) -> tuple[int, int]:
    """``[start, end)`` in epoch ns of the ``per`` window containing ``wall_ns`` on the clock UTC+``offset_minutes``.

    Raises ValueError for an unknown period or a date outside years 1 to 9999.

    Example:
        >>> start, end = window_bounds(0, "month", 0)  # January 1970
        >>> (end - start) // DAY_NS
        31
    """
    if per not in PERIODS:
        raise ValueError(f"per must be one of {', '.join(PERIODS)}, got {per!r}")
    offset_ns = offset_minutes * MINUTE_NS
    local_ns = wall_ns + offset_ns
    size = _FIXED_NS.get(per)
    if size is not None:
        start = local_ns - local_ns % size  # floor, also before 1970
        return start - offset_ns, start + size - offset_ns
    days = local_ns // DAY_NS
    if per == "week":
        monday = days - (days + _EPOCH_WEEKDAY) % 7
        return monday * DAY_NS - offset_ns, (monday + 7) * DAY_NS - offset_ns
    try:
        today = date.fromordinal(_EPOCH_ORDINAL + days)
        first = today.replace(day=1)
        following = date(first.year + 1, 1, 1) if first.month == 12 else date(first.year, first.month + 1, 1)
    except (ValueError, OverflowError) as exc:
        raise ValueError(f"wall time {wall_ns} ns is outside the calendar (years 1 to 9999)") from exc
    start_day, end_day = first.toordinal() - _EPOCH_ORDINAL, following.toordinal() - _EPOCH_ORDINAL
    return start_day * DAY_NS - offset_ns, end_day * DAY_NS - offset_ns


class QuotaCounter:
    """What a key spent of one quota limit in the current window.

    The window rolls forward lazily at each access with a wall time at or after
    its end. A wall clock that steps back never rolls it back (that would
    forget what was spent): the current window stays until the clock passes
    its end again.

    ``window_start_ns`` and ``used`` are what a checkpoint saves; setting
    ``window_start_ns`` (a restored or adopted counter) moves the window to the
    one containing it, and the next access rolls it forward if it has passed.

    Example:
        >>> counter = QuotaCounter(Limit("m", quota=10, per="minute"), wall_ns=0, window_start_ns=0, used=4)
        >>> counter.remaining(30 * 10**9), counter.remaining(60 * 10**9)
        (6, 10)
    """

    __slots__ = ("_start", "limit", "used", "window_end_ns")

    def __init__(self, limit: Limit, wall_ns: int, *, window_start_ns: int | None = None, used: int = 0) -> None:
        if not limit.is_quota:
            raise ValueError(f"limit {limit.name!r} is a bucket, not a quota")
        self.limit = limit
        start, end = window_bounds(wall_ns, limit.per, limit.offset_minutes)
        self._start, self.window_end_ns, self.used = start, end, 0
        if window_start_ns is not None and window_start_ns >= start:
            # The saved window is this one, or one a clock ahead of ours already started: keep what was
            # spent (counting it in this window too is safer than forgetting it). A passed window starts empty.
            self.used = max(0, used)

    @property
    def window_start_ns(self) -> int:
        return self._start

    @window_start_ns.setter
    def window_start_ns(self, start_ns: int) -> None:
        limit = self.limit
        self._start = start_ns
        self.window_end_ns = window_bounds(start_ns, limit.per, limit.offset_minutes)[1]

    def roll(self, wall_ns: int) -> None:
        """Start the window containing ``wall_ns``, empty, if the current one has ended."""
        if wall_ns >= self.window_end_ns:
            limit = self.limit
            self._start, self.window_end_ns = window_bounds(wall_ns, limit.per, limit.offset_minutes)
            self.used = 0

    def has_room(self, cost: int, wall_ns: int) -> bool:
        """Whether ``cost`` more fits in the window containing ``wall_ns``."""
        self.roll(wall_ns)
        return self.used + cost <= self.limit.quota

    def charge(self, cost: int) -> None:
        """Count ``cost`` in the current window (call :meth:`has_room` first: it rolls the window)."""
        self.used += cost

    def remaining(self, wall_ns: int) -> int:
        """What is left in the window containing ``wall_ns`` (0, never negative, after a quota cut)."""
        self.roll(wall_ns)
        return max(0, self.limit.quota - self.used)

    def retry_after_ms(self, cost: int, wall_ns: int) -> int:
        """0 if ``cost`` fits now; else ms to the window's end if it fits a fresh window; else ``NEVER_MS``."""
        if self.has_room(cost, wall_ns):
            return 0
        if cost > self.limit.quota:
            return NEVER_MS
        return min(NEVER_MS, max(1, math.ceil((self.window_end_ns - wall_ns) / 1_000_000)))

    def expires_ns(self, wall_ns: int) -> int:
        """The end of the current window: after it, a checkpoint of this counter is void."""
        self.roll(wall_ns)
        return self.window_end_ns
