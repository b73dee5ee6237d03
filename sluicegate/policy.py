"""One key's policy beyond its main bucket: extra limits, shadow limits, a share of a parent. Pure.

The partition keeps a :class:`~sluicegate.bucket.Bucket` per key (the main
limit, ``"rate"``) and, only for keys whose rule asks for more, a
:class:`KeyPolicy`. :func:`decide` then answers a check:

* every limit that is not a shadow must have room, or the check is denied:
  the answer names the limit that frees last and says when (nothing is
  charged);
* otherwise every limit with room is charged (shadow ones too, so a shadow
  limit's state is what it would be if it were enforced), and a shadow limit
  without room is reported as ``would_deny`` with its name;
* a child of a parent also needs room in its share (``"share"``); its demand
  is recorded only when its own limits have room, so it never claims more
  than its own ceiling.

Example:
    >>> from sluicegate.bucket import Bucket
    >>> from sluicegate.rules import Rule
    >>> rule = Rule.from_dict({"key": "k", "capacity": 10, "rate": 10, "limits": [{"quota": 2, "per": "day"}]})
    >>> policy, bucket = KeyPolicy(rule, wall_ns=0), Bucket(rule, now_ns=0)
    >>> [decide(policy, bucket, 1, now_ns=0, wall_ns=0)[5] for _ in range(3)]
    [b'', b'', b'day']
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from sluicegate import codec
from sluicegate.bucket import Bucket
from sluicegate.limits import Limit
from sluicegate.quota import QuotaCounter
from sluicegate.rules import CREDIT_SCALE, DEFAULT_RULE_KEY, MAIN_LIMIT, NEVER_MS, Rule

if TYPE_CHECKING:
    from sluicegate.shares import ShareGroup

SHARE_LIMIT = b"share"
_MAIN = MAIN_LIMIT.encode()
Result = tuple[int, int, int, int, int, bytes]  # the codec's reply item


def _limit_bucket(limit: Limit, now_ns: int) -> Bucket:
    # A Bucket runs on a Rule; the placeholder key skips key validation.
    return Bucket(Rule(DEFAULT_RULE_KEY, limit.capacity, limit.rate), now_ns)


class KeyPolicy:
    """The state of a key's extra limits (same order as ``rule.limits``) and its share membership."""

    __slots__ = ("group", "member", "names", "rule", "states")

    def __init__(self, rule: Rule, *, wall_ns: int, now_ns: int = 0, saved_quotas: str = "") -> None:
        self.rule = rule
        self.names = [limit.name.encode() for limit in rule.limits]
        saved = decode_quotas(saved_quotas)
        self.states: list[Bucket | QuotaCounter | None] = []
        for limit in rule.limits:
            if limit.is_concurrency:
                self.states.append(None)  # leases live in the partition's admission state, not here
            elif limit.is_quota:
                window_start, used = saved.get(limit.name, (None, 0))
                self.states.append(QuotaCounter(limit, wall_ns, window_start_ns=window_start, used=used))
            else:
                self.states.append(_limit_bucket(limit, now_ns))
        self.group: ShareGroup | None = None
        self.member: Any = None

    def adopt(self, old: KeyPolicy, now_ns: int) -> None:
        """Keep the state of limits that kept their name and kind across a rule change."""
        previous = {limit.name: (limit, state) for limit, state in zip(old.rule.limits, old.states, strict=True)}
        for index, limit in enumerate(self.rule.limits):
            found = previous.get(limit.name)
            if found is None or found[0].is_quota != limit.is_quota or found[1] is None or limit.is_concurrency:
                continue
            state = found[1]
            if isinstance(state, QuotaCounter):
                fresh = self.states[index]
                assert isinstance(fresh, QuotaCounter)
                fresh.window_start_ns, fresh.used = state.window_start_ns, state.used
            else:
                state.set_rule(Rule(DEFAULT_RULE_KEY, limit.capacity, limit.rate), now_ns)
                self.states[index] = state

    def quotas(self) -> tuple[str, int]:
        """``(state, expires_ns)`` of the quota counters for a checkpoint ("" and 0 if none used)."""
        used = [
            (limit.name, state)
            for limit, state in zip(self.rule.limits, self.states, strict=True)
            if isinstance(state, QuotaCounter) and state.used
        ]
        if not used:
            return "", 0
        state = encode_quotas((name, counter.window_start_ns, counter.used) for name, counter in used)
        return state, max(counter.window_end_ns for _, counter in used)


