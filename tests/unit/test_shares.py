"""Weighted max-min fair shares: allocate(), the demand meter, and ShareGroup replaying DRR, Quorum and QED.

The ShareGroup scenarios are driven the way the partition drives it: for each
arrival (evenly spaced or seeded-random), ``record_demand``, ``has_room`` and,
when admitted, ``charge``, on a simulated clock. Admitted rates are measured
after a warm-up second.
"""

from __future__ import annotations

import math
import random
from collections.abc import Hashable

import pytest

from sluicegate.rules import NEVER_MS, Rule
from sluicegate.shares import Claim, DemandMeter, Member, ShareGroup, allocate

SECOND = 1_000_000_000
WARM_UP = 1 * SECOND


# -- allocate ---------------------------------------------------------------------------------


class TestAllocate:
    def test_quorum_table_2_water_filling(self) -> None:
        shares = allocate(1874, [Claim("A", 375, 0, 185), Claim("B", 937, 0, 1718), Claim("C", 562, 0, 557)])
        assert shares["A"] == pytest.approx(185)
        assert shares["C"] == pytest.approx(557)
        assert shares["B"] == pytest.approx(1132)

    def test_everyone_above_their_share_splits_by_weight(self) -> None:
        shares = allocate(250, [Claim("a", 6, 0, 1e9), Claim("b", 3, 0, 1e9), Claim("c", 1, 0, math.inf)])
        assert shares == pytest.approx({"a": 150, "b": 75, "c": 25})

    def test_what_a_modest_claimant_leaves_goes_to_the_others_repeatedly(self) -> None:
        # Equal weights, 100 to share: 10 is satisfied; 30 is then under 90/3 = 30; the rest split 60 by 2.
        shares = allocate(100, [Claim(i, 1, 0, d) for i, d in enumerate([10, 30, 80, 500])])
        assert shares == pytest.approx({0: 10, 1: 30, 2: 30, 3: 30})

    def test_no_demand_gets_nothing_and_the_rate_may_stay_unallocated(self) -> None:
        shares = allocate(100, [Claim("idle", 5, 0, 0), Claim("light", 1, 0, 20)])
        assert shares == {"idle": 0.0, "light": 20.0}
        assert allocate(100, []) == {}
        assert allocate(0, [Claim("x", 1, 0, 10)]) == {"x": 0.0}

    def test_strict_serves_the_highest_priority_first(self) -> None:
        claims = [Claim("high", 1, 2, 750), Claim("medium", 1, 1, 750), Claim("low", 1, 0, 750)]
        assert allocate(250, claims, mode="strict") == {"high": 250.0, "medium": 0.0, "low": 0.0}
        claims = [Claim("high", 1, 2, 100), Claim("medium", 1, 1, 100), Claim("low", 1, 0, 750)]
        assert allocate(250, claims, mode="strict") == pytest.approx({"high": 100, "medium": 100, "low": 50})

    def test_strict_levels_are_water_filled_inside(self) -> None:
        claims = [Claim("h1", 3, 1, 1000), Claim("h2", 1, 1, 1000), Claim("l", 1, 0, 1000)]
        assert allocate(100, claims, mode="strict") == pytest.approx({"h1": 75, "h2": 25, "l": 0})

    def test_weighted_levels_by_level_weight_then_claimants_by_weight(self) -> None:
        claims = [Claim("h", 1, 2, 750), Claim("m1", 3, 1, 750), Claim("m2", 1, 1, 750), Claim("l", 1, 0, 750)]
        shares = allocate(700, claims, level_weights={2: 4, 1: 2, 0: 1})
        assert shares == pytest.approx({"h": 400, "m1": 150, "m2": 50, "l": 100})

    def test_weighted_levels_default_to_weight_one_and_an_idle_level_leaves_its_part(self) -> None:
        claims = [Claim("h", 1, 2, 0), Claim("m", 1, 1, 1000), Claim("l", 1, 0, 1000)]
        assert allocate(300, claims) == pytest.approx({"h": 0, "m": 150, "l": 150})
        claims = [Claim("h", 1, 2, 20), Claim("m", 1, 1, 1000), Claim("l", 1, 0, 1000)]
        assert allocate(300, claims, level_weights={1: 2}) == pytest.approx({"h": 20, "m": 280 * 2 / 3, "l": 280 / 3})

    @pytest.mark.parametrize("mode", ["weighted", "strict"])
    def test_random_claims_obey_max_min_and_never_exceed_the_rate(self, mode: str) -> None:
        rng = random.Random(3)
        for _ in range(500):
            rate = rng.choice([0, 1, 7.5, 250, 1874, 1e6 / 3])
            claims = [
                Claim(i, rng.choice([0.1, 1, 3, 937]), rng.randint(0, 2), rng.choice([0, 0.5, 5, 100, 1e5, math.inf]))
                for i in range(rng.randint(1, 9))
            ]
            shares = allocate(rate, claims, mode=mode)
            assert set(shares) == {claim.ident for claim in claims}
            assert math.fsum(shares.values()) <= rate
            total_demand = math.fsum(claim.demand for claim in claims)
            # Work-conserving: the whole rate is handed out unless every demand is met.
            assert math.fsum(shares.values()) == pytest.approx(min(rate, total_demand), rel=1e-9, abs=1e-9)
            for claim in claims:
                assert 0 <= shares[claim.ident] <= claim.demand * (1 + 1e-12)
                if claim.demand == 0:
                    assert shares[claim.ident] == 0
            if mode == "weighted" and len({claim.priority for claim in claims}) == 1:
                # Max-min: any claimant that got less than it asked has the highest share per weight.
                level = max(shares[c.ident] / c.weight for c in claims)
                for claim in claims:
                    if shares[claim.ident] < claim.demand * (1 - 1e-9):
                        assert shares[claim.ident] / claim.weight == pytest.approx(level, rel=1e-9)

    @pytest.mark.parametrize(
        ("call", "message"),
        [
            (lambda: allocate(-1, []), "rate must be"),
            (lambda: allocate(math.nan, []), "rate must be"),
            (lambda: allocate(10, [], mode="fifo"), "mode must be one of"),
            (lambda: allocate(10, [Claim("a", 0, 0, 1)]), "weight must be"),
            (lambda: allocate(10, [Claim("a", 1, 0, -1)]), "demand must be"),
            (lambda: allocate(10, [Claim("a", 1, 0, math.nan)]), "demand must be"),
            (lambda: allocate(10, [Claim("a", 1, 0, 1), Claim("a", 1, 1, 1)]), "claim once"),
        ],
    )
    def test_bad_input_is_refused(self, call, message: str) -> None:  # type: ignore[no-untyped-def]
        with pytest.raises(ValueError, match=message):
            call()


