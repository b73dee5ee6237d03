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

from typing import Any

from sluicegate import codec
from sluicegate import codec_leases as wire
from sluicegate.bucket import Bucket
from sluicegate.policy import decide
from sluicegate.rules import MAIN_LIMIT, Rule
from sluicegate.server.admission import ACQUIRE, CHECK, Admission
from sluicegate.server.intake import NEVER_FULL, AdapterSide, Address, Ident, Taken, is_valid_key
from sluicegate.server.replies import ReplyCache
from sluicegate.server.rulebook import RuleBook

DEFAULT_REPLY_CACHE_NS = 1_000_000_000
MAIN_LIMIT_NAME = MAIN_LIMIT.encode()
__all__ = ["NEVER_FULL", "Address", "Ident", "Partition", "Taken"]


class Partition(AdapterSide):
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
        if not is_valid_key(key):
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
        missing = [key for key, _ in checks if not self._ready(key) and is_valid_key(key)]
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
