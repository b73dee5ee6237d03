"""The store contract, run against every backend, plus SQLite specifics.

Backends come from ``tests/stores`` (one plugin each, listed in
``tests.stores.BACKENDS``): every contract test runs against each. An opener
returns a new handle on the *same* underlying store each time it is called
within one test, so "two handles see each other's writes" is part of the
contract. The policy fields, pattern index, checkpoint quotas and migration
from an older schema: ``test_store_policy.py``.
"""

from __future__ import annotations

import contextlib
import random
import sqlite3
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sluicegate.rules import MAX_CAPACITY, Rule, RuleError
from sluicegate.store import RuleStore, StoreError, StoreUnavailable, open_store
from sluicegate.store.base import DEFAULT_BATCH, MAX_LIST, NEVER_EXPIRES_NS, Checkpoint
from sluicegate.store.sqlite import SqliteRuleStore
from tests.stores import BACKENDS

Opener = Callable[[], RuleStore]


@pytest.fixture(params=BACKENDS)
def open_handle(request: pytest.FixtureRequest) -> Iterator[Opener]:
    """Opens handles on one fresh store of the backend; closes them after the test."""
    opener = request.getfixturevalue(f"{request.param}_opener")
    handles: list[RuleStore] = []

    def open_() -> RuleStore:
        handles.append(opener())
        return handles[-1]

    yield open_
    for handle in handles:
        with contextlib.suppress(StoreError):
            handle.close()


@pytest.fixture
def store(open_handle: Opener) -> RuleStore:
    return open_handle()


def keys_of(rules: list[Rule]) -> list[str]:
    return [rule.key for rule in rules]


def assert_mapped(exc: BaseException) -> None:
    """A store error a caller sees is ours, and it keeps the driver error as its cause."""
    assert not isinstance(exc, sqlite3.Error)
    assert isinstance(exc.__cause__, sqlite3.Error)


