"""SQLite store: the embedded default (one file, WAL, shared by processes)."""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Iterable, Iterator, Sequence

from sluicegate.rules import Rule
from sluicegate.store.base import Checkpoint, RuleChange, RuleStore, change_times

_SCHEMA = """
CREATE TABLE IF NOT EXISTS rules (
    key TEXT PRIMARY KEY,
    capacity INTEGER NOT NULL,
    rate REAL NOT NULL,
    updated_at REAL NOT NULL,
    deleted INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS rules_updated_at ON rules (updated_at);
CREATE TABLE IF NOT EXISTS checkpoints (
    key TEXT PRIMARY KEY,
    credit INTEGER NOT NULL,
    at_ns INTEGER NOT NULL,
    expires_ns INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS checkpoints_expires_ns ON checkpoints (expires_ns);
"""
_LIVE = "deleted = 0"


class SqliteRuleStore(RuleStore):
    """Rules and checkpoints in one SQLite file; several processes may share it (WAL mode).

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
                # No fsync per commit (WAL stays consistent; a power cut may lose the last
                # commits): checkpoints are written every second by every partition.
                self._db.execute("PRAGMA synchronous=NORMAL")
            self._migrate()

    def _migrate(self) -> None:
        with self._lock:
            columns = {row[1] for row in self._db.execute("PRAGMA table_info(rules)")}
            if columns and "deleted" not in columns:  # a file from before tombstones
                self._db.execute("ALTER TABLE rules ADD COLUMN deleted INTEGER NOT NULL DEFAULT 0")
            self._db.executescript(_SCHEMA)

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def _rows_of(self, select: str, keys: Sequence[str]) -> list[tuple]:
        """Rows of ``select`` (which ends in ``WHERE``) for the given keys."""
        marks = ",".join("?" * len(keys))
        with self._lock:
            return self._db.execute(f"{select} key IN ({marks})", keys).fetchall()

    def _fetch(self, keys: Sequence[str]) -> Iterable[Rule]:
        return [Rule(*row) for row in self._rows_of(f"SELECT key, capacity, rate FROM rules WHERE {_LIVE} AND", keys)]

    def _write(self, rules: Sequence[Rule]) -> None:
        rows = [
            (rule.key, rule.capacity, rule.rate, at) for rule, at in zip(rules, change_times(len(rules)), strict=True)
        ]
        with self._transaction() as db:
            db.executemany(
                "INSERT INTO rules (key, capacity, rate, updated_at, deleted) VALUES (?, ?, ?, ?, 0) "
                "ON CONFLICT (key) DO UPDATE SET capacity = excluded.capacity, "
                "rate = excluded.rate, updated_at = excluded.updated_at, deleted = 0",
                rows,
            )

    def _remove(self, key: str) -> bool:
        # A tombstone, so that changed_since reports the deletion.
        with self._lock:
            cursor = self._db.execute(
                f"UPDATE rules SET deleted = 1, updated_at = ? WHERE key = ? AND {_LIVE}", (change_times(1)[0], key)
            )
            return cursor.rowcount > 0

    def _scan(self, prefix: str, after: str | None, limit: int) -> list[Rule]:
        # Range on the primary key instead of LIKE, so '%' and '_' in keys mean themselves.
        query = f"SELECT key, capacity, rate FROM rules WHERE key >= ? AND key > ? AND {_LIVE}"
        params: list[object] = [prefix, after or ""]
        if prefix:
            query += " AND substr(key, 1, ?) = ?"
            params += [len(prefix), prefix]
        query += " ORDER BY key LIMIT ?"
        params.append(limit)
        with self._lock:
            rows = self._db.execute(query, params).fetchall()
        return [Rule(*row) for row in rows]

    def _changes(self, since: float, limit: int) -> list[RuleChange]:
        query = (
            "SELECT key, capacity, rate, updated_at, deleted FROM rules "
            "WHERE updated_at > ? ORDER BY updated_at, key LIMIT ?"
        )
        with self._lock:
            rows = self._db.execute(query, (since, limit)).fetchall()
        return [
            RuleChange(key, None if deleted else Rule(key, capacity, rate), updated_at)
            for key, capacity, rate, updated_at, deleted in rows
        ]

    def _write_checkpoints(self, checkpoints: Sequence[Checkpoint]) -> None:
        rows = [(c.key, c.credit, c.at_ns, c.expires_ns) for c in checkpoints]
        with self._transaction() as db:
            db.executemany(
                "INSERT INTO checkpoints (key, credit, at_ns, expires_ns) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (key) DO UPDATE SET credit = excluded.credit, at_ns = excluded.at_ns, "
                "expires_ns = excluded.expires_ns",
                rows,
            )

    def _fetch_checkpoints(self, keys: Sequence[str]) -> Iterable[Checkpoint]:
        return [
            Checkpoint(*row)
            for row in self._rows_of("SELECT key, credit, at_ns, expires_ns FROM checkpoints WHERE", keys)
        ]

    def _sweep(self, now_ns: int) -> int:
        with self._lock:
            return self._db.execute("DELETE FROM checkpoints WHERE expires_ns <= ?", (now_ns,)).rowcount

    def _close(self) -> None:
        with self._lock:
            self._db.close()
