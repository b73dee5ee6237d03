"""The rules admin Lambda in-process with recorded function-URL events, on DynamoDB (moto)."""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest
from moto import mock_aws

from sluicegate.rules import Rule
from sluicegate.store.dynamodb import DynamoRuleStore
from tests.functions.conftest import LambdaContext, event

TABLES = {"SLUICEGATE_DYNAMODB_RULES_TABLE": "rules-t", "SLUICEGATE_DYNAMODB_CHECKPOINTS_TABLE": "checkpoints-t"}


@pytest.fixture
def tables(monkeypatch: pytest.MonkeyPatch) -> Iterator[DynamoRuleStore]:
    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    with mock_aws():
        store = DynamoRuleStore(
            rules_table=TABLES["SLUICEGATE_DYNAMODB_RULES_TABLE"],
            checkpoints_table=TABLES["SLUICEGATE_DYNAMODB_CHECKPOINTS_TABLE"],
            region="eu-west-1",
        )
        store.migrate()  # in the cloud the CDK stack creates them
        yield store


@pytest.fixture
def admin(load_function, tables: DynamoRuleStore) -> ModuleType:  # type: ignore[no-untyped-def]
    return load_function("admin", SLUICEGATE_STORE="dynamodb", **TABLES)


def call(
    admin: ModuleType, method: str, path: str, body: object = None, *, query: str = "", iam: bool = True
) -> tuple[int, dict[str, str], Any]:
    request = event("function_url_put_rule", rawPath=path, rawQueryString=query)
    request["requestContext"] = copy.deepcopy(request["requestContext"])
    request["requestContext"]["http"].update(method=method, path=path)
    if not iam:
        del request["requestContext"]["authorizer"]
    if body is None:
        request.pop("body")
    else:
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        request.update(body=base64.b64encode(raw).decode(), isBase64Encoded=True)
    answer = admin.handler(request, LambdaContext(function_name="sluicegate-admin"))
    payload = json.loads(answer["body"]) if answer.get("body") else None
    return answer["statusCode"], answer.get("headers", {}), payload


def test_recorded_put_stores_the_rule(admin: ModuleType, tables: DynamoRuleStore) -> None:
    answer = admin.handler(event("function_url_put_rule"), LambdaContext(function_name="sluicegate-admin"))
    assert answer["statusCode"] == 200
    assert json.loads(answer["body"]) == {"key": "tenant-acme", "capacity": 1000, "rate": 100}
    assert tables.get_rule("tenant-acme") == Rule("tenant-acme", 1000, 100)


def test_get_list_and_delete(admin: ModuleType, tables: DynamoRuleStore) -> None:
    for key in ("a:1", "a:2", "b:1"):
        tables.put_rule(Rule(key, 10, 1))
    assert call(admin, "GET", "/v1/rules/a%3A2")[::2] == (200, {"key": "a:2", "capacity": 10, "rate": 1})
    status, _, listing = call(admin, "GET", "/v1/rules", query="prefix=a%3A&limit=1")
    assert status == 200 and [r["key"] for r in listing["rules"]] == ["a:1"] and listing["next"] == "a:1"
    assert call(admin, "DELETE", "/v1/rules/b:1")[0] == 204
    assert tables.get_rule("b:1") is None
    assert call(admin, "DELETE", "/v1/rules/b:1")[0] == 404
    assert call(admin, "GET", "/v1/rules/b:1")[0] == 404


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{not json", "not JSON"),
        ([1, 2], "body must be an object"),
        ({"capacity": -1, "rate": 1}, "capacity"),
        ({"capacity": 10}, "rate"),
        ({"capacity": 10, "rate": "fast"}, "rate"),
        ({"capacity": 2**40, "rate": 1}, "capacity"),
    ],
)
def test_bad_bodies_get_400_with_a_message(
    admin: ModuleType, tables: DynamoRuleStore, body: object, message: str
) -> None:
    status, headers, payload = call(admin, "PUT", "/v1/rules/tenant-acme", body)
    assert status == 400 and message in payload["error"]
    assert headers.get("Content-Type") == "application/json"
    assert tables.get_rule("tenant-acme") is None


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [("GET", "/v1/rules/" + "k" * 300, 400), ("POST", "/v1/rules/x", 405), ("GET", "/v1/check/x", 404)],
)
def test_bad_requests_are_refused_with_a_message(admin: ModuleType, method: str, path: str, status: int) -> None:
    answer = call(admin, method, path)
    assert answer[0] == status and answer[2]["error"]


@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE"])
def test_requests_without_iam_identity_are_refused(admin: ModuleType, tables: DynamoRuleStore, method: str) -> None:
    tables.put_rule(Rule("tenant-acme", 5, 1))
    status, _, payload = call(admin, method, "/v1/rules/tenant-acme", {"capacity": 9, "rate": 9}, iam=False)
    assert status == 403 and "IAM" in payload["error"]
    assert tables.get_rule("tenant-acme") == Rule("tenant-acme", 5, 1)  # nothing changed


def test_an_empty_identity_is_no_identity(admin: ModuleType) -> None:
    request = event("function_url_put_rule")
    request["requestContext"] = {**request["requestContext"], "authorizer": {"iam": {}}}
    assert admin.handler(request, LambdaContext())["statusCode"] == 403


def test_store_settings_are_checked_at_cold_start(load_function) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(Exception, match="SLUICEGATE_STORE"):
        load_function("admin", SLUICEGATE_STORE="redis")