class TestStoreContract:
    def test_put_then_get_round_trips_every_field(self, store: RuleStore) -> None:
        rules = [Rule("alice", 1000, 100), Rule("half", 3, 0.5), Rule("max", MAX_CAPACITY, 1e6), Rule("deny", 0, 0)]
        for rule in rules:
            store.put_rule(rule)
        for rule in rules:
            got = store.get_rule(rule.key)
            assert got is not None
            assert (got.key, got.capacity, got.rate) == (rule.key, rule.capacity, rule.rate)

    def test_get_missing_key_is_none(self, store: RuleStore) -> None:
        store.put_rule(Rule("alice", 1, 1))
        assert store.get_rule("bob") is None

    def test_put_replaces_existing_rule(self, store: RuleStore) -> None:
        store.put_rule(Rule("alice", 1, 1))
        store.put_rule(Rule("alice", 50, 5))
        assert store.get_rule("alice") == Rule("alice", 50, 5)
        assert keys_of(store.list_rules()) == ["alice"]

    def test_get_rules_leaves_out_missing_keys_and_tolerates_duplicates(self, store: RuleStore) -> None:
        store.put_rules([Rule("a", 1, 1), Rule("b", 2, 2)])
        assert store.get_rules(["b", "missing", "a", "b", "a"]) == {"a": Rule("a", 1, 1), "b": Rule("b", 2, 2)}
        assert store.get_rules([]) == {}
        assert store.get_rules(iter(["nope"])) == {}

    def test_get_rules_beyond_one_batch(self, store: RuleStore) -> None:
        store.put_rules(Rule(f"k{i:05}", i, 1) for i in range(0, 2 * DEFAULT_BATCH + 300, 2))
        wanted = [f"k{i:05}" for i in range(2 * DEFAULT_BATCH + 300)]
        found = store.get_rules(wanted)
        assert sorted(found) == [f"k{i:05}" for i in range(0, 2 * DEFAULT_BATCH + 300, 2)]
        assert all(rule.capacity == int(key[1:]) for key, rule in found.items())

    def test_put_rules_batches_and_reports_progress(self, store: RuleStore) -> None:
        seen: list[int] = []
        count = store.put_rules((Rule(f"k{i}", i, 1) for i in range(7)), batch_size=3, progress=seen.append)
        assert count == 7
        assert seen == [3, 6, 7]
        assert len(store.list_rules()) == 7

    def test_put_rules_exact_multiple_of_batch_reports_each_batch_once(self, store: RuleStore) -> None:
        seen: list[int] = []
        store.put_rules((Rule(f"k{i}", 1, 1) for i in range(4)), batch_size=2, progress=seen.append)
        assert seen == [2, 4]

    def test_put_rules_last_write_wins_inside_a_batch(self, store: RuleStore) -> None:
        store.put_rules([Rule("a", 1, 1), Rule("b", 2, 2), Rule("a", 3, 3), Rule("a", 4, 4)])
        assert store.get_rule("a") == Rule("a", 4, 4)
        assert store.get_rule("b") == Rule("b", 2, 2)

    def test_put_rules_last_write_wins_across_batches(self, store: RuleStore) -> None:
        store.put_rules([Rule("a", 1, 1), Rule("b", 2, 2), Rule("a", 3, 3)], batch_size=2)
        assert store.get_rule("a") == Rule("a", 3, 3)

    def test_put_rules_rejects_non_rules(self, store: RuleStore) -> None:
        with pytest.raises(TypeError):
            store.put_rules([{"key": "a", "capacity": 1, "rate": 1}])  # type: ignore[list-item]
        assert store.list_rules() == []

    def test_delete_reports_whether_there_was_a_rule(self, store: RuleStore) -> None:
        store.put_rules([Rule("a", 1, 1), Rule("b", 1, 1)])
        assert store.delete_rule("a") is True
        assert store.get_rule("a") is None
        assert store.delete_rule("a") is False
        assert store.delete_rule("never") is False
        assert keys_of(store.list_rules()) == ["b"]

    def test_list_is_in_key_order(self, store: RuleStore) -> None:
        keys = ["b", "a", "B", "é", "a1", "😀", "~", "a/b", "A", "ab"]
        shuffled = keys[:]
        random.Random(7).shuffle(shuffled)
        store.put_rules(Rule(key, 1, 1) for key in shuffled)
        # Code point order (= UTF-8 byte order), the same in every backend.
        assert keys_of(store.list_rules()) == sorted(keys)

    def test_list_limit(self, store: RuleStore) -> None:
        store.put_rules(Rule(f"k{i}", 1, 1) for i in range(5))
        assert keys_of(store.list_rules(limit=2)) == ["k0", "k1"]
        assert len(store.list_rules(limit=MAX_LIST)) == 5

    @pytest.mark.parametrize("limit", [0, -1, MAX_LIST + 1])
    def test_list_limit_out_of_bounds(self, store: RuleStore, limit: int) -> None:
        with pytest.raises(RuleError, match="limit"):
            store.list_rules(limit=limit)

    def test_prefix_includes_the_prefix_itself_and_nothing_outside(self, store: RuleStore) -> None:
        store.put_rules(Rule(key, 1, 1) for key in ["team", "team/a", "team/b", "teal", "teams", "tea", "u"])
        assert keys_of(store.list_rules(prefix="team")) == ["team", "team/a", "team/b", "teams"]
        assert keys_of(store.list_rules(prefix="team/")) == ["team/a", "team/b"]
        assert store.list_rules(prefix="zzz") == []

    def test_prefix_treats_like_wildcards_literally(self, store: RuleStore) -> None:
        keys = ["a%b", "a%c", "axb", "a_b", "a_c", "aXc", "a", "a\\b", "ab"]
        store.put_rules(Rule(key, 1, 1) for key in keys)
        assert keys_of(store.list_rules(prefix="a%")) == ["a%b", "a%c"]
        assert keys_of(store.list_rules(prefix="a_")) == ["a_b", "a_c"]
        assert keys_of(store.list_rules(prefix="a\\")) == ["a\\b"]
        assert keys_of(store.list_rules(prefix="%")) == []

    def test_prefix_with_non_ascii_characters(self, store: RuleStore) -> None:
        store.put_rules(Rule(key, 1, 1) for key in ["😀a", "😀b", "😁", "é1", "e1"])
        assert keys_of(store.list_rules(prefix="😀")) == ["😀a", "😀b"]
        assert keys_of(store.list_rules(prefix="é")) == ["é1"]

    def test_after_pages_through_everything_once(self, store: RuleStore) -> None:
        keys = [f"k{i:02}" for i in range(11)]
        store.put_rules(Rule(key, 1, 1) for key in keys)
        seen: list[str] = []
        after = None
        while page := store.list_rules(after=after, limit=3):
            seen += keys_of(page)
            after = page[-1].key
        assert seen == keys

    def test_after_a_key_that_is_not_stored(self, store: RuleStore) -> None:
        store.put_rules(Rule(key, 1, 1) for key in ["a", "c", "e"])
        assert keys_of(store.list_rules(after="b")) == ["c", "e"]
        assert store.list_rules(after="e") == []

    def test_after_with_prefix(self, store: RuleStore) -> None:
        store.put_rules(Rule(key, 1, 1) for key in ["a", "p/1", "p/2", "p/3", "q"])
        assert keys_of(store.list_rules(prefix="p/", after="p/1")) == ["p/2", "p/3"]
        # An `after` before the prefix range still only returns prefixed keys.
        assert keys_of(store.list_rules(prefix="p/", after="a")) == ["p/1", "p/2", "p/3"]

    def test_iter_rules_walks_more_than_one_page(self, store: RuleStore) -> None:
        count = 2 * MAX_LIST + 345
        keys = [f"user-{i:05}" for i in range(count)]
        store.put_rules(Rule(key, 1, 1) for key in reversed(keys))
        store.put_rules(Rule(f"other-{i}", 1, 1) for i in range(10))
        assert keys_of(list(store.iter_rules(prefix="user-"))) == keys
        assert sum(1 for _ in store.iter_rules()) == count + 10

    def test_iter_rules_with_exactly_one_full_page(self, store: RuleStore) -> None:
        store.put_rules(Rule(f"k{i:04}", 1, 1) for i in range(MAX_LIST))
        assert len(list(store.iter_rules())) == MAX_LIST

    @pytest.mark.parametrize(
        "key",
        ["", "x" * 257, "é" * 128 + "x", "bad\ud800key", 17],
        ids=["empty", "257-bytes", "257-utf8-bytes", "lone-surrogate", "int"],
    )
    def test_bad_keys_are_rejected(self, store: RuleStore, key: object) -> None:
        with pytest.raises(RuleError):
            store.get_rule(key)  # type: ignore[arg-type]
        with pytest.raises(RuleError):
            store.get_rules(["fine", key])  # type: ignore[list-item]
        with pytest.raises(RuleError):
            store.delete_rule(key)  # type: ignore[arg-type]

    def test_longest_key_round_trips(self, store: RuleStore) -> None:
        key = "é" * 128  # 256 UTF-8 bytes
        store.put_rule(Rule(key, 1, 1))
        assert store.get_rule(key) == Rule(key, 1, 1)
        assert keys_of(store.list_rules(prefix="éé")) == [key]

    @pytest.mark.parametrize("name", ["prefix", "after"])
    def test_bad_prefix_or_after_is_a_rule_error(self, store: RuleStore, name: str) -> None:
        # e.g. undecodable bytes from a command line arrive as lone surrogates
        with pytest.raises(RuleError, match=name):
            store.list_rules(**{name: "\udcff"})

    def test_two_handles_see_each_others_writes(self, open_handle: Opener) -> None:
        first, second = open_handle(), open_handle()
        first.put_rule(Rule("alice", 10, 1))
        assert second.get_rule("alice") == Rule("alice", 10, 1)
        second.put_rules([Rule("alice", 20, 2), Rule("bob", 1, 1)])
        assert first.get_rule("alice") == Rule("alice", 20, 2)
        assert keys_of(first.list_rules()) == ["alice", "bob"]
        assert first.delete_rule("bob") is True
        assert second.get_rule("bob") is None
        assert second.delete_rule("bob") is False

    def test_rules_survive_reopening(self, open_handle: Opener) -> None:
        first = open_handle()
        first.put_rule(Rule("alice", 10, 1))
        first.close()
        assert open_handle().get_rule("alice") == Rule("alice", 10, 1)


