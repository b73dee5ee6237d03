"""SQLite store for tests: a fresh file in the test's temp dir."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from sluicegate.store import RuleStore
from sluicegate.store.sqlite import SqliteRuleStore


@pytest.fixture
def sqlite_opener(tmp_path: Path) -> Callable[[], RuleStore]:
    return lambda: SqliteRuleStore(str(tmp_path / "rules.db"))