# -- DemandMeter ------------------------------------------------------------------------------


class TestDemandMeter:
    def test_steady_rate(self) -> None:
        meter = DemandMeter(0)
        for i in range(5000):  # 500/s for 10 s, cost 2
            meter.add(2, i * 2_000_000)
        assert meter.rate(10 * SECOND) == pytest.approx(1000, rel=0.01)
        assert meter.rate(10 * SECOND + 50_000_000) == pytest.approx(1000, rel=0.06)  # mid-slot

    def test_a_new_meter_is_not_diluted_by_the_window(self) -> None:
        meter = DemandMeter(5 * SECOND)
        for i in range(30):  # 100/s for 0.3 s
            meter.add(1, 5 * SECOND + i * 10_000_000)
        assert meter.rate(5 * SECOND + 300_000_000) == pytest.approx(100)
        first = DemandMeter(0)
        first.add(1, 0)
        assert first.rate(0) == pytest.approx(10)  # one request over one slot, not infinite

    def test_demand_fades_after_the_window(self) -> None:
        meter = DemandMeter(0)
        for i in range(100):
            meter.add(1, i * 10_000_000)
        assert meter.rate(SECOND) > 90
        # At 1.5 s the window covers 0.6-1.5 s (9 full slots and an empty current one): 40 requests in 0.9 s.
        assert meter.rate(SECOND + 500_000_000) == pytest.approx(40 / 0.9)
        assert meter.rate(2 * SECOND + 1) == 0
        assert meter.rate(60 * SECOND) == 0

    def test_a_clock_going_back_counts_in_the_current_slot(self) -> None:
        meter = DemandMeter(0)
        meter.add(1, SECOND)
        meter.add(1, SECOND - 300_000_000)
        assert meter.rate(SECOND) == pytest.approx(2 / 0.9)  # two requests over the 0.9 s covered


