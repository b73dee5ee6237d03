"""Bucket servers over real UDP on 127.0.0.1: accuracy, loss, outages, malformed input."""

from __future__ import annotations

import asyncio
import random
import socket
import time
from pathlib import Path

from sluicegate import codec
from sluicegate.bucket import Bucket
from sluicegate.router.client import PartitionClient, UdpLink
from sluicegate.rules import Rule, default_rule
from sluicegate.server.partition import Partition
from sluicegate.server.udp import PartitionServer, serve_partition
from sluicegate.store import open_store
from tests.conftest import ManualClock


async def start_cluster(
    count: int, db: Path, rule_for_unknown: Rule, clock: ManualClock | None = None
) -> list[tuple[PartitionServer, tuple[str, int]]]:
    servers = []
    for _ in range(count):
        partition = Partition(default_rule=rule_for_unknown)
        kwargs = {"clock": clock} if clock else {}
        servers.append(
            await serve_partition(partition, open_store("sqlite", path=str(db)), listen=("127.0.0.1", 0), **kwargs)
        )
    return servers


def test_admitted_totals_match_the_pure_model(tmp_path: Path) -> None:
    """Random rules and cost sequences through 3 real servers equal the pure model, check by check."""
    rng = random.Random(7)
    keys = [f"tenant-{i}" for i in range(40)] + [f"{{shared}}/k{i}" for i in range(10)]
    fallback_rule = default_rule(20, 3)
    store = open_store("sqlite", path=str(tmp_path / "rules.db"))
    rules = {key: Rule(key, rng.randint(0, 60), rng.choice([0, 0.5, 1, 5, 12.5, 40])) for key in keys[::2]}
    rules[keys[0]] = Rule(keys[0], 0, 0)  # deny-all
    store.put_rules(rules.values())
    clock = ManualClock()

    async def scenario() -> tuple[dict[str, int], dict[str, int], int]:
        servers = await start_cluster(3, tmp_path / "rules.db", fallback_rule, clock)
        client = PartitionClient([address for _, address in servers], timeout_s=1.0)
        await client.start()
        model: dict[str, Bucket] = {}
        served = dict.fromkeys(keys, 0)
        expected = dict.fromkeys(keys, 0)
        mismatches = 0
        for _ in range(300):
            clock.advance(rng.choice([0, 0.001, 0.05, 0.3, 1.7]))
            batch = [(rng.choice(keys), rng.randint(1, 8)) for _ in range(rng.randint(1, 30))]
            decisions = await client.check_many(batch)
            for (key, cost), decision in zip(batch, decisions, strict=True):
                bucket = model.setdefault(key, Bucket(rules.get(key, fallback_rule), clock()))
                allowed = bucket.take(cost, clock())
                mismatches += allowed != decision.allowed or bucket.remaining != decision.remaining
                assert not decision.fallback
                served[key] += cost if decision.allowed else 0
                expected[key] += cost if allowed else 0
        client.close()
        for server, _ in servers:
            server.close()
        return served, expected, mismatches

    served, expected, mismatches = asyncio.run(scenario())
    assert mismatches == 0
    assert served == expected
    assert expected[keys[0]] == 0 and sum(expected.values()) > 1000  # deny-all held, others admitted


class LossyLink:
    """Wraps the real UDP link and drops a share of datagrams in each direction."""

    def __init__(self, drop: float, seed: int) -> None:
        self.drop = drop
        self.rng = random.Random(seed)
        self.delivered: dict[int, list[tuple[bytes, int]]] = {}  # request id -> checks that reached a server
        self.inner: UdpLink | None = None

    async def open(self, deliver, family=socket.AF_INET):  # type: ignore[no-untyped-def]
        def lossy_deliver(data: bytes, addr: object) -> None:
            if self.rng.random() >= self.drop:
                deliver(data, addr)

        self.inner = await UdpLink.open(lossy_deliver, family)
        return self

    def send(self, data: bytes, addr: tuple[str, int]) -> None:
        if self.rng.random() < self.drop:
            return
        request_id, checks = codec.decode_check_request(data)
        self.delivered[request_id] = checks
        self.inner.send(data, addr)  # type: ignore[union-attr]

    def close(self) -> None:
        self.inner.close()  # type: ignore[union-attr]


def test_lossy_network_every_check_answered_none_charged_twice(tmp_path: Path) -> None:
    link = LossyLink(drop=0.25, seed=11)

    async def scenario() -> tuple[list, dict[str, int], PartitionClient]:
        servers = await start_cluster(2, tmp_path / "rules.db", default_rule(10**9, 10**6))
        client = PartitionClient(
            [address for _, address in servers], timeout_s=0.02, attempts=4, link_factory=link.open
        )
        await client.start()
        rng = random.Random(3)
        decisions = []
        for _ in range(100):
            batch = [(f"user-{rng.randrange(500)}", rng.randint(1, 9)) for _ in range(20)]
            decisions += await asyncio.wait_for(client.check_many(batch), timeout=5)
        totals = {"checks": 0, "charged": 0, "duplicates": 0}
        for server, _ in servers:
            for name in totals:
                totals[name] += server.partition.counters()[name]
        client.close()
        for server, _ in servers:
            server.close()
        return decisions, totals, client

    decisions, totals, client = asyncio.run(scenario())
    assert len(decisions) == 2000  # every check got an answer
    fallbacks = [d for d in decisions if d.fallback]
    assert all(d.allowed for d in decisions)  # real answers allow (huge bucket); fallbacks fail open
    assert 0 < len(fallbacks) < 400, len(fallbacks)
    distinct = [check for checks in link.delivered.values() for check in checks]
    assert totals["checks"] == len(distinct)
    assert totals["charged"] == sum(cost for _, cost in distinct)
    assert totals["duplicates"] > 0  # retries did reach the servers, and were not charged again


