"""The store contract for the policy engine's data, run against every backend.

Rules with policy fields (limits, shadow, precedence, parent, weight, priority,
share, level weights) round-trip exactly through every read; pattern rules are
listed from an index of their own; checkpoints carry the quota counters' text;
a store created by the release before policies is migrated and its rows read
back unchanged; a stored rule that is not valid any more is skipped, logged and
counted, never failing a whole read. Backend layouts: ``test_store_layout.py``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import pytest

from sluicegate.limits import Limit
from sluicegate.rules import Rule, RuleError
from sluicegate.store import RuleStore
from sluicegate.store.base import Checkpoint
from sluicegate.store.rows import StoredRule, policy_text, rule_of
from tests.stores import BACKENDS
from tests.stores.contract import Handles, OldCheckpoint, OldRule, Opener, Seeder, set_raw_policy

PARENT = Rule("{acme}", 250, 250, share="strict", level_weights=((2, 4.0), (1, 2.0), (0, 1.0)))
CHILD = Rule(
    "{acme}:search",
    100,
    150,
    parent="{acme}",
    weight=6,
    priority=2,
    limits=(
        Limit("burst", capacity=20, rate=5),
        Limit("daily", quota=250, per="day", offset_minutes=120, shadow=True),
    ),
)
PATTERN = Rule("tenant:*", 10, 0.5, precedence=5, shadow=True)
PLAIN = Rule("alice", 10, 1)
RULES = [PARENT, CHILD, PATTERN, PLAIN]


@pytest.fixture(params=BACKENDS)
def open_handle(request: pytest.FixtureRequest) -> Iterator[Opener]:
    """Opens handles on one fresh store of the backend; closes them after the test."""
    handles = Handles()
    yield handles.opener(request.getfixturevalue(f"{request.param}_opener"))
    handles.close_all()


@pytest.fixture
def store(open_handle: Opener) -> RuleStore:
    return open_handle()


@pytest.fixture(params=BACKENDS)
def legacy(request: pytest.FixtureRequest) -> Iterator[Seeder]:
    """The backend's seeder of a store from before policies (tests/stores/contract.py); handles closed after."""
    seeder: Seeder = request.getfixturevalue(f"{request.param}_legacy")
    handles = Handles()
    yield lambda rules, checkpoints: handles.opener(seeder(rules, checkpoints))
    handles.close_all()


def keys_of(rules: list[Rule]) -> list[str]:
    return [rule.key for rule in rules]


class TestPolicyFields:
    def test_every_field_round_trips_exactly_through_every_read(self, store: RuleStore) -> None:
        start = time.time() - 1
        store.put_rules(RULES)
        by_key = sorted(RULES, key=lambda rule: rule.key)
        assert store.get_rules(rule.key for rule in RULES) == {rule.key: rule for rule in RULES}
        assert all(store.get_rule(rule.key) == rule for rule in RULES)
        assert store.list_rules() == by_key
        assert list(store.iter_rules()) == by_key
        assert sorted((change.rule for change in store.changed_since(start)), key=lambda r: r.key) == by_key  # type: ignore[union-attr]
        assert store.list_patterns() == [PATTERN]
        # Equality covers every field; spell out the ones a partition acts on.
        child = store.get_rule(CHILD.key)
        assert child is not None and child.limits[1].shadow and child.limits[1].offset_minutes == 120
        assert store.get_rule(PARENT.key).level_weights == ((0, 1.0), (1, 2.0), (2, 4.0))  # type: ignore[union-attr]

    def test_a_plain_rule_replacing_a_policy_rule_leaves_no_policy_behind(self, open_handle: Opener) -> None:
        writer, reader = open_handle(), open_handle()
        writer.put_rule(CHILD)
        assert reader.get_rule(CHILD.key) == CHILD
        writer.put_rule(Rule(CHILD.key, 7, 2))
        replaced = reader.get_rule(CHILD.key)
        assert replaced == Rule(CHILD.key, 7, 2) and replaced.policy_dict() == {}  # type: ignore[union-attr]
        assert reader.changed_since(0)[-1].rule == Rule(CHILD.key, 7, 2)

    def test_old_style_rules_read_back_as_plain_rules(self, store: RuleStore) -> None:
        store.put_rules([PLAIN, Rule("deny", 0, 0)])
        assert store.get_rules(["alice", "deny"]) == {"alice": PLAIN, "deny": Rule("deny", 0, 0)}
        assert all(rule.is_plain and rule.policy_dict() == {} for rule in store.list_rules())


