"""SQLite rule store: the embedded default (one file, WAL, shared by processes)."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterable, Sequence

from sluicegate.rules import Rule
from sluicegate.store.base import RuleStore

_SCHEMA = """
CREATE TABLE IF NOT EXISTS rules (
    key TEXT PRIMARY KEY,
    capacity INTEGER NOT NULL,
    rate REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS rules_updated_at ON rules (updated_at);
"""


class SqliteRuleStore(RuleStore):
    """Rules in one SQLite file; several processes may share it (WAL mode).

    Example:
        >>> store = SqliteRuleStore(":memory:")
        >>> store.put_rule(Rule("k", capacity=5, rate=1))
        >>> [r.key for r in store.list_rules()]
        ['k']
    """

    unavailable_errors = (sqlite3.OperationalError,)
    driver_errors = (sqlite3.Error,)

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        with self._driver_errors_mapped():
            # One connection shared by the threads of a process, serialised by the lock.
            self._db = sqlite3.connect(path, timeout=5.0, check_same_thread=False, isolation_level=None)
            if path != ":memory:":
                self._db.execute("PRAGMA journal_mode=WAL")
            self._db.executescript(_SCHEMA)

    def _fetch(self, keys: Sequence[str]) -> Iterable[Rule]:
        marks = ",".join("?" * len(keys))
        with self._lock:
            rows = self._db.execute(f"SELECT key, capacity, rate FROM rules WHERE key IN ({marks})", keys).fetchall()
        return [Rule(*row) for row in rows]

    def _write(self, rules: Sequence[Rule]) -> None:
        now = time.time()
        rows = [(rule.key, rule.capacity, rule.rate, now) for rule in rules]
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.executemany(
                    "INSERT INTO rules (key, capacity, rate, updated_at) VALUES (?, ?, ?, ?) "
                    "ON CONFLICT (key) DO UPDATE SET capacity = excluded.capacity, "
                    "rate = excluded.rate, updated_at = excluded.updated_at",
                    rows,
                )
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def _remove(self, key: str) -> bool:
        with self._lock:
            return self._db.execute("DELETE FROM rules WHERE key = ?", (key,)).rowcount > 0

    def _scan(self, prefix: str, after: str | None, limit: int) -> list[Rule]:
        # Range on the primary key instead of LIKE, so '%' and '_' in keys mean themselves.
        query = "SELECT key, capacity, rate FROM rules WHERE key >= ? AND key > ?"
        params: list[object] = [prefix, after or ""]
        if prefix:
            query += " AND substr(key, 1, ?) = ?"
            params += [len(prefix), prefix]
        query += " ORDER BY key LIMIT ?"
        params.append(limit)
        with self._lock:
            rows = self._db.execute(query, params).fetchall()
        return [Rule(*row) for row in rows]

    def _close(self) -> None:
        with self._lock:
            self._db.close()
