"""DynamoDB store: the cloud backend (two on-demand tables, boto3 low-level client).

The store's parts: :mod:`~sluicegate.store.dynamodb_schema` (the tables and
their names, which the CDK stack shares; creating them),
:mod:`~sluicegate.store.dynamodb_codec` (items and exact numbers) and
:mod:`~sluicegate.store.dynamodb_calls` (client, timeouts, error mapping,
batches). Their public names are importable from here too.

**Listing** in key order has no index: one page of ``list_rules`` is a Scan
of the whole rules table (filtered on the server, sorted here). Fine for an
admin listing; :meth:`DynamoRuleStore.iter_rules` scans once for all pages
rather than once per page.

**Patterns** are listed from a sparse index that only pattern rules are on
(:data:`RULES_PATTERN_INDEX`). **Changes** are found on the update-time index,
whose projection has no policies: the changed rules that are live are then
read from the table by key (one BatchGetItem per 100), so a sync still costs
what changed.

Opening makes no call to DynamoDB; :meth:`RuleStore.migrate` creates the
tables where the deployment does not (locally, in tests), and adds the pattern
index to a rules table from before it.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator, Sequence
from operator import attrgetter
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError, HTTPClientError
from botocore.exceptions import ConnectionError as BotoConnectionError

from sluicegate.rules import Rule, RuleError
from sluicegate.store.base import Checkpoint, RuleStore, StoreError, change_times
from sluicegate.store.dynamodb_calls import (
    BATCH_GET_MAX,
    BATCH_WRITE_MAX,
    DEFAULT_REGION,
    UNAVAILABLE_CODES,
    DynamoCalls,
    create_client,
    is_unavailable,
)
from sluicegate.store.dynamodb_codec import (
    checkpoint_item,
    float_text,
    item_checkpoint,
    item_row,
    representable,
    rule_item,
)
from sluicegate.store.dynamodb_schema import (
    AT_NS,
    CAPACITY,
    CREDIT,
    DEFAULT_CHECKPOINTS_TABLE,
    DEFAULT_RULES_TABLE,
    DELETED,
    EXPIRES_NS,
    KEY,
    PATTERN,
    PATTERN_SHARD,
    POLICY,
    QUOTAS,
    RATE,
    RULES_BY_UPDATE_INDEX,
    RULES_PATTERN_INDEX,
    RULES_SHARD,
    SHARD,
    TTL,
    UPDATED_AT,
    checkpoints_table_spec,
    ensure_tables,
    rules_table_spec,
)
from sluicegate.store.rows import StoredRule

#: What a read of a rule needs from its item.
_RULE_ATTRIBUTES = (KEY, CAPACITY, RATE, POLICY, DELETED)


class DynamoRuleStore(DynamoCalls, RuleStore):
    """Rules and checkpoints in two DynamoDB tables.

    ``endpoint`` empty means AWS itself; a URL (``http://127.0.0.1:8000``)
    means DynamoDB Local or a moto server, for which placeholder credentials
    are used if none are configured. ``region``: argument, else
    ``AWS_DEFAULT_REGION`` / ``~/.aws/config`` / ``AWS_REGION``, else
    ``us-east-1`` (so that local use needs no AWS setup).

    Each call: ``connect_timeout``/``read_timeout`` seconds, ``max_attempts``
    tries in all (botocore standard retries), so a refused connection fails
    at once, a silent network in about 1 s, a hung endpoint in about 2 s.
    Batch items DynamoDB leaves unprocessed are retried up to
    ``batch_attempts`` times, backing off from ``backoff_s`` to
    ``max_backoff_s`` with jitter. The batches of one large write or read go
    out on up to ``workers`` threads.

    Example (with moto or DynamoDB Local on 127.0.0.1:8000):
        >>> store = DynamoRuleStore(endpoint="http://127.0.0.1:8000")  # doctest: +SKIP
        >>> store.migrate()  # doctest: +SKIP
        >>> store.put_rule(Rule("alice", 10, 1))  # doctest: +SKIP
    """

    # botocore's network errors; throttling ClientErrors are mapped in _call, since
    # a tuple of types cannot say "ClientError with one of these codes".
    unavailable_errors = (BotoConnectionError, HTTPClientError)
    driver_errors = (BotoCoreError, ClientError)

    def __init__(
        self,
        *,
        rules_table: str = DEFAULT_RULES_TABLE,
        checkpoints_table: str = DEFAULT_CHECKPOINTS_TABLE,
        endpoint: str = "",
        region: str | None = None,
        connect_timeout: float = 0.5,
        read_timeout: float = 1.0,
        max_attempts: int = 2,
        batch_attempts: int = 8,
        backoff_s: float = 0.05,
        max_backoff_s: float = 1.0,
        workers: int = 8,
    ) -> None:
        self.rules_table = rules_table
        self.checkpoints_table = checkpoints_table
        self.endpoint = endpoint
        try:
            with self._driver_errors_mapped():
                client, self.region = create_client(
                    endpoint=endpoint,
                    region=region,
                    connect_timeout=connect_timeout,
                    read_timeout=read_timeout,
                    max_attempts=max_attempts,
                    workers=workers,
                )
        except ValueError as exc:  # e.g. an endpoint that is not a URL
            raise StoreError(f"DynamoRuleStore: {exc}") from exc
        super().__init__(
            client, batch_attempts=batch_attempts, backoff_s=backoff_s, max_backoff_s=max_backoff_s, workers=workers
        )

    # -- rules ---------------------------------------------------------------

    def _fetch(self, keys: Sequence[str]) -> Iterable[StoredRule]:
        items = self._batch_get(self.rules_table, keys, _RULE_ATTRIBUTES)
        return [item_row(item) for item in items if not item[DELETED]["BOOL"]]

    def _write(self, rules: Sequence[Rule]) -> None:
        for rule in rules:
            if not representable(rule.rate):
                raise StoreError(f"DynamoRuleStore: rate {rule.rate!r} of {rule.key!r} is outside DynamoDB's numbers")
        # Distinct change times, so that changed_since can page through one batch.
        items = [rule_item(rule, at) for rule, at in zip(rules, change_times(len(rules)), strict=True)]
        self._batch_write(self.rules_table, items)

    def _remove(self, key: str) -> bool:
        # A tombstone (so that changed_since reports the deletion), only over a live rule.
        try:
            self._call(
                "update_item",
                TableName=self.rules_table,
                Key={KEY: {"S": key}},
                UpdateExpression="SET #d = :true, #u = :now REMOVE #p",  # off the pattern index
                ConditionExpression="#d = :false",
                ExpressionAttributeNames={"#d": DELETED, "#u": UPDATED_AT, "#p": PATTERN},
                ExpressionAttributeValues={
                    ":true": {"BOOL": True},
                    ":false": {"BOOL": False},
                    ":now": {"N": float_text(change_times(1)[0])},
                },
            )
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") == "ConditionalCheckFailedException":
                return False  # no rule, or already a tombstone
            raise
        return True

    def _live_rules(self, prefix: str, after: str | None) -> Iterator[StoredRule]:
        """Every live rule with ``prefix`` and a key above ``after``, in no order (a paginated Scan)."""
        names = {"#k": KEY, "#c": CAPACITY, "#r": RATE, "#d": DELETED, "#p": POLICY}
        values: dict[str, Any] = {":false": {"BOOL": False}}
        conditions = ["#d = :false"]
        if prefix:  # DynamoDB compares strings by UTF-8 bytes = code point order, as Python does
            conditions.append("begins_with(#k, :prefix)")
            values[":prefix"] = {"S": prefix}
        if after:
            conditions.append("#k > :after")
            values[":after"] = {"S": after}
        params: dict[str, Any] = {
            "TableName": self.rules_table,
            "ProjectionExpression": "#k, #c, #r, #p",
            "FilterExpression": " AND ".join(conditions),
            "ExpressionAttributeNames": names,
            "ExpressionAttributeValues": values,
        }
        while True:
            response = self._call("scan", **params)
            yield from map(item_row, response.get("Items", []))
            if "LastEvaluatedKey" not in response:
                return
            params["ExclusiveStartKey"] = response["LastEvaluatedKey"]

    def _scan(self, prefix: str, after: str | None, limit: int) -> list[StoredRule]:
        # A Scan has no key order, so one page costs a scan of the whole table (filtered
        # on the server, the first `limit` kept in a heap): fine for an admin listing,
        # not for a hot path. Keeping the list in key order would take a second index.
        return heapq.nsmallest(limit, self._live_rules(prefix, after), key=attrgetter("key"))

    def iter_rules(self, *, prefix: str = "") -> Iterator[Rule]:
        """Every rule whose key starts with ``prefix``, in key order, from one Scan.

        The base class pages with :meth:`list_rules`, which here would scan the
        whole table once per page (quadratic); one Scan sorted in memory holds
        every matching rule at once instead.
        """
        try:
            prefix.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise RuleError("prefix is not valid Unicode text") from exc
        with self._driver_errors_mapped():
            rows = sorted(self._live_rules(prefix, None), key=attrgetter("key"))
        yield from self._rules_of(rows)

    def _patterns(self) -> list[StoredRule]:
        # The sparse index holds live pattern rules only, in key order (its range key).
        params: dict[str, Any] = {
            "TableName": self.rules_table,
            "IndexName": RULES_PATTERN_INDEX,
            "KeyConditionExpression": "#p = :patterns",
            "ExpressionAttributeNames": {"#p": PATTERN},
            "ExpressionAttributeValues": {":patterns": {"S": PATTERN_SHARD}},
        }
        rows: list[StoredRule] = []
        while True:
            response = self._call("query", **params)
            rows += map(item_row, response.get("Items", []))
            if "LastEvaluatedKey" not in response:
                return rows
            params["ExclusiveStartKey"] = response["LastEvaluatedKey"]

    def _changes(self, since: float, limit: int) -> list[StoredRule]:
        # One Query on the update-time index: it reads the changed items only.
        params: dict[str, Any] = {
            "TableName": self.rules_table,
            "IndexName": RULES_BY_UPDATE_INDEX,
            "KeyConditionExpression": "#s = :shard AND #u > :since",
            "ExpressionAttributeNames": {"#s": SHARD, "#u": UPDATED_AT},
            "ExpressionAttributeValues": {":shard": {"S": RULES_SHARD}, ":since": {"N": float_text(since)}},
            "ScanIndexForward": True,
        }
        found: list[dict[str, Any]] = []
        while len(found) < limit:
            params["Limit"] = limit - len(found)
            response = self._call("query", **params)
            found += response.get("Items", [])
            if "LastEvaluatedKey" not in response:
                break
            params["ExclusiveStartKey"] = response["LastEvaluatedKey"]
        return self._completed(found[:limit])

    def _completed(self, found: list[dict[str, Any]]) -> list[StoredRule]:
        """The changes the update-time index lists, with the live rules' policies read from the table.

        The table may be newer than the (eventually consistent) index: its item is reported
        at the index's time, which keeps paging right, and a rule deleted meanwhile as deleted.
        """
        live = [item[KEY]["S"] for item in found if not item[DELETED]["BOOL"]]
        current = {item[KEY]["S"]: item for item in self._batch_get(self.rules_table, live, _RULE_ATTRIBUTES)}
        rows = []
        for item in found:
            key, at = item[KEY]["S"], float(item[UPDATED_AT]["N"])
            stored = current.get(key)
            if stored is None or stored[DELETED]["BOOL"]:
                rows.append(StoredRule(key, 0, 0.0, "", at, deleted=True))
            else:
                rows.append(item_row(stored, updated_at=at))
        return rows

    # -- checkpoints -----------------------------------------------------------

    def _write_checkpoints(self, checkpoints: Sequence[Checkpoint]) -> None:
        self._batch_write(self.checkpoints_table, [checkpoint_item(checkpoint) for checkpoint in checkpoints])

    def _fetch_checkpoints(self, keys: Sequence[str]) -> Iterable[Checkpoint]:
        items = self._batch_get(self.checkpoints_table, keys, (KEY, CREDIT, AT_NS, EXPIRES_NS, QUOTAS))
        return [item_checkpoint(item) for item in items]

    # -- schema and lifetime ----------------------------------------------------

    def _migrate(self) -> None:
        ensure_tables(self._client, self._call, self.rules_table, self.checkpoints_table)

    def _close(self) -> None:
        self._close_calls()


__all__ = [
    "AT_NS",
    "BATCH_GET_MAX",
    "BATCH_WRITE_MAX",
    "CAPACITY",
    "CREDIT",
    "DEFAULT_CHECKPOINTS_TABLE",
    "DEFAULT_REGION",
    "DEFAULT_RULES_TABLE",
    "DELETED",
    "EXPIRES_NS",
    "KEY",
    "PATTERN",
    "PATTERN_SHARD",
    "POLICY",
    "QUOTAS",
    "RATE",
    "RULES_BY_UPDATE_INDEX",
    "RULES_PATTERN_INDEX",
    "RULES_SHARD",
    "SHARD",
    "TTL",
    "UNAVAILABLE_CODES",
    "UPDATED_AT",
    "DynamoRuleStore",
    "checkpoints_table_spec",
    "is_unavailable",
    "rules_table_spec",
]