class TestPatterns:
    def test_list_patterns_holds_every_live_pattern_and_no_exact_rule(self, open_handle: Opener) -> None:
        writer, reader = open_handle(), open_handle()
        assert reader.list_patterns() == []
        patterns = [Rule(key, 5, 1) for key in ["tenant:*", "user-?", "[ab]x", "tenant:acme:*", "*"]]
        writer.put_rules([*patterns, PLAIN, Rule("tenant:acme:bob", 1, 1)])
        assert reader.list_patterns() == sorted(patterns, key=lambda rule: rule.key)
        assert writer.delete_rule("user-?")
        assert keys_of(reader.list_patterns()) == ["*", "[ab]x", "tenant:*", "tenant:acme:*"]
        writer.put_rules([Rule("user-?", 9, 3, precedence=-1), Rule("tenant:*", 6, 2)])  # back, and replaced
        listed = {rule.key: rule for rule in reader.list_patterns()}
        assert listed["user-?"] == Rule("user-?", 9, 3, precedence=-1) and listed["tenant:*"] == Rule("tenant:*", 6, 2)
        assert len(listed) == 5

    def test_pattern_changes_are_changes_like_any_other(self, store: RuleStore) -> None:
        start = time.time() - 1
        store.put_rule(PATTERN)
        store.delete_rule(PATTERN.key)
        assert [(change.key, change.rule) for change in store.changed_since(start)] == [(PATTERN.key, None)]
        store.put_rule(PATTERN)
        assert store.changed_since(start)[-1].rule == PATTERN


class TestCheckpointQuotas:
    def test_quotas_round_trip_and_default_to_empty(self, store: RuleStore) -> None:
        now = time.time_ns()
        quotas = '{"day":[20614,249],"month":[677,3000]} é'
        store.put_checkpoints([Checkpoint("a", 5, now, now + 10**12, quotas), Checkpoint("b", 0, now, now + 10**9)])
        got = store.get_checkpoints(["a", "b"], now)
        assert got == {"a": Checkpoint("a", 5, now, now + 10**12, quotas), "b": Checkpoint("b", 0, now, now + 10**9)}
        assert got["b"].quotas == ""
        store.put_checkpoints([Checkpoint("a", 6, now + 1, now + 10**12)])  # a newer one without quotas
        assert store.get_checkpoints(["a"], now)["a"].quotas == ""

    def test_expiry_alone_decides_what_is_void(self, store: RuleStore) -> None:
        now = time.time_ns()
        store.put_checkpoints(
            [Checkpoint("spent", 1, now - 10, now - 1, "day:1"), Checkpoint("window", 9, now, now + 10**12, "day:1")]
        )
        store.sweep(now)
        assert set(store.get_checkpoints(["spent", "window"], now)) == {"window"}
        assert store.get_checkpoints(["window"], now)["window"].quotas == "day:1"


