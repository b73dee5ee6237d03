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

from sluicegate.rules import Rule
from sluicegate.store.base import Checkpoint, RuleChange, RuleStore, StoreError, StoreUnavailable


def open_store(kind: str = "sqlite", **settings: object) -> RuleStore:
    """Open the backend named ``kind`` with its settings (e.g. ``path=`` for sqlite)."""
    if kind == "sqlite":
        from sluicegate.store.sqlite import SqliteRuleStore

        return SqliteRuleStore(str(settings.get("path", "sluicegate.db")))
    raise StoreError(f"unknown store {kind!r}; this build supports: sqlite")


__all__ = ["Checkpoint", "Rule", "RuleChange", "RuleStore", "StoreError", "StoreUnavailable", "open_store"]
