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
* **Checkpoints**: a bucket's credit at a wall-clock time, void from the time
  the bucket would be full again (a missing checkpoint means "full").
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple, TypeVar

from sluicegate.rules import Rule, RuleError, validate_key

DEFAULT_BATCH = 500
CHECKPOINT_BATCH = 5000  # checkpoints come in bulk every second: fewer, larger transactions
MAX_LIST = 1000
NEVER_EXPIRES_NS = 2**63 - 1  # a checkpoint of a bucket that never refills


@dataclass(frozen=True, slots=True)
class RuleChange:
    """A rule written (``rule``) or deleted (``rule`` is None) at ``updated_at`` (epoch seconds)."""

    key: str
    rule: Rule | None
    updated_at: float


class Checkpoint(NamedTuple):
    """``credit`` nano-credits at wall time ``at_ns`` (epoch ns); void from ``expires_ns`` on.

    A named tuple, not a dataclass: a busy partition builds tens of thousands a second.
    """

    key: str
    credit: int
    at_ns: int
    expires_ns: int


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


class RuleStore(ABC):
    """Rules by key. Thread-safe for one writer at a time per backend."""

    #: Driver exceptions that mean "cannot reach the store now".
    unavailable_errors: tuple[type[BaseException], ...] = ()
    #: Any other driver exception the backend may raise.
    driver_errors: tuple[type[BaseException], ...] = ()

    def get_rule(self, key: str) -> Rule | None:
        """The rule stored for ``key``, or None."""
        return self.get_rules([key]).get(key)

    def get_rules(self, keys: Iterable[str]) -> dict[str, Rule]:
        """Rules of the ``keys`` that have one (keys without a rule are absent)."""
        return {rule.key: rule for rule in self._read_in_batches(keys, self._fetch)}

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

    def _read_in_batches(self, keys: Iterable[str], fetch: Callable[[list[str]], Iterable[_Keyed]]) -> list[_Keyed]:
        """What ``fetch`` returns for the distinct, validated ``keys``, a batch at a time."""
        wanted = [validate_key(key) for key in dict.fromkeys(keys)]
        found: list[_Keyed] = []
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
        """Rules in key order, starting after ``after``, whose key starts with ``prefix``."""
        if not 1 <= limit <= MAX_LIST:
            raise RuleError(f"limit must be 1 to {MAX_LIST}")
        for name, text in (("prefix", prefix), ("after", after or "")):
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise RuleError(f"{name} is not valid Unicode text") from exc
        with self._driver_errors_mapped():
            return self._scan(prefix, after, limit)

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
        """Rules written or deleted after ``since`` (epoch seconds), oldest first, at most ``limit``."""
        if not 1 <= limit <= MAX_LIST:
            raise RuleError(f"limit must be 1 to {MAX_LIST}")
        with self._driver_errors_mapped():
            return self._changes(since, limit)

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
    def _fetch(self, keys: Sequence[str]) -> Iterable[Rule]: ...

    @abstractmethod
    def _write(self, rules: Sequence[Rule]) -> None: ...

    @abstractmethod
    def _remove(self, key: str) -> bool: ...

    @abstractmethod
    def _scan(self, prefix: str, after: str | None, limit: int) -> list[Rule]: ...

    @abstractmethod
    def _close(self) -> None: ...

    @abstractmethod
    def _changes(self, since: float, limit: int) -> list[RuleChange]: ...

    @abstractmethod
    def _write_checkpoints(self, checkpoints: Sequence[Checkpoint]) -> None: ...

    @abstractmethod
    def _fetch_checkpoints(self, keys: Sequence[str]) -> Iterable[Checkpoint]: ...

    def _sweep(self, now_ns: int) -> int:
        return 0  # stores with a TTL of their own (DynamoDB) expire checkpoints themselves

    def _migrate(self) -> None:
        return None  # stores that create their schema on open
