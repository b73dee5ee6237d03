"""DynamoDB store schema: table, attribute and index names, the tables' specs, their creation.

The names are module constants so that the CDK stack builds the same tables
as :func:`ensure_tables` (see :func:`rules_table_spec` and
:func:`checkpoints_table_spec`):

* **Rules table**, hash key ``key`` (S); ``capacity`` (N), ``rate`` (N),
  ``updated_at`` (N, epoch seconds), ``deleted`` (BOOL) and ``shard`` (S, the
  constant :data:`RULES_SHARD`); ``policy`` (S, the rule's policy JSON) only
  on rules that have one. A deleted rule stays as a tombstone, as in
  SQLite, so that rule sync hears of deletions.
  The global secondary index :data:`RULES_BY_UPDATE_INDEX` (hash ``shard``,
  range ``updated_at``) turns "what changed since t" into one Query that reads
  only the changed items: a sync costs what changed, not what a server holds.
  One constant shard is fine because rules change rarely; it caps writes
  through the index at one partition's throughput (about 1,000 items/s),
  which bounds bulk imports, not decisions. Its projection predates policies
  and stays as it is (DynamoDB cannot change an index's projection, and
  CloudFormation would refuse the update): a sync reads the changed rules'
  policies from the table, by key.
* **Pattern index** :data:`RULES_PATTERN_INDEX`: sparse, keyed on ``pattern``
  (S, the constant :data:`PATTERN_SHARD`), an attribute only live pattern
  rules carry (a tombstone drops it), ranged on ``key``; one paginated Query
  lists every pattern rule without reading exact ones. :func:`ensure_tables`
  adds it to a rules table from before patterns.
* **Checkpoints table**, hash key ``key`` (S); ``credit``, ``at_ns``,
  ``expires_ns`` (N), ``quotas`` (S, only when not empty) and ``ttl`` (N,
  epoch *seconds*, rounded up), the
  table's TTL attribute. TTL deletion is lazy (hours late), which is why the
  base class ignores checkpoints with ``expires_ns <= now`` on read; a
  checkpoint that never expires has no ``ttl``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from botocore.client import BaseClient
from botocore.exceptions import ClientError

from sluicegate.rules import is_pattern_key
from sluicegate.store.base import StoreError

# Table, attribute and index names: the CDK stack imports these.
DEFAULT_RULES_TABLE = "sluicegate-rules"
DEFAULT_CHECKPOINTS_TABLE = "sluicegate-checkpoints"
KEY = "key"  # hash key of both tables (S)
CAPACITY = "capacity"
RATE = "rate"
UPDATED_AT = "updated_at"  # epoch seconds (N), the index's range key
DELETED = "deleted"  # BOOL: a tombstone
SHARD = "shard"  # S, the index's hash key
RULES_SHARD = "rules"  # the one value of SHARD
RULES_BY_UPDATE_INDEX = "by-updated-at"
POLICY = "policy"  # S: the rule's policy JSON, absent on plain rules
PATTERN = "pattern"  # S, the pattern index's hash key: only on live pattern rules
PATTERN_SHARD = "patterns"  # the one value of PATTERN
RULES_PATTERN_INDEX = "patterns"
QUOTAS = "quotas"  # S: a checkpoint's quota counters, absent when empty
CREDIT = "credit"  # nano-credits (N)
AT_NS = "at_ns"
EXPIRES_NS = "expires_ns"
TTL = "ttl"  # epoch seconds (N), the checkpoints table's TTL attribute

INDEX_WAIT_S = 900  # DynamoDB builds a new index in minutes on a large table

#: One API call by operation name, with the store's error mapping (``DynamoRuleStore._call``).
Call = Callable[..., dict[str, Any]]


def pattern_index_spec() -> dict[str, Any]:
    """The sparse pattern index, as in ``CreateTable`` and ``UpdateTable``'s ``Create``."""
    return {
        "IndexName": RULES_PATTERN_INDEX,
        "KeySchema": [{"AttributeName": PATTERN, "KeyType": "HASH"}, {"AttributeName": KEY, "KeyType": "RANGE"}],
        "Projection": {"ProjectionType": "INCLUDE", "NonKeyAttributes": [CAPACITY, RATE, POLICY]},
    }


