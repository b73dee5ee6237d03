"""The sans-I/O partition core: decisions, reply cache, parking while rules load, counters."""

from __future__ import annotations

from sluicegate import codec
from sluicegate.rules import Rule, default_rule
from sluicegate.server.partition import Partition

ADDR = ("127.0.0.1", 40000)
SECOND = 1_000_000_000


def ask(partition: Partition, request_id: int, checks: list[tuple[bytes, int]], now: int = 0) -> bytes | None:
    return partition.receive_datagram(codec.encode_check_request(request_id, checks), ADDR, now)


def results(reply: bytes | None) -> list[codec.ItemResult]:
    assert reply is not None
    return codec.decode_check_reply(reply)[1]


def loaded(partition: Partition, rules: dict[bytes, Rule | None], now: int = 0) -> list[tuple[bytes, object]]:
    assert sorted(partition.keys_to_load()) == sorted(rules)
    return partition.rules_loaded(rules, now)


def test_unknown_key_parks_until_its_rule_loads_then_is_decided() -> None:
    p = Partition(default_rule=default_rule(10, 1))
    assert ask(p, 1, [(b"alice", 4), (b"bob", 1)]) is None
    replies = loaded(p, {b"alice": Rule("alice", 5, 1), b"bob": None})
    assert len(replies) == 1 and replies[0][1] == ADDR
    alice, bob = results(replies[0][0])
    assert alice.allowed and alice.remaining == 1 and alice.capacity == 5 and not alice.default_rule
    assert bob.allowed and bob.remaining == 9 and bob.default_rule
    # Held keys are decided at once from now on.
    assert results(ask(p, 2, [(b"alice", 4)]))[0].retry_after_ms == 3000


def test_held_keys_are_not_blocked_by_a_pending_rule_load() -> None:
    p = Partition(default_rule=default_rule(10, 1))
    ask(p, 1, [(b"held", 1)])
    loaded(p, {b"held": None})
    assert ask(p, 2, [(b"new", 1)]) is None  # parked
    assert results(ask(p, 3, [(b"held", 1)]))[0].allowed  # answered right away


def test_repeated_request_id_gets_the_cached_reply_and_is_not_charged() -> None:
    p = Partition(default_rule=default_rule(10, 0))
    ask(p, 1, [(b"k", 1)])
    loaded(p, {b"k": None})
    first = ask(p, 2, [(b"k", 3)])
    again = ask(p, 2, [(b"k", 3)])
    assert first == again
    assert results(again)[0].remaining == 6
    assert p.counters()["charged"] == 4 and p.counters()["duplicates"] == 1


def test_repeat_of_a_parked_request_is_not_parked_twice() -> None:
    p = Partition(default_rule=default_rule(10, 0))
    assert ask(p, 1, [(b"k", 2)]) is None
    assert ask(p, 1, [(b"k", 2)]) is None
    replies = loaded(p, {b"k": None})
    assert len(replies) == 1
    assert p.counters()["charged"] == 2


def test_reply_cache_forgets_after_its_window() -> None:
    p = Partition(default_rule=default_rule(10, 0), reply_cache_ns=SECOND)
    ask(p, 1, [(b"k", 1)], now=0)
    loaded(p, {b"k": None})
    ask(p, 2, [(b"k", 1)], now=0)
    ask(p, 3, [(b"k", 1)], now=SECOND // 2)
    assert results(ask(p, 2, [(b"k", 1)], now=SECOND - 1))[0].remaining == 8  # still cached
    assert results(ask(p, 2, [(b"k", 1)], now=SECOND))[0].remaining == 6  # forgotten: charged anew
    assert results(ask(p, 3, [(b"k", 1)], now=SECOND))[0].remaining == 7  # younger entry kept


def test_invalidate_reloads_a_held_key_keeping_credit() -> None:
    p = Partition(default_rule=default_rule(100, 0))
    ask(p, 1, [(b"k", 1)])
    loaded(p, {b"k": None})
    ask(p, 2, [(b"k", 30)])
    assert p.receive_datagram(codec.encode_invalidate_request(3, [b"k", b"not-held"]), ADDR, 0) is None
    [(reply, addr)] = loaded(p, {b"k": Rule("k", 50, 0)})  # answered once the new rule is in force
    assert codec.decode_invalidate_reply(reply) == (3, 1) and addr == ADDR
    assert results(ask(p, 4, [(b"k", 1)]))[0].remaining == 49
    reply = p.receive_datagram(codec.encode_invalidate_request(5, [b"not-held"]), ADDR, 0)
    assert codec.decode_invalidate_reply(reply) == (5, 0)


def test_key_that_is_not_utf8_gets_invalid_status_without_a_rule_load() -> None:
    p = Partition(default_rule=default_rule(10, 1))
    (item,) = results(ask(p, 1, [(b"\xff\xfe", 1)]))
    assert item.status == codec.STATUS_INVALID
    assert p.keys_to_load() == []


def test_malformed_datagrams_are_counted_not_answered() -> None:
    p = Partition(default_rule=default_rule(10, 1))
    for junk in (
        b"",
        b"SG",
        b"hello world, this is not a datagram",
        codec.encode_check_reply(1, [(0, 0, 0, 0, 0, b"")]),
    ):
        assert p.receive_datagram(junk, ADDR, 0) is None
    assert p.counters()["malformed"] == 4


def test_stats_op_reports_counters() -> None:
    p = Partition(default_rule=default_rule(1, 0))
    ask(p, 1, [(b"k", 1), (b"k", 1)])
    loaded(p, {b"k": None})
    _, counters = codec.decode_stats_reply(p.receive_datagram(codec.encode_stats_request(2), ADDR, 0))
    assert counters["checks"] == 2 and counters["allowed"] == 1 and counters["denied"] == 1 and counters["keys"] == 1
    assert counters["datagrams"] == 2  # the two checks shared one datagram; the stats request is the other


def test_checkpoints_are_taken_in_chunks_each_dirty_key_once() -> None:
    p = Partition(default_rule=default_rule(10, 1))
    keys = [b"k%d" % i for i in range(25)]
    ask(p, 1, [(key, 1) for key in keys])
    loaded(p, dict.fromkeys(keys))
    chunks = []
    while chunk := p.take_checkpoints(0, limit=10):
        chunks.append(chunk)
    assert [len(chunk) for chunk in chunks] == [10, 10, 5]
    assert sorted(key for chunk in chunks for key, *_ in chunk) == sorted(keys)
    assert all(taken.credit == 9 * 10**9 and taken.full_at_ns == 10**9 for chunk in chunks for taken in chunk)
    assert p.take_checkpoints(0) == []  # nothing spent since
