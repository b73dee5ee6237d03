"""Which rule and policy state each held key has: exact rules, patterns, parents. Sans-I/O.

The partition asks the rule book three things:

* :meth:`RuleBook.resolve`: a key's rule is its exact stored rule, else the
  best matching pattern (:class:`~sluicegate.patterns.PatternIndex`), else the
  default rule; keys without an exact rule are remembered, so that a pattern
  change re-resolves exactly them (:meth:`RuleBook.set_patterns`,
  :meth:`RuleBook.change_patterns`);
* :meth:`RuleBook.install`: the key's :class:`~sluicegate.policy.KeyPolicy`
  when its rule needs more than the main bucket, and its membership of its
  parent's :class:`~sluicegate.shares.ShareGroup`; a child whose parent is not
  held yet waits for it (:meth:`RuleBook.waiting_for`);
* :attr:`RuleBook.policies`: the decision path's lookup (absent = plain key).

Example:
    >>> from sluicegate.rules import Rule, default_rule
    >>> book = RuleBook(default_rule(10, 1))
    >>> book.set_patterns([Rule("tenant:*", 50, 5)])
    >>> book.resolve(b"tenant:acme", None).key
    'tenant:*'
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from sluicegate.bucket import Bucket
from sluicegate.patterns import PatternIndex
from sluicegate.policy import KeyPolicy
from sluicegate.rules import Rule
from sluicegate.shares import ShareGroup


class RuleBook:
    """Rule resolution and policy state of one partition's held keys."""

    def __init__(self, default_rule: Rule) -> None:
        self.default_rule = default_rule
        self.patterns = PatternIndex()
        self.policies: dict[bytes, KeyPolicy] = {}
        self.groups: dict[bytes, ShareGroup] = {}  # by parent key
        self._inexact: set[bytes] = set()  # held keys on a pattern or the default rule
        self._children: dict[bytes, set[bytes]] = {}  # parent key -> held children
        self._waiting: dict[bytes, set[bytes]] = {}  # parent key not held yet -> children waiting

    # -- resolution -------------------------------------------------------------------------

    def resolve(self, key: bytes, exact: Rule | None) -> Rule:
        """The rule in force for ``key`` given its exact stored rule (None: none stored)."""
        if exact is not None:
            self._inexact.discard(key)
            return exact
        self._inexact.add(key)
        if len(self.patterns):
            matched = self.patterns.match(key.decode("utf-8"))
            if matched is not None:
                return matched
        return self.default_rule

    def set_patterns(self, rules: Iterable[Rule]) -> None:
        """Replace every pattern (at start: all stored patterns)."""
        self.patterns = PatternIndex()
        for rule in rules:
            self.patterns.put(rule)

    def change_patterns(self, changes: Mapping[str, Rule | None]) -> list[bytes]:
        """Apply changed patterns (None: deleted); return the held keys whose resolution may change."""
        for key, rule in changes.items():
            if rule is None:
                self.patterns.remove(key)
            else:
                self.patterns.put(rule)
        return list(self._inexact)

    def forget(self, key: bytes) -> None:
        self._inexact.discard(key)

    # -- policy state -----------------------------------------------------------------------

    def install(
        self, key: bytes, rule: Rule, buckets: Mapping[bytes, Bucket], *, now_ns: int, wall_ns: int, quotas: str = ""
    ) -> bytes | None:
        """Set ``key``'s policy state for ``rule``; returns a parent key that must be loaded first, or None."""
        old = self.policies.get(key)
        if old is not None and old.rule == rule and not quotas:
            return (
                None
                if rule.parent is None or old.group is not None
                else self._parent_missing(key, rule, buckets, now_ns)
            )
        self._leave(key, old)
        if rule.is_plain:
            self.policies.pop(key, None)
        else:
            policy = KeyPolicy(rule, wall_ns=wall_ns, now_ns=now_ns, saved_quotas=quotas)
            if old is not None:
                policy.adopt(old, now_ns)
            self.policies[key] = policy
        if key in self._waiting or key in self.groups:
            # This key is a parent: its rule is the group's; children waiting for it can go.
            self._parent_ready(key, rule, buckets, now_ns)
        return self._parent_missing(key, rule, buckets, now_ns)

    def children_of(self, parent: bytes) -> set[bytes]:
        """The held children of ``parent`` (in its share group)."""
        return self._children.get(parent, set())

    @property
    def has_waiting(self) -> bool:
        """Whether any child waits for its parent (a cheap test before :meth:`waiting_for`)."""
        return bool(self._waiting)

    def waiting_for(self, key: bytes) -> bool:
        """Whether ``key`` is a child whose parent's rule is not held yet."""
        return any(key in children for children in self._waiting.values())

    def _parent_missing(self, key: bytes, rule: Rule, buckets: Mapping[bytes, Bucket], now_ns: int) -> bytes | None:
        if rule.parent is None:
            return None
        parent = rule.parent.encode("utf-8")
        bucket = buckets.get(parent)
        if bucket is None:
            self._waiting.setdefault(parent, set()).add(key)
            return parent
        self._join(key, parent, bucket, now_ns=now_ns)
        return None

    def _parent_ready(self, parent: bytes, rule: Rule, buckets: Mapping[bytes, Bucket], now_ns: int) -> None:
        group = self.groups.get(parent)
        if group is not None:
            group.set_parent(rule, now_ns)
        for child in self._waiting.pop(parent, set()):
            policy = self.policies.get(child)
            if policy is not None and child in buckets and parent in buckets:
                self._join(child, parent, buckets[parent], now_ns=now_ns)

    def _join(self, key: bytes, parent: bytes, parent_bucket: Bucket, *, now_ns: int) -> None:
        policy = self.policies[key]
        group = self.groups.get(parent)
        if group is None:
            # The parent key's own bucket: its direct checks and its children's spend one credit.
            group = self.groups[parent] = ShareGroup(parent_bucket.rule, now_ns, parent_bucket=parent_bucket)
        policy.group = group
        policy.member = group.join(key, policy.rule, now_ns)
        self._children.setdefault(parent, set()).add(key)

    def _leave(self, key: bytes, policy: KeyPolicy | None) -> None:
        if policy is None or policy.group is None:
            return
        parent = policy.rule.parent.encode("utf-8") if policy.rule.parent else b""
        policy.group.leave(key)
        policy.group = policy.member = None
        children = self._children.get(parent)
        if children is not None:
            children.discard(key)
            if not children:
                del self._children[parent]
                self.groups.pop(parent, None)