class TestChangesContract:
    """Rule sync reads what changed since a time: writes and deletions, oldest first."""

    def test_writes_and_deletions_are_reported_in_order(self, store: RuleStore) -> None:
        start = time.time() - 1
        store.put_rule(Rule("a", 10, 1))
        store.put_rule(Rule("b", 20, 2))
        store.delete_rule("a")
        changes = store.changed_since(start)
        assert [(c.key, c.rule) for c in changes] == [("b", Rule("b", 20, 2)), ("a", None)]
        assert changes[0].updated_at <= changes[1].updated_at

    def test_only_changes_after_since_and_within_limit(self, store: RuleStore) -> None:
        store.put_rules(Rule(f"k{i:03}", i, 1) for i in range(30))
        changes = store.changed_since(time.time() - 60, limit=10)
        assert len(changes) == 10
        assert store.changed_since(max(c.updated_at for c in store.changed_since(0, limit=1000)) + 0.001) == []

    def test_deleted_rule_is_gone_for_readers_and_can_come_back(self, store: RuleStore) -> None:
        store.put_rule(Rule("a", 10, 1))
        assert store.delete_rule("a")
        assert store.get_rule("a") is None and store.list_rules() == [] and not store.delete_rule("a")
        store.put_rule(Rule("a", 5, 1))
        assert store.get_rule("a") == Rule("a", 5, 1) and keys_of(store.list_rules()) == ["a"]
        assert store.changed_since(0)[-1].rule == Rule("a", 5, 1)


