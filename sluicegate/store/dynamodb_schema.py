"""DynamoDB store schema: table, attribute and index names, the tables' specs, their creation.

The names are module constants so that the CDK stack builds the same tables
as :func:`ensure_tables` (see :func:`rules_table_spec` and
:func:`checkpoints_table_spec`):

* **Rules table**, hash key ``key`` (S); ``capacity`` (N), ``rate`` (N),
  ``updated_at`` (N, epoch seconds), ``deleted`` (BOOL) and ``shard`` (S, the
  constant :data:`RULES_SHARD`). A deleted rule stays as a tombstone, as in
  SQLite, so that rule sync hears of deletions.
  The global secondary index :data:`RULES_BY_UPDATE_INDEX` (hash ``shard``,
  range ``updated_at``) turns "what changed since t" into one Query that reads
  only the changed items: a sync costs what changed, not what a server holds.
  One constant shard is fine because rules change rarely; it caps writes
  through the index at one partition's throughput (about 1,000 items/s),
  which bounds bulk imports, not decisions.
* **Checkpoints table**, hash key ``key`` (S); ``credit``, ``at_ns``,
  ``expires_ns`` (N) and ``ttl`` (N, epoch *seconds*, rounded up), the
  table's TTL attribute. TTL deletion is lazy (hours late), which is why the
  base class ignores checkpoints with ``expires_ns <= now`` on read; a
  checkpoint that never expires has no ``ttl``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from botocore.client import BaseClient
from botocore.exceptions import ClientError

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
CREDIT = "credit"  # nano-credits (N)
AT_NS = "at_ns"
EXPIRES_NS = "expires_ns"
TTL = "ttl"  # epoch seconds (N), the checkpoints table's TTL attribute

#: One API call by operation name, with the store's error mapping (``DynamoRuleStore._call``).
Call = Callable[..., dict[str, Any]]


def rules_table_spec(name: str = DEFAULT_RULES_TABLE) -> dict[str, Any]:
    """``CreateTable`` arguments of the rules table (on demand, with the update-time index)."""
    return {
        "TableName": name,
        "BillingMode": "PAY_PER_REQUEST",
        "AttributeDefinitions": [
            {"AttributeName": KEY, "AttributeType": "S"},
            {"AttributeName": SHARD, "AttributeType": "S"},
            {"AttributeName": UPDATED_AT, "AttributeType": "N"},
        ],
        "KeySchema": [{"AttributeName": KEY, "KeyType": "HASH"}],
        "GlobalSecondaryIndexes": [
            {
                "IndexName": RULES_BY_UPDATE_INDEX,
                "KeySchema": [
                    {"AttributeName": SHARD, "KeyType": "HASH"},
                    {"AttributeName": UPDATED_AT, "KeyType": "RANGE"},
                ],
                # What a sync needs, no more: keys are always projected.
                "Projection": {"ProjectionType": "INCLUDE", "NonKeyAttributes": [CAPACITY, RATE, DELETED]},
            }
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
    _ensure_table(client, call, rules_table_spec(rules_table), index=RULES_BY_UPDATE_INDEX)
    _ensure_table(client, call, checkpoints_table_spec(checkpoints_table))
    _ensure_ttl(call, checkpoints_table)


def _ensure_table(client: BaseClient, call: Call, spec: dict[str, Any], *, index: str | None = None) -> None:
    name = spec["TableName"]
    try:
        table = call("describe_table", TableName=name)["Table"]
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") != "ResourceNotFoundException":
            raise
        try:
            call("create_table", **spec)
        except ClientError as create_exc:  # another process created it meanwhile
            if create_exc.response.get("Error", {}).get("Code") != "ResourceInUseException":
                raise
        client.get_waiter("table_exists").wait(TableName=name, WaiterConfig={"Delay": 1, "MaxAttempts": 300})
        return
    # An existing table without the index would make every sync fail; say so once, here.
    if index and index not in {gsi["IndexName"] for gsi in table.get("GlobalSecondaryIndexes", [])}:
        raise StoreError(f"DynamoRuleStore: table {name} exists without the index {index}; recreate it")


def _ensure_ttl(call: Call, table: str) -> None:
    ttl = call("describe_time_to_live", TableName=table)["TimeToLiveDescription"]
    status = ttl.get("TimeToLiveStatus", "DISABLED")
    if status in ("ENABLED", "ENABLING"):
        # DynamoDB allows one TTL attribute per table: another one would never expire checkpoints.
        if ttl.get("AttributeName") != TTL:
            raise StoreError(f"DynamoRuleStore: table {table} has TTL on {ttl.get('AttributeName')!r}, not {TTL!r}")
        return
    call("update_time_to_live", TableName=table, TimeToLiveSpecification={"Enabled": True, "AttributeName": TTL})
