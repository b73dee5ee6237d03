"""The store interface: a base class that owns the workflow, backends that do I/O.

A backend implements the ``_``-prefixed abstract methods and names its
driver's exception types; the base validates input, batches, and turns driver
errors into :class:`StoreError` / :class:`StoreUnavailable` (``raise ... from
exc``), so no caller ever sees a driver exception.

Two kinds of data:

* **Rules** by key, each with the store time it was last written. A deleted
  rule stays as a tombstone (invisible to ``get``/``list``) so that
  :meth:`RuleStore.changed_since` reports deletions too: bucket servers sync
  by asking for what changed, so a sync costs what changed, not what is held.
  A rule's policy fields travel as one JSON text (:mod:`sluicegate.store.rows`);
  pattern rules are also indexed apart (:meth:`RuleStore.list_patterns`).
* **Checkpoints**: a bucket's credit at a wall-clock time, void from the time
  the bucket would be full again (a missing checkpoint means "full"), and the
  partition's opaque text of the key's quota counters.

A stored rule that is no longer valid (say, policy JSON edited by hand) must
not stop every sync: readers skip it, log it once per key and handle, and
count it in :attr:`RuleStore.invalid_rules`.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple, TypeVar

from sluicegate.rules import Rule, RuleError, validate_key
from sluicegate.store.rows import StoredRule, rule_of

log = logging.getLogger(__name__)

DEFAULT_BATCH = 500
CHECKPOINT_BATCH = 5000  # checkpoints come in bulk every second: fewer, larger transactions
MAX_LIST = 1000
NEVER_EXPIRES_NS = 2**63 - 1  # a checkpoint of a bucket that never refills
MAX_WARNED_KEYS = 1000  # invalid rows are logged once per key, for this many keys per handle


@dataclass(frozen=True, slots=True)
class RuleChange:
    """A rule written (``rule``) or deleted (``rule`` is None) at ``updated_at`` (epoch seconds)."""

    key: str
    rule: Rule | None
    updated_at: float


class Checkpoint(NamedTuple):
    """``credit`` nano-credits at wall time ``at_ns`` (epoch ns); void from ``expires_ns`` on.

    ``quotas`` is the partition's text for the key's calendar quota counters,
    stored and returned as is ("" when there are none, and for old rows).
    A named tuple, not a dataclass: a busy partition builds tens of thousands a second.

    Example:
        >>> Checkpoint("alice", credit=5 * 10**9, at_ns=0, expires_ns=10**9).quotas
        ''
    """

    key: str
    credit: int
    at_ns: int
    expires_ns: int
    quotas: str = ""


class StoreError(Exception):
    """The store failed to do what was asked."""


class StoreUnavailable(StoreError):
    """The store cannot be reached (or is locked/throttled); retrying may help."""


_clock_lock = threading.Lock()
_last_change = 0.0


def change_times(count: int) -> list[float]:
    """``count`` strictly increasing store times (epoch seconds) for rule writes.

    Backends stamp each written or deleted rule with one, so that rows of one
    bulk write do not share a time and ``changed_since`` can page through them.
    """
    global _last_change
    with _clock_lock:
        start = max(time.time(), _last_change + 1e-6)
        times = [start + i * 1e-6 for i in range(count)]
        _last_change = times[-1] if times else _last_change
    return times


_Keyed = TypeVar("_Keyed", Rule, Checkpoint)
_Row = TypeVar("_Row", StoredRule, Checkpoint)


class RuleStore(ABC):
    """Rules by key. Thread-safe for one writer at a time per backend."""

    #: Driver exceptions that mean "cannot reach the store now".
    unavailable_errors: tuple[type[BaseException], ...] = ()
    #: Any other driver exception the backend may raise.
    driver_errors: tuple[type[BaseException], ...] = ()

    _invalid_lock = threading.Lock()  # shared by all handles: invalid rows are rare
    _invalid_count = 0
    _warned_keys: frozenset[str] = frozenset()

    @property
    def invalid_rules(self) -> int:
        """Stored rows skipped by this handle's reads because they are not valid rules (each read counts)."""
        return self._invalid_count

    def _rules_of(self, rows: Iterable[StoredRule]) -> list[Rule]:
        """The valid rules among ``rows``; invalid ones are skipped, logged and counted."""
        rules = []
        for row in rows:
            try:
                rules.append(rule_of(row))
            except (ValueError, TypeError) as exc:  # RuleError is a ValueError
                self._skip_invalid(row.key, exc)
        return rules

    def _skip_invalid(self, key: str, exc: Exception) -> None:
        with self._invalid_lock:
            self._invalid_count += 1
            first = key not in self._warned_keys and len(self._warned_keys) < MAX_WARNED_KEYS
            if first:
                self._warned_keys = self._warned_keys | {key}
        if first:
            log.warning(
                "%s: skipped the stored rule %r, which is not a valid rule (%s); it reads as missing until rewritten",
                type(self).__name__,
                key,
                exc,
            )

    def get_rule(self, key: str) -> Rule | None:
        """The rule stored for ``key``, or None."""
        return self.get_rules([key]).get(key)

    def get_rules(self, keys: Iterable[str]) -> dict[str, Rule]:
        """Rules of the ``keys`` that have one (keys without a valid rule are absent)."""
        return {rule.key: rule for rule in self._rules_of(self._read_in_batches(keys, self._fetch))}

    def put_rule(self, rule: Rule) -> None:
        """Create or replace one rule."""
        self.put_rules([rule])

    def put_rules(
        self,
        rules: Iterable[Rule],
        *,
        batch_size: int = DEFAULT_BATCH,
        progress: Callable[[int], None] | None = None,
    ) -> int:
        """Create or replace many rules in batches; ``progress(n_done)`` after each batch."""

        def checked(items: Iterable[Rule]) -> Iterator[Rule]:
            for rule in items:
                if not isinstance(rule, Rule):
                    raise TypeError("put_rules takes Rule objects")
                yield rule

        return self._write_in_batches(checked(rules), self._write, batch_size, progress)

    def _write_in_batches(
        self,
        items: Iterable[_Keyed],
        write: Callable[[list[_Keyed]], None],
        batch_size: int = DEFAULT_BATCH,
        progress: Callable[[int], None] | None = None,
    ) -> int:
        """``write`` the items batch by batch; returns how many were given."""
        done = 0
        iterator = iter(items)
        while batch := list(itertools.islice(iterator, batch_size)):
            # Last write wins inside one batch, as it would across batches.
            unique = list({item.key: item for item in batch}.values())
            with self._driver_errors_mapped():
                write(unique)
            done += len(batch)
            if progress:
                progress(done)
        return done

    def _read_in_batches(self, keys: Iterable[str], fetch: Callable[[list[str]], Iterable[_Row]]) -> list[_Row]:
        """What ``fetch`` returns for the distinct, validated ``keys``, a batch at a time."""
        wanted = [validate_key(key) for key in dict.fromkeys(keys)]
        found: list[_Row] = []
        for start in range(0, len(wanted), DEFAULT_BATCH):
            with self._driver_errors_mapped():
                found.extend(fetch(wanted[start : start + DEFAULT_BATCH]))
        return found

    def delete_rule(self, key: str) -> bool:
        """Delete the rule for ``key``; True if there was one."""
        validate_key(key)
        with self._driver_errors_mapped():
            return self._remove(key)

    def list_rules(self, *, prefix: str = "", after: str | None = None, limit: int = 100) -> list[Rule]:
        """Rules in key order, starting after ``after``, whose key starts with ``prefix``.

        A page holds ``limit`` rules unless there are no more: invalid rows skipped
        on the way are made up for, so a short page still means "the end".
        """
        if not 1 <= limit <= MAX_LIST:
            raise RuleError(f"limit must be 1 to {MAX_LIST}")
        for name, text in (("prefix", prefix), ("after", after or "")):
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise RuleError(f"{name} is not valid Unicode text") from exc
        rules: list[Rule] = []
        while True:
            wanted = limit - len(rules)
            with self._driver_errors_mapped():
                rows = self._scan(prefix, after, wanted)
            rules += self._rules_of(rows)
            if len(rows) < wanted or len(rules) >= limit:
                return rules
            after = rows[-1].key

    def list_patterns(self) -> list[Rule]:
        """Every live pattern rule (:attr:`Rule.is_pattern`), in key order, from an index of patterns only."""
        with self._driver_errors_mapped():
            return self._rules_of(self._patterns())

    def iter_rules(self, *, prefix: str = "") -> Iterator[Rule]:
        """Every rule whose key starts with ``prefix``, page by page."""
        after = None
        while True:
            page = self.list_rules(prefix=prefix, after=after, limit=MAX_LIST)
            yield from page
            if len(page) < MAX_LIST:
                return
            after = page[-1].key

    def changed_since(self, since: float, *, limit: int = MAX_LIST) -> list[RuleChange]:
        """Rules written or deleted after ``since`` (epoch seconds), oldest first, at most ``limit``.

        A rule written with an invalid stored form is skipped (the reader keeps what it
        had); as in :meth:`list_rules`, fewer than ``limit`` changes means there are no more.
        """
        if not 1 <= limit <= MAX_LIST:
            raise RuleError(f"limit must be 1 to {MAX_LIST}")
        changes: list[RuleChange] = []
        while True:
            wanted = limit - len(changes)
            with self._driver_errors_mapped():
                rows = self._changes(since, wanted)
            for row in rows:
                if row.deleted:
                    changes.append(RuleChange(row.key, None, row.updated_at))
                else:
                    changes += (RuleChange(row.key, rule, row.updated_at) for rule in self._rules_of([row]))
            if len(rows) < wanted or len(changes) >= limit:
                return changes
            since = rows[-1].updated_at

    def put_checkpoints(self, checkpoints: Iterable[Checkpoint]) -> int:
        """Create or replace checkpoints, in batches; returns how many were given."""
        return self._write_in_batches(checkpoints, self._write_checkpoints, CHECKPOINT_BATCH)

    def get_checkpoints(self, keys: Iterable[str], now_ns: int) -> dict[str, Checkpoint]:
        """The checkpoints of ``keys`` still valid at ``now_ns`` (expired ones count as missing)."""
        return {
            checkpoint.key: checkpoint
            for checkpoint in self._read_in_batches(keys, self._fetch_checkpoints)
            if checkpoint.expires_ns > now_ns
        }

    def sweep(self, now_ns: int) -> int:
        """Delete expired checkpoints (stores without a TTL of their own); returns how many."""
        with self._driver_errors_mapped():
            return self._sweep(now_ns)

    def migrate(self) -> None:
        """Create the tables/schema if missing (idempotent)."""
        with self._driver_errors_mapped():
            self._migrate()

    def close(self) -> None:
        with self._driver_errors_mapped():
            self._close()

    @contextlib.contextmanager
    def _driver_errors_mapped(self) -> Iterator[None]:
        try:
            yield
        except self.unavailable_errors as exc:
            raise StoreUnavailable(f"{type(self).__name__}: store unavailable: {exc}") from exc
        except self.driver_errors as exc:
            raise StoreError(f"{type(self).__name__}: {exc}") from exc

    @abstractmethod
    def _fetch(self, keys: Sequence[str]) -> Iterable[StoredRule]:
        """Live rows of ``keys``."""

    @abstractmethod
    def _write(self, rules: Sequence[Rule]) -> None:
        """Upsert ``rules`` (distinct keys) with their policy text (:func:`~sluicegate.store.rows.policy_text`)."""

    @abstractmethod
    def _remove(self, key: str) -> bool: ...

    @abstractmethod
    def _scan(self, prefix: str, after: str | None, limit: int) -> list[StoredRule]:
        """Up to ``limit`` live rows in key order, keys above ``after`` starting with ``prefix``."""

    @abstractmethod
    def _patterns(self) -> list[StoredRule]:
        """Every live pattern row, in key order (through an index of patterns, not a scan)."""

    @abstractmethod
    def _close(self) -> None: ...

    @abstractmethod
    def _changes(self, since: float, limit: int) -> list[StoredRule]:
        """Up to ``limit`` rows (tombstones too) written after ``since``, by ``updated_at``."""

    @abstractmethod
    def _write_checkpoints(self, checkpoints: Sequence[Checkpoint]) -> None: ...

    @abstractmethod
    def _fetch_checkpoints(self, keys: Sequence[str]) -> Iterable[Checkpoint]: ...

    def _sweep(self, now_ns: int) -> int:
        return 0  # stores with a TTL of their own (DynamoDB) expire checkpoints themselves

    def _migrate(self) -> None:
        return None  # stores that create their schema on open