# -- ShareGroup scenarios ---------------------------------------------------------------------


def even(rate: float, start_ns: int, end_ns: int, phase: float = 0.0) -> list[int]:
    """Arrival times at ``rate``/s, evenly spaced, from ``start_ns`` (shifted by ``phase`` of a gap)."""
    gap = SECOND / rate
    count = int((end_ns - start_ns) / gap)
    return [start_ns + round((i + phase) * gap) for i in range(count)]


def poisson(rate: float, start_ns: int, end_ns: int, rng: random.Random) -> list[int]:
    times, t = [], float(start_ns)
    while True:
        t += rng.expovariate(rate) * SECOND
        if t >= end_ns:
            return times
        times.append(round(t))


def replay(group: ShareGroup, arrivals: dict[Member, list[int]], cost: int = 1) -> dict[Hashable, list[int]]:
    """Drive ``group`` with every member's arrivals in time order; the admitted times per member."""
    events = sorted((t, i, member) for i, (member, times) in enumerate(arrivals.items()) for t in times)
    admitted: dict[Hashable, list[int]] = {member.ident: [] for member in arrivals}
    for now, _, member in events:
        group.record_demand(member, cost, now)
        if group.has_room(member, cost, now):
            group.charge(member, cost, now)
            admitted[member.ident].append(now)
    return admitted


def rate_between(times: list[int], start_ns: int, end_ns: int) -> float:
    return sum(start_ns <= t < end_ns for t in times) * SECOND / (end_ns - start_ns)


def parent(rate: float, **policy: object) -> Rule:
    return Rule.from_dict({"key": "{t}parent", "capacity": round(rate), "rate": rate, **policy})


def child(name: str, weight: float = 1, priority: int = 0) -> Rule:
    return Rule(f"{{t}}{name}", 1_000_000, 1_000_000, parent="{t}parent", weight=weight, priority=priority)


def join_all(group: ShareGroup, **children: Rule) -> dict[str, Member]:
    return {name: group.join(name, rule, 0) for name, rule in children.items()}


class TestDRR:
    """SOAP's DRR scheduler: parent 250/s, weights 6:3:1, everyone far above its share for 20 s."""

    @pytest.mark.parametrize("arrivals", ["even", "random"])
    def test_admitted_rates_are_150_75_25(self, arrivals: str) -> None:
        group = ShareGroup(parent(250), 0)
        members = join_all(group, a=child("a", 6), b=child("b", 3), c=child("c", 1))
        end = WARM_UP + 20 * SECOND
        rng = random.Random(250)
        plan = {
            member: even(750, 0, end, phase=i / 3) if arrivals == "even" else poisson(750, 0, end, rng)
            for i, member in enumerate(members.values())
        }
        admitted = replay(group, plan)
        rates = {name: rate_between(times, WARM_UP, end) for name, times in admitted.items()}
        print(f"DRR ({arrivals}) admitted per second: {rates}")
        assert rates["a"] == pytest.approx(150, rel=0.03)
        assert rates["b"] == pytest.approx(75, rel=0.03)
        assert rates["c"] == pytest.approx(25, rel=0.03)
        assert sum(rates.values()) <= 250 * (1 + 250 / (20 * 250))  # the parent's rate (+ at most one burst)


