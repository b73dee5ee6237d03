"""Durable state through real servers: rule sync, checkpoints, restore, store outages."""

from __future__ import annotations

import asyncio
import logging
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import pytest

from sluicegate import codec
from sluicegate.router.client import PartitionClient
from sluicegate.rules import Rule, default_rule
from sluicegate.server.keeper import StoreKeeper
from sluicegate.server.partition import Partition
from sluicegate.server.udp import serve_partition
from sluicegate.store import Checkpoint, RuleChange, RuleStore, StoreUnavailable
from sluicegate.store import open_store as open_store_kind
from sluicegate.store.base import NEVER_EXPIRES_NS
from tests.conftest import ManualClock, child_env
from tests.stores import BACKENDS

SYNC_S = 0.2


@pytest.fixture(params=BACKENDS)
def open_store(request: pytest.FixtureRequest) -> Callable[[], RuleStore]:
    return request.getfixturevalue(f"{request.param}_opener")


async def start_server(store: RuleStore, **options: float) -> tuple[object, PartitionClient]:
    partition = Partition(default_rule=default_rule(100, 0))
    options.setdefault("sync_interval_s", SYNC_S)
    server, address = await serve_partition(partition, store, listen=("127.0.0.1", 0), **options)
    client = PartitionClient([address], timeout_s=0.5)
    await client.start()
    return server, client


def test_changed_rule_reaches_a_live_key_within_the_sync_interval(open_store: Callable[[], RuleStore]) -> None:
    writer = open_store()
    writer.put_rule(Rule("k", 1000, 0))

    async def scenario() -> float:
        server, client = await start_server(open_store())
        for _ in range(20):
            assert (await client.check("k")).capacity == 1000
        writer.put_rule(Rule("k", 5, 0))  # while the key is being checked
        changed_at = time.monotonic()
        while (await client.check("k")).capacity != 5:
            assert time.monotonic() - changed_at < 5, "the new rule never arrived"
            await asyncio.sleep(0.01)
        seen = time.monotonic() - changed_at
        spent = [(await client.check("k")).allowed for _ in range(5)]
        assert spent.count(True) <= 4 and not spent[-1]  # credit 980 was clamped to 5, not kept
        writer.delete_rule("k")  # back to the default rule
        while (await client.check("k")).capacity != 100:
            assert time.monotonic() - changed_at < 10
            await asyncio.sleep(0.01)
        client.close()
        await server.stop()
        return seen

    assert asyncio.run(scenario()) <= SYNC_S + 0.5


class CountingStore:
    """Wraps a store and counts what the bucket server reads."""

    def __init__(self, inner: RuleStore) -> None:
        self.inner = inner
        self.items_read = 0
        self.get_calls = 0

    def changed_since(self, since: float, *, limit: int = 1000) -> list[RuleChange]:
        changes = self.inner.changed_since(since, limit=limit)
        self.items_read += len(changes)
        return changes

    def get_rules(self, keys: Iterable[str]) -> dict[str, Rule]:
        self.get_calls += 1
        return self.inner.get_rules(keys)

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)


def test_one_sync_reads_the_changed_rules_not_the_held_keys(sqlite_opener: Callable[[], RuleStore]) -> None:
    store = sqlite_opener()
    keys = [f"user-{i}" for i in range(100_000)]
    partition = Partition(default_rule=default_rule(100, 0))
    counting = CountingStore(store)
    overlap = 0.3

    async def scenario() -> list[int]:
        keeper = StoreKeeper(partition, counting, lambda reply, addr: None, sync_overlap_s=overlap)  # type: ignore[arg-type]
        store.put_rules(Rule(key, 10, 1) for key in keys)  # a bulk import while the server runs
        partition.rules_loaded({key.encode(): Rule(key, 10, 1) for key in keys}, time.monotonic_ns())
        reads = [await keeper.sync()]  # sees the import
        await asyncio.sleep(overlap + 0.05)
        reads.append(await keeper.sync())  # the overlap has passed: nothing is read again
        await asyncio.sleep(overlap + 0.05)
        store.put_rules(Rule(key, 20, 1) for key in keys[:10])
        reads.append(await keeper.sync())
        keeper.close()
        return reads

    reads = asyncio.run(scenario())
    assert reads[0] == 100_000 and reads[1:] == [0, 10]
    assert counting.get_calls == 0
    assert len(partition.buckets) == 100_000
    assert [partition.buckets[key.encode()].rule.capacity for key in keys[:11]] == [20] * 10 + [10]


def test_restarted_server_resumes_from_the_checkpoint_plus_refill(open_store: Callable[[], RuleStore]) -> None:
    open_store().put_rule(Rule("k", 100, 10))

    async def scenario() -> list[int | None]:
        server, client = await start_server(open_store(), checkpoint_interval_s=0.1)
        for _ in range(60):
            await client.check("k")  # 40 left
        await server.stop()  # SIGTERM path: final checkpoint
        client.close()
        stopped = time.monotonic()
        server, client = await start_server(open_store())
        await asyncio.sleep(max(0.0, 0.5 - (time.monotonic() - stopped)))
        decision = await client.check("k")
        elapsed = time.monotonic() - stopped
        client.close()
        await server.stop()
        return [decision.remaining, round(40 + 10 * elapsed - 1)]

    remaining, expected = asyncio.run(scenario())
    assert remaining is not None and expected - 2 <= remaining <= expected + 2


