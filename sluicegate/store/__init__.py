"""Rule stores: one interface (:class:`RuleStore`), several backends.

SQLite is the embedded default; DynamoDB and PostgreSQL backends implement the
same few private methods. Callers only ever see :class:`StoreError`.

Example:
    >>> store = open_store("sqlite", path=":memory:")
    >>> store.put_rule(Rule("alice", capacity=10, rate=1))
    >>> store.get_rule("alice").capacity
    10
"""

from __future__ import annotations

from sluicegate.config import Config
from sluicegate.rules import Rule
from sluicegate.store.base import Checkpoint, RuleChange, RuleStore, StoreError, StoreUnavailable


def open_store(kind: str = "sqlite", **settings: str) -> RuleStore:
    """Open the backend named ``kind`` with its settings.

    * ``sqlite``: ``path``.
    * ``postgres``: ``dsn`` (libpq connection string).
    * ``dynamodb``: ``rules_table``, ``checkpoints_table``, ``endpoint`` (empty: AWS).
    """
    if kind == "sqlite":
        from sluicegate.store.sqlite import SqliteRuleStore

        return SqliteRuleStore(settings.get("path", "sluicegate.db"))
    if kind == "postgres":
        from sluicegate.store.postgres import PostgresRuleStore

        return PostgresRuleStore(settings["dsn"])
    if kind == "dynamodb":
        from sluicegate.store.dynamodb import DynamoRuleStore

        return DynamoRuleStore(
            rules_table=settings.get("rules_table", "sluicegate-rules"),
            checkpoints_table=settings.get("checkpoints_table", "sluicegate-checkpoints"),
            endpoint=settings.get("endpoint", ""),
        )
    raise StoreError(f"unknown store {kind!r}; use sqlite, dynamodb or postgres")


def store_from_config(config: Config, *, db: str | None = None) -> RuleStore:
    """The store ``config`` names (``db`` overrides the SQLite file)."""
    return open_store(
        config.store,
        path=db or config.db,
        dsn=config.postgres_conninfo,
        rules_table=config.dynamodb_rules_table,
        checkpoints_table=config.dynamodb_checkpoints_table,
        endpoint=config.dynamodb_endpoint,
    )


__all__ = [
    "Checkpoint",
    "Rule",
    "RuleChange",
    "RuleStore",
    "StoreError",
    "StoreUnavailable",
    "open_store",
    "store_from_config",
]
