"""Helpers the contract suites share (``tests/functional/test_store_contract.py``, ``..._policy.py``).

* :class:`Handles`: opens handles with an opener and closes them all at the end of a test.
* :class:`OldRule`, :class:`OldCheckpoint`: rows as the release before policies
  wrote them; each backend plugin's ``<backend>_legacy`` fixture is a :class:`Seeder`
  that creates a store with that release's schema (no policy, pattern or quotas
  columns, no pattern index) holding such rows, and returns an opener on it.
* :func:`set_raw_policy`: writes a rule's stored policy text behind the store's back.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable
from typing import NamedTuple, Protocol

import psycopg

from sluicegate.store import RuleStore, StoreError
from sluicegate.store.dynamodb import DynamoRuleStore
from sluicegate.store.postgres import PostgresRuleStore
from sluicegate.store.sqlite import SqliteRuleStore

Opener = Callable[[], RuleStore]


class OldRule(NamedTuple):
    """A rules row as the release before policies wrote it."""

    key: str
    capacity: int
    rate: float
    updated_at: float = 1.0
    deleted: bool = False


class OldCheckpoint(NamedTuple):
    key: str
    credit: int
    at_ns: int
    expires_ns: int


class Seeder(Protocol):
    def __call__(self, rules: list[OldRule], checkpoints: list[OldCheckpoint]) -> Opener: ...


class Handles:
    """Store handles opened during a test, closed by :meth:`close_all`.

    Example:
        >>> handles = Handles()  # doctest: +SKIP
        >>> store = handles.opener(sqlite_opener)()  # doctest: +SKIP
    """

    def __init__(self) -> None:
        self.opened: list[RuleStore] = []

    def opener(self, open_: Opener) -> Opener:
        def tracked() -> RuleStore:
            self.opened.append(open_())
            return self.opened[-1]

        return tracked

    def close_all(self) -> None:
        for handle in self.opened:
            with contextlib.suppress(StoreError):
                handle.close()


def set_raw_policy(store: RuleStore, key: str, text: str) -> None:
    """Overwrite the stored policy text of ``key``'s rule, as a hand edit of the database would."""
    if isinstance(store, SqliteRuleStore):
        with contextlib.closing(sqlite3.connect(store.path)) as db, db:
            db.execute("UPDATE rules SET policy = ? WHERE key = ?", (text, key))
    elif isinstance(store, PostgresRuleStore):
        with psycopg.connect(store.dsn, autocommit=True) as conn:
            conn.execute("UPDATE rules SET policy = %s WHERE key = %s", (text, key))
    elif isinstance(store, DynamoRuleStore):
        store._client.update_item(
            TableName=store.rules_table,
            Key={"key": {"S": key}},
            UpdateExpression="SET policy = :p",
            ExpressionAttributeValues={":p": {"S": text}},
        )
    else:
        raise TypeError(f"no raw access to {type(store).__name__}")
