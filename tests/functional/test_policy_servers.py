"""The policy engine through real bucket servers on UDP, with a controlled clock.

The same scenarios as the pure tests (tests/unit/test_shares.py and friends),
end to end: rules in the store, a partition process's code on a real socket,
checks through the router's client. Demand is simulated in 10 ms ticks of the
manual clock; admitted rates are measured after a warm-up.
"""

from __future__ import annotations

import asyncio
import datetime
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from sluicegate.router.client import PartitionClient
from sluicegate.rules import Rule, default_rule
from sluicegate.server.partition import Partition
from sluicegate.server.udp import serve_partition
from sluicegate.store import open_store
from tests.conftest import ManualClock

TICK_S = 0.01
# 2026-11-21 23:58:00 UTC, so a day's quota can be spent and then reset at midnight in one test.
WALL_START_NS = int(datetime.datetime(2026, 11, 21, 23, 58, tzinfo=datetime.UTC).timestamp()) * 10**9


def run(  # type: ignore[no-untyped-def]
    tmp_path: Path,
    rules: list[dict],
    scenario: Callable[[PartitionClient, ManualClock], Awaitable[object]],
    *,
    wall_start_ns: int | None = None,
):
    """Serve ``rules`` on one real partition (UDP on 127.0.0.1) and run ``scenario(client, clock)``.

    The wall clock is the real one (rule changes are stamped with it), or, for calendar quotas,
    ``wall_start_ns`` moving with the manual clock.
    """
    store = open_store("sqlite", path=str(tmp_path / "rules.db"))
    store.put_rules([Rule.from_dict(rule) for rule in rules])
    clock = ManualClock()
    start = clock()

    async def main() -> object:
        partition = Partition(default_rule=default_rule(100, 10))
        server, address = await serve_partition(
            partition,
            open_store("sqlite", path=str(tmp_path / "rules.db")),
            listen=("127.0.0.1", 0),
            clock=clock,
            wall_clock=time.time_ns if wall_start_ns is None else lambda: wall_start_ns + clock() - start,
            sync_interval_s=0.05,
        )
        client = PartitionClient([address], timeout_s=1.0)
        await client.start()
        try:
            return await scenario(client, clock)
        finally:
            client.close()
            server.close()

    return asyncio.run(main())


async def demand(
    client: PartitionClient, clock: ManualClock, rates: dict[str, float], seconds: float, warmup_s: float = 2.0
) -> dict[str, float]:
    """Each key asks ``rates[key]`` checks/s, evenly spread; returns admitted checks/s after the warm-up."""
    owed = dict.fromkeys(rates, 0.0)
    admitted = dict.fromkeys(rates, 0)
    ticks = round(seconds / TICK_S)
    for tick in range(ticks):
        clock.advance(TICK_S)
        batch = []
        for key, rate in rates.items():
            owed[key] += rate * TICK_S
            while owed[key] >= 1:
                owed[key] -= 1
                batch.append((key, 1))
        if not batch:
            continue
        decisions = await client.check_many(batch)
        if tick * TICK_S >= warmup_s:
            for (key, _), decision in zip(batch, decisions, strict=True):
                assert not decision.fallback
                admitted[key] += decision.allowed
    measured = seconds - warmup_s
    return {key: count / measured for key, count in admitted.items()}


def near(value: float, expected: float, tolerance: float = 0.03) -> bool:
    return abs(value - expected) <= tolerance * expected


def children(parent: str, weights: dict[str, float], **extra: object) -> list[dict]:
    return [
        {"key": f"{{t}}:{name}", "capacity": 10**6, "rate": 10**6, "parent": parent, "weight": weight, **extra}
        for name, weight in weights.items()
    ]


def test_drr_weights_6_3_1_split_the_parent_rate(tmp_path: Path) -> None:
    parent = {"key": "{t}:parent", "capacity": 250, "rate": 250}
    rules = [parent, *children("{t}:parent", {"a": 6, "b": 3, "c": 1})]

    async def scenario(client: PartitionClient, clock: ManualClock) -> dict[str, float]:
        return await demand(client, clock, {"{t}:a": 400, "{t}:b": 400, "{t}:c": 400}, seconds=20)

    got = run(tmp_path, rules, scenario)
    assert near(got["{t}:a"], 150) and near(got["{t}:b"], 75) and near(got["{t}:c"], 25), got


