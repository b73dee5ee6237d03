"""PostgreSQL store for tests: one real server per session, a fresh schema per test.

Isolation is a new, empty schema per test (``CREATE SCHEMA`` is about a millisecond;
``CREATE DATABASE`` costs far more), selected through the DSN's ``search_path``
option, so every test also exercises the store's create-if-missing path. The
server runs with fsync off (``tests/pgserver.py``); a missing PostgreSQL is a
test failure that says how to install it, never a skip.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator

import psycopg
import pytest

from sluicegate.store import RuleStore
from sluicegate.store.postgres import PostgresRuleStore
from tests.pgserver import PostgresNotInstalled, PostgresServer

_schemas = itertools.count(1)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """The session's PostgreSQL server: ``.dsn()``, ``.stop()``, ``.start()``, ``.outage()`` (a context manager)."""
    try:
        server = PostgresServer(fast=True)
    except PostgresNotInstalled as exc:
        pytest.fail(str(exc), pytrace=False)
    with server:
        yield server


@pytest.fixture
def postgres_dsn(postgres_server: PostgresServer) -> str:
    """The DSN of a new, empty schema (made the only one on the search path) in the session's server."""
    postgres_server.start()  # a no-op unless an earlier test left it stopped
    schema = f"test_{next(_schemas)}"
    with psycopg.connect(postgres_server.dsn(), autocommit=True) as admin:
        admin.execute(f"CREATE SCHEMA {schema}")
    return postgres_server.dsn(options=f"-c search_path={schema}")


@pytest.fixture
def postgres_opener(postgres_dsn: str) -> Callable[[], RuleStore]:
    return lambda: PostgresRuleStore(postgres_dsn)


#: The schema of the release before policies (tests/stores/contract.py: ``legacy``).
OLD_SCHEMA = (
    """CREATE TABLE rules (
        key text COLLATE "C" PRIMARY KEY, capacity bigint NOT NULL, rate double precision NOT NULL,
        updated_at double precision NOT NULL, deleted boolean NOT NULL DEFAULT false
    )""",
    "CREATE INDEX rules_updated_at ON rules (updated_at)",
    """CREATE TABLE checkpoints (
        key text COLLATE "C" PRIMARY KEY, credit bigint NOT NULL, at_ns bigint NOT NULL, expires_ns bigint NOT NULL
    )""",
    "CREATE INDEX checkpoints_expires_ns ON checkpoints (expires_ns)",
)


@pytest.fixture
def postgres_legacy(postgres_dsn: str) -> Callable[..., Callable[[], RuleStore]]:
    """Seeds the test's schema with the tables of the release before policies; returns an opener on it."""

    def seed(rules: list[tuple], checkpoints: list[tuple]) -> Callable[[], RuleStore]:
        with psycopg.connect(postgres_dsn, autocommit=True) as conn:
            for statement in OLD_SCHEMA:
                conn.execute(statement)
            with conn.cursor() as cursor:
                cursor.executemany("INSERT INTO rules VALUES (%s, %s, %s, %s, %s)", rules)
                cursor.executemany("INSERT INTO checkpoints VALUES (%s, %s, %s, %s)", checkpoints)
        return lambda: PostgresRuleStore(postgres_dsn)

    return seed
