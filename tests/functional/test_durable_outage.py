"""A real store outage under load: the database / DynamoDB endpoint stopped for 10 s."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from sluicegate.router.client import PartitionClient
from sluicegate.rules import Rule, default_rule
from sluicegate.server.partition import Partition
from sluicegate.server.udp import serve_partition
from sluicegate.store import RuleStore
from sluicegate.store.postgres import PostgresRuleStore

OUTAGE_S = 10.0


@dataclass
class StoppableStore:
    open: Callable[[], RuleStore]
    stop: Callable[[], None]
    start: Callable[[], None]


@pytest.fixture(params=["postgres", "dynamodb"])
def stoppable(request: pytest.FixtureRequest) -> StoppableStore:
    if request.param == "postgres":
        server = request.getfixturevalue("postgres_server")
        dsn = request.getfixturevalue("postgres_dsn")
        return StoppableStore(lambda: PostgresRuleStore(dsn), server.stop, server.start)
    tables = request.getfixturevalue("dynamodb_server_tables")
    return StoppableStore(tables.open, tables.server.stop, tables.server.start)


def test_store_stopped_for_10s_under_load(stoppable: StoppableStore) -> None:
    admin = stoppable.open()
    admin.put_rules([Rule("known", 10**6, 0), Rule("later", 3, 0)])

    async def scenario() -> dict[str, int]:
        partition = Partition(default_rule=default_rule(100, 0))
        server, address = await serve_partition(
            partition, stoppable.open(), listen=("127.0.0.1", 0), sync_interval_s=0.2, checkpoint_interval_s=0.2
        )
        client = PartitionClient([address], timeout_s=0.25, attempts=3)
        await client.start()
        assert (await client.check("known", 10)).capacity == 10**6
        stoppable.stop()
        spent = 10
        outage_end = time.monotonic() + OUTAGE_S
        i = 0
        while time.monotonic() < outage_end:
            known = await client.check("known")
            assert known.allowed and not known.fallback and known.capacity == 10**6  # no hang, same rule
            spent += 1
            new = await client.check(f"new-{i}")
            assert not new.fallback and new.capacity == 100  # default rule for now
            i += 1
            await asyncio.sleep(0.02)
        later = await client.check("later")
        assert not later.fallback and later.capacity == 100
        stoppable.start()
        deadline = time.monotonic() + 10
        while (await client.check("later")).capacity != 3:  # rule reloads resume
            assert time.monotonic() < deadline, "rules were never reloaded after the outage"
            await asyncio.sleep(0.1)
        reader = stoppable.open()
        while True:  # checkpoints resume, with the credit spent during the outage
            saved = reader.get_checkpoints(["known"], time.time_ns()).get("known")
            if saved is not None and saved.credit == (10**6 - spent) * 10**9:
                break
            assert time.monotonic() < deadline, f"checkpoint never caught up: {saved}"
            await asyncio.sleep(0.1)
        counters = partition.counters()
        client.close()
        await server.stop()
        return counters

    counters = asyncio.run(scenario())
    assert counters["store_errors"] >= 1 and counters["expired"] == 0
