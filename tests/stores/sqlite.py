"""SQLite store for tests: a fresh file in the test's temp dir."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from sluicegate.store import RuleStore
from sluicegate.store.sqlite import SqliteRuleStore

#: The schema of the release before policies (tests/stores/contract.py: ``legacy``).
OLD_SCHEMA = """
CREATE TABLE rules (
    key TEXT PRIMARY KEY, capacity INTEGER NOT NULL, rate REAL NOT NULL,
    updated_at REAL NOT NULL, deleted INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX rules_updated_at ON rules (updated_at);
CREATE TABLE checkpoints (
    key TEXT PRIMARY KEY, credit INTEGER NOT NULL, at_ns INTEGER NOT NULL, expires_ns INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX checkpoints_expires_ns ON checkpoints (expires_ns);
"""


@pytest.fixture
def sqlite_opener(tmp_path: Path) -> Callable[[], RuleStore]:
    return lambda: SqliteRuleStore(str(tmp_path / "rules.db"))


@pytest.fixture
def sqlite_legacy(tmp_path: Path) -> Callable[..., Callable[[], RuleStore]]:
    """Seeds a file with the schema of the release before policies; returns an opener on it."""

    def seed(rules: list[tuple], checkpoints: list[tuple]) -> Callable[[], RuleStore]:
        path = tmp_path / "old.db"
        with contextlib.closing(sqlite3.connect(path)) as db, db:
            db.executescript(OLD_SCHEMA)
            db.executemany("INSERT INTO rules VALUES (?, ?, ?, ?, ?)", rules)
            db.executemany("INSERT INTO checkpoints VALUES (?, ?, ?, ?)", checkpoints)
        return lambda: SqliteRuleStore(str(path))

    return seed