def rules_table_spec(name: str = DEFAULT_RULES_TABLE) -> dict[str, Any]:
    """``CreateTable`` arguments of the rules table (on demand, with the update-time and pattern indexes)."""
    return {
        "TableName": name,
        "BillingMode": "PAY_PER_REQUEST",
        "AttributeDefinitions": [
            {"AttributeName": KEY, "AttributeType": "S"},
            {"AttributeName": SHARD, "AttributeType": "S"},
            {"AttributeName": UPDATED_AT, "AttributeType": "N"},
            {"AttributeName": PATTERN, "AttributeType": "S"},
        ],
        "KeySchema": [{"AttributeName": KEY, "KeyType": "HASH"}],
        "GlobalSecondaryIndexes": [
            {
                "IndexName": RULES_BY_UPDATE_INDEX,
                "KeySchema": [
                    {"AttributeName": SHARD, "KeyType": "HASH"},
                    {"AttributeName": UPDATED_AT, "KeyType": "RANGE"},
                ],
                # What a sync needs to find changes; keys are always projected.
                "Projection": {"ProjectionType": "INCLUDE", "NonKeyAttributes": [CAPACITY, RATE, DELETED]},
            },
            pattern_index_spec(),
        ],
    }


def checkpoints_table_spec(name: str = DEFAULT_CHECKPOINTS_TABLE) -> dict[str, Any]:
    """``CreateTable`` arguments of the checkpoints table (TTL is set apart: :data:`TTL`)."""
    return {
        "TableName": name,
        "BillingMode": "PAY_PER_REQUEST",
        "AttributeDefinitions": [{"AttributeName": KEY, "AttributeType": "S"}],
        "KeySchema": [{"AttributeName": KEY, "KeyType": "HASH"}],
    }


def ensure_tables(client: BaseClient, call: Call, rules_table: str, checkpoints_table: str) -> None:
    """Create the tables where the deployment does not (locally, in tests); check them where it does.

    ``call`` makes the API calls, so that they fail as the store's other calls
    do; ``client`` only provides the waiter for a table being created.
    """
    rules = _ensure_table(client, call, rules_table_spec(rules_table))
    if rules is not None:  # it existed: it may be from before some index
        indexes = {gsi["IndexName"]: gsi for gsi in rules.get("GlobalSecondaryIndexes", [])}
        # Without the update-time index every sync would fail; say so once, here.
        if RULES_BY_UPDATE_INDEX not in indexes:
            raise StoreError(
                f"DynamoRuleStore: table {rules_table} exists without the index {RULES_BY_UPDATE_INDEX}; recreate it"
            )
        pattern_index = indexes.get(RULES_PATTERN_INDEX)
        if pattern_index is None or pattern_index.get("IndexStatus", "ACTIVE") != "ACTIVE":
            _add_pattern_index(call, rules_table, creating=pattern_index is not None)
    _ensure_table(client, call, checkpoints_table_spec(checkpoints_table))
    _ensure_ttl(call, checkpoints_table)


def _ensure_table(client: BaseClient, call: Call, spec: dict[str, Any]) -> dict[str, Any] | None:
    """Create the table if missing (None); else its description."""
    name = spec["TableName"]
    try:
        return call("describe_table", TableName=name)["Table"]  # type: ignore[no-any-return]
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") != "ResourceNotFoundException":
            raise
    try:
        call("create_table", **spec)
    except ClientError as create_exc:  # another process created it meanwhile
        if create_exc.response.get("Error", {}).get("Code") != "ResourceInUseException":
            raise
    client.get_waiter("table_exists").wait(TableName=name, WaiterConfig={"Delay": 1, "MaxAttempts": 300})
    return None