def encode_quotas(counters: Iterator[tuple[str, int, int]] | list[tuple[str, int, int]]) -> str:
    """Checkpoint text of quota counters: ``[[name, window_start_ns, used], ...]``."""
    return json.dumps([list(counter) for counter in counters], separators=(",", ":"))


def decode_quotas(text: str) -> dict[str, tuple[int, int]]:
    """``{name: (window_start_ns, used)}`` from :func:`encode_quotas` text; unreadable text is no state."""
    if not text:
        return {}
    try:
        return {str(name): (int(start), int(used)) for name, start, used in json.loads(text)}
    except (ValueError, TypeError):
        return {}


def decide(policy: KeyPolicy, bucket: Bucket, cost: int, *, now_ns: int, wall_ns: int) -> Result:
    """Charge ``cost`` if every enforced limit has room; the reply item either way."""
    rule = policy.rule
    shadow_all = rule.shadow
    need = cost * CREDIT_SCALE
    blocked: list[tuple[bytes, int, int, int, int]] = []  # (name, retry, remaining, capacity, window)
    would: bytes = b""
    bucket.refill(now_ns)
    main_room = bucket.credit >= need
    if not main_room:
        entry = (_MAIN, bucket.retry_after_ms(cost, now_ns), bucket.remaining, rule.capacity, rule.window_ms)
        if shadow_all:
            would = _MAIN
        else:
            blocked.append(entry)
    rooms: list[bool] = []
    for limit, name, state in zip(rule.limits, policy.names, policy.states, strict=True):
        if state is None:  # a concurrency limit: acquires only
            rooms.append(False)
            continue
        if isinstance(state, QuotaCounter):
            room = state.has_room(cost, wall_ns)
        else:
            state.refill(now_ns)
            room = state.credit >= need
        rooms.append(room)
        if room:
            continue
        if shadow_all or limit.shadow:
            would = would or name
        else:
            blocked.append((name, *_describe(state, cost, now_ns, wall_ns)))
    group, member = policy.group, policy.member
    share_room = True
    if group is not None:
        if not blocked:
            group.record_demand(member, cost, now_ns)
        share_room = group.has_room(member, cost, now_ns)
        if not share_room:
            if shadow_all:
                would = would or SHARE_LIMIT
            else:
                retry = group.retry_after_ms(member, cost, now_ns)
                blocked.append((SHARE_LIMIT, retry, group.remaining(member), rule.capacity, rule.window_ms))
    if blocked:
        # Admitted only when all of them have room: the answer is the one that frees last.
        name, retry, remaining, capacity, window = max(blocked, key=lambda entry: entry[1])
        return codec.STATUS_DENIED, remaining, retry, capacity, window, name
    if main_room:
        bucket.credit -= need
    for room, state in zip(rooms, policy.states, strict=True):
        if room and state is not None:
            if isinstance(state, QuotaCounter):
                state.charge(cost)
            else:
                state.credit -= need
    if group is not None and share_room:
        group.charge(member, cost, now_ns)
    status = codec.STATUS_ALLOWED | (codec.FLAG_WOULD_DENY if would else 0)
    return status, bucket.remaining, 0, rule.capacity, rule.window_ms, would


def _describe(state: Bucket | QuotaCounter, cost: int, now_ns: int, wall_ns: int) -> tuple[int, int, int, int]:
    """``(retry_after_ms, remaining, capacity, window_ms)`` of an extra limit without room."""
    if isinstance(state, QuotaCounter):
        limit = state.limit
        window_ms = min(NEVER_MS, (state.window_end_ns - state.window_start_ns) // 1_000_000)
        return state.retry_after_ms(cost, wall_ns), state.remaining(wall_ns), limit.quota, window_ms
    return state.retry_after_ms(cost, now_ns), state.remaining, state.rule.capacity, state.rule.window_ms
