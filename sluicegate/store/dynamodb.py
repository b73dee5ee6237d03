"""DynamoDB store: the cloud backend (two on-demand tables, boto3 low-level client).

Layout (the names are module constants so that the CDK stack builds the same
tables: see :func:`rules_table_spec` and :func:`checkpoints_table_spec`):

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
* **Listing** in key order has no index: one page of ``list_rules`` is a
  Scan of the whole rules table (filtered on the server, sorted here). Fine
  for an admin listing; :meth:`DynamoRuleStore.iter_rules` scans once for all
  pages rather than once per page.

Numbers travel as decimal strings: integers are written with ``str(int)``
and read with ``int()`` (credit reaches (2^32-1)*10^9, beyond a float's 53
bits), floats with their shortest round-trip text (17 significant digits at
most, well inside DynamoDB's 38), so every value reads back exactly.

Opening makes no call to DynamoDB (a server must be able to start while the
store is down); :meth:`RuleStore.migrate` creates the tables where the
deployment does not (locally, in tests). Timeouts are short and botocore
retries once, so an unreachable store is reported in a second or two as
:class:`StoreUnavailable` rather than after minutes of retries; so are
throttling and DynamoDB's 5xx errors (mapped here, see :func:`is_unavailable`).
"""

from __future__ import annotations

import heapq
import os
import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from operator import attrgetter
from typing import Any, TypeVar

import botocore.config
import botocore.loaders
import botocore.session
from botocore.exceptions import BotoCoreError, ClientError, HTTPClientError
from botocore.exceptions import ConnectionError as BotoConnectionError

from sluicegate.rules import Rule, RuleError
from sluicegate.store.base import (
    NEVER_EXPIRES_NS,
    Checkpoint,
    RuleChange,
    RuleStore,
    StoreError,
    StoreUnavailable,
    change_times,
)

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
DEFAULT_REGION = "us-east-1"  # when neither the environment nor ~/.aws/config names one

# DynamoDB's limits per call.
BATCH_GET_MAX = 100
BATCH_WRITE_MAX = 25

#: ClientError codes that mean "throttled or down for now": retrying later may help.
UNAVAILABLE_CODES = frozenset(
    {
        "ProvisionedThroughputExceededException",
        "ThrottlingException",
        "RequestLimitExceeded",
        "InternalServerError",
        "ServiceUnavailable",
    }
)

# DynamoDB numbers: up to 38 significant digits, magnitudes 1E-130 to below 1E+126.
_MIN_NUMBER = 1e-130
_MAX_NUMBER = 9.9999999999999999e125

_Item = dict[str, dict[str, Any]]
_T = TypeVar("_T")
_R = TypeVar("_R")

# Loading botocore's service models costs ~50 ms per session; share the loader
# (its cache) between the sessions of one process. Each store still gets its own
# session, so credentials and region are read when the store is opened.
_loader_lock = threading.Lock()
_loader: botocore.loaders.Loader | None = None


def _shared_loader() -> botocore.loaders.Loader:
    global _loader
    with _loader_lock:
        if _loader is None:
            _loader = botocore.loaders.create_loader()
        return _loader


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


def is_unavailable(exc: BaseException) -> bool:
    """True if a botocore exception means "cannot reach / throttled now" rather than "wrong request"."""
    if isinstance(exc, BotoConnectionError | HTTPClientError):
        return True
    if isinstance(exc, ClientError):
        code = exc.response.get("Error", {}).get("Code", "")
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
        return code in UNAVAILABLE_CODES or status >= 500
    return False


def _float_text(value: float) -> str:
    """A float as a DynamoDB number: its shortest round-trip decimal (what boto3 sends for a Decimal)."""
    return str(Decimal(repr(float(value))))


def _int(text: str) -> int:
    """A DynamoDB integer, exactly (a normalised '4.2E+18' too)."""
    try:
        return int(text)
    except ValueError:
        return int(Decimal(text))