class TestQuorum:
    """Quorum Table 2/3: parent 1874/s; A, B, C weights 375:937:562, demands 185, 1718, 557 per second."""

    @pytest.mark.parametrize("arrivals", ["even", "random"])
    def test_light_children_get_their_demand_and_the_heavy_one_the_rest(self, arrivals: str) -> None:
        group = ShareGroup(parent(1874), 0)
        members = join_all(group, A=child("A", 375), B=child("B", 937), C=child("C", 562))
        end = WARM_UP + 20 * SECOND
        rng = random.Random(1874)
        demand = {"A": 185, "B": 1718, "C": 557}
        plan = {
            member: even(demand[name], 0, end, phase=0.37) if arrivals == "even" else poisson(demand[name], 0, end, rng)
            for name, member in members.items()
        }
        admitted = replay(group, plan)
        rates = {name: rate_between(times, WARM_UP, end) for name, times in admitted.items()}
        asked = {member.ident: rate_between(times, WARM_UP, end) for member, times in plan.items()}
        print(f"Quorum ({arrivals}) asked {asked}, admitted per second: {rates}")
        assert rates["A"] == pytest.approx(asked["A"], rel=0.03)  # all it asked (185/s)
        assert rates["C"] == pytest.approx(asked["C"], rel=0.03)  # all it asked (557/s)
        assert rates["B"] == pytest.approx(1874 - asked["A"] - asked["C"], rel=0.03)  # the rest, about 1132
        assert rates["B"] == pytest.approx(1132, rel=0.03)
        if arrivals == "even":
            assert group.allocation(members["A"]) == pytest.approx(185, rel=0.01)

    def test_when_a_stops_b_and_c_take_its_part_by_max_min(self) -> None:
        group = ShareGroup(parent(1874), 0)
        members = join_all(group, A=child("A", 375), B=child("B", 937), C=child("C", 562))
        stop_a, end = 10 * SECOND, 22 * SECOND
        plan = {
            members["A"]: even(185, 0, stop_a),
            members["B"]: even(1718, 0, end, phase=0.5),
            members["C"]: even(557, 0, end, phase=0.25),
        }
        admitted = replay(group, plan)
        before = {name: rate_between(times, WARM_UP, stop_a) for name, times in admitted.items()}
        after = {name: rate_between(times, stop_a + 2 * SECOND, end) for name, times in admitted.items()}
        print(f"Quorum, A stops at 10 s: before {before}, after {after}")
        assert before["B"] == pytest.approx(1132, rel=0.03)
        # Split by weight, C's part (1874 * 562/1499 = 703) is above its demand: C keeps 557, B takes 1317.
        assert after["A"] == 0
        assert after["C"] == pytest.approx(557, rel=0.03)
        assert after["B"] == pytest.approx(1874 - 557, rel=0.03)


class TestQED:
    """QED: high, medium and low priority children each asking 3x the parent's rate."""

    def plan(self, members: dict[str, Member], end: int) -> dict[Member, list[int]]:
        return {member: even(750, 0, end, phase=i / 3) for i, member in enumerate(members.values())}

    def test_strict_gives_high_the_whole_rate(self) -> None:
        group = ShareGroup(parent(250, share="strict"), 0)
        members = join_all(group, high=child("high", priority=2), medium=child("medium", priority=1), low=child("low"))
        end = WARM_UP + 20 * SECOND
        admitted = replay(group, self.plan(members, end))
        rates = {name: rate_between(times, WARM_UP, end) for name, times in admitted.items()}
        print(f"QED strict admitted per second: {rates}")
        assert rates["high"] == pytest.approx(250, rel=0.03)
        assert rates["medium"] == rates["low"] == 0
        assert 1 <= group.retry_after_ms(members["low"], 1, end) <= 100  # a starved child hears of the next round

    def test_weighted_levels_4_2_1_and_low_never_starves(self) -> None:
        group = ShareGroup(parent(250, level_weights={"2": 4, "1": 2, "0": 1}), 0)
        members = join_all(group, high=child("high", priority=2), medium=child("medium", priority=1), low=child("low"))
        end = WARM_UP + 20 * SECOND
        admitted = replay(group, self.plan(members, end))
        rates = {name: rate_between(times, WARM_UP, end) for name, times in admitted.items()}
        print(f"QED weighted 4:2:1 admitted per second: {rates}")
        assert rates["high"] == pytest.approx(250 * 4 / 7, rel=0.03)
        assert rates["medium"] == pytest.approx(250 * 2 / 7, rel=0.03)
        assert rates["low"] == pytest.approx(250 / 7, rel=0.03)
        for second in range(1, 21):  # low gets something every second
            assert rate_between(admitted["low"], second * SECOND, (second + 1) * SECOND) > 0