def test_stopped_partition_answers_fallback_within_retry_budget(partition_process) -> None:  # type: ignore[no-untyped-def]
    servers = [partition_process() for _ in range(3)]
    servers[1].process.terminate()
    servers[1].process.wait(5)
    timeout_s, attempts = 0.05, 3

    async def scenario(fail_open: bool) -> tuple[list, float, list[int]]:
        client = PartitionClient(
            [s.address for s in servers], timeout_s=timeout_s, attempts=attempts, fail_open=fail_open
        )
        await client.start()
        keys = [f"k{i}" for i in range(60)]
        started = time.monotonic()
        decisions = await client.check_many([(key, 1) for key in keys])
        elapsed = time.monotonic() - started
        owners = [client.partition(key) for key in keys]
        client.close()
        return decisions, elapsed, owners

    for fail_open in (True, False):
        decisions, elapsed, owners = asyncio.run(scenario(fail_open))
        assert elapsed < timeout_s * attempts + 0.5
        for decision, owner in zip(decisions, owners, strict=True):
            if owner == 1:
                assert decision.fallback and decision.allowed is fail_open and decision.remaining in (None, 0)
            else:
                assert not decision.fallback and decision.allowed and decision.remaining == 99
        assert {1} < set(owners)


def test_100k_malformed_datagrams_counted_never_crash_never_amplify(partition_process) -> None:  # type: ignore[no-untyped-def]
    server = partition_process()
    rng = random.Random(5)
    reference = Partition(default_rule=default_rule(1, 1))  # decides what counts as malformed
    valid = codec.encode_check_request(1, [(b"alice", 1), (b"bob", 2)])

    def malformed() -> bytes:
        while True:
            kind = rng.random()
            if kind < 0.4:
                blob = rng.randbytes(rng.randrange(0, 1400))
            elif kind < 0.7:
                blob = valid[: rng.randrange(0, len(valid))]
            else:
                mutable = bytearray(valid)
                for _ in range(rng.randint(1, 4)):
                    mutable[rng.randrange(0, 20)] = rng.randrange(256)
                blob = bytes(mutable)
            before = reference.malformed
            if reference.receive_datagram(blob, ("x", 1), 0) is None and reference.malformed > before:
                return blob

    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.settimeout(5)
    sent = 0
    replies = 0

    def stats() -> dict[str, int]:
        nonlocal replies
        request = codec.encode_stats_request(rng.getrandbits(64))
        sock.sendto(request, server.address)
        while True:  # anything before the stats reply is an unexpected reply to junk
            data = sock.recv(65536)
            if codec.decode_header(data)[0] == codec.OP_STATS | codec.REPLY_BIT:
                assert len(data) <= len(request)
                return codec.decode_stats_reply(data)[1]
            replies += 1

    while sent < 100_000:
        for _ in range(200):  # a burst the socket buffer holds; stats waits until it is processed
            sock.sendto(malformed(), server.address)
        sent += 200
        assert stats()["malformed"] == sent
    assert replies == 0
    assert server.process.poll() is None
    # Still serving, and a real reply is never larger than its request.
    for count in (1, 5, 50):
        request = codec.encode_check_request(1000 + count, [(b"k%d" % i, 1) for i in range(count)])
        sock.sendto(request, server.address)
        reply = sock.recv(65536)
        assert codec.decode_check_reply(reply)[0] == 1000 + count and len(reply) <= len(request)
    sock.close()


def test_more_checks_than_one_datagram_holds_are_all_answered(tmp_path: Path) -> None:
    async def scenario() -> list:
        servers = await start_cluster(1, tmp_path / "rules.db", default_rule(10**6, 0))
        client = PartitionClient([address for _, address in servers], max_datagram=65507)
        await client.start()
        decisions = await asyncio.wait_for(client.check_many([(f"k{i}", 1) for i in range(codec.MAX_ITEMS + 50)]), 10)
        client.close()
        for server, _ in servers:
            server.close()
        return decisions

    decisions = asyncio.run(scenario())
    assert len(decisions) == codec.MAX_ITEMS + 50 and all(d.allowed and not d.fallback for d in decisions)


def test_partition_over_ipv6_and_by_name(tmp_path: Path) -> None:
    async def scenario() -> tuple:
        partition = Partition(default_rule=default_rule(5, 0))
        server, (host, port) = await serve_partition(
            partition, open_store("sqlite", path=str(tmp_path / "r.db")), listen=("::1", 0)
        )
        v6 = PartitionClient([(host, port)])
        await v6.start()
        first = await v6.check("k")
        v6.close()
        server.close()
        server, (_, port) = await serve_partition(
            partition, open_store("sqlite", path=str(tmp_path / "r.db")), listen=("127.0.0.1", 0)
        )
        named = PartitionClient([("localhost", port)])
        await named.start()
        second = await named.check("k")
        named.close()
        server.close()
        return first, second

    first, second = asyncio.run(scenario())
    assert not first.fallback and first.remaining == 4
    assert not second.fallback and second.remaining == 3