def test_quorum_table_2_and_3(tmp_path: Path) -> None:
    parent = {"key": "{t}:parent", "capacity": 1874, "rate": 1874}
    rules = [parent, *children("{t}:parent", {"a": 375, "b": 937, "c": 562})]

    async def scenario(client: PartitionClient, clock: ManualClock) -> tuple[dict[str, float], dict[str, float]]:
        all_three = await demand(client, clock, {"{t}:a": 185, "{t}:b": 1718, "{t}:c": 557}, seconds=12)
        without_a = await demand(client, clock, {"{t}:b": 1718, "{t}:c": 557}, seconds=12)
        return all_three, without_a

    all_three, without_a = run(tmp_path, rules, scenario)
    assert near(all_three["{t}:a"], 185) and near(all_three["{t}:c"], 557), all_three
    assert near(all_three["{t}:b"], 1874 - 185 - 557), all_three
    # A's part goes to the others by max-min: C already has all it asks, B takes the rest.
    assert near(without_a["{t}:c"], 557) and near(without_a["{t}:b"], 1874 - 557), without_a


@pytest.mark.parametrize(
    ("share", "expected"), [("strict", (300, 0, 0)), ("weighted", (4 * 300 / 7, 2 * 300 / 7, 300 / 7))]
)
def test_qed_priorities(tmp_path: Path, share: str, expected: tuple[float, float, float]) -> None:
    parent = {"key": "{t}:parent", "capacity": 300, "rate": 300, "share": share}
    if share == "weighted":
        parent["level_weights"] = {"3": 4, "2": 2, "1": 1}
    rules = [parent]
    for name, priority in (("high", 3), ("medium", 2), ("low", 1)):
        rules += children("{t}:parent", {name: 1}, priority=priority)

    async def scenario(client: PartitionClient, clock: ManualClock) -> dict[str, float]:
        return await demand(client, clock, {"{t}:high": 900, "{t}:medium": 900, "{t}:low": 900}, seconds=12)

    got = run(tmp_path, rules, scenario)
    for name, rate in zip(("high", "medium", "low"), expected, strict=True):
        if rate:
            assert near(got[f"{{t}}:{name}"], rate), got
        else:
            assert got[f"{{t}}:{name}"] < 0.01 * 300, got


def test_rate_and_daily_quota_deny_the_251st_check_and_reset_at_midnight(tmp_path: Path) -> None:
    rule = {"key": "acme", "capacity": 10, "rate": 10, "limits": [{"name": "daily", "quota": 250, "per": "day"}]}

    async def scenario(client: PartitionClient, clock: ManualClock) -> None:
        for _ in range(250):
            clock.advance(0.1)
            assert (await client.check("acme")).allowed
        denied = await client.check("acme")
        assert not denied.allowed and denied.limit == "daily"
        now = WALL_START_NS + 25 * 10**9
        midnight = WALL_START_NS + 120 * 10**9
        assert abs(denied.retry_after_ms - (midnight - now) / 1e6) <= 200  # frees at the window's edge
        burst = await client.check("acme")  # the rate limit alone would admit it
        assert burst.limit == "daily"
        clock.advance((midnight - now) / 1e9 + 0.001)
        fresh = await client.check("acme")
        assert fresh.allowed and fresh.limit is None

    run(tmp_path, [rule], scenario, wall_start_ns=WALL_START_NS)


def test_a_shadow_limit_reports_exactly_what_it_would_deny(tmp_path: Path) -> None:
    shadowed = {
        "key": "try",
        "capacity": 1000,
        "rate": 1000,
        "limits": [{"name": "new", "capacity": 5, "rate": 2, "shadow": True}],
    }
    enforced = {"key": "real", "capacity": 5, "rate": 2}

    async def scenario(client: PartitionClient, clock: ManualClock) -> tuple[int, int, int]:
        would = denied = admitted = 0
        for step in range(400):
            clock.advance(0.05 if step % 3 else 0.4)
            trial, real = await client.check_many([("try", 1), ("real", 1)])
            admitted += trial.allowed
            would += trial.would_deny
            denied += not real.allowed
            if trial.would_deny:
                assert trial.limit == "new"
        return admitted, would, denied

    admitted, would, denied = run(tmp_path, [shadowed, enforced], scenario)
    assert admitted == 400  # a shadow never denies
    assert would == denied > 100


