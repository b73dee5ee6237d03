"""SQLite store: the embedded default (one file, WAL, shared by processes).

Opening a file migrates it: a file from an older Sluicegate gets the columns
it lacks (``ALTER TABLE ... ADD COLUMN``), and its rows read back as before.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Iterable, Iterator, Sequence

from sluicegate.rules import DEFAULT_RULE_KEY, Rule
from sluicegate.store.base import Checkpoint, RuleStore, change_times
from sluicegate.store.rows import StoredRule, policy_text

_TABLES = (
    """CREATE TABLE IF NOT EXISTS rules (
        key TEXT PRIMARY KEY,
        capacity INTEGER NOT NULL,
        rate REAL NOT NULL,
        updated_at REAL NOT NULL,
        deleted INTEGER NOT NULL DEFAULT 0,
        policy TEXT NOT NULL DEFAULT '',
        pattern INTEGER NOT NULL DEFAULT 0
    )""",
    """CREATE TABLE IF NOT EXISTS checkpoints (
        key TEXT PRIMARY KEY,
        credit INTEGER NOT NULL,
        at_ns INTEGER NOT NULL,
        expires_ns INTEGER NOT NULL,
        quotas TEXT NOT NULL DEFAULT ''
    ) WITHOUT ROWID""",
)
#: Columns added since the first release: (table, column, definition) for files that lack them.
_ADDED_COLUMNS = (
    ("rules", "deleted", "INTEGER NOT NULL DEFAULT 0"),
    ("rules", "policy", "TEXT NOT NULL DEFAULT ''"),
    ("rules", "pattern", "INTEGER NOT NULL DEFAULT 0"),
    ("checkpoints", "quotas", "TEXT NOT NULL DEFAULT ''"),
)
_LIVE = "deleted = 0"
_LIVE_PATTERN = "pattern = 1 AND deleted = 0"  # exactly the partial index's condition, so that it is used
_INDEXES = (
    "CREATE INDEX IF NOT EXISTS rules_updated_at ON rules (updated_at)",
    f"CREATE INDEX IF NOT EXISTS rules_patterns ON rules (key) WHERE {_LIVE_PATTERN}",
    "CREATE INDEX IF NOT EXISTS checkpoints_expires_ns ON checkpoints (expires_ns)",
)
# Rules stored before patterns existed: the same test as rules.is_pattern_key.
_MARK_PATTERNS = (
    "UPDATE rules SET pattern = 1 WHERE key <> ? "
    "AND (instr(key, '*') > 0 OR instr(key, '?') > 0 OR instr(key, '[') > 0)"
)
_RULE_COLUMNS = "key, capacity, rate, policy"


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
        # One write transaction: processes opening the same old file at once add each column once.
        with self._transaction() as db:
            for table, column, definition in _ADDED_COLUMNS:
                columns = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
                if columns and column not in columns:  # an existing file from before this column
                    db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {definition}")
                    if column == "pattern":
                        db.execute(_MARK_PATTERNS, (DEFAULT_RULE_KEY,))
            for statement in (*_TABLES, *_INDEXES):
                db.execute(statement)

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

    def _fetch(self, keys: Sequence[str]) -> Iterable[StoredRule]:
        return [StoredRule(*row) for row in self._rows_of(f"SELECT {_RULE_COLUMNS} FROM rules WHERE {_LIVE} AND", keys)]

    def _write(self, rules: Sequence[Rule]) -> None:
        rows = [
            (rule.key, rule.capacity, rule.rate, policy_text(rule), rule.is_pattern, at)
            for rule, at in zip(rules, change_times(len(rules)), strict=True)
        ]
        with self._transaction() as db:
            db.executemany(
                "INSERT INTO rules (key, capacity, rate, policy, pattern, updated_at, deleted) "
                "VALUES (?, ?, ?, ?, ?, ?, 0) "
                "ON CONFLICT (key) DO UPDATE SET capacity = excluded.capacity, rate = excluded.rate, "
                "policy = excluded.policy, pattern = excluded.pattern, updated_at = excluded.updated_at, deleted = 0",
                rows,
            )

    def _remove(self, key: str) -> bool:
        # A tombstone, so that changed_since reports the deletion.
        with self._lock:
            cursor = self._db.execute(
                f"UPDATE rules SET deleted = 1, updated_at = ? WHERE key = ? AND {_LIVE}", (change_times(1)[0], key)
            )
            return cursor.rowcount > 0

    def _scan(self, prefix: str, after: str | None, limit: int) -> list[StoredRule]:
        # Range on the primary key instead of LIKE, so '%' and '_' in keys mean themselves.
        query = f"SELECT {_RULE_COLUMNS} FROM rules WHERE key >= ? AND key > ? AND {_LIVE}"
        params: list[object] = [prefix, after or ""]
        if prefix:
            query += " AND substr(key, 1, ?) = ?"
            params += [len(prefix), prefix]
        query += " ORDER BY key LIMIT ?"
        params.append(limit)
        with self._lock:
            rows = self._db.execute(query, params).fetchall()
        return [StoredRule(*row) for row in rows]

    def _patterns(self) -> list[StoredRule]:
        with self._lock:
            rows = self._db.execute(f"SELECT {_RULE_COLUMNS} FROM rules WHERE {_LIVE_PATTERN} ORDER BY key").fetchall()
        return [StoredRule(*row) for row in rows]

    def _changes(self, since: float, limit: int) -> list[StoredRule]:
        query = (
            f"SELECT {_RULE_COLUMNS}, updated_at, deleted FROM rules "
            "WHERE updated_at > ? ORDER BY updated_at, key LIMIT ?"
        )
        with self._lock:
            rows = self._db.execute(query, (since, limit)).fetchall()
        return [StoredRule(*row[:5], bool(row[5])) for row in rows]

    def _write_checkpoints(self, checkpoints: Sequence[Checkpoint]) -> None:
        with self._transaction() as db:
            db.executemany(
                "INSERT INTO checkpoints (key, credit, at_ns, expires_ns, quotas) VALUES (?, ?, ?, ?, ?) "
                "ON CONFLICT (key) DO UPDATE SET credit = excluded.credit, at_ns = excluded.at_ns, "
                "expires_ns = excluded.expires_ns, quotas = excluded.quotas",
                checkpoints,  # named tuples in column order
            )

    def _fetch_checkpoints(self, keys: Sequence[str]) -> Iterable[Checkpoint]:
        return [
            Checkpoint(*row)
            for row in self._rows_of("SELECT key, credit, at_ns, expires_ns, quotas FROM checkpoints WHERE", keys)
        ]

    def _sweep(self, now_ns: int) -> int:
        with self._lock:
            return self._db.execute("DELETE FROM checkpoints WHERE expires_ns <= ?", (now_ns,)).rowcount

    def _close(self) -> None:
        with self._lock:
            self._db.close()
