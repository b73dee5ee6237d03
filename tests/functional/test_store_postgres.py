"""PostgreSQL specifics, against the session's real server (tests/stores/postgres.py).

The contract suite already runs on PostgreSQL; these cover what only this
backend has: psycopg errors mapped to ours, healing after the server restarts
or kills a session, one statement per write batch, schema creation and
migration (also for a role without DDL rights), and key order independent of
the database's collation.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterator

import psycopg
import pytest

from sluicegate.rules import Rule, RuleError
from sluicegate.store import RuleStore, StoreError, StoreUnavailable, open_store
from sluicegate.store.base import CHECKPOINT_BATCH, DEFAULT_BATCH, Checkpoint
from sluicegate.store.postgres import PostgresRuleStore, _prefix_end
from tests.pgserver import PostgresServer, free_port

_names = itertools.count(1)


def admin(server: PostgresServer, sql: str, dbname: str = "postgres") -> list[tuple[object, ...]]:
    """Run ``sql`` as the superuser on a connection of its own; the rows it returns, if any."""
    with psycopg.connect(server.dsn(dbname=dbname), autocommit=True) as conn:
        cursor = conn.execute(sql)
        return cursor.fetchall() if cursor.description else []


def assert_mapped(exc: BaseException, cause: type[psycopg.Error] = psycopg.Error) -> None:
    """A store error a caller sees is ours, and it keeps the psycopg error as its cause."""
    assert not isinstance(exc, psycopg.Error)
    assert isinstance(exc.__cause__, cause)


@pytest.fixture
def stores(postgres_dsn: str) -> Iterator[Callable[..., PostgresRuleStore]]:
    """Factory of handles on the test's schema (or another DSN); all closed after the test."""
    opened: list[PostgresRuleStore] = []

    def open_(dsn: str = postgres_dsn) -> PostgresRuleStore:
        opened.append(PostgresRuleStore(dsn))
        return opened[-1]

    yield open_
    for store in opened:
        store.close()


OPERATIONS: list[tuple[str, Callable[[RuleStore], object]]] = [
    ("get_rule", lambda s: s.get_rule("a")),
    ("get_rules", lambda s: s.get_rules(["a", "b"])),
    ("put_rules", lambda s: s.put_rules([Rule("a", 1, 1), Rule("b", 2, 2)])),
    ("delete_rule", lambda s: s.delete_rule("a")),
    ("list_rules", lambda s: s.list_rules(prefix="a")),
    ("iter_rules", lambda s: next(s.iter_rules(), None)),
    ("changed_since", lambda s: s.changed_since(0)),
    ("put_checkpoints", lambda s: s.put_checkpoints([Checkpoint("a", 1, 0, 10)])),
    ("get_checkpoints", lambda s: s.get_checkpoints(["a"], 0)),
    ("sweep", lambda s: s.sweep(0)),
    ("migrate", lambda s: s.migrate()),
]