class TestCheckpointContract:
    def test_round_trip_and_newest_wins(self, store: RuleStore) -> None:
        now = time.time_ns()
        store.put_checkpoints([Checkpoint("a", 5 * 10**9, now, now + 10**9), Checkpoint("b", 0, now, NEVER_EXPIRES_NS)])
        store.put_checkpoints([Checkpoint("a", 7, now + 1, now + 2 * 10**9)])
        got = store.get_checkpoints(["a", "b", "missing"], now)
        assert got == {
            "a": Checkpoint("a", 7, now + 1, now + 2 * 10**9),
            "b": Checkpoint("b", 0, now, NEVER_EXPIRES_NS),
        }

    def test_expired_checkpoint_counts_as_missing_and_sweep_leaves_valid_ones(self, store: RuleStore) -> None:
        now = time.time_ns()
        store.put_checkpoints([Checkpoint("old", 1, now - 10, now - 1), Checkpoint("new", 2, now, now + 10**12)])
        assert set(store.get_checkpoints(["old", "new"], now)) == {"new"}
        store.sweep(now)
        assert set(store.get_checkpoints(["old", "new"], now)) == {"new"}

    def test_largest_credit_and_many_checkpoints(self, store: RuleStore) -> None:
        now = time.time_ns()
        biggest = MAX_CAPACITY * 10**9
        store.put_checkpoints(Checkpoint(f"k{i}", biggest - i, now, now + 10**12) for i in range(DEFAULT_BATCH + 7))
        got = store.get_checkpoints([f"k{i}" for i in range(DEFAULT_BATCH + 7)], now)
        assert len(got) == DEFAULT_BATCH + 7 and got["k0"].credit == biggest

    def test_migrate_is_idempotent(self, store: RuleStore) -> None:
        store.put_rule(Rule("a", 1, 1))
        store.migrate()
        store.migrate()
        assert store.get_rule("a") == Rule("a", 1, 1)