class TestInvalidRows:
    def test_a_bad_row_is_skipped_by_every_read_logged_once_and_counted(
        self, open_handle: Opener, caplog: pytest.LogCaptureFixture
    ) -> None:
        writer = open_handle()
        start = time.time() - 1
        good = [Rule("a", 1, 1, shadow=True), Rule("c", 3, 3), Rule("d*", 4, 4, precedence=1)]
        writer.put_rules([good[0], Rule("b*", 2, 2, precedence=3), *good[1:]])
        set_raw_policy(writer, "b*", '{"precedence": 3, "weight": -1')  # cut short by a hand edit
        reader = open_handle()
        with caplog.at_level(logging.WARNING, logger="sluicegate.store"):
            assert reader.get_rules(["a", "b*", "c"]) == {"a": good[0], "c": good[1]}
            assert reader.get_rule("b*") is None
            assert reader.list_rules(limit=2) == good[:2]  # a full page: the bad row is made up for
            assert list(reader.iter_rules()) == good
            assert reader.list_patterns() == [good[2]]
            assert [change.key for change in reader.changed_since(start, limit=2)] == ["a", "c"]
            assert [c.rule for c in reader.changed_since(start)] == good
        assert reader.invalid_rules == 7  # one per read that met it
        warnings = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
        assert len(warnings) == 1 and "'b*'" in warnings[0]
        writer.put_rule(Rule("b*", 2, 2))  # rewriting it repairs it
        assert reader.get_rule("b*") == Rule("b*", 2, 2)

    @pytest.mark.parametrize(
        "text",
        [
            "{not json",
            "[1, 2]",
            "3",
            '"shadow"',
            '{"weight": -1}',
            '{"colour": "red"}',
            '{"limits": [{"quota": 1, "per": "fortnight"}]}',
            '{"parent": "{other}"}',
            "[" * 100_000 + "]" * 100_000,
        ],
        ids=["broken", "list", "number", "string", "bad-weight", "unknown", "bad-limit", "foreign-parent", "deep"],
    )
    def test_a_policy_text_that_is_not_a_valid_policy_is_a_rule_error(self, text: str) -> None:
        with pytest.raises(RuleError):
            rule_of(StoredRule("{acme}:x", 1, 1.0, text))

    def test_policy_text_is_compact_sorted_json_and_empty_for_plain_rules(self) -> None:
        assert policy_text(PLAIN) == "" and rule_of(StoredRule("alice", 10, 1.0, None)) == PLAIN
        assert policy_text(PATTERN) == '{"precedence":5,"shadow":true}'
        assert all(rule_of(StoredRule(rule.key, rule.capacity, rule.rate, policy_text(rule))) == rule for rule in RULES)


class TestMigration:
    def test_a_store_from_before_policies_is_migrated_and_reads_back_unchanged(self, legacy: Seeder) -> None:
        now = time.time_ns()
        open_ = legacy(
            [OldRule("alice", 10, 1.0, 1.0), OldRule("tenant:*", 5, 0.5, 2.0), OldRule("gone:*", 1, 1.0, 3.0, True)],
            [OldCheckpoint("alice", 7, now, now + 10**12)],
        )
        store = open_()
        store.migrate()
        store.migrate()
        old = [Rule("alice", 10, 1), Rule("tenant:*", 5, 0.5)]
        assert store.get_rules(["alice", "tenant:*", "gone:*"]) == {rule.key: rule for rule in old}
        assert store.list_rules() == old
        assert store.list_patterns() == [Rule("tenant:*", 5, 0.5)]  # stored as an exact rule, a pattern now
        assert [(c.key, c.rule) for c in store.changed_since(0)] == [*((r.key, r) for r in old), ("gone:*", None)]
        assert store.get_checkpoints(["alice"], now) == {"alice": Checkpoint("alice", 7, now, now + 10**12, "")}
        # The migrated store takes the new fields, and another handle sees them.
        store.put_rule(Rule("tenant:acme:*", 3, 1, precedence=2))
        store.put_checkpoints([Checkpoint("alice", 1, now, now + 10**12, "day:9")])
        assert store.delete_rule("tenant:*")
        other = open_()
        assert other.list_patterns() == [Rule("tenant:acme:*", 3, 1, precedence=2)]
        assert other.get_checkpoints(["alice"], now)["alice"].quotas == "day:9"


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_sql_stores_migrate_an_old_schema_on_first_use(backend: str, request: pytest.FixtureRequest) -> None:
    seeder: Seeder = request.getfixturevalue(f"{backend}_legacy")
    store = seeder([OldRule("tenant:*", 5, 0.5)], [])()
    try:
        assert store.list_patterns() == [Rule("tenant:*", 5, 0.5)]  # no migrate() call
        store.put_rule(PATTERN)
        assert store.get_rule(PATTERN.key) == PATTERN
    finally:
        store.close()