def _ttl_seconds(expires_ns: int) -> int:
    return -(-expires_ns // 1_000_000_000)  # round up: never delete before the checkpoint is void


class DynamoRuleStore(RuleStore):
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
        self.batch_attempts = batch_attempts
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.workers = workers
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()
        self._closed = False
        config = botocore.config.Config(
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            retries={"mode": "standard", "total_max_attempts": max_attempts},
            max_pool_connections=max(10, workers),
        )
        try:
            with self._driver_errors_mapped():
                session = botocore.session.get_session()
                session.register_component("data_loader", _shared_loader())
                # botocore reads AWS_DEFAULT_REGION and ~/.aws/config; Lambda and ECS also set AWS_REGION.
                self.region = (
                    region or session.get_config_variable("region") or os.environ.get("AWS_REGION") or DEFAULT_REGION
                )
                credentials: dict[str, str] = {}
                if endpoint and session.get_credentials() is None:
                    # DynamoDB Local and moto check signatures' shape, not the keys.
                    credentials = {"aws_access_key_id": "local", "aws_secret_access_key": "local"}
                self._client = session.create_client(
                    "dynamodb", region_name=self.region, endpoint_url=endpoint or None, config=config, **credentials
                )
        except ValueError as exc:  # e.g. an endpoint that is not a URL
            raise StoreError(f"DynamoRuleStore: {exc}") from exc

    # -- calls ---------------------------------------------------------------

    def _call(self, operation: str, **params: Any) -> dict[str, Any]:
        """One API call; throttling and 5xx ClientErrors become StoreUnavailable here."""
        if self._closed:
            raise StoreError("DynamoRuleStore: the store is closed")
        try:
            return getattr(self._client, operation)(**params)  # type: ignore[no-any-return]
        except ClientError as exc:
            if is_unavailable(exc):
                raise StoreUnavailable(f"DynamoRuleStore: store unavailable: {exc}") from exc
            raise

    def _sleep_before_retry(self, attempt: int) -> None:
        # Exponential backoff with jitter, so that throttled writers spread out.
        delay = min(self.max_backoff_s, self.backoff_s * 2**attempt)
        time.sleep(delay / 2 + random.uniform(0, delay / 2))

    def _map(self, function: Callable[[_T], _R], chunks: Sequence[_T]) -> list[_R]:
        """``function`` over ``chunks``: on a few threads when there is more than one."""
        if len(chunks) <= 1 or self.workers <= 1:
            return [function(chunk) for chunk in chunks]
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="dynamodb")
        return list(self._pool.map(function, chunks))

    def _batch_write(self, table: str, items: Sequence[_Item]) -> None:
        """Put ``items`` (distinct keys) with BatchWriteItem, 25 per call, retrying unprocessed ones."""
        chunks = [items[start : start + BATCH_WRITE_MAX] for start in range(0, len(items), BATCH_WRITE_MAX)]
        self._map(lambda chunk: self._write_chunk(table, chunk), chunks)

    def _write_chunk(self, table: str, chunk: Sequence[_Item]) -> None:
        pending: dict[str, Any] = {table: [{"PutRequest": {"Item": item}} for item in chunk]}
        for attempt in range(self.batch_attempts):
            if attempt:
                self._sleep_before_retry(attempt - 1)
            pending = self._call("batch_write_item", RequestItems=pending).get("UnprocessedItems") or {}
            if not pending:
                return
        left = sum(len(requests) for requests in pending.values())
        # Never lose writes silently: the caller keeps them and retries later.
        raise StoreUnavailable(
            f"DynamoRuleStore: {left} of {len(chunk)} writes to {table} still unprocessed "
            f"after {self.batch_attempts} attempts (throttled)"
        )

    def _batch_get(self, table: str, keys: Sequence[str], attributes: Sequence[str]) -> list[_Item]:
        """Items of ``keys`` (distinct) with BatchGetItem, 100 per call, retrying unprocessed keys."""
        chunks = [keys[start : start + BATCH_GET_MAX] for start in range(0, len(keys), BATCH_GET_MAX)]
        return [
            item
            for items in self._map(lambda chunk: self._get_chunk(table, chunk, attributes), chunks)
            for item in items
        ]

    def _get_chunk(self, table: str, chunk: Sequence[str], attributes: Sequence[str]) -> list[_Item]:
        names = {f"#a{i}": name for i, name in enumerate(attributes)}
        pending: dict[str, Any] = {
            table: {
                "Keys": [{KEY: {"S": key}} for key in chunk],
                "ProjectionExpression": ", ".join(names),
                "ExpressionAttributeNames": names,
                # A replacement server must see the checkpoint its predecessor just wrote.
                "ConsistentRead": True,
            }
        }
        found: list[_Item] = []
        for attempt in range(self.batch_attempts):
            if attempt:
                self._sleep_before_retry(attempt - 1)
            response = self._call("batch_get_item", RequestItems=pending)
            found += response.get("Responses", {}).get(table, [])
            pending = response.get("UnprocessedKeys") or {}
            if not pending:
                return found
        raise StoreUnavailable(
            f"DynamoRuleStore: reads from {table} still unprocessed after {self.batch_attempts} attempts (throttled)"
        )

    # -- rules ---------------------------------------------------------------

    def _fetch(self, keys: Sequence[str]) -> Iterable[Rule]:
        items = self._batch_get(self.rules_table, keys, (KEY, CAPACITY, RATE, DELETED))
        return [_rule(item) for item in items if not item[DELETED]["BOOL"]]

    def _write(self, rules: Sequence[Rule]) -> None:
        for rule in rules:
            if rule.rate and not _MIN_NUMBER <= rule.rate <= _MAX_NUMBER:
                raise StoreError(f"DynamoRuleStore: rate {rule.rate!r} of {rule.key!r} is outside DynamoDB's numbers")
        # Distinct change times, so that changed_since can page through one batch.
        items = [
            {
                KEY: {"S": rule.key},
                CAPACITY: {"N": str(rule.capacity)},
                RATE: {"N": _float_text(rule.rate)},
                UPDATED_AT: {"N": _float_text(at)},
                DELETED: {"BOOL": False},
                SHARD: {"S": RULES_SHARD},
            }
            for rule, at in zip(rules, change_times(len(rules)), strict=True)
        ]
        self._batch_write(self.rules_table, items)

    def _remove(self, key: str) -> bool:
        # A tombstone (so that changed_since reports the deletion), only over a live rule.
        try:
            self._call(
                "update_item",
                TableName=self.rules_table,
                Key={KEY: {"S": key}},
                UpdateExpression="SET #d = :true, #u = :now",
                ConditionExpression="#d = :false",
                ExpressionAttributeNames={"#d": DELETED, "#u": UPDATED_AT},
                ExpressionAttributeValues={
                    ":true": {"BOOL": True},
                    ":false": {"BOOL": False},
                    ":now": {"N": _float_text(change_times(1)[0])},
                },
            )
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") == "ConditionalCheckFailedException":
                return False  # no rule, or already a tombstone
            raise
        return True

    def _live_rules(self, prefix: str, after: str | None) -> Iterator[Rule]:
        """Every live rule with ``prefix`` and a key above ``after``, in no order (a paginated Scan)."""
        names = {"#k": KEY, "#c": CAPACITY, "#r": RATE, "#d": DELETED}
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
            "ProjectionExpression": "#k, #c, #r",
            "FilterExpression": " AND ".join(conditions),
            "ExpressionAttributeNames": names,
            "ExpressionAttributeValues": values,
        }
        while True:
            response = self._call("scan", **params)
            yield from map(_rule, response.get("Items", []))
            if "LastEvaluatedKey" not in response:
                return
            params["ExclusiveStartKey"] = response["LastEvaluatedKey"]

    def _scan(self, prefix: str, after: str | None, limit: int) -> list[Rule]:
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
            rules = sorted(self._live_rules(prefix, None), key=attrgetter("key"))
        yield from rules

    def _changes(self, since: float, limit: int) -> list[RuleChange]:
        # One Query on the update-time index: it reads the changed items only.
        params: dict[str, Any] = {
            "TableName": self.rules_table,
            "IndexName": RULES_BY_UPDATE_INDEX,
            "KeyConditionExpression": "#s = :shard AND #u > :since",
            "ExpressionAttributeNames": {"#s": SHARD, "#u": UPDATED_AT},
            "ExpressionAttributeValues": {":shard": {"S": RULES_SHARD}, ":since": {"N": _float_text(since)}},
            "ScanIndexForward": True,
        }
        changes: list[RuleChange] = []
        while len(changes) < limit:
            params["Limit"] = limit - len(changes)
            response = self._call("query", **params)
            for item in response.get("Items", []):
                rule = None if item[DELETED]["BOOL"] else _rule(item)
                changes.append(RuleChange(item[KEY]["S"], rule, float(item[UPDATED_AT]["N"])))
            if "LastEvaluatedKey" not in response:
                break
            params["ExclusiveStartKey"] = response["LastEvaluatedKey"]
        return changes[:limit]

    # -- checkpoints -----------------------------------------------------------

    def _write_checkpoints(self, checkpoints: Sequence[Checkpoint]) -> None:
        items: list[_Item] = []
        for checkpoint in checkpoints:
            item: _Item = {
                KEY: {"S": checkpoint.key},
                CREDIT: {"N": str(int(checkpoint.credit))},
                AT_NS: {"N": str(int(checkpoint.at_ns))},
                EXPIRES_NS: {"N": str(int(checkpoint.expires_ns))},
            }
            if checkpoint.expires_ns != NEVER_EXPIRES_NS:
                item[TTL] = {"N": str(_ttl_seconds(checkpoint.expires_ns))}
            items.append(item)
        self._batch_write(self.checkpoints_table, items)

    def _fetch_checkpoints(self, keys: Sequence[str]) -> Iterable[Checkpoint]:
        items = self._batch_get(self.checkpoints_table, keys, (KEY, CREDIT, AT_NS, EXPIRES_NS))
        return [
            Checkpoint(item[KEY]["S"], _int(item[CREDIT]["N"]), _int(item[AT_NS]["N"]), _int(item[EXPIRES_NS]["N"]))
            for item in items
        ]

    # -- schema and lifetime ----------------------------------------------------

    def _migrate(self) -> None:
        self._ensure_table(rules_table_spec(self.rules_table), index=RULES_BY_UPDATE_INDEX)
        self._ensure_table(checkpoints_table_spec(self.checkpoints_table))
        self._ensure_ttl(self.checkpoints_table)

    def _ensure_table(self, spec: dict[str, Any], *, index: str | None = None) -> None:
        name = spec["TableName"]
        try:
            table = self._call("describe_table", TableName=name)["Table"]
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") != "ResourceNotFoundException":
                raise
            try:
                self._call("create_table", **spec)
            except ClientError as create_exc:  # another process created it meanwhile
                if create_exc.response.get("Error", {}).get("Code") != "ResourceInUseException":
                    raise
            self._client.get_waiter("table_exists").wait(TableName=name, WaiterConfig={"Delay": 1, "MaxAttempts": 300})
            return
        if index and index not in {gsi["IndexName"] for gsi in table.get("GlobalSecondaryIndexes", [])}:
            raise StoreError(f"DynamoRuleStore: table {name} exists without the index {index}; recreate it")

    def _ensure_ttl(self, table: str) -> None:
        ttl = self._call("describe_time_to_live", TableName=table)["TimeToLiveDescription"]
        status = ttl.get("TimeToLiveStatus", "DISABLED")
        if status in ("ENABLED", "ENABLING"):
            if ttl.get("AttributeName") != TTL:
                raise StoreError(f"DynamoRuleStore: table {table} has TTL on {ttl.get('AttributeName')!r}, not {TTL!r}")
            return
        self._call(
            "update_time_to_live", TableName=table, TimeToLiveSpecification={"Enabled": True, "AttributeName": TTL}
        )

    def _close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        self._client.close()


def _rule(item: _Item) -> Rule:
    return Rule(item[KEY]["S"], _int(item[CAPACITY]["N"]), float(item[RATE]["N"]))


__all__ = [
    "AT_NS",
    "CAPACITY",
    "CREDIT",
    "DEFAULT_CHECKPOINTS_TABLE",
    "DEFAULT_RULES_TABLE",
    "DELETED",
    "EXPIRES_NS",
    "KEY",
    "RATE",
    "RULES_BY_UPDATE_INDEX",
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
