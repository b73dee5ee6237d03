"""Rules as every backend stores them: the main bucket's columns plus one policy text.

A rule's fields beyond its main bucket (limits, shadow, precedence, parent,
weight, priority, share, level_weights: :meth:`Rule.policy_dict`) are kept as
one compact JSON text, empty for a plain rule, so that old rows (written
before policies existed) and plain rules are the same thing in every store.

Example:
    >>> policy_text(Rule("alice", 10, 1))
    ''
    >>> policy_text(Rule("tenant:*", 10, 1, precedence=2, shadow=True))
    '{"precedence":2,"shadow":true}'
    >>> rule_of(StoredRule("tenant:*", 10, 1.0, '{"precedence":2,"shadow":true}')).precedence
    2
"""

from __future__ import annotations

import json
from typing import NamedTuple

from sluicegate.rules import Rule, RuleError


class StoredRule(NamedTuple):
    """A rules row as a backend reads it; ``rule_of`` turns it into a :class:`Rule`.

    ``policy`` is the policy column's text ("" or None: a plain rule);
    ``updated_at`` and ``deleted`` matter only for ``changed_since``.
    """

    key: str
    capacity: int
    rate: float
    policy: str | None = ""
    updated_at: float = 0.0
    deleted: bool = False


def policy_text(rule: Rule) -> str:
    """The policy column's text of ``rule``: sorted compact JSON of its non-default fields, "" if none."""
    policy = rule.policy_dict()
    return json.dumps(policy, separators=(",", ":"), sort_keys=True) if policy else ""


def rule_of(row: StoredRule) -> Rule:
    """The rule a stored row holds; :class:`RuleError` if the row is not a valid rule (e.g. bad policy JSON)."""
    policy = None
    if row.policy:
        try:
            policy = json.loads(row.policy)
        except (ValueError, RecursionError) as exc:  # RecursionError: absurdly deep nesting
            raise RuleError(f"policy is not valid JSON: {exc}") from exc
        if not isinstance(policy, dict):
            raise RuleError("policy is not a JSON object")
    return Rule.from_parts(row.key, row.capacity, row.rate, policy)