def _add_pattern_index(call: Call, table: str, *, creating: bool) -> None:
    """Give a rules table from before patterns its pattern index, and wait until it serves.

    Pattern rules already stored get the index's key first: DynamoDB fills a new index
    from the items that carry its key, and a crash between the two steps is repaired by
    the next migrate (the first step is idempotent).
    """
    if not creating:
        _mark_patterns(call, table)
        try:
            call(
                "update_table",
                TableName=table,
                AttributeDefinitions=[
                    {"AttributeName": KEY, "AttributeType": "S"},
                    {"AttributeName": PATTERN, "AttributeType": "S"},
                ],
                GlobalSecondaryIndexUpdates=[{"Create": pattern_index_spec()}],
            )
        except ClientError:
            if _pattern_index_status(call, table) is None:
                raise
            # else another migrate is adding it at the same time: wait for it too
    for _ in range(INDEX_WAIT_S):
        if _pattern_index_status(call, table) == "ACTIVE":
            return
        time.sleep(1)
    raise StoreError(f"DynamoRuleStore: index {RULES_PATTERN_INDEX} of {table} not active after {INDEX_WAIT_S} s")


def _pattern_index_status(call: Call, table: str) -> str | None:
    """The pattern index's status (``CREATING``, ``ACTIVE``, ...), None if the table has none."""
    for gsi in call("describe_table", TableName=table)["Table"].get("GlobalSecondaryIndexes", []):
        if gsi["IndexName"] == RULES_PATTERN_INDEX:
            return str(gsi.get("IndexStatus", "ACTIVE"))
    return None


def _mark_patterns(call: Call, table: str) -> None:
    """Give every live pattern rule that lacks it the pattern index's key (a Scan: once, at migration)."""
    params: dict[str, Any] = {
        "TableName": table,
        "ProjectionExpression": "#k",
        "FilterExpression": "#d = :false AND attribute_not_exists(#p) "
        "AND (contains(#k, :star) OR contains(#k, :mark) OR contains(#k, :bracket))",
        "ExpressionAttributeNames": {"#k": KEY, "#d": DELETED, "#p": PATTERN},
        "ExpressionAttributeValues": {
            ":false": {"BOOL": False},
            ":star": {"S": "*"},
            ":mark": {"S": "?"},
            ":bracket": {"S": "["},
        },
    }
    while True:
        response = call("scan", **params)
        for item in response.get("Items", []):
            if is_pattern_key(item[KEY]["S"]):
                _mark_pattern(call, table, item[KEY]["S"])
        if "LastEvaluatedKey" not in response:
            return
        params["ExclusiveStartKey"] = response["LastEvaluatedKey"]


def _mark_pattern(call: Call, table: str, key: str) -> None:
    try:
        call(
            "update_item",
            TableName=table,
            Key={KEY: {"S": key}},
            UpdateExpression="SET #p = :shard",
            ConditionExpression="#d = :false",  # not a rule deleted meanwhile
            ExpressionAttributeNames={"#p": PATTERN, "#d": DELETED},
            ExpressionAttributeValues={":shard": {"S": PATTERN_SHARD}, ":false": {"BOOL": False}},
        )
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") != "ConditionalCheckFailedException":
            raise


def _ensure_ttl(call: Call, table: str) -> None:
    ttl = call("describe_time_to_live", TableName=table)["TimeToLiveDescription"]
    status = ttl.get("TimeToLiveStatus", "DISABLED")
    if status in ("ENABLED", "ENABLING"):
        # DynamoDB allows one TTL attribute per table: another one would never expire checkpoints.
        if ttl.get("AttributeName") != TTL:
            raise StoreError(f"DynamoRuleStore: table {table} has TTL on {ttl.get('AttributeName')!r}, not {TTL!r}")
        return
    call("update_time_to_live", TableName=table, TimeToLiveSpecification={"Enabled": True, "AttributeName": TTL})