class SwitchableStore:
    """A store that can be made unreachable, like a stopped database."""

    def __init__(self, inner: RuleStore) -> None:
        self.inner = inner
        self.down = False
        self.checkpoint_writes: list[list[Checkpoint]] = []

    def _check(self) -> None:
        if self.down:
            raise StoreUnavailable("store is down")

    def get_rules(self, keys: Iterable[str]) -> dict[str, Rule]:
        self._check()
        return self.inner.get_rules(keys)

    def get_checkpoints(self, keys: Iterable[str], now_ns: int) -> dict[str, Checkpoint]:
        self._check()
        return self.inner.get_checkpoints(keys, now_ns)

    def changed_since(self, since: float, *, limit: int = 1000) -> list[RuleChange]:
        self._check()
        return self.inner.changed_since(since, limit=limit)

    def list_patterns(self) -> list[Rule]:
        self._check()
        return self.inner.list_patterns()

    def put_checkpoints(self, checkpoints: Sequence[Checkpoint]) -> int:
        self._check()
        checkpoints = list(checkpoints)
        self.checkpoint_writes.append(checkpoints)
        return self.inner.put_checkpoints(checkpoints)

    def sweep(self, now_ns: int) -> int:
        self._check()
        return self.inner.sweep(now_ns)


def test_store_outage_keeps_deciding_and_heals(
    sqlite_opener: Callable[[], RuleStore], caplog: pytest.LogCaptureFixture
) -> None:
    inner = sqlite_opener()
    inner.put_rules([Rule("known", 1000, 0), Rule("later", 3, 0)])
    store = SwitchableStore(inner)

    async def scenario() -> None:
        server, client = await start_server(store, checkpoint_interval_s=0.1)  # type: ignore[arg-type]
        assert (await client.check("known", 10)).remaining == 990
        store.down = True
        for _ in range(30):  # ~1.5 s of outage under load
            known = await client.check("known")
            assert known.allowed and known.capacity == 1000 and not known.fallback
            later = await client.check("later")
            assert not later.fallback and later.capacity == 100  # default rule for now
            await asyncio.sleep(0.05)
        assert server.partition.store_errors > 0
        store.down = False
        deadline = time.monotonic() + 5
        while (await client.check("later")).capacity != 3:  # reloaded once the store is back
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        while not any(c.key == "known" and c.credit == 960 * 10**9 for w in store.checkpoint_writes for c in w):
            assert time.monotonic() < deadline, "the credit spent during the outage was never checkpointed"
            await asyncio.sleep(0.05)
        client.close()
        await server.stop()

    with caplog.at_level(logging.WARNING, logger="sluicegate.server"):
        asyncio.run(scenario())
    outage_logs = [r for r in caplog.records if "store unavailable" in r.getMessage()]
    assert len(outage_logs) == 1  # logged once, not per request
    assert any("available again" in r.getMessage() for r in caplog.records)


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sluicegate.cli", *args], capture_output=True, text=True, env=env, timeout=120
    )


@pytest.fixture(params=["postgres", "dynamodb"])
def store_env(request: pytest.FixtureRequest) -> tuple[dict[str, str], Callable[[], RuleStore]]:
    """Environment pointing the CLI at a fresh PostgreSQL schema / DynamoDB tables, and an opener for checks."""
    if request.param == "postgres":
        dsn = request.getfixturevalue("postgres_dsn")
        env = child_env(SLUICEGATE_STORE="postgres", SLUICEGATE_POSTGRES_DSN=dsn)
        return env, lambda: open_store_kind("postgres", dsn=dsn)
    tables = request.getfixturevalue("dynamodb_server_tables")
    return child_env(**tables.env()), tables.open


def test_cli_migrates_and_bulk_imports_into_each_backend(
    store_env: tuple[dict[str, str], Callable[[], RuleStore]], tmp_path: Path
) -> None:
    env, open_ = store_env
    assert _cli("migrate", env=env).returncode == 0
    assert _cli("migrate", env=env).returncode == 0  # idempotent
    rows = "".join(f"user-{i},{i % 50 + 1},1.5\n" for i in range(1200))
    source = tmp_path / "rules.csv"
    source.write_text("key,capacity,rate\n" + rows + "broken,-1,1\n")
    done = _cli("rules", "import", str(source), env=env)
    assert done.returncode == 1  # one bad row
    assert f"{source}:1202:" in done.stderr and "imported 1200 rules" in done.stderr
    store = open_()
    assert store.get_rule("user-7") == Rule("user-7", 8, 1.5)
    assert len(list(store.iter_rules(prefix="user-"))) == 1200


