"""Weighted max-min fair shares of a parent's rate among its children, with priorities. Pure.

:func:`allocate` splits a rate among claims by weighted max-min fairness
(water-filling): a claimant asking less than its share gets all it asks, and
what it leaves is split among the others by weight, repeatedly. Priorities
come first: ``strict`` serves levels from the highest priority down;
``weighted`` splits the rate among levels by level weight (water-filling
again, so an idle level's part goes to the others) and then each level's part
among its claimants.

:class:`ShareGroup` applies it on a partition: each child of one parent rule
gets a share bucket refilled at its allocation, recomputed from the children's
recent demand (:class:`DemandMeter`); the parent's own bucket is charged too,
so the children together never exceed the parent rule.

Example:
    >>> allocate(1874, [Claim("A", 375, 0, 185), Claim("B", 937, 0, 1718), Claim("C", 562, 0, 557)])
    {'A': 185.0, 'B': 1132.0, 'C': 557.0}
    >>> allocate(250, [Claim("hi", 1, 2, 750), Claim("lo", 1, 0, 750)], mode="strict")
    {'hi': 250.0, 'lo': 0.0}
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from typing import NamedTuple

from sluicegate.bucket import Bucket
from sluicegate.rules import CREDIT_SCALE, DEFAULT_RULE_KEY, MAX_CAPACITY, NEVER_MS, SHARE_MODES, Rule

SECOND_NS = 1_000_000_000
_AT_ONCE = -(2**63)  # a due time every clock has passed


class Claim(NamedTuple):
    """One claimant: ``weight`` (> 0), ``priority`` (higher is served first) and ``demand`` in credits/s."""

    ident: Hashable
    weight: float
    priority: int
    demand: float


def _water_fill(amount: float, claims: Sequence[tuple[Hashable, float, float]]) -> dict[Hashable, float]:
    """Weighted max-min split of ``amount`` among ``(ident, weight, demand)``."""
    result: dict[Hashable, float] = {ident: 0.0 for ident, _, _ in claims}
    # The most modest (demand per weight) first: if it fits its share it is satisfied, and so on.
    active = sorted((claim for claim in claims if claim[2] > 0), key=lambda claim: claim[2] / claim[1])
    weights_left = [0.0] * (len(active) + 1)
    for i in range(len(active) - 1, -1, -1):
        weights_left[i] = weights_left[i + 1] + active[i][1]
    left = amount
    for i, (ident, weight, demand) in enumerate(active):
        if demand * weights_left[i] <= left * weight:
            result[ident] = float(demand)
            left = max(0.0, left - demand)
            continue
        # This one and every later one ask more than an equal split by weight: they share what is left.
        for other, other_weight, _ in active[i:]:
            result[other] = left * other_weight / weights_left[i]
        break
    return result


def _clamp(result: dict[Hashable, float], amount: float) -> dict[Hashable, float]:
    """Shave float rounding so that the total never exceeds ``amount``."""
    while (total := math.fsum(result.values())) > amount:
        factor = amount / total * (1 - 1e-15)
        result = {ident: value * factor for ident, value in result.items()}
    return result


def allocate(
    rate: float,
    claims: Sequence[Claim],
    *,
    mode: str = "weighted",
    level_weights: Mapping[int, float] | None = None,
) -> dict[Hashable, float]:
    """Each claimant's share of ``rate`` (credits/s); never more than ``rate`` in total, 0 for no demand.

    ``mode="strict"``: priority levels are served from the highest down, each
    water-filled with what the levels above left. ``mode="weighted"``: the
    levels first split ``rate`` by ``level_weights`` (1 for a level not in it),
    each level's demand being the sum of its claimants', then each level's part
    is split among its claimants by their weights.

    Example:
        >>> levels = [Claim("hi", 1, 2, 750), Claim("mid", 1, 1, 750), Claim("lo", 1, 0, 750)]
        >>> allocate(700, levels, level_weights={2: 4, 1: 2, 0: 1})
        {'hi': 400.0, 'mid': 200.0, 'lo': 100.0}
    """
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not math.isfinite(rate) or rate < 0:
        raise ValueError(f"rate must be a finite number >= 0, got {rate!r}")
    if mode not in SHARE_MODES:
        raise ValueError(f"mode must be one of {', '.join(SHARE_MODES)}, got {mode!r}")
    levels: dict[int, list[tuple[Hashable, float, float]]] = {}
    for claim in claims:
        ident, weight, priority, demand = claim
        if not (weight > 0 and math.isfinite(weight)):
            raise ValueError(f"claim {ident!r}: weight must be a finite number > 0, got {weight!r}")
        if not demand >= 0:  # also refuses NaN; an infinite demand is fine
            raise ValueError(f"claim {ident!r}: demand must be >= 0, got {demand!r}")
        levels.setdefault(priority, []).append((ident, weight, demand))
    if sum(map(len, levels.values())) != len({claim.ident for claim in claims}):
        raise ValueError("each claimant may claim once")
    result: dict[Hashable, float] = {}
    if mode == "strict":
        left = float(rate)
        for priority in sorted(levels, reverse=True):
            part = _water_fill(left, levels[priority])
            result.update(part)
            left = max(0.0, left - math.fsum(part.values()))
    else:
        chosen = level_weights or {}
        level_claims = [
            (priority, float(chosen.get(priority, 1.0)), math.fsum(demand for _, _, demand in members))
            for priority, members in levels.items()
        ]
        for priority, level_rate in _water_fill(rate, level_claims).items():
            result.update(_water_fill(level_rate, levels[priority]))  # type: ignore[index]
    return _clamp({claim.ident: result[claim.ident] for claim in claims}, rate)


class DemandMeter:
    """Credits requested per second over a sliding window of ``slots`` slots (1 s in 10 by default).

    The rate is over the time the window actually covers: the full slots and
    the current partial one, and never more than the meter's age (so a new
    meter is not diluted), at least one slot (so one request is not infinite).

    Example:
        >>> meter = DemandMeter(0)
        >>> for i in range(100):
        ...     meter.add(1, i * 10_000_000)  # 100 requests in one second
        >>> round(meter.rate(1_000_000_000))
        100
    """

    __slots__ = ("_counts", "_created_ns", "_epoch", "_slot_ns", "_total")

    def __init__(self, now_ns: int, *, window_ns: int = SECOND_NS, slots: int = 10) -> None:
        if slots < 1 or window_ns < slots:
            raise ValueError("a demand meter needs at least one slot of at least 1 ns")
        self._slot_ns = window_ns // slots
        self._counts = [0] * slots
        self._epoch = now_ns // self._slot_ns  # the slot now counting
        self._created_ns = now_ns
        self._total = 0

    def _advance(self, now_ns: int) -> None:
        slot = now_ns // self._slot_ns
        passed = slot - self._epoch
        if passed <= 0:
            return  # same slot, or a clock that went back: keep counting in the current slot
        counts, size = self._counts, len(self._counts)
        for step in range(1, min(passed, size) + 1):
            index = (self._epoch + step) % size
            self._total -= counts[index]
            counts[index] = 0
        self._epoch = slot

    def add(self, cost: int, now_ns: int) -> None:
        self._advance(now_ns)
        self._counts[self._epoch % len(self._counts)] += cost
        self._total += cost

    def rate(self, now_ns: int) -> float:
        """Credits per second requested over the window ending at ``now_ns``."""
        self._advance(now_ns)
        covered = (len(self._counts) - 1) * self._slot_ns + now_ns - self._epoch * self._slot_ns
        span = max(self._slot_ns, min(covered, now_ns - self._created_ns))
        return self._total * SECOND_NS / span


class Member:
    """A child in a :class:`ShareGroup`: its rule (weight, priority), demand, allocation and share bucket."""

    __slots__ = ("allocation", "bucket", "ident", "max_cost", "meter", "pending", "rule", "starved")

    def __init__(self, ident: Hashable, rule: Rule, meter: DemandMeter) -> None:
        self.ident = ident
        self.rule = rule
        self.meter = meter
        self.allocation = 0.0  # credits/s
        self.bucket: Bucket | None = None  # None while the allocation is 0
        self.max_cost = 1  # the largest cost it asked: its share bucket always holds one such check
        self.pending = False  # asked since the last allocation
        self.starved = False  # asked, yet got nothing at the last allocation (higher priorities took it all)

    def __repr__(self) -> str:
        return f"Member({self.ident!r}, allocation={self.allocation:g})"


class ShareGroup:
    """The children of one parent rule on a partition, sharing the parent's rate by weighted max-min.

    Each member has a share bucket refilled at its allocation, holding the
    allocation times the parent's window (``capacity / rate``: the same burst
    the parent allows), and at least one check of the largest cost it asked;
    a share bucket starts with one such check in it, not full.
    Allocations are recomputed from every member's demand over the last
    ``window_ns`` each ``interval_ns`` (lazily, by the first check after that)
    and at once when a member without an allocation asks, so a new or
    returning light child is not refused until the next round. What no member
    asks for (only when every demand is met) is handed out as headroom, by
    weight, to the members that asked something. A check needs room in the
    member's share bucket and in the parent's bucket, and charges both.

    Call :meth:`record_demand` before :meth:`has_room`, and only when the
    child's own limits have room, so its demand never exceeds its own ceiling.

    Example:
        >>> group = ShareGroup(Rule("{t}parent", 250, 250), now_ns=0)
        >>> gold = group.join("gold", Rule("{t}gold", 100, 100, weight=3), now_ns=0)
        >>> bronze = group.join("bronze", Rule("{t}bronze", 100, 100), now_ns=0)
        >>> for i in range(2000):  # both ask 1000/s for 1 s
        ...     now = i * 1_000_000
        ...     for member in (gold, bronze):
        ...         group.record_demand(member, 1, now)
        ...         if group.has_room(member, 1, now):
        ...             group.charge(member, 1, now)
        >>> round(group.allocation(gold)), round(group.allocation(bronze))
        (188, 62)
    """

    def __init__(
        self,
        parent: Rule,
        now_ns: int,
        *,
        interval_ns: int = 100_000_000,
        window_ns: int = SECOND_NS,
        parent_bucket: Bucket | None = None,
    ) -> None:
        if interval_ns <= 0 or window_ns <= 0:
            raise ValueError("interval_ns and window_ns must be positive")
        self.parent = parent
        # The parent's bucket: pass the one the partition keeps for the parent key to share its credit.
        self.bucket = parent_bucket if parent_bucket is not None else Bucket(parent, now_ns)
        self.interval_ns = interval_ns
        self.window_ns = window_ns
        self.members: dict[Hashable, Member] = {}
        self._due_ns = now_ns  # the next regular recomputation

    def __len__(self) -> int:
        return len(self.members)

    def join(self, ident: Hashable, child: Rule, now_ns: int) -> Member:
        """Add a child (or update the rule of one already in): its weight and priority count from now."""
        member = self.members.get(ident)
        if member is None:
            member = self.members[ident] = Member(ident, child, DemandMeter(now_ns, window_ns=self.window_ns))
        else:
            member.rule = child
        self._due_ns = _AT_ONCE  # the next check recomputes with it
        return member

    def leave(self, ident: Hashable) -> None:
        """Remove a child; its part goes to the others at the next check."""
        if self.members.pop(ident, None) is not None:
            self._due_ns = _AT_ONCE

    def set_parent(self, rule: Rule, now_ns: int) -> None:
        """A new parent rule (rate, capacity, share mode, level weights): applied at once, credit kept."""
        self.bucket.set_rule(rule, now_ns)
        self.parent = rule
        self._recompute(now_ns)

    def record_demand(self, member: Member, cost: int, now_ns: int) -> None:
        member.meter.add(cost, now_ns)
        member.pending = True
        if cost > member.max_cost:
            member.max_cost = cost

    def has_room(self, member: Member, cost: int, now_ns: int) -> bool:
        """Whether ``cost`` fits both the member's share and the parent's bucket."""
        self._refresh(member, now_ns)
        share = member.bucket
        if share is None:
            return False
        need = cost * CREDIT_SCALE
        share.refill(now_ns)
        if share.credit < need:
            return False
        parent = self.bucket
        parent.refill(now_ns)
        return parent.credit >= need

    def charge(self, member: Member, cost: int, now_ns: int) -> None:
        """Charge ``cost`` to the member's share and the parent (what they hold, at most: never below 0)."""
        need = cost * CREDIT_SCALE
        for bucket in (member.bucket, self.bucket):
            if bucket is not None:
                bucket.refill(now_ns)
                bucket.credit = max(0, bucket.credit - need)

    def retry_after_ms(self, member: Member, cost: int, now_ns: int) -> int:
        """When ``cost`` may fit: the later of share and parent; without a share, the next recomputation."""
        self._refresh(member, now_ns)
        parent = self.bucket.retry_after_ms(cost, now_ns)
        if parent == NEVER_MS or member.bucket is None:
            return parent if parent == NEVER_MS else max(parent, 1, math.ceil((self._due_ns - now_ns) / 1e6))
        return max(parent, member.bucket.retry_after_ms(cost, now_ns))

    def remaining(self, member: Member) -> int:
        """Whole credits the member could spend now (its share, within the parent's credit)."""
        if member.bucket is None:
            return 0
        return min(member.bucket.remaining, self.bucket.remaining)

    def allocation(self, member: Member) -> float:
        """The member's current refill rate (credits/s)."""
        return member.allocation

    # -- allocation ---------------------------------------------------------------------------

    def _refresh(self, member: Member, now_ns: int) -> None:
        if now_ns >= self._due_ns or (member.bucket is None and member.pending and not member.starved):
            self._recompute(now_ns)

    def _recompute(self, now_ns: int) -> None:
        parent = self.parent
        members = self.members.values()
        claims = [Claim(m.ident, m.rule.weight, m.rule.priority, m.meter.rate(now_ns)) for m in members]
        shares = allocate(parent.rate, claims, mode=parent.share, level_weights=dict(parent.level_weights))
        spare = parent.rate - math.fsum(shares.values())
        askers = [claim for claim in claims if claim.demand > 0]
        if spare > 1e-9 * parent.rate and askers:
            total_weight = math.fsum(claim.weight for claim in askers)
            for claim in askers:
                shares[claim.ident] += spare * claim.weight / total_weight
            shares = _clamp(shares, parent.rate)
        window_s = parent.capacity / parent.rate if parent.rate > 0 else 0.0
        for member, claim in zip(members, claims, strict=True):
            self._assign(member, shares[member.ident], window_s, now_ns)
            member.starved = claim.demand > 0 and member.bucket is None
            member.pending = False
        self._due_ns = now_ns + self.interval_ns

    def _assign(self, member: Member, rate: float, window_s: float, now_ns: int) -> None:
        if rate <= 0:
            member.allocation, member.bucket = 0.0, None
            return
        capacity = min(MAX_CAPACITY, max(member.max_cost, math.ceil(rate * window_s)))
        old = member.bucket
        member.allocation = rate
        if old is not None and old.rule.rate == rate and old.rule.capacity == capacity:
            return
        rule = Rule(DEFAULT_RULE_KEY, capacity, rate)  # the placeholder key skips key validation
        if old is None:
            # A share that starts (again) holds one check: enough for the one asking now, and no free burst
            # for a child that comes and goes (its burst builds up at its allocation, like everyone's).
            member.bucket = Bucket(rule, now_ns, credit_nano=member.max_cost * CREDIT_SCALE)
        else:
            old.set_rule(rule, now_ns)
