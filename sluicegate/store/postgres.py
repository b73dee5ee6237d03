"""PostgreSQL store (psycopg 3): the optional relational backend, usable against Aurora PostgreSQL.

Same data and semantics as the SQLite reference backend: rules with tombstones
and ``updated_at`` (epoch seconds of the writer's clock), their policy as JSON
text and a ``pattern`` flag under a partial index, checkpoints in nano-credits
with an expiry that :meth:`RuleStore.sweep` enforces and the quota counters' text.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from sluicegate.rules import DEFAULT_RULE_KEY, Rule
from sluicegate.store.base import Checkpoint, RuleStore, change_times
from sluicegate.store.rows import StoredRule, policy_text

T = TypeVar("T")
Connection = psycopg.Connection[tuple[Any, ...]]

#: Seconds to wait for a connection unless the DSN (or PGCONNECT_TIMEOUT) says otherwise:
#: libpq's default is to wait forever, and a store call must not hang a server's sync loop.
CONNECT_TIMEOUT_S = 5
STATEMENT_TIMEOUT_MS = 5000
#: Any constant shared by all Sluicegate processes: serialises concurrent schema creation.
_SCHEMA_LOCK_ID = 0x5_1C3_6A7E

# COLLATE "C": keys compare by UTF-8 bytes, i.e. by code point like Python's str, whatever the
# database's default collation (a linguistic one would break `after` paging and key order).
_TABLES = (
    """CREATE TABLE IF NOT EXISTS rules (
        key text COLLATE "C" PRIMARY KEY,
        capacity bigint NOT NULL,
        rate double precision NOT NULL,
        updated_at double precision NOT NULL,
        deleted boolean NOT NULL DEFAULT false,
        policy text NOT NULL DEFAULT '',
        pattern boolean NOT NULL DEFAULT false
    )""",
    """CREATE TABLE IF NOT EXISTS checkpoints (
        key text COLLATE "C" PRIMARY KEY,
        credit bigint NOT NULL,
        at_ns bigint NOT NULL,
        expires_ns bigint NOT NULL,
        quotas text NOT NULL DEFAULT ''
    )""",
)
#: Columns added since the first release, as "table.column": definition (a constant default: no table rewrite).
_ADDED_COLUMNS = {
    "rules.policy": "text NOT NULL DEFAULT ''",
    "rules.pattern": "boolean NOT NULL DEFAULT false",
    "checkpoints.quotas": "text NOT NULL DEFAULT ''",
}
_LIVE_PATTERN = "pattern AND NOT deleted"  # exactly the partial index's condition, so that it is used
_INDEXES = (
    "CREATE INDEX IF NOT EXISTS rules_updated_at ON rules (updated_at)",
    f"CREATE INDEX IF NOT EXISTS rules_patterns ON rules (key) WHERE {_LIVE_PATTERN}",
    "CREATE INDEX IF NOT EXISTS checkpoints_expires_ns ON checkpoints (expires_ns)",
)
#: The columns of both tables, as "table.column" (none while a table is missing).
_COLUMNS = """
SELECT CASE WHEN attrelid = to_regclass('rules') THEN 'rules' ELSE 'checkpoints' END || '.' || attname
FROM pg_attribute
WHERE attrelid IN (to_regclass('rules'), to_regclass('checkpoints')) AND attnum > 0 AND NOT attisdropped
"""
_NEEDED_COLUMNS = frozenset({"rules.key", "checkpoints.key", *_ADDED_COLUMNS})
# Rules stored before patterns existed: the same test as rules.is_pattern_key.
_MARK_PATTERNS = (
    "UPDATE rules SET pattern = true WHERE key <> %s "
    "AND (strpos(key, '*') > 0 OR strpos(key, '?') > 0 OR strpos(key, '[') > 0)"
)
_RULE_COLUMNS = "key, capacity, rate, policy"

# One statement per batch, whatever its size: the rows travel as arrays and unnest() turns them into a table.
_UPSERT_RULES = """
INSERT INTO rules (key, capacity, rate, policy, pattern, updated_at, deleted)
SELECT key, capacity, rate, policy, pattern, updated_at, false
FROM unnest(%s::text[], %s::bigint[], %s::float8[], %s::text[], %s::bool[], %s::float8[])
    AS t (key, capacity, rate, policy, pattern, updated_at)
ON CONFLICT (key) DO UPDATE SET capacity = excluded.capacity, rate = excluded.rate, policy = excluded.policy,
    pattern = excluded.pattern, updated_at = excluded.updated_at, deleted = false
"""
_UPSERT_CHECKPOINTS = """
INSERT INTO checkpoints (key, credit, at_ns, expires_ns, quotas)
SELECT * FROM unnest(%s::text[], %s::bigint[], %s::bigint[], %s::bigint[], %s::text[])
ON CONFLICT (key) DO UPDATE SET credit = excluded.credit, at_ns = excluded.at_ns, expires_ns = excluded.expires_ns,
    quotas = excluded.quotas