def test_patterns_resolve_by_precedence_and_follow_changes(tmp_path: Path) -> None:
    rules = [
        {"key": "tenant:*", "capacity": 1, "rate": 0},
        {"key": "tenant:acme:*", "capacity": 2, "rate": 0},
        {"key": "tenant:*:admin", "capacity": 3, "rate": 0, "precedence": 5},
        {"key": "tenant:acme:bob", "capacity": 4, "rate": 0},
    ]
    store_path = tmp_path / "rules.db"

    async def scenario(client: PartitionClient, clock: ManualClock) -> None:
        async def capacity(key: str) -> int:
            return (await client.check(key)).capacity  # type: ignore[return-value]

        assert await capacity("tenant:zeta:x") == 1
        assert await capacity("tenant:acme:x") == 2  # the longer literal part
        assert await capacity("tenant:acme:admin") == 3  # higher precedence beats specificity
        assert await capacity("tenant:acme:bob") == 4  # an exact rule beats every pattern
        assert await capacity("other") == 100  # the default rule
        store = open_store("sqlite", path=str(store_path))
        store.put_rule(Rule("tenant:acme:*", 7, 0, precedence=9))
        store.delete_rule("tenant:*")
        for _ in range(50):  # the sync interval is 50 ms of real time
            await asyncio.sleep(0.02)
            if await capacity("tenant:acme:y") == 7:
                break
        assert await capacity("tenant:acme:x") == 7  # a key already held follows the change
        assert await capacity("tenant:acme:admin") == 7
        assert await capacity("tenant:zeta:x") == 100  # its pattern is gone: the default rule

    run(tmp_path, rules, scenario)


def test_quota_counters_survive_a_restart_within_one_checkpoint_interval(tmp_path: Path) -> None:
    rule = Rule.from_dict({"key": "acme", "capacity": 10**6, "rate": 10**6, "limits": [{"quota": 150, "per": "day"}]})
    open_store("sqlite", path=str(tmp_path / "rules.db")).put_rule(rule)
    clock = ManualClock()
    start = clock()

    async def serve() -> tuple[object, PartitionClient]:
        server, address = await serve_partition(
            Partition(default_rule=default_rule(100, 10)),
            open_store("sqlite", path=str(tmp_path / "rules.db")),
            listen=("127.0.0.1", 0),
            clock=clock,
            wall_clock=lambda: WALL_START_NS + clock() - start,
            checkpoint_interval_s=0.05,
        )
        client = PartitionClient([address], timeout_s=1.0)
        await client.start()
        return server, client

    async def spend(client: PartitionClient, count: int) -> int:
        return sum(d.allowed for d in await client.check_many([("acme", 1)] * count))

    async def scenario() -> tuple[int, int]:
        server, client = await serve()
        assert await spend(client, 100) == 100
        await asyncio.sleep(0.3)  # a checkpoint round or more
        assert await spend(client, 10) == 10  # maybe not checkpointed: lost in a crash
        client.close()
        server.close()  # a crash: no final checkpoint
        server, client = await serve()
        after_crash = await spend(client, 100)
        client.close()
        await server.stop()  # a clean stop writes the last counters
        server, client = await serve()
        after_stop = await spend(client, 100)
        client.close()
        await server.stop()
        return after_crash, after_stop

    after_crash, after_stop = asyncio.run(scenario())
    # 150 a day: 110 were spent before the crash; at most the 10 of the last interval come back.
    assert 40 <= after_crash <= 50
    assert after_stop == 0  # the day's quota is used up, across a clean restart too


def test_a_child_ceiling_caps_its_demand_and_the_others_get_the_rest(tmp_path: Path) -> None:
    parent = {"key": "{t}:parent", "capacity": 300, "rate": 300}
    capped = {"key": "{t}:capped", "capacity": 50, "rate": 50, "parent": "{t}:parent", "weight": 5}
    rules = [parent, capped, *children("{t}:parent", {"other": 1})]

    async def scenario(client: PartitionClient, clock: ManualClock) -> dict[str, float]:
        return await demand(client, clock, {"{t}:capped": 600, "{t}:other": 600}, seconds=12)

    got = run(tmp_path, rules, scenario)
    # By weight alone "capped" would get 250/s; its own 50/s ceiling holds, and "other" takes the rest.
    assert near(got["{t}:capped"], 50) and near(got["{t}:other"], 250), got
