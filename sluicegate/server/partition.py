"""Sans-I/O core of a bucket server: datagrams in, replies out, time passed in.

The core never blocks and never does I/O. A check for a key it has not seen
parks its datagram and asks (through :meth:`Partition.keys_to_load`) for the
key's rule and checkpoint; the adapter loads them from the store and hands
them back with :meth:`Partition.rules_loaded`, which answers the parked
datagrams. Keys already held are decided at once, so a slow load blocks
nobody else. The adapter also feeds rule changes in
(:meth:`Partition.apply_rule_changes`) and takes checkpoints out
(:meth:`Partition.take_checkpoints`). All times are the caller's monotonic
nanoseconds.

Example:
    >>> from sluicegate import codec
    >>> from sluicegate.rules import default_rule
    >>> p = Partition(default_rule=default_rule(10, 1))
    >>> request = codec.encode_check_request(1, [(b"alice", 3)])
    >>> p.receive_datagram(request, ("127.0.0.1", 5000), now_ns=0) is None  # parked
    True
    >>> p.keys_to_load()
    [b'alice']
    >>> [(reply, addr)] = p.rules_loaded({b"alice": None}, now_ns=0)
    >>> codec.decode_check_reply(reply)[1][0].remaining
    7
    >>> p.take_checkpoints(now_ns=0)  # key, credit, its time, when it will be full, quota state
    [Taken(key=b'alice', credit=7000000000, at_ns=0, full_at_ns=3000000000, quotas='', quotas_until=0)]
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from sluicegate import codec
from sluicegate import codec_leases as wire
from sluicegate.bucket import Bucket
from sluicegate.policy import decide
from sluicegate.rules import MAIN_LIMIT, Rule
from sluicegate.server.admission import ACQUIRE, CHECK, Admission
from sluicegate.server.replies import ReplyCache
from sluicegate.server.rulebook import RuleBook

Address = Any  # whatever the transport uses: (host, port) for UDP
Ident = tuple[Address, int]  # (sender, request id)
DEFAULT_REPLY_CACHE_NS = 1_000_000_000
NEVER_FULL = -1  # full_at of a bucket that never refills
MAIN_LIMIT_NAME = MAIN_LIMIT.encode()
MAX_WAIT_NS = 2**61  # ~73 years: a slower refill is recorded as never (keeps times in 64 bits)


class Taken(NamedTuple):
    """A key's state for a checkpoint; times are the partition's monotonic ns except ``quotas_until``."""

    key: bytes
    credit: int
    at_ns: int
    full_at_ns: int  # NEVER_FULL if the bucket never refills
    quotas: str = ""  # the quota counters' state (policy.encode_quotas), "" if none in use
    quotas_until: int = 0  # wall ns when that state is void (its last window ends)


class Partition:
    """One partition's buckets, reply cache and counters."""

    def __init__(self, *, default_rule: Rule, reply_cache_ns: int = DEFAULT_REPLY_CACHE_NS) -> None:
        self.default_rule = default_rule
        self.buckets: dict[bytes, Bucket] = {}
        # Patterns, policies beyond the main bucket, share groups (absent for plain keys).
        self.book = RuleBook(default_rule)
        self.wall_offset_ns = 0  # wall (epoch) ns = now_ns + this; the adapter keeps it current
        # Leases and waiting requests; replies to requests that waited leave through the outbox.
        self.admission = Admission(self)
        self.outbox: list[tuple[bytes, Address]] = []
        # A retried request gets the same answer, charged once.
        self._replies = ReplyCache(reply_cache_ns)
        self._reply_cache_ns = reply_cache_ns
        # Requests waiting for rules, oldest first: ident -> (parked at, checks[, (kind, ttl_ms, max_wait_ms)]).
        self._parked: dict[Ident, tuple[Any, ...]] = {}
        self._wanted: set[bytes] = set()
        self._loading: set[bytes] = set()
        self._invalidations: list[tuple[Address, int, set[bytes], int]] = []  # waiting for reloads
        self._dirty: set[bytes] = set()  # spent since the last checkpoint
        self.checks = self.allowed = self.denied = self.malformed = 0
        self.duplicates = self.charged = self.rule_loads = self.datagrams = 0
        self.expired = 0  # parked requests dropped: their sender had given up
        self.would_deny = 0  # admitted, but a shadow limit would have denied
        # Counted by the adapter, reported with the rest.
        self.store_errors = self.send_errors = 0

    def counters(self) -> dict[str, int]:
        """Counters since start: checks, allowed, denied, malformed, duplicates, keys, datagrams, ..."""
        return {
            "checks": self.checks,
            "allowed": self.allowed,
            "denied": self.denied,
            "malformed": self.malformed,
            "duplicates": self.duplicates,
            "keys": len(self.buckets),
            "charged": self.charged,
            "rule_loads": self.rule_loads,
            "datagrams": self.datagrams,
            "expired": self.expired,
            "would_deny": self.would_deny,
            "reclaimed": self.admission.reclaimed,
            "waited": self.admission.waited,
            "store_errors": self.store_errors,
            "send_errors": self.send_errors,
        }

    def receive_datagram(self, data: bytes, addr: Address, now_ns: int) -> bytes | None:
        """Handle one datagram; return the reply to send to ``addr``, or None.

        None means dropped (malformed, counted) or parked until rules arrive.
        """
        self.datagrams += 1
        try:
            single = codec.decode_single_check(data)
            if single is not None:
                return self._receive_single(single[0], single[1], single[2], addr, now_ns)
            op, request_id, count = codec.decode_header(data)
            if op == codec.OP_CHECK:
                return self._receive_check(data, addr, request_id, count, now_ns)
            if op == codec.OP_STATS:
                return codec.encode_stats_reply(codec.decode_stats_request(data), self.counters())
            if op == codec.OP_INVALIDATE:
                return self._receive_invalidate(data, addr)
            if op == codec.OP_ACQUIRE:
                request_id, key, cost, ttl_ms, max_wait_ms = wire.decode_acquire_request(data)
                return self._receive_held(addr, request_id, ACQUIRE, key, cost, ttl_ms, max_wait_ms, now_ns)
            if op == codec.OP_CHECK_WAIT:
                request_id, key, cost, max_wait_ms = wire.decode_check_wait_request(data)
                return self._receive_held(addr, request_id, CHECK, key, cost, 0, max_wait_ms, now_ns)
            if op == codec.OP_RELEASE:
                return self._receive_release(data, addr, now_ns)
            raise codec.MalformedDatagram("a reply sent to a server")
        except codec.MalformedDatagram:
            self.malformed += 1
            return None

    def _receive_single(self, request_id: int, key: bytes, cost: int, addr: Address, now_ns: int) -> bytes | None:
        # The hot path (one check per datagram): _receive_check + _decide without lists.
        ident = (addr, request_id)
        cached = self._replay(ident, now_ns)
        if cached is not None:
            return cached
        bucket = self.buckets.get(key)
        if bucket is None or ident in self._parked or (self.book.has_waiting and self.book.waiting_for(key)):
            return self._receive_check_items(ident, [(key, cost)], now_ns)
        self.checks += 1
        reply = codec.encode_single_reply(request_id, *self._charge(key, bucket, cost, now_ns))
        self._replies.put(ident, reply, now_ns)
        return reply

    def _receive_held(
        self, addr: Address, request_id: int, kind: str, key: bytes, cost: int, ttl_ms: int, wait_ms: int, now_ns: int
    ) -> bytes | None:
        """An acquire or a waiting check: decided now, parked for its rule, or queued by admission."""
        ident = (addr, request_id)
        cached = self._replay(ident, now_ns)
        if cached is not None:
            return cached
        if ident in self._parked or self.admission.is_waiting(ident):
            self.duplicates += 1  # a retry of a request still waiting: it is answered once, later
            return None
        if not _is_valid_key(key):
            invalid = (codec.STATUS_INVALID, 0, 0, 0, 0, b"")
            if kind == ACQUIRE:
                return wire.encode_acquire_reply(request_id, invalid, 0)
            return codec.encode_check_reply(request_id, [invalid])
        if not self._ready(key):
            self._parked[ident] = (now_ns, [(key, cost)], (kind, ttl_ms, wait_ms))
            if key not in self._loading and key not in self.buckets:
                self._wanted.add(key)
            return None
        return self.admission.request(ident, kind, key, cost, ttl_ms, wait_ms, now_ns)

    def _receive_release(self, data: bytes, addr: Address, now_ns: int) -> bytes:
        request_id, releases = wire.decode_release_request(data)
        ident = (addr, request_id)
        cached = self._replay(ident, now_ns)
        if cached is not None:
            return cached
        reply = wire.encode_release_reply(request_id, self.admission.release(releases, now_ns))
        self._replies.put(ident, reply, now_ns)
        return reply

    def charge(self, key: bytes, cost: int, now_ns: int) -> tuple[int, int, int, int, int, bytes]:
        """Decide a check of a held key (counted as allowed or denied; the caller counts the check)."""
        return self._charge(key, self.buckets[key], cost, now_ns)

    def remember(self, ident: Ident, reply: bytes, now_ns: int) -> None:
        """Keep a reply for retries of its request."""
        self._replies.put(ident, reply, now_ns)

    def tick(self, now_ns: int) -> None:
        """Time-driven work (lease reclaim, waiting requests); replies land in :attr:`outbox`."""
        self.admission.tick(now_ns)

    def next_event_ns(self) -> int | None:
        """When :meth:`tick` should run next (None: nothing is waiting on time)."""
        return self.admission.next_event_ns()

    def take_outbox(self) -> list[tuple[bytes, Address]]:
        outbox, self.outbox = self.outbox, []
        return outbox

    def _receive_invalidate(self, data: bytes, addr: Address) -> bytes | None:
        # Answer only once the keys' rules are reloaded, so that when the sender
        # hears back, the new rules are in force. A key whose first load is under
        # way counts too: that load may have read the old rule.
        request_id, keys = codec.decode_invalidate_request(data)
        held = {key for key in keys if key in self.buckets or key in self._loading}
        if not held:
            return codec.encode_invalidate_reply(request_id, 0)
        self._wanted.update(held)
        self._invalidations.append((addr, request_id, held, len(held)))
        return None

    def _receive_check(self, data: bytes, addr: Address, request_id: int, count: int, now_ns: int) -> bytes | None:
        ident = (addr, request_id)
        cached = self._replay(ident, now_ns)
        if cached is not None:
            return cached
        return self._receive_check_items(ident, codec.decode_check_items(data, count), now_ns)

    def _receive_check_items(self, ident: Ident, checks: list[tuple[bytes, int]], now_ns: int) -> bytes | None:
        if ident in self._parked:
            self.duplicates += 1
            return None
        missing = [key for key, _ in checks if not self._ready(key) and _is_valid_key(key)]
        if missing:
            self._parked[ident] = (now_ns, checks)
            self._wanted.update(key for key in missing if key not in self._loading and key not in self.buckets)
            return None
        return self._decide(ident, checks, now_ns)

    def _ready(self, key: bytes) -> bool:
        """Held, and not a child still waiting for its parent's rule."""
        return key in self.buckets and not (self.book.has_waiting and self.book.waiting_for(key))

    def _decide(self, ident: Ident, checks: list[tuple[bytes, int]], now_ns: int) -> bytes:
        results = []
        buckets = self.buckets
        for key, cost in checks:
            bucket = buckets.get(key)
            if bucket is None:  # only keys that are not valid keys are never loaded
                results.append((codec.STATUS_INVALID, 0, 0, 0, 0, b""))
            else:
                results.append(self._charge(key, bucket, cost, now_ns))
        self.checks += len(checks)
        reply = codec.encode_check_reply(ident[1], results)
        self._replies.put(ident, reply, now_ns)
        return reply

    def _charge(self, key: bytes, bucket: Bucket, cost: int, now_ns: int) -> tuple[int, int, int, int, int, bytes]:
        """Decide one check: ``(status, remaining, retry_after_ms, capacity, window_ms, limit)``."""
        policy = self.book.policies.get(key)
        if policy is not None:
            return self._charge_policy(key, bucket, policy, cost, now_ns)
        rule = bucket.rule
        if bucket.take(cost, now_ns):
            self.allowed += 1
            self.charged += cost
            self._dirty.add(key)
            status, retry = codec.STATUS_ALLOWED, 0
        else:
            self.denied += 1
            status, retry = codec.STATUS_DENIED, bucket.retry_after_ms(cost, now_ns)
        if rule is self.default_rule:
            status |= codec.FLAG_DEFAULT_RULE
        return status, bucket.remaining, retry, rule.capacity, rule.window_ms, b"" if retry == 0 else MAIN_LIMIT_NAME

    def _charge_policy(self, key: bytes, bucket: Bucket, policy: Any, cost: int, now_ns: int) -> tuple:
        result = decide(policy, bucket, cost, now_ns=now_ns, wall_ns=now_ns + self.wall_offset_ns)
        status = result[0]
        if status & codec.STATUS_MASK == codec.STATUS_ALLOWED:
            self.allowed += 1
            self.charged += cost
            self._dirty.add(key)
            if status & codec.FLAG_WOULD_DENY:
                self.would_deny += 1
        else:
            self.denied += 1
        if bucket.rule is self.default_rule:
            return (status | codec.FLAG_DEFAULT_RULE, *result[1:])
        return result

    def _replay(self, ident: Ident, now_ns: int) -> bytes | None:
        """The cached reply to a repeated request (counted as a duplicate), else None."""
        cached = self._replies.get(ident, now_ns)
        if cached is not None:
            self.duplicates += 1
        return cached

    # -- rules and checkpoints: the adapter's side -------------------------------------------

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
            elif all(self._ready(key) or (key not in buckets and not _is_valid_key(key)) for key, _ in checks):
                del self._parked[ident]
                if held:  # an acquire or a waiting check: decided or queued now
                    (key, cost), (kind, ttl_ms, wait_ms) = checks[0], held[0]
                    reply = self.admission.request(ident, kind, key, cost, ttl_ms, wait_ms, now_ns)
                    if reply is not None:
                        replies.append((reply, ident[0]))
                    continue
                replies.append((self._decide(ident, checks, now_ns), ident[0]))
        return replies


def _is_valid_key(key: bytes) -> bool:
    """What the store accepts as a key: UTF-8 without NUL (anything else is answered INVALID)."""
    if b"\x00" in key:
        return False
    try:
        key.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True