class TestShareGroup:
    def test_a_new_light_child_is_admitted_at_once_among_saturated_ones(self) -> None:
        group = ShareGroup(parent(100), 0)
        members = join_all(group, a=child("a"), b=child("b"))
        replay(group, {members["a"]: even(1000, 0, 5 * SECOND), members["b"]: even(1000, 0, 5 * SECOND, 0.5)})
        newcomer = group.join("new", child("new"), 5 * SECOND)
        now = 5 * SECOND + 1_000_000
        group.record_demand(newcomer, 1, now)
        assert group.has_room(newcomer, 1, now)
        assert 0 < group.allocation(newcomer) <= 50

    def test_a_child_back_from_idle_is_admitted_at_once(self) -> None:
        group = ShareGroup(parent(100), 0)
        members = join_all(group, a=child("a"), b=child("b"), c=child("c"))
        busy = {members["a"]: even(1000, 0, 5 * SECOND), members["b"]: even(1000, 0, 5 * SECOND, 0.5)}
        admitted = replay(group, {**busy, members["c"]: even(5, 0, SECOND // 2, 0.5)})
        assert len(admitted["c"]) == 2  # light: all it asked
        replay(group, {m: even(1000, 5 * SECOND, 8 * SECOND) for m in busy})
        assert group.allocation(members["c"]) == 0  # idle for seconds: no share any more
        now = 8 * SECOND  # the others' checks just recomputed the shares: c asks between two rounds
        group.record_demand(members["c"], 1, now)
        assert group.has_room(members["c"], 1, now)
        assert group.allocation(members["c"]) > 0

    def test_the_children_together_never_exceed_the_parent(self) -> None:
        group = ShareGroup(parent(200), 0)
        members = join_all(group, **{f"c{i}": child(f"c{i}", weight=i + 1) for i in range(5)})
        rng = random.Random(5)
        end = 10 * SECOND
        plan = {member: poisson(rng.choice([20, 100, 400]), 0, end, rng) for member in members.values()}
        admitted = replay(group, plan)
        times = sorted(t for member_times in admitted.values() for t in member_times)
        for count, t in enumerate(times, start=1):
            assert count <= 200 + 200 * t / SECOND  # the parent's capacity plus its refill so far

    def test_leave_hands_the_share_to_the_others(self) -> None:
        group = ShareGroup(parent(300), 0)
        members = join_all(group, a=child("a"), b=child("b"), c=child("c"))
        replay(group, {m: even(1000, 0, 3 * SECOND, i / 3) for i, m in enumerate(members.values())})
        assert group.allocation(members["a"]) == pytest.approx(100, rel=0.01)
        group.leave("c")
        assert len(group) == 2
        admitted = replay(group, {m: even(1000, 3 * SECOND, 6 * SECOND, 0.5) for m in (members["a"], members["b"])})
        assert rate_between(admitted["a"], 4 * SECOND, 6 * SECOND) == pytest.approx(150, rel=0.03)

    def test_join_again_updates_weight(self) -> None:
        group = ShareGroup(parent(300), 0)
        members = join_all(group, a=child("a"), b=child("b"))
        replay(group, {m: even(1000, 0, 2 * SECOND, i / 2) for i, m in enumerate(members.values())})
        assert group.join("a", child("a", weight=2), 2 * SECOND) is members["a"]
        admitted = replay(group, {m: even(1000, 2 * SECOND, 6 * SECOND, i / 2) for i, m in enumerate(members.values())})
        assert rate_between(admitted["a"], 3 * SECOND, 6 * SECOND) == pytest.approx(200, rel=0.03)
        assert rate_between(admitted["b"], 3 * SECOND, 6 * SECOND) == pytest.approx(100, rel=0.03)

    def test_set_parent_applies_a_new_rate_and_mode_at_once(self) -> None:
        group = ShareGroup(parent(300), 0)
        members = join_all(group, hi=child("hi", priority=1), lo=child("lo"))
        replay(group, {m: even(1000, 0, 2 * SECOND, i / 2) for i, m in enumerate(members.values())})
        assert group.allocation(members["lo"]) == pytest.approx(150, rel=0.01)
        group.set_parent(parent(600, share="strict"), 2 * SECOND)
        assert group.allocation(members["hi"]) == pytest.approx(600, rel=0.01)
        assert group.allocation(members["lo"]) == 0

    def test_spare_rate_is_headroom_for_those_who_ask(self) -> None:
        group = ShareGroup(parent(1000), 0)
        members = join_all(group, a=child("a"), b=child("b", weight=3), idle=child("idle"))
        replay(group, {members["a"]: even(100, 0, 3 * SECOND), members["b"]: even(100, 0, 3 * SECOND, 0.5)})
        # Demands 100 + 100 leave 800 spare: a gets 100 + 200, b 100 + 600, idle nothing.
        assert group.allocation(members["a"]) == pytest.approx(300, rel=0.02)
        assert group.allocation(members["b"]) == pytest.approx(700, rel=0.02)
        assert group.allocation(members["idle"]) == 0
        assert group.remaining(members["idle"]) == 0

    def test_costs_above_one_and_retry_after(self) -> None:
        group = ShareGroup(parent(10), 0)  # capacity 10, 10/s
        (only,) = join_all(group, only=child("only")).values()
        group.record_demand(only, 4, 0)
        assert group.has_room(only, 4, 0)  # a new share holds one check of the cost asked
        group.charge(only, 4, 0)
        assert group.allocation(only) == 10  # alone: the whole parent rate
        assert group.remaining(only) == 0
        group.record_demand(only, 4, 0)
        assert not group.has_room(only, 4, 0)
        assert group.retry_after_ms(only, 4, 0) == 400  # 4 missing credits at 10/s
        assert not group.has_room(only, 4, 399_000_000)
        assert group.has_room(only, 4, 400_000_000)
        assert group.retry_after_ms(only, 11, 400_000_000) == NEVER_MS  # more than the parent ever holds

    def test_a_parent_that_never_refills_denies_for_good(self) -> None:
        group = ShareGroup(parent(0), 0)
        (only,) = join_all(group, only=child("only")).values()
        group.record_demand(only, 1, 0)
        assert not group.has_room(only, 1, 0)
        assert group.retry_after_ms(only, 1, 0) == NEVER_MS

    def test_a_shared_parent_bucket_counts_direct_checks_of_the_parent_key(self) -> None:
        from sluicegate.bucket import Bucket

        rule = parent(100)
        bucket = Bucket(rule, 0)
        group = ShareGroup(rule, 0, parent_bucket=bucket)
        (only,) = join_all(group, only=child("only")).values()
        admitted = []
        for i in range(3000):  # the child asks 1000/s; direct checks of the parent take 50/s of the same bucket
            now = i * 1_000_000
            if i % 20 == 0:
                bucket.take(1, now)
            group.record_demand(only, 1, now)
            if group.has_room(only, 1, now):
                group.charge(only, 1, now)
                admitted.append(now)
        assert rate_between(admitted, 2 * SECOND, 3 * SECOND) == pytest.approx(50, abs=2)
