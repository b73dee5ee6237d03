"""The adapter's side of a partition: rule loads, rule and pattern changes, checkpoints. Sans-I/O.

:class:`~sluicegate.server.partition.Partition` is this class plus the datagram side; the two halves
live in two files only to keep each readable. The methods here work on the partition's state,
declared below.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

from sluicegate import codec
from sluicegate.bucket import Bucket
from sluicegate.rules import Rule

if TYPE_CHECKING:
    from sluicegate.server.admission import Admission
    from sluicegate.server.rulebook import RuleBook

Address = Any  # whatever the transport uses: (host, port) for UDP
Ident = tuple[Address, int]  # (sender, request id)
NEVER_FULL = -1  # full_at of a bucket that never refills
MAX_WAIT_NS = 2**61  # ~73 years: a slower refill is recorded as never (keeps times in 64 bits)


class Taken(NamedTuple):
    """A key's state for a checkpoint; times are the partition's monotonic ns except ``quotas_until``."""

    key: bytes
    credit: int
    at_ns: int
    full_at_ns: int  # NEVER_FULL if the bucket never refills
    quotas: str = ""  # the quota counters' state (policy.encode_quotas), "" if none in use
    quotas_until: int = 0  # wall ns when that state is void (its last window ends)


class AdapterSide:
    """Loads, rule changes and checkpoints: what the store keeper calls."""

    # The partition's state (set by Partition.__init__).
    default_rule: Rule
    buckets: dict[bytes, Bucket]
    book: RuleBook
    admission: Admission
    wall_offset_ns: int
    rule_loads: int
    expired: int
    _reply_cache_ns: int
    _parked: dict[Ident, tuple[Any, ...]]
    _wanted: set[bytes]
    _loading: set[bytes]
    _dirty: set[bytes]
    _invalidations: list[tuple[Address, int, set[bytes], int]]

    def _ready(self, key: bytes) -> bool:
        raise NotImplementedError

    def _decide(self, ident: Ident, checks: list[tuple[bytes, int]], now_ns: int) -> bytes:
        raise NotImplementedError

    @property
    def wants_rules(self) -> bool:
        return bool(self._wanted)

    def keys_to_load(self, limit: int = 1000) -> list[bytes]:
        """Keys whose rules (and checkpoints) the adapter should load now (at most ``limit``)."""
        keys = []
        while self._wanted and len(keys) < limit:
            keys.append(self._wanted.pop())
        self._loading.update(keys)
        return keys

    def reload(self, keys: Iterable[bytes]) -> None:
        """Ask for the rules of these held keys again (e.g. loaded during a store outage)."""
        self._wanted.update(key for key in keys if key in self.buckets)

    def rules_loaded(
        self,
        rules: Mapping[bytes, Rule | None],
        now_ns: int,
        checkpoints: Mapping[bytes, tuple[int, int] | tuple[int, int, str]] | None = None,
    ) -> list[tuple[bytes, Address]]:
        """Install loaded rules (None: the default rule); return replies now due.

        ``None`` means no exact rule is stored: the best matching pattern, else
        the default rule, applies. A new key starts full, or at its checkpoint
        ``(credit, at_ns[, quotas])`` plus the refill since ``at_ns`` under the
        rule now in force (quota counters as saved, if their window is still
        on). A key already held keeps its credit, clamped to the new capacity,
        and never more than its checkpoint allows (a key first met during a
        store outage started full). A child whose parent is not held yet waits
        for the parent's rule, which is loaded next.
        """
        checkpoints = checkpoints or {}
        for key, exact in rules.items():
            self._loading.discard(key)
            self.rule_loads += 1
            rule = self.book.resolve(key, exact)
            bucket = self.buckets.get(key)
            saved = checkpoints.get(key)
            restored = None
            if saved is not None:
                restored = Bucket(rule, min(saved[1], now_ns), saved[0])
                restored.refill(now_ns)
            if bucket is None:
                self.buckets[key] = restored or Bucket(rule, now_ns)
                self._install(key, rule, now_ns, saved[2] if saved is not None and len(saved) > 2 else "")
            else:
                self._set_rule(key, bucket, rule, now_ns)
                if restored is not None and restored.credit < bucket.credit:
                    bucket.credit = restored.credit
        return self._answer_invalidations(rules) + self._answer_parked(now_ns)

    def set_patterns(self, rules: Iterable[Rule], now_ns: int) -> int:
        """Install every stored pattern (at start); held keys without an exact rule are re-resolved."""
        self.book.set_patterns(rules)
        return self._reresolve(self.book.change_patterns({}), now_ns)

    def apply_pattern_changes(self, changes: Mapping[str, Rule | None], now_ns: int) -> int:
        """Apply changed pattern rules (None: deleted); returns how many held keys changed rule."""
        return self._reresolve(self.book.change_patterns(changes), now_ns)

    def _reresolve(self, keys: Iterable[bytes], now_ns: int) -> int:
        changed = 0
        for key in keys:
            bucket = self.buckets.get(key)
            if bucket is not None:
                rule = self.book.resolve(key, None)
                if rule != bucket.rule:
                    self._set_rule(key, bucket, rule, now_ns)
                    changed += 1
        return changed

    def _install(self, key: bytes, rule: Rule, now_ns: int, quotas: str = "") -> None:
        wall_ns = now_ns + self.wall_offset_ns
        parent = self.book.install(key, rule, self.buckets, now_ns=now_ns, wall_ns=wall_ns, quotas=quotas)
        if parent is not None and parent not in self._loading:
            self._wanted.add(parent)

    def rules_failed(self, keys: Iterable[bytes], now_ns: int) -> tuple[list[bytes], list[tuple[bytes, Address]]]:
        """The store could not be read: new keys get the default rule for now, held keys keep theirs.

        Returns the keys that got the default rule this way (to :meth:`reload`
        once the store is back) and the replies now due.
        """
        keys = list(keys)
        new = [key for key in keys if key not in self.buckets]
        held = dict.fromkeys(key for key in keys if key in self.buckets)
        self._loading.difference_update(held)
        return new, self._answer_invalidations(held) + self.rules_loaded(dict.fromkeys(new), now_ns)

    def apply_rule_changes(self, changes: Mapping[bytes, Rule | None], now_ns: int) -> int:
        """Apply changed rules (None: deleted, back to the default) to held keys; returns how many."""
        applied = 0
        for key, exact in changes.items():
            if key in self._loading:
                self._wanted.add(key)  # its first load may have read the old rule: load it again
            bucket = self.buckets.get(key)
            if bucket is not None:
                self._set_rule(key, bucket, self.book.resolve(key, exact), now_ns)
                applied += 1
        return applied

    def _set_rule(self, key: bytes, bucket: Bucket, rule: Rule, now_ns: int) -> None:
        if bucket.rule != rule:
            bucket.set_rule(rule, now_ns)
            self._dirty.add(key)  # the credit may have been clamped
        self._install(key, rule, now_ns)

    def take_checkpoints(self, now_ns: int, limit: int | None = None) -> list[Taken]:
        """:class:`Taken` of buckets spent since they were last taken and not full (or with quota used).

        At most ``limit`` keys are taken per call (the rest stay for the next
        call), so that the caller can interleave the work with serving checks.

        ``full_at_ns`` is when the bucket will be full again (``NEVER_FULL`` if it
        never refills): from then on the checkpoint is void, as a missing one
        means "full". A failed write goes back with :meth:`mark_dirty`. Quota
        counters in use ride along (``quotas``), void at their window's end
        (``quotas_until``, wall ns).
        """
        out = []
        buckets = self.buckets
        policies = self.book.policies
        dirty = self._dirty
        if limit is None or limit >= len(dirty):
            keys, self._dirty = dirty, set()
        else:
            keys = [dirty.pop() for _ in range(limit)]
        for key in keys:
            bucket = buckets.get(key)
            if bucket is None:
                continue
            bucket.refill(now_ns)
            rule = bucket.rule
            missing = rule.capacity_nano - bucket.credit
            policy = policies.get(key)
            quotas, quotas_until = policy.quotas() if policy is not None else ("", 0)
            if missing <= 0:
                if quotas:
                    out.append(Taken(key, bucket.credit, bucket.stamp, bucket.stamp, quotas, quotas_until))
                continue
            wait_ns = NEVER_FULL if rule.rate <= 0 else math.ceil(missing / rule.rate)
            full_at = NEVER_FULL if wait_ns == NEVER_FULL or wait_ns > MAX_WAIT_NS else bucket.stamp + wait_ns
            out.append(Taken(key, bucket.credit, bucket.stamp, full_at, quotas, quotas_until))
        return out

    @property
    def dirty_count(self) -> int:
        """Buckets spent since they were last taken for a checkpoint."""
        return len(self._dirty)

    def mark_dirty(self, keys: Iterable[bytes]) -> None:
        """Checkpoint these keys again next time (their last write failed)."""
        self._dirty.update(keys)

    def _answer_invalidations(self, rules: Mapping[bytes, Rule | None]) -> list[tuple[bytes, Address]]:
        replies = []
        waiting = []
        for addr, request_id, keys, held in self._invalidations:
            keys.difference_update(rules)
            if keys:
                waiting.append((addr, request_id, keys, held))
            else:
                replies.append((codec.encode_invalidate_reply(request_id, held), addr))
        self._invalidations = waiting
        return replies

    def _answer_parked(self, now_ns: int) -> list[tuple[bytes, Address]]:
        replies = []
        buckets = self.buckets
        for ident, (parked_at, checks, *held) in list(self._parked.items()):
            if now_ns - parked_at >= self._reply_cache_ns:
                # Its sender has long given up (answered its caller with the
                # fallback): charging now would charge for nothing.
                del self._parked[ident]
                self.expired += 1
            elif all(self._ready(key) or (key not in buckets and not is_valid_key(key)) for key, _ in checks):
                del self._parked[ident]
                if held:  # an acquire or a waiting check: decided or queued now
                    (key, cost), (kind, ttl_ms, wait_ms) = checks[0], held[0]
                    reply = self.admission.request(ident, kind, key, cost, ttl_ms, wait_ms, now_ns)
                    if reply is not None:
                        replies.append((reply, ident[0]))
                    continue
                replies.append((self._decide(ident, checks, now_ns), ident[0]))
        return replies


def is_valid_key(key: bytes) -> bool:
    """What the store accepts as a key: UTF-8 without NUL (anything else is answered INVALID)."""
    if b"\x00" in key:
        return False
    try:
        key.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True
