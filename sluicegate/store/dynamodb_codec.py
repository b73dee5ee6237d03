"""DynamoDB store items: rules, changes and checkpoints to and from DynamoDB's typed values.

Numbers travel as decimal strings: integers are written with ``str(int)``
and read with ``int()`` (credit reaches (2^32-1)*10^9, beyond a float's 53
bits), floats with their shortest round-trip text (17 significant digits at
most, well inside DynamoDB's 38), so every value reads back exactly.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from sluicegate.rules import Rule
from sluicegate.store.base import NEVER_EXPIRES_NS, Checkpoint
from sluicegate.store.dynamodb_schema import (
    AT_NS,
    CAPACITY,
    CREDIT,
    DELETED,
    EXPIRES_NS,
    KEY,
    PATTERN,
    PATTERN_SHARD,
    POLICY,
    QUOTAS,
    RATE,
    RULES_SHARD,
    SHARD,
    TTL,
    UPDATED_AT,
)
from sluicegate.store.rows import StoredRule, policy_text

Item = dict[str, dict[str, Any]]

# DynamoDB numbers: up to 38 significant digits, magnitudes 1E-130 to below 1E+126.
_MIN_NUMBER = 1e-130
_MAX_NUMBER = 9.9999999999999999e125


def representable(value: float) -> bool:
    """True if DynamoDB can store ``value``: a float's range is wider than DynamoDB's numbers."""
    return not value or _MIN_NUMBER <= value <= _MAX_NUMBER


def float_text(value: float) -> str:
    """A float as a DynamoDB number: its shortest round-trip decimal (what boto3 sends for a Decimal)."""
    return str(Decimal(repr(float(value))))


def read_int(text: str) -> int:
    """A DynamoDB integer, exactly (a normalised '4.2E+18' too)."""
    try:
        return int(text)
    except ValueError:
        return int(Decimal(text))


def ttl_seconds(expires_ns: int) -> int:
    """The TTL of a checkpoint void from ``expires_ns``, rounded up: never deleted before it is void."""
    return -(-expires_ns // 1_000_000_000)


def rule_item(rule: Rule, at: float) -> Item:
    """The rules-table item of ``rule`` changed at ``at``: live, on the update-time index, and on the
    pattern index if it is a pattern. A plain rule has no policy attribute, like an old item."""
    item: Item = {
        KEY: {"S": rule.key},
        CAPACITY: {"N": str(rule.capacity)},
        RATE: {"N": float_text(rule.rate)},
        UPDATED_AT: {"N": float_text(at)},
        DELETED: {"BOOL": False},
        SHARD: {"S": RULES_SHARD},
    }
    if policy := policy_text(rule):
        item[POLICY] = {"S": policy}
    if rule.is_pattern:
        item[PATTERN] = {"S": PATTERN_SHARD}
    return item


def item_row(item: Item, *, updated_at: float = 0.0, deleted: bool = False) -> StoredRule:
    """The stored row of a rules-table item (``key``, ``capacity``, ``rate``, maybe ``policy``)."""
    policy = item.get(POLICY, {}).get("S", "")
    return StoredRule(
        item[KEY]["S"], read_int(item[CAPACITY]["N"]), float(item[RATE]["N"]), policy, updated_at, deleted
    )


def checkpoint_item(checkpoint: Checkpoint) -> Item:
    """The checkpoints-table item of ``checkpoint``; one that never expires has no TTL, empty quotas none."""
    item: Item = {
        KEY: {"S": checkpoint.key},
        CREDIT: {"N": str(int(checkpoint.credit))},
        AT_NS: {"N": str(int(checkpoint.at_ns))},
        EXPIRES_NS: {"N": str(int(checkpoint.expires_ns))},
    }
    if checkpoint.quotas:
        item[QUOTAS] = {"S": checkpoint.quotas}
    if checkpoint.expires_ns != NEVER_EXPIRES_NS:
        item[TTL] = {"N": str(ttl_seconds(checkpoint.expires_ns))}
    return item


def item_checkpoint(item: Item) -> Checkpoint:
    return Checkpoint(
        item[KEY]["S"],
        read_int(item[CREDIT]["N"]),
        read_int(item[AT_NS]["N"]),
        read_int(item[EXPIRES_NS]["N"]),
        item.get(QUOTAS, {}).get("S", ""),
    )