class TestDriverErrors:
    @pytest.mark.parametrize("use", [use for _, use in OPERATIONS], ids=[name for name, _ in OPERATIONS])
    def test_nothing_listening_is_unavailable(self, use: Callable[[RuleStore], object]) -> None:
        store = PostgresRuleStore(f"host=127.0.0.1 port={free_port()} user=postgres dbname=postgres")
        with pytest.raises(StoreUnavailable) as info:
            use(store)
        assert_mapped(info.value, psycopg.OperationalError)
        store.close()

    @pytest.mark.parametrize("dsn", ["host=127.0.0.1 port", "nonsense=1", "postgresql://[::1"])
    def test_malformed_dsn_is_a_store_error_at_open(self, dsn: str) -> None:
        with pytest.raises(StoreError) as info:
            open_store("postgres", dsn=dsn)
        assert not isinstance(info.value, StoreUnavailable)
        assert_mapped(info.value)

    @pytest.mark.parametrize("use", [use for _, use in OPERATIONS], ids=[name for name, _ in OPERATIONS])
    def test_closed_store_is_a_store_error_and_stays_closed(
        self, stores: Callable[..., PostgresRuleStore], use: Callable[[RuleStore], object]
    ) -> None:
        store = stores()
        store.put_rule(Rule("a", 1, 1))
        store.close()
        with pytest.raises(StoreError) as info:
            use(store)
        assert not isinstance(info.value, StoreUnavailable)  # retrying would not help
        assert_mapped(info.value)
        store.close()  # closing twice is harmless

    def test_key_with_nul_is_refused_before_the_driver(self, stores: Callable[..., PostgresRuleStore]) -> None:
        # PostgreSQL text cannot hold NUL: keys with one are invalid everywhere, so no backend differs.
        store = stores()
        with pytest.raises(RuleError, match="NUL"):
            store.put_rule(Rule("a\x00b", 1, 1))
        store.put_rule(Rule("a", 1, 1))  # and the handle still works
        assert store.get_rule("a") == Rule("a", 1, 1)

    def test_database_not_in_utf8_is_refused(self, postgres_server: PostgresServer) -> None:
        name = f"ascii_{next(_names)}"
        admin(postgres_server, f"CREATE DATABASE {name} TEMPLATE template0 ENCODING 'SQL_ASCII' LOCALE 'C'")
        store = PostgresRuleStore(postgres_server.dsn(dbname=name))
        with pytest.raises(StoreError, match="UTF8") as info:
            store.get_rule("a")
        assert_mapped(info.value)
        store.close()


class TestHealing:
    def test_same_handle_heals_after_the_server_restarts(
        self, postgres_server: PostgresServer, stores: Callable[..., PostgresRuleStore]
    ) -> None:
        store = stores()
        store.put_rule(Rule("a", 1, 1))
        with postgres_server.outage():
            for use in (lambda: store.get_rule("a"), lambda: store.put_rule(Rule("b", 2, 2))):
                with pytest.raises(StoreUnavailable) as info:
                    use()
                assert_mapped(info.value, psycopg.OperationalError)
            opened_during_outage = stores()  # opening does no I/O, so it works while the server is down
        # The first call after the restart succeeds: no error for the caller to handle.
        assert store.get_rule("a") == Rule("a", 1, 1)
        store.put_rule(Rule("b", 2, 2))
        assert opened_during_outage.get_rule("b") == Rule("b", 2, 2)

    def test_restart_between_calls_is_invisible(
        self, postgres_server: PostgresServer, stores: Callable[..., PostgresRuleStore]
    ) -> None:
        store = stores()
        store.put_rule(Rule("a", 1, 1))
        postgres_server.stop()
        postgres_server.start()
        assert store.get_rule("a") == Rule("a", 1, 1)  # the stale connection is replaced, the read retried

    def test_killed_session_is_replaced(
        self, postgres_server: PostgresServer, stores: Callable[..., PostgresRuleStore]
    ) -> None:
        store = stores()
        store.put_rules([Rule("a", 1, 1), Rule("b", 1, 1)])

        def kill_sessions() -> None:
            admin(
                postgres_server,
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'sluicegate'",
            )

        kill_sessions()
        assert store.list_rules() == [Rule("a", 1, 1), Rule("b", 1, 1)]
        kill_sessions()
        store.put_checkpoints([Checkpoint("a", 5, 1, 2**40)])  # an idempotent write is retried too
        assert store.get_checkpoints(["a"], 0) == {"a": Checkpoint("a", 5, 1, 2**40)}
        kill_sessions()
        # A delete is not replayed (a replay could answer False for a rule it deleted): it fails, once.
        with pytest.raises(StoreUnavailable):
            store.delete_rule("a")
        assert store.delete_rule("a") is True
        assert store.get_rule("a") is None


