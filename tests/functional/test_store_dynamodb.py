"""DynamoDB store specifics: table layout, batching and retries, error mapping, sync cost.

The contract every backend meets is in ``test_store_contract.py``; these tests
run under moto (``mock_aws`` in-process, or the moto server on 127.0.0.1 where
a real endpoint matters).
"""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from botocore.exceptions import BotoCoreError, ClientError, EndpointConnectionError, ReadTimeoutError

from sluicegate.rules import MAX_CAPACITY, Rule
from sluicegate.store import RuleStore, StoreError, StoreUnavailable, open_store
from sluicegate.store.base import NEVER_EXPIRES_NS, Checkpoint
from sluicegate.store.dynamodb import (
    BATCH_GET_MAX,
    BATCH_WRITE_MAX,
    RULES_BY_UPDATE_INDEX,
    RULES_PATTERN_INDEX,
    TTL,
    UNAVAILABLE_CODES,
    DynamoRuleStore,
)
from tests.conftest import child_env
from tests.stores.dynamodb import MotoEndpoint, ServerTables

Opener = Callable[[], RuleStore]


@pytest.fixture
def store(dynamodb_opener: Opener) -> DynamoRuleStore:
    opened = dynamodb_opener()
    assert isinstance(opened, DynamoRuleStore)
    return opened


@pytest.fixture
def closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on: connections are refused."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that accepts connections (kernel backlog) but never answers: reads time out."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        yield int(listener.getsockname()[1])


def raw_item(store: DynamoRuleStore, table: str, key: str) -> dict[str, Any]:
    return store._client.get_item(TableName=table, Key={"key": {"S": key}}, ConsistentRead=True)["Item"]


def client_error(code: str, status: int = 400, operation: str = "BatchWriteItem") -> ClientError:
    return ClientError(
        {"Error": {"Code": code, "Message": "simulated"}, "ResponseMetadata": {"HTTPStatusCode": status}}, operation
    )


class TestTables:
    def test_rules_table_has_the_update_time_and_pattern_indexes_and_is_on_demand(self, store: DynamoRuleStore) -> None:
        table = store._client.describe_table(TableName=store.rules_table)["Table"]
        assert table["KeySchema"] == [{"AttributeName": "key", "KeyType": "HASH"}]
        assert table["BillingModeSummary"]["BillingMode"] == "PAY_PER_REQUEST"
        indexes = {index["IndexName"]: index for index in table["GlobalSecondaryIndexes"]}
        assert set(indexes) == {RULES_BY_UPDATE_INDEX, RULES_PATTERN_INDEX}
        changes = indexes[RULES_BY_UPDATE_INDEX]
        assert changes["KeySchema"] == [
            {"AttributeName": "shard", "KeyType": "HASH"},
            {"AttributeName": "updated_at", "KeyType": "RANGE"},
        ]
        # Unchanged since the first release: DynamoDB cannot change the projection of an existing index.
        assert changes["Projection"]["ProjectionType"] == "INCLUDE"
        assert set(changes["Projection"]["NonKeyAttributes"]) == {"capacity", "rate", "deleted"}
        patterns = indexes[RULES_PATTERN_INDEX]
        assert patterns["KeySchema"] == [
            {"AttributeName": "pattern", "KeyType": "HASH"},
            {"AttributeName": "key", "KeyType": "RANGE"},
        ]
        assert set(patterns["Projection"]["NonKeyAttributes"]) == {"capacity", "rate", "policy"}
        types = {a["AttributeName"]: a["AttributeType"] for a in table["AttributeDefinitions"]}
        assert types == {"key": "S", "shard": "S", "updated_at": "N", "pattern": "S"}

    def test_checkpoints_table_expires_items_by_ttl(self, store: DynamoRuleStore) -> None:
        table = store._client.describe_table(TableName=store.checkpoints_table)["Table"]
        assert table["KeySchema"] == [{"AttributeName": "key", "KeyType": "HASH"}]
        assert table["BillingModeSummary"]["BillingMode"] == "PAY_PER_REQUEST"
        ttl = store._client.describe_time_to_live(TableName=store.checkpoints_table)["TimeToLiveDescription"]
        assert ttl == {"TimeToLiveStatus": "ENABLED", "AttributeName": TTL}

    def test_migrate_refuses_a_rules_table_without_the_index(self, store: DynamoRuleStore) -> None:
        old_table = f"old-{store.rules_table}"
        store._client.create_table(
            TableName=old_table,
            BillingMode="PAY_PER_REQUEST",
            AttributeDefinitions=[{"AttributeName": "key", "AttributeType": "S"}],
            KeySchema=[{"AttributeName": "key", "KeyType": "HASH"}],
        )
        old = DynamoRuleStore(rules_table=old_table, checkpoints_table=store.checkpoints_table)
        try:
            with pytest.raises(StoreError, match=RULES_BY_UPDATE_INDEX):
                old.migrate()
        finally:
            store._client.delete_table(TableName=old_table)  # the mock keeps data between tests

    def test_a_missing_table_is_a_store_error_not_an_outage(self, store: DynamoRuleStore) -> None:
        missing = DynamoRuleStore(rules_table="no-such-table", checkpoints_table="no-such-table-either")
        with pytest.raises(StoreError) as info:
            missing.get_rule("a")
        assert not isinstance(info.value, StoreUnavailable)
        assert isinstance(info.value.__cause__, ClientError)

    def test_tombstone_keeps_the_item_with_a_new_update_time(self, store: DynamoRuleStore) -> None:
        store.put_rule(Rule("a", 3, 1))
        written = float(raw_item(store, store.rules_table, "a")["updated_at"]["N"])
        assert store.delete_rule("a")
        item = raw_item(store, store.rules_table, "a")
        assert item["deleted"] == {"BOOL": True} and item["shard"] == {"S": "rules"}
        assert float(item["updated_at"]["N"]) >= written

    def test_checkpoint_ttl_is_expiry_in_seconds_rounded_up_and_absent_for_never(self, store: DynamoRuleStore) -> None:
        store.put_checkpoints(
            [
                Checkpoint("spent", 5, 1_700_000_000_000_000_000, 1_700_000_010_000_000_001),
                Checkpoint("exact", 5, 1_700_000_000_000_000_000, 1_700_000_010_000_000_000),
                Checkpoint("never", 0, 1_700_000_000_000_000_000, NEVER_EXPIRES_NS),
            ]
        )
        assert raw_item(store, store.checkpoints_table, "spent")[TTL] == {"N": "1700000011"}
        assert raw_item(store, store.checkpoints_table, "exact")[TTL] == {"N": "1700000010"}
        assert TTL not in raw_item(store, store.checkpoints_table, "never")