class TestSqlite:
    def test_sweep_deletes_expired_checkpoints(self, tmp_path: Path) -> None:
        store = SqliteRuleStore(str(tmp_path / "rules.db"))
        store.put_checkpoints([Checkpoint("old", 1, 0, 5), Checkpoint("new", 2, 0, 50)])
        assert store.sweep(10) == 1
        assert store._fetch_checkpoints(["old", "new"]) == [Checkpoint("new", 2, 0, 50)]

    def test_file_from_before_tombstones_is_migrated(self, tmp_path: Path) -> None:
        path = tmp_path / "old.db"
        with contextlib.closing(sqlite3.connect(path)) as db:
            db.execute("CREATE TABLE rules (key TEXT PRIMARY KEY, capacity INTEGER, rate REAL, updated_at REAL)")
            db.execute("INSERT INTO rules VALUES ('k', 3, 1.0, 1.0)")
            db.commit()
        store = SqliteRuleStore(str(path))
        assert store.get_rule("k") == Rule("k", 3, 1)
        assert store.delete_rule("k") and store.get_rule("k") is None

    def test_path_in_missing_directory_is_unavailable(self, tmp_path: Path) -> None:
        with pytest.raises(StoreUnavailable) as info:
            SqliteRuleStore(str(tmp_path / "no" / "such" / "dir" / "rules.db"))
        assert_mapped(info.value)
        with pytest.raises(StoreError) as info2:
            open_store("sqlite", path=str(tmp_path / "missing" / "rules.db"))
        assert_mapped(info2.value)

    def test_file_that_is_not_a_database(self, tmp_path: Path) -> None:
        path = tmp_path / "notes.txt"
        path.write_bytes(b"this is not a database, just some text " * 100)
        with pytest.raises(StoreError) as info:
            SqliteRuleStore(str(path))
        assert_mapped(info.value)

    @pytest.mark.parametrize(
        "use",
        [
            lambda s: s.get_rule("a"),
            lambda s: s.get_rules(["a", "b"]),
            lambda s: s.put_rule(Rule("a", 1, 1)),
            lambda s: s.put_rules([Rule("a", 1, 1)]),
            lambda s: s.delete_rule("a"),
            lambda s: s.list_rules(),
            lambda s: next(s.iter_rules()),
        ],
        ids=["get_rule", "get_rules", "put_rule", "put_rules", "delete_rule", "list_rules", "iter_rules"],
    )
    def test_closed_store_raises_store_error(self, tmp_path: Path, use: Callable[[RuleStore], object]) -> None:
        store = SqliteRuleStore(str(tmp_path / "rules.db"))
        store.close()
        with pytest.raises(StoreError) as info:
            use(store)
        assert_mapped(info.value)

    def test_reader_is_not_blocked_by_another_writers_open_transaction(self, tmp_path: Path) -> None:
        # WAL: a process in the middle of a big import must not stall or fail the readers.
        path = tmp_path / "rules.db"
        store = SqliteRuleStore(str(path))
        store.put_rule(Rule("alice", 1, 1))
        other = sqlite3.connect(path, isolation_level=None, timeout=0)
        try:
            other.execute("BEGIN EXCLUSIVE")
            other.execute("UPDATE rules SET capacity = 99 WHERE key = 'alice'")
            assert store.get_rule("alice") == Rule("alice", 1, 1)  # the committed value, at once
            other.execute("COMMIT")
            assert store.get_rule("alice") == Rule("alice", 99, 1)
        finally:
            other.close()
            store.close()

    def test_another_process_sees_writes_and_its_writes_are_seen(self, tmp_path: Path) -> None:
        path = tmp_path / "rules.db"
        store = SqliteRuleStore(str(path))
        try:
            store.put_rule(Rule("from-parent", 5, 1))
            script = textwrap.dedent(
                """
                import sys
                from sluicegate.rules import Rule
                from sluicegate.store.sqlite import SqliteRuleStore
                store = SqliteRuleStore(sys.argv[1])
                print(store.get_rule("from-parent").capacity)
                store.put_rules(Rule(f"child-{i}", i, 1) for i in range(3))
                store.close()
                """
            )
            done = subprocess.run(
                [sys.executable, "-c", script, str(path)], capture_output=True, text=True, timeout=30, check=True
            )
            assert done.stdout.strip() == "5"
            assert keys_of(store.list_rules(prefix="child-")) == ["child-0", "child-1", "child-2"]
        finally:
            store.close()

    def test_open_store_rejects_unknown_backend(self) -> None:
        with pytest.raises(StoreError, match="unknown store"):
            open_store("cassandra")


def test_one_bulk_write_pages_through_changed_since_without_losing_rows(open_handle: Opener) -> None:
    store = open_handle()
    start = time.time() - 1
    store.put_rules(Rule(f"k{i:04}", 1, 1) for i in range(2 * MAX_LIST + 5))  # more than a page, one write
    seen: list[str] = []
    since = start
    while page := store.changed_since(since):
        seen += [change.key for change in page]
        since = page[-1].updated_at
    assert sorted(seen) == [f"k{i:04}" for i in range(2 * MAX_LIST + 5)]
