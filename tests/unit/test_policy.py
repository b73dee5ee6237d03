"""A key's policy beyond its main bucket (sluicegate.policy), on the pure core with a controlled clock."""

from __future__ import annotations

from sluicegate import codec
from sluicegate.bucket import Bucket
from sluicegate.policy import KeyPolicy, decide, decode_quotas
from sluicegate.quota import DAY_NS
from sluicegate.rules import Rule

SECOND = 10**9
DAY0 = 20_000 * DAY_NS  # a midnight, UTC


def make(rule: dict, *, wall_ns: int = DAY0, quotas: str = "") -> tuple[KeyPolicy, Bucket]:
    parsed = Rule.from_dict({"key": "k", **rule})
    return KeyPolicy(parsed, wall_ns=wall_ns, now_ns=0, saved_quotas=quotas), Bucket(parsed, now_ns=0)


def test_rate_plus_daily_quota_names_the_limit_that_denies_and_when_it_frees() -> None:
    policy, bucket = make({"capacity": 10, "rate": 10, "limits": [{"name": "daily", "quota": 250, "per": "day"}]})
    now = wall = 0
    for _ in range(250):
        now += SECOND // 10
        status, *_ = decide(policy, bucket, 1, now_ns=now, wall_ns=DAY0 + now)
        assert status == codec.STATUS_ALLOWED
    status, remaining, retry, capacity, window, limit = decide(policy, bucket, 1, now_ns=now, wall_ns=DAY0 + now)
    assert (status, limit, remaining, capacity) == (codec.STATUS_DENIED, b"daily", 0, 250)
    assert retry == (DAY_NS - now) // 10**6 and window == DAY_NS // 10**6
    wall = DAY0 + DAY_NS  # midnight: a new day
    assert decide(policy, bucket, 1, now_ns=now + SECOND, wall_ns=wall)[0] == codec.STATUS_ALLOWED


def test_denied_by_several_the_answer_is_the_one_that_frees_last_and_nothing_is_charged() -> None:
    policy, bucket = make({"capacity": 2, "rate": 1, "limits": [{"name": "slow", "capacity": 2, "rate": 0.1}]})
    decide(policy, bucket, 2, now_ns=0, wall_ns=DAY0)
    status, _, retry, _, _, limit = decide(policy, bucket, 1, now_ns=0, wall_ns=DAY0)
    assert status == codec.STATUS_DENIED and limit == b"slow" and retry == 10_000  # not "rate" (1 s)
    # One second later the main bucket has room again but "slow" does not: still denied, nothing charged.
    status, remaining, *_ = decide(policy, bucket, 1, now_ns=SECOND, wall_ns=DAY0)
    assert status == codec.STATUS_DENIED and bucket.credit == 1 * 10**9


def test_a_shadow_limit_never_denies_and_keeps_the_state_it_would_have() -> None:
    shadowed, main = make(
        {"capacity": 100, "rate": 100, "limits": [{"name": "try", "capacity": 3, "rate": 1, "shadow": True}]}
    )
    twin = Bucket(Rule("twin", 3, 1), now_ns=0)
    would = denied = 0
    for step in range(200):
        now = step * SECOND // 4
        status, *_, limit = decide(shadowed, main, 1, now_ns=now, wall_ns=DAY0)
        assert status & codec.STATUS_MASK == codec.STATUS_ALLOWED
        if status & codec.FLAG_WOULD_DENY:
            would += 1
            assert limit == b"try"
        denied += not twin.take(1, now)
    assert would == denied > 50


def test_a_shadow_rule_admits_everything_and_reports_its_main_bucket() -> None:
    policy, bucket = make({"capacity": 1, "rate": 0, "shadow": True})
    decide(policy, bucket, 1, now_ns=0, wall_ns=DAY0)
    status, *_, limit = decide(policy, bucket, 1, now_ns=0, wall_ns=DAY0)
    assert status == codec.STATUS_ALLOWED | codec.FLAG_WOULD_DENY and limit == b"rate"


def test_quota_state_survives_a_checkpoint_within_its_window_only() -> None:
    rule = {"capacity": 100, "rate": 100, "limits": [{"name": "daily", "quota": 5, "per": "day", "offset": "+02:00"}]}
    policy, bucket = make(rule)
    for _ in range(4):
        decide(policy, bucket, 1, now_ns=0, wall_ns=DAY0)
    text, until = policy.quotas()
    assert decode_quotas(text)["daily"][1] == 4
    assert until == DAY0 + DAY_NS - 2 * 3600 * SECOND  # local midnight at UTC+2
    restored, bucket = make(rule, quotas=text)
    assert decide(restored, bucket, 1, now_ns=0, wall_ns=DAY0)[0] == codec.STATUS_ALLOWED
    assert decide(restored, bucket, 1, now_ns=0, wall_ns=DAY0)[5] == b"daily"
    stale, bucket = make(rule, wall_ns=until + 1, quotas=text)  # restored after its window ended
    assert stale.quotas() == ("", 0)


def test_a_rule_change_keeps_the_state_of_limits_that_kept_their_name() -> None:
    policy, bucket = make({"capacity": 10, "rate": 10, "limits": [{"name": "daily", "quota": 5, "per": "day"}]})
    for _ in range(3):
        decide(policy, bucket, 1, now_ns=0, wall_ns=DAY0)
    changed = KeyPolicy(
        Rule.from_dict(
            {"key": "k", "capacity": 10, "rate": 10, "limits": [{"name": "daily", "quota": 4, "per": "day"}]}
        ),
        wall_ns=DAY0,
    )
    changed.adopt(policy, now_ns=0)
    decide(changed, bucket, 1, now_ns=0, wall_ns=DAY0)
    assert decide(changed, bucket, 1, now_ns=0, wall_ns=DAY0)[5] == b"daily"  # 3 + 1 of 4 used