class TestNumbers:
    @pytest.mark.parametrize("rate", [0.0, 0.1, 1 / 3, 1e-7, 2.5e-100, 123456.789, 2**49 + 0.5, 999999999999999.9])
    def test_rates_round_trip_exactly(self, store: DynamoRuleStore, rate: float) -> None:
        store.put_rule(Rule("r", MAX_CAPACITY, rate))
        got = store.get_rule("r")
        assert got is not None and got.rate == rate and got.capacity == MAX_CAPACITY
        assert store.changed_since(0)[-1].rule == Rule("r", MAX_CAPACITY, rate)

    def test_rate_dynamodb_cannot_hold_is_a_store_error_and_writes_nothing(self, store: DynamoRuleStore) -> None:
        with pytest.raises(StoreError, match="rate"):
            store.put_rules([Rule("fine", 1, 1), Rule("tiny", 1, 1e-200)])
        assert store.list_rules() == []

    def test_integers_read_back_exactly_even_in_exponent_form(self, store: DynamoRuleStore) -> None:
        # DynamoDB may hand a number back normalised; credit is beyond a float's 53 bits.
        store._client.put_item(
            TableName=store.checkpoints_table,
            Item={
                "key": {"S": "k"},
                "credit": {"N": "4.294967295E+18"},
                "at_ns": {"N": "1700000000000000001"},
                "expires_ns": {"N": str(NEVER_EXPIRES_NS)},
            },
        )
        assert store.get_checkpoints(["k"], 0)["k"] == Checkpoint(
            "k", MAX_CAPACITY * 10**9, 1700000000000000001, NEVER_EXPIRES_NS
        )


class Recorder:
    """Wraps one client method: records each call's arguments and lets a test rewrite its answer."""

    def __init__(self, real: Callable[..., dict[str, Any]], rewrite: Callable[..., dict[str, Any]] | None = None):
        self.real = real
        self.rewrite = rewrite
        self.calls: list[dict[str, Any]] = []
        self.responses: list[dict[str, Any]] = []

    def __call__(self, **params: Any) -> dict[str, Any]:
        self.calls.append(params)
        response = self.rewrite(self.real, len(self.calls), **params) if self.rewrite else self.real(**params)
        self.responses.append(response)
        return response


def record(monkeypatch: pytest.MonkeyPatch, store: DynamoRuleStore, operation: str, rewrite: Any = None) -> Recorder:
    recorder = Recorder(getattr(store._client, operation), rewrite)
    monkeypatch.setattr(store._client, operation, recorder)
    return recorder


