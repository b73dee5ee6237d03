"""DynamoDB store calls: the botocore client, error mapping, and batches retried and spread on threads.

Opening makes no call to DynamoDB (a server must be able to start while the
store is down). Timeouts are short and botocore retries once, so an
unreachable store is reported in a second or two as :class:`StoreUnavailable`
rather than after minutes of retries; so are throttling and DynamoDB's 5xx
errors (mapped here, see :func:`is_unavailable`).
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import botocore.config
import botocore.loaders
import botocore.session
from botocore.client import BaseClient
from botocore.exceptions import ClientError, HTTPClientError
from botocore.exceptions import ConnectionError as BotoConnectionError

from sluicegate.store.base import StoreError, StoreUnavailable
from sluicegate.store.dynamodb_codec import Item
from sluicegate.store.dynamodb_schema import KEY

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


def is_unavailable(exc: BaseException) -> bool:
    """True if a botocore exception means "cannot reach / throttled now" rather than "wrong request"."""
    if isinstance(exc, BotoConnectionError | HTTPClientError):
        return True
    if isinstance(exc, ClientError):
        code = exc.response.get("Error", {}).get("Code", "")
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
        return code in UNAVAILABLE_CODES or status >= 500
    return False


def create_client(
    *,
    endpoint: str,
    region: str | None,
    connect_timeout: float,
    read_timeout: float,
    max_attempts: int,
    workers: int,
) -> tuple[BaseClient, str]:
    """A DynamoDB client and its region, without calling DynamoDB (see :class:`DynamoRuleStore`).

    Raises ValueError for an endpoint that is not a URL and botocore's errors
    for a broken AWS configuration: the store maps both to StoreError.
    """
    config = botocore.config.Config(
        connect_timeout=connect_timeout,
        read_timeout=read_timeout,
        retries={"mode": "standard", "total_max_attempts": max_attempts},
        max_pool_connections=max(10, workers),
    )
    session = botocore.session.get_session()
    session.register_component("data_loader", _shared_loader())
    # botocore reads AWS_DEFAULT_REGION and ~/.aws/config; Lambda and ECS also set AWS_REGION.
    region = region or session.get_config_variable("region") or os.environ.get("AWS_REGION") or DEFAULT_REGION
    credentials: dict[str, str] = {}
    if endpoint and session.get_credentials() is None:
        # DynamoDB Local and moto check signatures' shape, not the keys.
        credentials = {"aws_access_key_id": "local", "aws_secret_access_key": "local"}
    client = session.create_client(
        "dynamodb", region_name=region, endpoint_url=endpoint or None, config=config, **credentials
    )
    return client, region


class DynamoCalls:
    """The call layer of :class:`DynamoRuleStore`, apart from what it stores.

    A base class rather than a helper object so that the store's settings
    (``backoff_s``, ...) and client stay plain attributes of the store, which
    tests and callers adjust in place.
    """

    def __init__(
        self, client: BaseClient, *, batch_attempts: int, backoff_s: float, max_backoff_s: float, workers: int
    ) -> None:
        self._client = client
        self.batch_attempts = batch_attempts
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.workers = workers
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()
        self._closed = False

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

    def _batch_write(self, table: str, items: Sequence[Item]) -> None:
        """Put ``items`` (distinct keys) with BatchWriteItem, 25 per call, retrying unprocessed ones."""
        chunks = [items[start : start + BATCH_WRITE_MAX] for start in range(0, len(items), BATCH_WRITE_MAX)]
        self._map(lambda chunk: self._write_chunk(table, chunk), chunks)

    def _write_chunk(self, table: str, chunk: Sequence[Item]) -> None:
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

    def _batch_get(self, table: str, keys: Sequence[str], attributes: Sequence[str]) -> list[Item]:
        """Items of ``keys`` (distinct) with BatchGetItem, 100 per call, retrying unprocessed keys."""
        chunks = [keys[start : start + BATCH_GET_MAX] for start in range(0, len(keys), BATCH_GET_MAX)]
        return [
            item
            for items in self._map(lambda chunk: self._get_chunk(table, chunk, attributes), chunks)
            for item in items
        ]

    def _get_chunk(self, table: str, chunk: Sequence[str], attributes: Sequence[str]) -> list[Item]:
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
        found: list[Item] = []
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

    def _close_calls(self) -> None:
        # Idempotent: later calls fail with "closed" rather than on a closed client.
        if self._closed:
            return
        self._closed = True
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        self._client.close()
