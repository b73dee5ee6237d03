"""PostgreSQL store (psycopg 3): the optional relational backend, usable against Aurora PostgreSQL.

Same data and semantics as the SQLite reference backend: rules with tombstones
and ``updated_at`` (epoch seconds of the writer's clock), checkpoints in
nano-credits with an expiry that :meth:`RuleStore.sweep` enforces.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from sluicegate.rules import Rule
from sluicegate.store.base import Checkpoint, RuleChange, RuleStore, change_times

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
_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS rules (
        key text COLLATE "C" PRIMARY KEY,
        capacity bigint NOT NULL,
        rate double precision NOT NULL,
        updated_at double precision NOT NULL,
        deleted boolean NOT NULL DEFAULT false
    )""",
    "CREATE INDEX IF NOT EXISTS rules_updated_at ON rules (updated_at)",
    """CREATE TABLE IF NOT EXISTS checkpoints (
        key text COLLATE "C" PRIMARY KEY,
        credit bigint NOT NULL,
        at_ns bigint NOT NULL,
        expires_ns bigint NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS checkpoints_expires_ns ON checkpoints (expires_ns)",
)

# One statement per batch, whatever its size: the rows travel as arrays and unnest() turns them into a table.
_UPSERT_RULES = """
INSERT INTO rules (key, capacity, rate, updated_at, deleted)
SELECT key, capacity, rate, updated_at, false
FROM unnest(%s::text[], %s::bigint[], %s::float8[], %s::float8[]) AS t (key, capacity, rate, updated_at)
ON CONFLICT (key) DO UPDATE SET capacity = excluded.capacity, rate = excluded.rate,
    updated_at = excluded.updated_at, deleted = false
"""
_UPSERT_CHECKPOINTS = """
INSERT INTO checkpoints (key, credit, at_ns, expires_ns)
SELECT * FROM unnest(%s::text[], %s::bigint[], %s::bigint[], %s::bigint[])
ON CONFLICT (key) DO UPDATE SET credit = excluded.credit, at_ns = excluded.at_ns, expires_ns = excluded.expires_ns
"""


class PostgresRuleStore(RuleStore):
    """Rules and checkpoints in two PostgreSQL tables, over one connection shared by a process's threads.

    * **Schema**: :meth:`migrate` creates it (idempotent; what ``RuleStore.migrate``
      and the CLI run). For the same out-of-the-box behaviour as SQLite, the first
      connection also creates it *if it is missing*; when the tables exist nothing is
      created, so a role without DDL rights works against a migrated database.
      Concurrent creators are serialised by an advisory lock (concurrent
      ``CREATE TABLE IF NOT EXISTS`` can otherwise fail on a catalog unique index).
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
        encoding, rules, checkpoints = conn.execute(
            "SELECT current_setting('server_encoding'), to_regclass('rules'), to_regclass('checkpoints')"
        ).fetchone() or ("", None, None)
        if encoding != "UTF8":
            raise psycopg.NotSupportedError(f"the database must use the UTF8 encoding, not {encoding}")
        if rules is None or checkpoints is None:
            self._create_schema(conn)

    @staticmethod
    def _create_schema(conn: Connection) -> None:
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK_ID,))
            for statement in _SCHEMA:
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

    def _fetch(self, keys: Sequence[str]) -> Iterable[Rule]:
        query = "SELECT key, capacity, rate FROM rules WHERE key = ANY(%s::text[]) AND NOT deleted"
        rows = self._run(lambda conn: conn.execute(query, (list(keys),)).fetchall())
        return [Rule(*row) for row in rows]

    def _write(self, rules: Sequence[Rule]) -> None:
        # Key order: concurrent writers of overlapping batches then lock rows in the same order (no deadlock).
        ordered = sorted(rules, key=lambda rule: rule.key)
        params = (
            [rule.key for rule in ordered],
            [rule.capacity for rule in ordered],
            [rule.rate for rule in ordered],
            change_times(len(ordered)),  # distinct, so changed_since can page through one batch
        )
        self._run(lambda conn: conn.execute(_UPSERT_RULES, params))

    def _remove(self, key: str) -> bool:
        # A tombstone, so that changed_since reports the deletion.
        query = "UPDATE rules SET deleted = true, updated_at = %s WHERE key = %s AND NOT deleted"
        at = change_times(1)[0]
        return self._run(lambda conn: conn.execute(query, (at, key)).rowcount > 0, replay=False)

    def _scan(self, prefix: str, after: str | None, limit: int) -> list[Rule]:
        # A key range instead of LIKE, so '%' and '_' in keys mean themselves; it also bounds the index scan.
        query = "SELECT key, capacity, rate FROM rules WHERE key >= %s AND key > %s AND NOT deleted"
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
        return [Rule(*row) for row in rows]

    def _changes(self, since: float, limit: int) -> list[RuleChange]:
        query = (
            "SELECT key, capacity, rate, updated_at, deleted FROM rules "
            "WHERE updated_at > %s ORDER BY updated_at, key LIMIT %s"
        )
        rows = self._run(lambda conn: conn.execute(query, (since, limit)).fetchall())
        return [
            RuleChange(key, None if deleted else Rule(key, capacity, rate), updated_at)
            for key, capacity, rate, updated_at, deleted in rows
        ]

    # -- checkpoints ----------------------------------------------------------------------------

    def _write_checkpoints(self, checkpoints: Sequence[Checkpoint]) -> None:
        ordered = sorted(checkpoints, key=lambda checkpoint: checkpoint.key)
        params = (
            [c.key for c in ordered],
            [c.credit for c in ordered],
            [c.at_ns for c in ordered],
            [c.expires_ns for c in ordered],
        )
        self._run(lambda conn: conn.execute(_UPSERT_CHECKPOINTS, params))

    def _fetch_checkpoints(self, keys: Sequence[str]) -> Iterable[Checkpoint]:
        query = "SELECT key, credit, at_ns, expires_ns FROM checkpoints WHERE key = ANY(%s::text[])"
        rows = self._run(lambda conn: conn.execute(query, (list(keys),)).fetchall())
        return [Checkpoint(*row) for row in rows]

    def _sweep(self, now_ns: int) -> int:
        query = "DELETE FROM checkpoints WHERE expires_ns <= %s"
        return self._run(lambda conn: conn.execute(query, (now_ns,)).rowcount)


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