def write_some_then_defer_the_rest(real: Callable[..., dict[str, Any]], call: int, **params: Any) -> dict[str, Any]:
    """DynamoDB under pressure: a full batch of 25 gets only 10 items written, the rest come back."""
    ((table, requests),) = params["RequestItems"].items()
    if len(requests) < BATCH_WRITE_MAX:
        return real(**params)
    response = real(RequestItems={table: requests[:10]})
    response["UnprocessedItems"] = {table: requests[10:]}
    return response


class TestBatching:
    def test_writes_go_out_in_batches_of_25(self, store: DynamoRuleStore, monkeypatch: pytest.MonkeyPatch) -> None:
        writes = record(monkeypatch, store, "batch_write_item")
        store.put_rules(Rule(f"k{i}", i, 1) for i in range(130))
        sizes = sorted(len(call["RequestItems"][store.rules_table]) for call in writes.calls)
        assert sizes == [5] + [BATCH_WRITE_MAX] * 5
        assert len(store.list_rules(limit=1000)) == 130

    def test_reads_go_out_in_batches_of_100_and_consistently(
        self, store: DynamoRuleStore, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        store.put_checkpoints(Checkpoint(f"k{i}", i, 1, 2) for i in range(250))
        reads = record(monkeypatch, store, "batch_get_item")
        assert len(store.get_checkpoints([f"k{i}" for i in range(250)], 0)) == 250
        requests = [call["RequestItems"][store.checkpoints_table] for call in reads.calls]
        assert sorted(len(request["Keys"]) for request in requests) == [50, BATCH_GET_MAX, BATCH_GET_MAX]
        assert all(request["ConsistentRead"] for request in requests)

    @pytest.mark.parametrize("what", ["rules", "checkpoints"])
    def test_unprocessed_items_are_retried_until_written(
        self, store: DynamoRuleStore, monkeypatch: pytest.MonkeyPatch, what: str
    ) -> None:
        writes = record(monkeypatch, store, "batch_write_item", write_some_then_defer_the_rest)
        if what == "rules":
            store.put_rules(Rule(f"k{i:02}", i, 1) for i in range(60))
            assert [r.capacity for r in store.list_rules(limit=100)] == list(range(60))
        else:
            store.put_checkpoints(Checkpoint(f"k{i:02}", i, 1, 2) for i in range(60))
            assert sorted(c.credit for c in store.get_checkpoints([f"k{i:02}" for i in range(60)], 0).values()) == list(
                range(60)
            )
        # 3 batches (25, 25, 10): the two full ones needed a second call for 15 items each.
        assert len(writes.calls) == 5
        assert sum(bool(r.get("UnprocessedItems")) for r in writes.responses) == 2

    def test_items_still_unprocessed_after_the_bound_raise_store_unavailable(
        self, store: DynamoRuleStore, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        store = DynamoRuleStore(
            rules_table=store.rules_table, checkpoints_table=store.checkpoints_table, batch_attempts=4, backoff_s=0.01
        )

        def throttled(real: Callable[..., dict[str, Any]], call: int, **params: Any) -> dict[str, Any]:
            return {"UnprocessedItems": params["RequestItems"]}  # nothing ever gets through

        writes = record(monkeypatch, store, "batch_write_item", throttled)
        started = time.monotonic()
        with pytest.raises(StoreUnavailable, match="unprocessed"):
            store.put_rules([Rule("a", 1, 1), Rule("b", 1, 1)])
        assert len(writes.calls) == 4
        # Backoff between attempts (0.01, 0.02, 0.04 s, each at least half that), bounded.
        assert 0.035 <= time.monotonic() - started < 2

    def test_unprocessed_keys_are_retried_and_then_raise_if_stuck(
        self, store: DynamoRuleStore, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        store.put_rules(Rule(f"k{i}", i, 1) for i in range(8))
        store.backoff_s = 0.001

        def half_then_rest(real: Callable[..., dict[str, Any]], call: int, **params: Any) -> dict[str, Any]:
            ((table, request),) = params["RequestItems"].items()
            keys = request["Keys"]
            if call > 1 or len(keys) < 2:
                return real(**params)
            response = real(RequestItems={table: {**request, "Keys": keys[:2]}})
            response["UnprocessedKeys"] = {table: {**request, "Keys": keys[2:]}}
            return response

        reads = record(monkeypatch, store, "batch_get_item", half_then_rest)
        assert sorted(store.get_rules(f"k{i}" for i in range(8))) == [f"k{i}" for i in range(8)]
        assert len(reads.calls) == 2

        monkeypatch.setattr(
            store._client, "batch_get_item", lambda **params: {"UnprocessedKeys": params["RequestItems"]}
        )
        with pytest.raises(StoreUnavailable, match="unprocessed"):
            store.get_rules(["k1"])


class TestErrors:
    @pytest.mark.parametrize("code", sorted(UNAVAILABLE_CODES))
    def test_throttling_and_service_errors_are_unavailable(
        self, store: DynamoRuleStore, monkeypatch: pytest.MonkeyPatch, code: str
    ) -> None:
        error = client_error(code, status=500 if code in ("InternalServerError", "ServiceUnavailable") else 400)

        def fail(**params: Any) -> dict[str, Any]:
            raise error

        monkeypatch.setattr(store._client, "batch_write_item", fail)
        with pytest.raises(StoreUnavailable) as info:
            store.put_rule(Rule("a", 1, 1))
        assert info.value.__cause__ is error

    def test_other_client_errors_are_store_errors(
        self, store: DynamoRuleStore, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        error = client_error("ValidationException", operation="Query")

        def fail(**params: Any) -> dict[str, Any]:
            raise error

        monkeypatch.setattr(store._client, "query", fail)
        with pytest.raises(StoreError) as info:
            store.changed_since(0)
        assert not isinstance(info.value, StoreUnavailable)
        assert info.value.__cause__ is error

    def test_unreachable_endpoint_is_unavailable_within_about_a_second(self, aws_env: object, closed_port: int) -> None:
        store = open_store("dynamodb", endpoint=f"http://127.0.0.1:{closed_port}")  # opening makes no call
        for use in (lambda: store.get_rule("a"), lambda: store.put_checkpoints([Checkpoint("a", 1, 1, 2)])):
            started = time.monotonic()
            with pytest.raises(StoreUnavailable) as info:
                use()
            assert time.monotonic() - started < 2.0
            assert isinstance(info.value.__cause__, EndpointConnectionError)

    def test_endpoint_that_never_answers_is_unavailable_after_the_read_timeout(
        self, aws_env: object, silent_port: int
    ) -> None:
        store = DynamoRuleStore(endpoint=f"http://127.0.0.1:{silent_port}", read_timeout=0.2)
        started = time.monotonic()
        with pytest.raises(StoreUnavailable) as info:
            store.list_rules()
        assert time.monotonic() - started < 2.5  # two attempts of 0.2 s and a short backoff
        assert isinstance(info.value.__cause__, ReadTimeoutError)

    def test_endpoint_that_is_not_a_url_is_a_store_error(self, aws_env: object) -> None:
        with pytest.raises(StoreError):
            open_store("dynamodb", endpoint="not a url")

    def test_closed_store_raises_store_error(self, store: DynamoRuleStore) -> None:
        store.close()
        with pytest.raises(StoreError, match="closed"):
            store.get_rule("a")
        store.close()  # twice is fine

    def test_callers_never_see_botocore_errors(self, store: DynamoRuleStore, monkeypatch: pytest.MonkeyPatch) -> None:
        def broken(**params: Any) -> dict[str, Any]:
            raise BotoCoreError()

        monkeypatch.setattr(store._client, "scan", broken)
        with pytest.raises(StoreError) as info:
            list(store.iter_rules())
        assert isinstance(info.value.__cause__, BotoCoreError)


class TestSettings:
    def test_region_defaults_to_us_east_1_and_empty_endpoint_means_aws(
        self, aws_env: object, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.delenv("AWS_DEFAULT_REGION")
        monkeypatch.delenv("AWS_REGION")
        store = DynamoRuleStore()
        assert store.region == "us-east-1"
        assert store._client.meta.endpoint_url == "https://dynamodb.us-east-1.amazonaws.com"

    def test_region_comes_from_the_environment(self, aws_env: object, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")
        monkeypatch.delenv("AWS_REGION")
        assert DynamoRuleStore().region == "eu-west-1"
        monkeypatch.delenv("AWS_DEFAULT_REGION")
        monkeypatch.setenv("AWS_REGION", "ap-south-1")  # what Lambda and ECS set
        assert DynamoRuleStore().region == "ap-south-1"
        assert DynamoRuleStore(region="us-west-2").region == "us-west-2"

    def test_timeouts_and_retries_are_short(self, store: DynamoRuleStore) -> None:
        config = store._client.meta.config
        assert config.connect_timeout <= 1 and config.read_timeout <= 1
        assert config.retries == {"mode": "standard", "total_max_attempts": 2}


class TestChangedSince:
    def test_reads_only_the_changed_rules(self, store: DynamoRuleStore, monkeypatch: pytest.MonkeyPatch) -> None:
        store.put_rules(Rule(f"user-{i:04}", 100, 10) for i in range(2000))
        time.sleep(0.01)
        since = time.time()
        time.sleep(0.01)
        store.put_rules(Rule(f"user-{i:04}", 5, 1) for i in range(0, 1400, 200))
        for i in (1500, 1600, 1700):
            assert store.delete_rule(f"user-{i:04}")
        queries = record(monkeypatch, store, "query")
        scans = record(monkeypatch, store, "scan")
        gets = record(monkeypatch, store, "batch_get_item")
        changes = store.changed_since(since)
        assert sorted(c.key for c in changes) == sorted(
            f"user-{i:04}" for i in (*range(0, 1400, 200), 1500, 1600, 1700)
        )
        assert [c.rule for c in changes[-3:]] == [None, None, None]
        # What DynamoDB read (and bills) is the 10 changed items, not the 2,000 rules:
        # the index's 10 entries, then the 7 live rules by key (for their policies).
        assert len(queries.calls) == 1 and scans.calls == []
        assert sum(r["ScannedCount"] for r in queries.responses) == 10
        assert queries.calls[0]["IndexName"] == RULES_BY_UPDATE_INDEX
        (get,) = gets.calls
        assert sorted(k["key"]["S"] for k in get["RequestItems"][store.rules_table]["Keys"]) == [
            f"user-{i:04}" for i in range(0, 1400, 200)
        ]

    def test_pages_through_the_index_when_answers_come_in_pieces(
        self, store: DynamoRuleStore, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        for i in range(12):  # distinct update times
            store.put_rule(Rule(f"k{i:02}", i, 1))

        def small_pages(real: Callable[..., dict[str, Any]], call: int, **params: Any) -> dict[str, Any]:
            return real(**{**params, "Limit": min(params["Limit"], 5)})  # as if each page hit 1 MB

        queries = record(monkeypatch, store, "query", small_pages)
        changes = store.changed_since(0, limit=11)
        assert [c.key for c in changes] == [f"k{i:02}" for i in range(11)]
        assert [call["Limit"] for call in queries.calls] == [11, 6, 1]
        assert [c.updated_at for c in changes] == sorted(c.updated_at for c in changes)


class TestMotoServer:
    def test_outage_and_recovery_through_a_real_endpoint(
        self, dynamodb_server_tables: ServerTables, moto_server: MotoEndpoint
    ) -> None:
        store = dynamodb_server_tables.open()
        store.put_rule(Rule("alice", 10, 1))
        moto_server.stop()
        started = time.monotonic()
        with pytest.raises(StoreUnavailable) as info:
            store.get_rule("alice")
        assert time.monotonic() - started < 2.0
        assert isinstance(info.value.__cause__, EndpointConnectionError)
        with pytest.raises(StoreUnavailable):
            store.put_checkpoints([Checkpoint("alice", 1, 1, 2)])
        moto_server.start()
        assert store.get_rule("alice") == Rule("alice", 10, 1)  # the data survived, the handle heals
        store.put_checkpoints([Checkpoint("alice", 1, 1, 2)])
        assert store.get_checkpoints(["alice"], 0) == {"alice": Checkpoint("alice", 1, 1, 2)}

    def test_another_process_reaches_the_tables_through_the_config(self, dynamodb_server_tables: ServerTables) -> None:
        dynamodb_server_tables.open().put_rule(Rule("from-parent", 5, 0.5))
        script = textwrap.dedent(
            """
            from sluicegate.config import Config
            from sluicegate.rules import Rule
            from sluicegate.store import store_from_config
            store = store_from_config(Config.from_env())
            print(store.get_rule("from-parent") == Rule("from-parent", 5, 0.5))
            store.put_rule(Rule("from-child", 7, 2))
            """
        )
        done = subprocess.run(
            [sys.executable, "-c", script],
            env=child_env(**dynamodb_server_tables.env()),
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        assert done.stdout.strip() == "True"
        assert dynamodb_server_tables.open().get_rule("from-child") == Rule("from-child", 7, 2)

    def test_placeholder_credentials_for_a_local_endpoint(
        self, dynamodb_server_tables: ServerTables, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
            monkeypatch.delenv(name)
        store = dynamodb_server_tables.open()
        store.put_rule(Rule("a", 1, 1))
        assert store.get_rule("a") == Rule("a", 1, 1)