class FlakyReads(SwitchableStore):
    """Up for rule sync, but its rule reads can be made to fail (a store that flaps)."""

    def __init__(self, inner: RuleStore) -> None:
        super().__init__(inner)
        self.fail_reads = False

    def get_rules(self, keys: Iterable[str]) -> dict[str, Rule]:
        if self.fail_reads:
            raise StoreUnavailable("reads failing")
        return super().get_rules(keys)


def test_key_defaulted_in_an_outage_keeps_trying_until_a_reload_works(sqlite_opener: Callable[[], RuleStore]) -> None:
    inner = sqlite_opener()
    inner.put_rule(Rule("later", 3, 0))
    store = FlakyReads(inner)

    async def scenario() -> list[int | None]:
        server, client = await start_server(store, sync_interval_s=3600, sync_overlap_s=0)  # type: ignore[arg-type]
        keeper = server.keeper
        seen = []
        store.down = True
        seen.append((await client.check("later")).capacity)  # default rule
        store.down, store.fail_reads = False, True
        await keeper.sync()  # works, but the reload it starts fails
        await asyncio.sleep(0.1)
        seen.append((await client.check("later")).capacity)
        store.fail_reads = False
        await keeper.sync()  # tries again
        await asyncio.sleep(0.1)
        seen.append((await client.check("later")).capacity)
        client.close()
        await server.stop()
        return seen

    assert asyncio.run(scenario()) == [100, 100, 3]


def test_invalid_key_is_answered_invalid_and_is_no_store_outage(sqlite_opener: Callable[[], RuleStore]) -> None:
    async def scenario() -> tuple[list, dict[str, int]]:
        partition = Partition(default_rule=default_rule(100, 0))
        server, address = await serve_partition(partition, sqlite_opener(), listen=("127.0.0.1", 0))
        loop = asyncio.get_running_loop()
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.setblocking(False)
        sock.connect(address)
        await loop.sock_sendall(sock, codec.encode_check_request(1, [(b"a\x00b", 1), (b"ok", 1)]))
        reply = await asyncio.wait_for(loop.sock_recv(sock, 65536), 2)
        sock.close()
        counters = partition.counters()
        await server.stop()
        return codec.decode_check_reply(reply)[1], counters

    (bad, good), counters = asyncio.run(scenario())
    assert bad.status == codec.STATUS_INVALID and good.allowed
    assert counters["store_errors"] == 0


class BrokenOnce(SwitchableStore):
    """put_checkpoints raises an unexpected error once (a bug, not an outage)."""

    def __init__(self, inner: RuleStore) -> None:
        super().__init__(inner)
        self.broken = True

    def put_checkpoints(self, checkpoints: Sequence[Checkpoint]) -> int:
        if self.broken:
            self.broken = False
            raise RuntimeError("unexpected")
        return super().put_checkpoints(checkpoints)


def test_checkpoint_loop_survives_an_unexpected_error_and_caps_far_expiries(
    sqlite_opener: Callable[[], RuleStore],
) -> None:
    inner = sqlite_opener()
    inner.put_rule(Rule("slow", 1_000_000, 0.0001))  # full again in ~285 years: beyond 64-bit ns
    store = BrokenOnce(inner)

    async def scenario() -> None:
        server, client = await start_server(store, checkpoint_interval_s=0.1)  # type: ignore[arg-type]
        await client.check("slow", 900_000)
        deadline = time.monotonic() + 5
        while not store.checkpoint_writes:
            assert time.monotonic() < deadline, "no checkpoint after the loop's first error"
            await asyncio.sleep(0.05)
        client.close()
        await server.stop()

    asyncio.run(scenario())
    saved = inner.get_checkpoints(["slow"], time.time_ns())["slow"]
    assert 100_000 * 10**9 <= saved.credit < 100_001 * 10**9  # plus a trickle of refill
    assert saved.expires_ns == NEVER_EXPIRES_NS


def test_restore_refills_under_the_rule_in_force_on_another_clock(sqlite_opener: Callable[[], RuleStore]) -> None:
    store = sqlite_opener()
    store.put_rule(Rule("k", 100, 10))

    async def scenario() -> int | None:
        server, client = await start_server(sqlite_opener())
        await client.check("k", 90)  # 10 left; under this rule, full again in 9 s
        await server.stop()  # final checkpoint
        client.close()
        store.put_rule(Rule("k", 100, 0.1))  # much slower now
        later = ManualClock(start_ns=time.time_ns() + 20 * 10**9)  # another machine, 20 s later
        server, client = await start_server(sqlite_opener(), clock=ManualClock(start_ns=5 * 10**9), wall_clock=later)
        decision = await client.check("k", 1)
        client.close()
        await server.stop()
        return decision.remaining

    # 10 + 0.1/s x 20 s - 1: the old checkpoint expired under the old rule, yet it still counts.
    assert asyncio.run(scenario()) == 11