"""


class PostgresRuleStore(RuleStore):
    """Rules and checkpoints in two PostgreSQL tables, over one connection shared by a process's threads.

    * **Schema**: :meth:`migrate` creates it (idempotent; what ``RuleStore.migrate``
      and the CLI run), and adds the columns an older schema lacks. For the same
      out-of-the-box behaviour as SQLite, the first connection also does so *if
      anything is missing*; when it is all there nothing is created, so a role
      without DDL rights works against a migrated database. Concurrent creators are
      serialised by an advisory lock (concurrent ``CREATE TABLE IF NOT EXISTS`` can
      otherwise fail on a catalog unique index).
    * **Lazy, self-healing connection**: the constructor does no I/O (a server can
      start while the database is down); a lost connection is dropped and the next
      call reconnects. A call that finds its connection went stale since its last
      use (database restarted, session killed) retries once on a new connection,
      except ``delete_rule``, whose answer a replay could change.
    * **Autocommit**: every operation is one statement, atomic by itself; a batch of
      writes is one multi-row ``INSERT ... SELECT FROM unnest(arrays) ON CONFLICT``.
    * Keys must be valid in a UTF8 database; PostgreSQL text cannot hold NUL, so a
      key containing ``"\\x00"`` is a :class:`StoreError` here (SQLite accepts it).

    Example:
        >>> store = PostgresRuleStore("host=127.0.0.1 dbname=sluicegate")  # doctest: +SKIP
        >>> store.put_rule(Rule("k", capacity=5, rate=1))  # doctest: +SKIP
    """

    unavailable_errors = (psycopg.OperationalError,)
    driver_errors = (psycopg.Error,)

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        with self._driver_errors_mapped():
            given = conninfo_to_dict(dsn)  # a malformed DSN fails here, not at the first call
        defaults: dict[str, Any] = {"application_name": "sluicegate"}
        if "connect_timeout" not in given and not os.environ.get("PGCONNECT_TIMEOUT"):
            defaults["connect_timeout"] = CONNECT_TIMEOUT_S
        # A server that stops answering (network black hole, failover freeze) must fail a call
        # in seconds, not block the bucket server's store thread for minutes.
        defaults.update(keepalives=1, keepalives_idle=5, keepalives_interval=2, keepalives_count=3)
        defaults["tcp_user_timeout"] = STATEMENT_TIMEOUT_MS
        options = given.get("options", "")
        if "statement_timeout" not in options:
            given_options = f"{options} " if options else ""
            defaults["options"] = f"{given_options}-c statement_timeout={STATEMENT_TIMEOUT_MS}"
            given.pop("options", None)
        self._conninfo = make_conninfo(dsn, **{k: v for k, v in defaults.items() if k not in given})
        self._lock = threading.Lock()
        self._conn: Connection | None = None
        self._closed = False
        self._schema_checked = False

    # -- connection handling ------------------------------------------------------------------

    def _connection(self) -> Connection:
        """The open connection, or a new one (with the schema checked once per store)."""
        if self._closed:
            raise psycopg.InterfaceError("the store is closed")
        if self._conn is None or self._conn.closed:
            self._conn = None
            conn = psycopg.connect(self._conninfo, autocommit=True)
            try:
                if not self._schema_checked:
                    self._ensure_schema(conn)
                    self._schema_checked = True
            except BaseException:
                conn.close()
                raise
            self._conn = conn
        return self._conn

    def _run(self, work: Callable[[Connection], T], *, replay: bool = True) -> T:
        """``work(connection)`` under the lock; a broken connection is dropped so the next call reconnects."""
        with self._lock:
            reused = self._conn is not None and not self._conn.closed
            conn = self._connection()
            try:
                return work(conn)
            except psycopg.OperationalError:
                if not conn.closed:
                    raise  # e.g. a cancelled statement: the connection itself is fine
                self._conn = None
                if not (replay and reused):
                    raise
            # The connection went stale while idle (server restart, killed session): one go on a new one.
            return work(self._connection())

    def _ensure_schema(self, conn: Connection) -> None:
        (encoding,) = conn.execute("SELECT current_setting('server_encoding')").fetchone() or ("",)
        if encoding != "UTF8":
            raise psycopg.NotSupportedError(f"the database must use the UTF8 encoding, not {encoding}")
        if not _NEEDED_COLUMNS <= _columns(conn):
            self._create_schema(conn)

    @staticmethod
    def _create_schema(conn: Connection) -> None:
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK_ID,))
            before = _columns(conn)  # under the lock: what another creator did is visible
            for statement in _TABLES:
                conn.execute(statement)
            # Only what is missing: ALTER TABLE locks the whole table, even when it changes nothing.
            for name, definition in _ADDED_COLUMNS.items():
                table, column = name.split(".")
                if table + ".key" in before and name not in before:
                    conn.execute(f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {column} {definition}")
                    if name == "rules.pattern":
                        conn.execute(_MARK_PATTERNS, (DEFAULT_RULE_KEY,))
            for statement in _INDEXES:
                conn.execute(statement)

    def _migrate(self) -> None:
        self._run(self._create_schema)

    def _close(self) -> None:
        with self._lock:
            self._closed = True
            conn, self._conn = self._conn, None
            if conn is not None:
                conn.close()

    # -- rules ----------------------------------------------------------------------------------

    def _fetch(self, keys: Sequence[str]) -> Iterable[StoredRule]:
        query = f"SELECT {_RULE_COLUMNS} FROM rules WHERE key = ANY(%s::text[]) AND NOT deleted"
        rows = self._run(lambda conn: conn.execute(query, (list(keys),)).fetchall())
        return [StoredRule(*row) for row in rows]

    def _write(self, rules: Sequence[Rule]) -> None:
        # Key order: concurrent writers of overlapping batches then lock rows in the same order (no deadlock).
        ordered = sorted(rules, key=lambda rule: rule.key)
        params = (
            [rule.key for rule in ordered],
            [rule.capacity for rule in ordered],
            [rule.rate for rule in ordered],
            [policy_text(rule) for rule in ordered],
            [rule.is_pattern for rule in ordered],
            change_times(len(ordered)),  # distinct, so changed_since can page through one batch
        )
        self._run(lambda conn: conn.execute(_UPSERT_RULES, params))

    def _remove(self, key: str) -> bool:
        # A tombstone, so that changed_since reports the deletion.
        query = "UPDATE rules SET deleted = true, updated_at = %s WHERE key = %s AND NOT deleted"
        at = change_times(1)[0]
        return self._run(lambda conn: conn.execute(query, (at, key)).rowcount > 0, replay=False)

    def _scan(self, prefix: str, after: str | None, limit: int) -> list[StoredRule]:
        # A key range instead of LIKE, so '%' and '_' in keys mean themselves; it also bounds the index scan.
        query = f"SELECT {_RULE_COLUMNS} FROM rules WHERE key >= %s AND key > %s AND NOT deleted"
        params: list[object] = [prefix, after or ""]
        if prefix:
            query += " AND left(key, %s) = %s"
            params += [len(prefix), prefix]
            end = _prefix_end(prefix)
            if end is not None:
                query += " AND key < %s"
                params.append(end)
        query += " ORDER BY key LIMIT %s"
        params.append(limit)
        rows = self._run(lambda conn: conn.execute(query, params).fetchall())
        return [StoredRule(*row) for row in rows]

    def _patterns(self) -> list[StoredRule]:
        query = f"SELECT {_RULE_COLUMNS} FROM rules WHERE {_LIVE_PATTERN} ORDER BY key"
        return [StoredRule(*row) for row in self._run(lambda conn: conn.execute(query).fetchall())]

    def _changes(self, since: float, limit: int) -> list[StoredRule]:
        query = (
            f"SELECT {_RULE_COLUMNS}, updated_at, deleted FROM rules "
            "WHERE updated_at > %s ORDER BY updated_at, key LIMIT %s"
        )
        rows = self._run(lambda conn: conn.execute(query, (since, limit)).fetchall())
        return [StoredRule(*row) for row in rows]

    # -- checkpoints ----------------------------------------------------------------------------

    def _write_checkpoints(self, checkpoints: Sequence[Checkpoint]) -> None:
        ordered = sorted(checkpoints, key=lambda checkpoint: checkpoint.key)
        params = (
            [c.key for c in ordered],
            [c.credit for c in ordered],
            [c.at_ns for c in ordered],
            [c.expires_ns for c in ordered],
            [c.quotas for c in ordered],
        )
        self._run(lambda conn: conn.execute(_UPSERT_CHECKPOINTS, params))

    def _fetch_checkpoints(self, keys: Sequence[str]) -> Iterable[Checkpoint]:
        query = "SELECT key, credit, at_ns, expires_ns, quotas FROM checkpoints WHERE key = ANY(%s::text[])"
        rows = self._run(lambda conn: conn.execute(query, (list(keys),)).fetchall())
        return [Checkpoint(*row) for row in rows]

    def _sweep(self, now_ns: int) -> int:
        query = "DELETE FROM checkpoints WHERE expires_ns <= %s"
        return self._run(lambda conn: conn.execute(query, (now_ns,)).rowcount)


def _columns(conn: Connection) -> set[str]:
    """The columns the rules and checkpoints tables have, as "table.column"."""
    return {name for (name,) in conn.execute(_COLUMNS).fetchall()}


def _prefix_end(prefix: str) -> str | None:
    """The least string above every string that starts with ``prefix`` (code point order), or None if none is.

    Example:
        >>> _prefix_end("team/")
        'team0'
    """
    chars = list(prefix)
    while chars:
        last = ord(chars.pop())
        if last < 0x10FFFF:
            following = 0xE000 if 0xD800 <= last + 1 <= 0xDFFF else last + 1  # surrogates are never in a key
            return "".join(chars) + chr(following)
    return None
