"""How each backend lays out the policy engine's data (the contract: ``test_store_policy.py``).

SQLite and PostgreSQL: a ``policy`` JSON text column, a ``pattern`` flag under
a partial index the pattern listing uses, a ``quotas`` column; an old file
migrated by processes opening it at once. DynamoDB: attributes present only
when they carry something, a sparse pattern index (created on an old table by
``migrate``), and rule sync completing the update-time index's entries from
the table.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from sluicegate.rules import Rule
from sluicegate.store import RuleStore
from sluicegate.store.base import Checkpoint
from sluicegate.store.dynamodb import PATTERN, POLICY, QUOTAS, RULES_PATTERN_INDEX, DynamoRuleStore
from sluicegate.store.postgres import PostgresRuleStore
from sluicegate.store.sqlite import SqliteRuleStore
from tests.functional.test_store_dynamodb import raw_item, record
from tests.stores.contract import OldRule

POLICY_RULE = Rule("tenant:*", 10, 0.5, precedence=5, shadow=True)


class TestSqlite:
    def test_policy_text_and_pattern_flag_columns(self, tmp_path: Path) -> None:
        store = SqliteRuleStore(str(tmp_path / "rules.db"))
        store.put_rules([POLICY_RULE, Rule("alice", 1, 1)])
        with contextlib.closing(sqlite3.connect(tmp_path / "rules.db")) as db:
            rows = db.execute("SELECT key, policy, pattern FROM rules ORDER BY key").fetchall()
            plan = " ".join(
                row[-1]
                for row in db.execute("EXPLAIN QUERY PLAN SELECT key FROM rules WHERE pattern = 1 AND deleted = 0")
            )
        assert rows == [("alice", "", 0), ("tenant:*", '{"precedence":5,"shadow":true}', 1)]
        assert "rules_patterns" in plan  # the listing reads the partial index, not the table
        store.close()

    def test_processes_opening_an_old_file_at_once_migrate_it_once(
        self, sqlite_legacy: Callable[..., Callable[[], RuleStore]]
    ) -> None:
        opener = sqlite_legacy([OldRule("tenant:*", 5, 0.5)], [])
        barrier = threading.Barrier(6)
        opened: list[RuleStore] = []
        errors: list[BaseException] = []

        def open_at_once() -> None:
            barrier.wait()
            try:
                opened.append(opener())  # a connection of its own, as another process has
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=open_at_once) for _ in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert errors == [] and len(opened) == 6
        assert all(store.list_patterns() == [Rule("tenant:*", 5, 0.5)] for store in opened)
        for store in opened:
            store.close()


class TestPostgres:
    def test_columns_and_the_partial_index_of_patterns(self, postgres_dsn: str) -> None:
        store = PostgresRuleStore(postgres_dsn)
        store.put_rules([POLICY_RULE, Rule("alice", 1, 1)])
        store.put_checkpoints([Checkpoint("alice", 1, 0, 10, "day:3")])
        with psycopg.connect(postgres_dsn, autocommit=True) as conn:
            rows = conn.execute("SELECT key, policy, pattern FROM rules ORDER BY key").fetchall()
            assert conn.execute("SELECT quotas FROM checkpoints").fetchall() == [("day:3",)]
            conn.execute("SET enable_seqscan = off")  # a tiny table: make the planner show what it can use
            plan = conn.execute("EXPLAIN SELECT key FROM rules WHERE pattern AND NOT deleted ORDER BY key").fetchall()
        assert rows == [("alice", "", False), ("tenant:*", '{"precedence":5,"shadow":true}', True)]
        assert "rules_patterns" in " ".join(line for (line,) in plan)
        store.close()


class TestDynamoDB:
    @pytest.fixture
    def store(self, dynamodb_opener: Callable[[], RuleStore]) -> DynamoRuleStore:
        opened = dynamodb_opener()
        assert isinstance(opened, DynamoRuleStore)
        return opened

    def test_attributes_only_where_they_carry_something(self, store: DynamoRuleStore) -> None:
        store.put_rules([POLICY_RULE, Rule("alice", 1, 1)])
        store.put_checkpoints([Checkpoint("q", 1, 0, 10, "day:3"), Checkpoint("plain", 1, 0, 10)])
        pattern, plain = raw_item(store, store.rules_table, "tenant:*"), raw_item(store, store.rules_table, "alice")
        assert pattern[POLICY] == {"S": '{"precedence":5,"shadow":true}'} and pattern[PATTERN] == {"S": "patterns"}
        assert POLICY not in plain and PATTERN not in plain  # the same item as before policies
        assert raw_item(store, store.checkpoints_table, "q")[QUOTAS] == {"S": "day:3"}
        assert QUOTAS not in raw_item(store, store.checkpoints_table, "plain")
        assert store.delete_rule("tenant:*")
        assert PATTERN not in raw_item(store, store.rules_table, "tenant:*")  # a tombstone leaves the index

    def test_patterns_are_one_paginated_query_on_the_sparse_index(
        self, store: DynamoRuleStore, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        store.put_rules(Rule(f"user-{i:03}", 1, 1) for i in range(300))
        store.put_rules(Rule(f"tenant-{i:02}:*", i, 1) for i in range(12))

        def small_pages(real: Callable[..., dict[str, Any]], call: int, **params: Any) -> dict[str, Any]:
            return real(**{**params, "Limit": 5})  # as if each page hit 1 MB

        queries = record(monkeypatch, store, "query", small_pages)
        scans = record(monkeypatch, store, "scan")
        assert [rule.key for rule in store.list_patterns()] == [f"tenant-{i:02}:*" for i in range(12)]
        assert scans.calls == [] and {call["IndexName"] for call in queries.calls} == {RULES_PATTERN_INDEX}
        assert len(queries.calls) == 3  # 5 + 5 + 2
        assert sum(response["ScannedCount"] for response in queries.responses) == 12  # no exact rule read

    def test_migrate_adds_the_pattern_index_to_an_old_table_and_marks_only_live_patterns(
        self, dynamodb_legacy: Callable[..., Callable[[], RuleStore]]
    ) -> None:
        opener = dynamodb_legacy(
            [OldRule("tenant:*", 5, 0.5), OldRule("gone?", 1, 1.0, deleted=True), OldRule("alice", 1, 1.0)], []
        )
        store = opener()
        assert isinstance(store, DynamoRuleStore)
        store.migrate()
        table = store._client.describe_table(TableName=store.rules_table)["Table"]
        (index,) = [gsi for gsi in table["GlobalSecondaryIndexes"] if gsi["IndexName"] == RULES_PATTERN_INDEX]
        assert index["IndexStatus"] == "ACTIVE"
        assert raw_item(store, store.rules_table, "tenant:*")[PATTERN] == {"S": "patterns"}
        assert PATTERN not in raw_item(store, store.rules_table, "gone?")
        assert PATTERN not in raw_item(store, store.rules_table, "alice")
        store.close()

    def test_sync_reads_policies_from_the_table_and_trusts_it_over_a_lagging_index(
        self, store: DynamoRuleStore, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        store.put_rules([POLICY_RULE, Rule("alice", 1, 1)])
        assert [change.rule for change in store.changed_since(0)] == [POLICY_RULE, Rule("alice", 1, 1)]
        store._client.update_item(  # deleted in the table; the index below still says live
            TableName=store.rules_table,
            Key={"key": {"S": "alice"}},
            UpdateExpression="SET deleted = :true",
            ExpressionAttributeValues={":true": {"BOOL": True}},
        )

        def lagging(real: Callable[..., dict[str, Any]], call: int, **params: Any) -> dict[str, Any]:
            response = real(**params)
            for item in response["Items"]:
                item["deleted"] = {"BOOL": False}
            return response

        record(monkeypatch, store, "query", lagging)
        changes = store.changed_since(0)
        assert [(change.key, change.rule) for change in changes] == [("tenant:*", POLICY_RULE), ("alice", None)]