class TestBatches:
    def test_one_statement_per_batch(
        self, postgres_server: PostgresServer, stores: Callable[..., PostgresRuleStore]
    ) -> None:
        store = stores()
        store.migrate()
        # Counted by the server itself: a statement-level trigger fires once per INSERT statement.
        with psycopg.connect(store.dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE statements (tbl text)")
            conn.execute(
                "CREATE FUNCTION count_statement() RETURNS trigger LANGUAGE plpgsql AS "
                "$$ BEGIN INSERT INTO statements VALUES (TG_TABLE_NAME); RETURN NULL; END $$"
            )
            for table in ("rules", "checkpoints"):
                conn.execute(
                    f"CREATE TRIGGER count AFTER INSERT ON {table} "
                    "FOR EACH STATEMENT EXECUTE FUNCTION count_statement()"
                )

            def counts() -> dict[str, int]:
                rows = conn.execute("SELECT tbl, count(*) FROM statements GROUP BY tbl").fetchall()
                conn.execute("TRUNCATE statements")
                return dict(rows)

            assert (
                store.put_rules((Rule(f"k{i}", i, 1) for i in range(2 * DEFAULT_BATCH + 1)), batch_size=DEFAULT_BATCH)
                == 1001
            )
            assert counts() == {"rules": 3}
            store.put_rules(Rule(f"k{i}", i + 1, 2) for i in range(DEFAULT_BATCH))  # all updates: still one statement
            assert counts() == {"rules": 1}
            assert store.get_rule("k7") == Rule("k7", 8, 2)
            store.put_checkpoints(Checkpoint(f"k{i}", i, 0, 10**12) for i in range(CHECKPOINT_BATCH + 1))
            assert counts() == {"checkpoints": 2}
            assert len(store.get_checkpoints([f"k{i}" for i in range(CHECKPOINT_BATCH + 1)], 0)) == CHECKPOINT_BATCH + 1

    def test_sweep_deletes_expired_checkpoints_and_counts_them(self, stores: Callable[..., PostgresRuleStore]) -> None:
        store = stores()
        store.put_checkpoints([Checkpoint("old", 1, 0, 5), Checkpoint("edge", 1, 0, 10), Checkpoint("new", 2, 0, 50)])
        assert store.sweep(10) == 2
        assert store.sweep(10) == 0
        assert list(store._fetch_checkpoints(["old", "edge", "new"])) == [Checkpoint("new", 2, 0, 50)]


class TestSchema:
    def test_migrate_keeps_existing_data_and_is_idempotent(self, stores: Callable[..., PostgresRuleStore]) -> None:
        first = stores()
        first.put_rule(Rule("a", 1, 1))
        first.put_checkpoints([Checkpoint("a", 1, 0, 10**12)])
        second = stores()
        second.migrate()
        second.migrate()
        assert second.get_rule("a") == Rule("a", 1, 1)
        assert set(second.get_checkpoints(["a"], 0)) == {"a"}

    def test_first_use_creates_the_schema_in_the_search_path(
        self, postgres_server: PostgresServer, postgres_dsn: str, stores: Callable[..., PostgresRuleStore]
    ) -> None:
        schema = postgres_dsn.rsplit("search_path=", 1)[1].rstrip("'")
        tables = f"SELECT table_name FROM information_schema.tables WHERE table_schema = '{schema}' ORDER BY 1"
        assert admin(postgres_server, tables) == []
        stores().migrate()
        assert admin(postgres_server, tables) == [("checkpoints",), ("rules",)]

    def test_concurrent_first_uses_create_the_schema_once(self, stores: Callable[..., PostgresRuleStore]) -> None:
        handles = [stores() for _ in range(6)]
        barrier = threading.Barrier(len(handles))
        errors: list[BaseException] = []

        def first_use(store: PostgresRuleStore) -> None:
            barrier.wait()
            try:
                store.put_rule(Rule(f"k{id(store)}", 1, 1))
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=first_use, args=(store,)) for store in handles]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert errors == []
        assert len(handles[0].list_rules()) == len(handles)

    def test_role_without_ddl_rights_works_on_a_migrated_schema(
        self, postgres_server: PostgresServer, postgres_dsn: str, stores: Callable[..., PostgresRuleStore]
    ) -> None:
        stores().migrate()
        schema = postgres_dsn.rsplit("search_path=", 1)[1].rstrip("'")
        role = f"app_{next(_names)}"
        admin(postgres_server, f"CREATE ROLE {role} LOGIN")
        admin(postgres_server, f"GRANT USAGE ON SCHEMA {schema} TO {role}")
        admin(postgres_server, f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {schema} TO {role}")
        app = stores(postgres_dsn.replace("user='postgres'", f"user='{role}'"))
        app.put_rule(Rule("a", 3, 1))
        assert app.get_rule("a") == Rule("a", 3, 1)
        with pytest.raises(StoreError) as info:
            app.migrate()  # creating needs rights this role lacks: our error, not "unavailable"
        assert not isinstance(info.value, StoreUnavailable)
        assert_mapped(info.value, psycopg.errors.InsufficientPrivilege)

    def test_key_order_is_code_point_order_whatever_the_database_collation(
        self, postgres_server: PostgresServer, stores: Callable[..., PostgresRuleStore]
    ) -> None:
        name = f"icu_{next(_names)}"
        admin(
            postgres_server,
            f"CREATE DATABASE {name} TEMPLATE template0 ENCODING 'UTF8' "
            "LOCALE_PROVIDER icu ICU_LOCALE 'en-US' LOCALE 'C'",
        )
        assert admin(postgres_server, "SELECT 'B' < 'a'", dbname=name) == [(False,)]  # linguistic order here
        store = stores(postgres_server.dsn(dbname=name))
        keys = ["b", "a", "B", "é", "e", "a-b", "a_b", "ab", "A"]
        store.put_rules(Rule(key, 1, 1) for key in keys)
        assert [rule.key for rule in store.list_rules()] == sorted(keys)
        assert [rule.key for rule in store.list_rules(after="B", limit=2)] == ["a", "a-b"]
        assert [rule.key for rule in store.list_rules(prefix="a")] == ["a", "a-b", "a_b", "ab"]


class TestPrefixRange:
    @pytest.mark.parametrize(
        ("prefix", "end"),
        [
            ("team/", "team0"),
            ("a", "b"),
            ("\ud7ff", "\ue000"),  # the next code point after U+D7FF that can be in a key
            ("a\U0010ffff", "b"),
            ("\U0010ffff\U0010ffff", None),
        ],
    )
    def test_prefix_end(self, prefix: str, end: str | None) -> None:
        assert _prefix_end(prefix) == end

    def test_prefixes_ending_in_the_last_code_point(self, stores: Callable[..., PostgresRuleStore]) -> None:
        store = stores()
        keys = ["a", "a\U0010ffff", "a\U0010ffffx", "b", "\U0010ffff", "\U0010ffff\U0010ffff", "\ud7ffz", "\ue000"]
        store.put_rules(Rule(key, 1, 1) for key in keys)
        assert [r.key for r in store.list_rules(prefix="a\U0010ffff")] == ["a\U0010ffff", "a\U0010ffffx"]
        assert [r.key for r in store.list_rules(prefix="\U0010ffff")] == ["\U0010ffff", "\U0010ffff\U0010ffff"]
        assert [r.key for r in store.list_rules(prefix="\ud7ff")] == ["\ud7ffz"]


def test_calls_have_a_statement_timeout_and_keep_given_options(postgres_dsn: str) -> None:
    store = PostgresRuleStore(postgres_dsn)  # the test DSN carries options=-c search_path=...
    store.put_rule(Rule("k", 1, 1))  # the search path still applies
    timeout = store._run(lambda conn: conn.execute("SHOW statement_timeout").fetchone()[0])
    assert timeout == "5s"
    # Cut off, not waited out (public calls map this OperationalError to StoreUnavailable).
    with pytest.raises(psycopg.errors.QueryCanceled):
        store._run(lambda conn: conn.execute("SELECT pg_sleep(6)"))
    assert store.get_rule("k") == Rule("k", 1, 1)
