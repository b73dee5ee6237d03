"""Calendar quota windows (edges, offsets, month lengths, leap days) and the quota counter."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from sluicegate.limits import Limit
from sluicegate.quota import DAY_NS, HOUR_NS, MINUTE_NS, QuotaCounter, window_bounds
from sluicegate.rules import NEVER_MS

SECOND = 1_000_000_000


def ns(text: str) -> int:
    """Epoch ns of an ISO time with its offset, e.g. ``2024-02-29T23:59:59+05:30``."""
    moment = datetime.fromisoformat(text)
    assert moment.tzinfo is not None
    delta = moment - datetime(1970, 1, 1, tzinfo=UTC)
    return (delta.days * 86_400 + delta.seconds) * SECOND + delta.microseconds * 1000


def bounds(text: str, per: str, offset: int = 0) -> tuple[str, str]:
    """window_bounds of an ISO time, as ISO times on the window's own clock (readable assertions)."""
    start, end = window_bounds(ns(text), per, offset)
    zone = timezone(timedelta(minutes=offset))

    def show(value: int) -> str:
        assert value % SECOND == 0
        return datetime.fromtimestamp(value // SECOND, zone).isoformat()

    return show(start), show(end)


class TestWindowBounds:
    @pytest.mark.parametrize(
        ("moment", "per", "expected"),
        [
            ("2025-03-14T15:09:26.5+00:00", "minute", ("2025-03-14T15:09:00+00:00", "2025-03-14T15:10:00+00:00")),
            ("2025-03-14T15:09:26+00:00", "hour", ("2025-03-14T15:00:00+00:00", "2025-03-14T16:00:00+00:00")),
            ("2025-03-14T15:09:26+00:00", "day", ("2025-03-14T00:00:00+00:00", "2025-03-15T00:00:00+00:00")),
            # 2025-03-14 is a Friday: its ISO week runs Monday 10th to Monday 17th.
            ("2025-03-14T15:09:26+00:00", "week", ("2025-03-10T00:00:00+00:00", "2025-03-17T00:00:00+00:00")),
            ("2025-03-14T15:09:26+00:00", "month", ("2025-03-01T00:00:00+00:00", "2025-04-01T00:00:00+00:00")),
            ("2025-12-31T23:59:59+00:00", "month", ("2025-12-01T00:00:00+00:00", "2026-01-01T00:00:00+00:00")),
        ],
    )
    def test_each_period_in_utc(self, moment: str, per: str, expected: tuple[str, str]) -> None:
        assert bounds(moment, per) == expected

    @pytest.mark.parametrize("per", ["minute", "hour", "day", "week", "month"])
    def test_an_edge_belongs_to_the_window_it_starts(self, per: str) -> None:
        start, end = window_bounds(ns("2025-06-18T12:34:56+00:00"), per, 0)
        assert window_bounds(start, per, 0) == (start, end)
        assert window_bounds(end - 1, per, 0) == (start, end)
        assert window_bounds(end, per, 0)[0] == end
        assert window_bounds(start - 1, per, 0)[1] == start

    @pytest.mark.parametrize(
        ("month", "days"),
        [("2025-01", 31), ("2025-02", 28), ("2024-02", 29), ("2000-02", 29), ("1900-02", 28), ("2025-04", 30)],
    )
    def test_month_lengths_and_leap_years(self, month: str, days: int) -> None:
        start, end = window_bounds(ns(f"{month}-15T12:00:00+00:00"), "month", 0)
        assert (end - start) // DAY_NS == days
        assert start == ns(f"{month}-01T00:00:00+00:00")

    def test_leap_day_is_its_own_day_and_in_february(self) -> None:
        assert bounds("2024-02-29T08:00:00+00:00", "day") == ("2024-02-29T00:00:00+00:00", "2024-03-01T00:00:00+00:00")
        assert bounds("2024-02-29T23:59:59+00:00", "month")[1] == "2024-03-01T00:00:00+00:00"

    def test_positive_offset_moves_the_day_edge_earlier_in_utc(self) -> None:
        # 20:00 UTC is already the next day at +05:30.
        assert bounds("2025-03-14T20:00:00+00:00", "day", 330) == (
            "2025-03-15T00:00:00+05:30",
            "2025-03-16T00:00:00+05:30",
        )
        start, _ = window_bounds(ns("2025-03-14T20:00:00+00:00"), "day", 330)
        assert start == ns("2025-03-14T18:30:00+00:00")

    def test_negative_offset_week_and_month(self) -> None:
        # Monday 03:00 UTC is still Sunday at -08:00: the previous ISO week there.
        assert bounds("2025-03-17T03:00:00+00:00", "week", -480) == (
            "2025-03-10T00:00:00-08:00",
            "2025-03-17T00:00:00-08:00",
        )
        # 1 March 05:00 UTC is still February (28 days in 2025) at -08:00.
        assert bounds("2025-03-01T05:00:00+00:00", "month", -480) == (
            "2025-02-01T00:00:00-08:00",
            "2025-03-01T00:00:00-08:00",
        )

    def test_hour_with_a_half_hour_offset(self) -> None:
        # 15:10 UTC is 20:40 at +05:30: the hour there began at 14:30 UTC.
        assert bounds("2025-03-14T15:10:00+00:00", "hour", 330) == (
            "2025-03-14T20:00:00+05:30",
            "2025-03-14T21:00:00+05:30",
        )

    @pytest.mark.parametrize("per", ["minute", "hour", "day", "week", "month"])
    @pytest.mark.parametrize("offset", [-840, -480, -90, 0, 345, 840])
    def test_window_edges_are_calendar_midnights_over_two_years(self, per: str, offset: int) -> None:
        """Walk window after window through 2023-2024 and compare every edge with datetime's calendar."""
        zone = timezone(timedelta(minutes=offset))
        step = {"minute": 997 * MINUTE_NS, "hour": 37 * HOUR_NS}.get(per, DAY_NS // 3)
        wall = ns("2023-01-01T00:00:00+00:00")
        stop_at = ns("2025-01-01T00:00:00+00:00")
        while wall < stop_at:
            start, end = window_bounds(wall, per, offset)
            assert start <= wall < end
            local = datetime.fromtimestamp(start // SECOND, zone)
            assert (local.second, local.microsecond) == (0, 0)
            if per != "minute":
                assert local.minute == 0
            if per in ("day", "week", "month"):
                assert local.hour == 0
            if per == "week":
                assert local.weekday() == 0
                assert end - start == 7 * DAY_NS
            if per == "month":
                assert local.day == 1
                following = datetime.fromtimestamp(end // SECOND, zone)
                assert (following.day, following.month) == (1, local.month % 12 + 1)
            # Windows tile the time line: the next starts where this one ends.
            assert window_bounds(end, per, offset)[0] == end
            assert window_bounds(start - 1, per, offset)[1] == start
            wall += step

    def test_before_1970_floors_rather_than_truncates(self) -> None:
        assert bounds("1969-12-31T23:59:59+00:00", "day") == ("1969-12-31T00:00:00+00:00", "1970-01-01T00:00:00+00:00")
        assert bounds("1969-12-31T23:59:59+00:00", "week") == (
            "1969-12-29T00:00:00+00:00",
            "1970-01-05T00:00:00+00:00",
        )

    def test_bad_period_and_out_of_calendar_time_are_errors(self) -> None:
        with pytest.raises(ValueError, match="per must be one of"):
            window_bounds(0, "year", 0)
        with pytest.raises(ValueError, match="outside the calendar"):
            window_bounds(400 * 365 * 25 * DAY_NS, "month", 0)


def daily(quota: int = 3, offset: int = 0) -> Limit:
    return Limit("daily", quota=quota, per="day", offset_minutes=offset)


class TestQuotaCounter:
    def test_counts_up_to_the_quota_then_refuses_until_the_edge(self) -> None:
        noon = ns("2025-03-14T12:00:00+00:00")
        counter = QuotaCounter(daily(3), noon)
        for i in range(3):
            assert counter.has_room(1, noon + i)
            counter.charge(1)
        assert not counter.has_room(1, noon + 5)
        assert counter.remaining(noon + 5) == 0
        assert counter.retry_after_ms(1, noon) == 12 * 3600 * 1000
        midnight = ns("2025-03-15T00:00:00+00:00")
        assert not counter.has_room(1, midnight - 1)
        assert counter.has_room(1, midnight)
        assert counter.used == 0
        assert counter.window_start_ns == midnight
        assert counter.remaining(midnight) == 3

    def test_cost_counts_whole(self) -> None:
        counter = QuotaCounter(daily(10), 0)
        assert counter.has_room(7, 0)
        counter.charge(7)
        assert not counter.has_room(4, 0)
        assert counter.has_room(3, 0)
        assert counter.retry_after_ms(4, 0) == DAY_NS // 1_000_000
        assert counter.retry_after_ms(3, 0) == 0

    def test_a_cost_above_the_quota_never_fits(self) -> None:
        counter = QuotaCounter(daily(5), 0)
        assert not counter.has_room(6, 0)
        assert counter.retry_after_ms(6, 0) == NEVER_MS

    def test_retry_after_rounds_up_and_is_at_least_one_ms(self) -> None:
        counter = QuotaCounter(Limit("m", quota=1, per="minute"), 0)
        counter.charge(1)
        assert counter.retry_after_ms(1, MINUTE_NS - 1) == 1
        assert counter.retry_after_ms(1, MINUTE_NS - 1_500_000) == 2

    def test_window_follows_the_offset(self) -> None:
        # Quota days at +02:00 end at 22:00 UTC.
        evening = ns("2025-03-14T21:00:00+00:00")
        counter = QuotaCounter(daily(1, offset=120), evening)
        counter.charge(1)
        assert counter.expires_ns(evening) == ns("2025-03-14T22:00:00+00:00")
        assert not counter.has_room(1, ns("2025-03-14T21:59:59+00:00"))
        assert counter.has_room(1, ns("2025-03-14T22:00:00+00:00"))

    def test_restore_within_the_same_window_keeps_what_was_used(self) -> None:
        morning = ns("2025-03-14T08:00:00+00:00")
        saved = QuotaCounter(daily(3), morning)
        saved.charge(2)
        restored = QuotaCounter(daily(3), morning + HOUR_NS, window_start_ns=saved.window_start_ns, used=saved.used)
        assert restored.used == 2
        assert restored.remaining(morning + HOUR_NS) == 1
        assert restored.expires_ns(morning + HOUR_NS) == ns("2025-03-15T00:00:00+00:00")

    def test_restore_across_the_window_edge_starts_empty(self) -> None:
        late = ns("2025-03-14T23:59:00+00:00")
        saved = QuotaCounter(daily(3), late)
        saved.charge(3)
        after_midnight = ns("2025-03-15T00:00:30+00:00")
        restored = QuotaCounter(daily(3), after_midnight, window_start_ns=saved.window_start_ns, used=saved.used)
        assert restored.used == 0
        assert restored.window_start_ns == ns("2025-03-15T00:00:00+00:00")
        assert restored.remaining(after_midnight) == 3

    def test_restore_from_a_clock_ahead_keeps_what_was_used(self) -> None:
        # The checkpoint writer's clock was already past midnight; ours is not: do not forget the spending.
        ahead = QuotaCounter(daily(3), ns("2025-03-15T00:00:01+00:00"))
        ahead.charge(2)
        ours = ns("2025-03-14T23:59:59+00:00")
        restored = QuotaCounter(daily(3), ours, window_start_ns=ahead.window_start_ns, used=ahead.used)
        assert restored.remaining(ours) == 1
        assert restored.window_start_ns == ns("2025-03-14T00:00:00+00:00")

    def test_adopting_an_old_window_rolls_forward_on_next_access(self) -> None:
        """The partition adopts a counter by setting window_start_ns and used: a passed window is void."""
        yesterday = ns("2025-03-13T10:00:00+00:00")
        today = ns("2025-03-14T10:00:00+00:00")
        fresh = QuotaCounter(daily(3), today)
        fresh.window_start_ns, fresh.used = window_bounds(yesterday, "day", 0)[0], 3
        assert fresh.window_end_ns == ns("2025-03-14T00:00:00+00:00")
        assert fresh.has_room(1, today)
        assert fresh.used == 0

    def test_a_wall_clock_stepping_back_does_not_reopen_the_previous_window(self) -> None:
        midnight = ns("2025-03-15T00:00:00+00:00")
        counter = QuotaCounter(daily(2), midnight + SECOND)
        counter.charge(2)
        assert not counter.has_room(1, midnight - SECOND)  # NTP stepped back 2 s: still today's count
        assert counter.window_start_ns == midnight

    def test_quota_lowered_below_usage_reports_zero_remaining(self) -> None:
        counter = QuotaCounter(daily(1), 0, window_start_ns=0, used=5)
        assert counter.remaining(0) == 0
        assert not counter.has_room(1, 0)

    def test_monthly_quota_resets_on_the_first_after_a_leap_february(self) -> None:
        counter = QuotaCounter(Limit("monthly", quota=1, per="month"), ns("2024-02-10T00:00:00+00:00"))
        counter.charge(1)
        assert not counter.has_room(1, ns("2024-02-29T23:59:59+00:00"))
        assert counter.retry_after_ms(1, ns("2024-02-29T00:00:00+00:00")) == 86_400_000
        assert counter.has_room(1, ns("2024-03-01T00:00:00+00:00"))

    def test_a_bucket_limit_is_refused(self) -> None:
        with pytest.raises(ValueError, match="is a bucket"):
            QuotaCounter(Limit("b", capacity=1, rate=1), 0)
