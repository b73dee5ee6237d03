"""The rules admin API (RulesAdmin behind CheckApi), called with HttpRequest objects on a real SQLite store."""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from sluicegate.router.admin import RulesAdmin
from sluicegate.router.api import CheckApi, HttpRequest, HttpResponse
from sluicegate.router.client import PartitionClient
from sluicegate.rules import Rule
from sluicegate.store.sqlite import SqliteRuleStore

TOKEN = "s3cret-token"


class Service:
    """A CheckApi with the admin API; its partition client is never started (admin routes do not use it)."""

    def __init__(self, store: SqliteRuleStore, token: str = TOKEN, *, admin: bool = True) -> None:
        self.store = store
        self.changes: list[list[str]] = []
        rules_admin = RulesAdmin(store, token, on_change=self._on_change) if admin else None
        self.api = CheckApi(PartitionClient([("127.0.0.1", 9)]), admin=rules_admin)

    async def _on_change(self, keys: Sequence[str]) -> None:
        self.changes.append(list(keys))

    def call(
        self,
        method: str,
        path: str,
        body: object = None,
        *,
        query: str = "",
        token: str | None = TOKEN,
        headers: dict[str, str] | None = None,
    ) -> HttpResponse:
        all_headers = dict(headers or {})
        if token is not None:
            all_headers["authorization"] = f"Bearer {token}"
        raw = body if isinstance(body, bytes) else b"" if body is None else json.dumps(body).encode()
        request = HttpRequest(method, path, query, all_headers, raw)

        async def handle() -> HttpResponse:
            result = self.api.handle(request)
            return await result if inspect.isawaitable(result) else result

        return asyncio.run(asyncio.wait_for(handle(), 10))


def payload(response: HttpResponse) -> Any:
    assert ("Content-Type", "application/json") in response.headers
    return json.loads(response.body)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteRuleStore]:
    store = SqliteRuleStore(str(tmp_path / "rules.db"))
    yield store
    store.close()


@pytest.fixture
def service(store: SqliteRuleStore) -> Service:
    return Service(store)


class TestAuth:
    @pytest.mark.parametrize(
        ("method", "path"), [("GET", "/v1/rules"), ("PUT", "/v1/rules/alice"), ("GET", "/v1/rules/a")]
    )
    def test_disabled_without_a_configured_token(self, store: SqliteRuleStore, method: str, path: str) -> None:
        service = Service(store, token="")
        for token in (None, "", "anything"):
            response = service.call(method, path, {"capacity": 1, "rate": 1}, token=token)
            assert response.status == 401
            assert "SLUICEGATE_ADMIN_TOKEN" in payload(response)["error"]
        assert store.get_rule("alice") is None

    @pytest.mark.parametrize(
        "authorization",
        [
            None,
            "",
            "Bearer",
            "Bearer ",
            "Bearer wrong",
            f"Bearer {TOKEN}x",
            f"Basic {TOKEN}",
            TOKEN,
            f"Bearer  {TOKEN}",
        ],
    )
    def test_missing_or_wrong_token(self, service: Service, store: SqliteRuleStore, authorization: str | None) -> None:
        headers = {} if authorization is None else {"authorization": authorization}
        response = service.call("PUT", "/v1/rules/alice", {"capacity": 1, "rate": 1}, token=None, headers=headers)
        assert response.status == 401
        assert ("WWW-Authenticate", "Bearer") in response.headers
        assert "token" in payload(response)["error"]
        assert store.get_rule("alice") is None
        assert service.changes == []

    def test_right_token_is_let_in(self, service: Service) -> None:
        assert service.call("GET", "/v1/rules").status == 200


class TestCrud:
    def test_put_stores_and_answers_the_rule(self, service: Service, store: SqliteRuleStore) -> None:
        response = service.call("PUT", "/v1/rules/alice", {"capacity": 1000, "rate": 100})
        assert response.status == 200
        assert payload(response) == {"key": "alice", "capacity": 1000, "rate": 100.0}
        assert store.get_rule("alice") == Rule("alice", 1000, 100)
        assert service.changes == [["alice"]]

    def test_put_replaces(self, service: Service, store: SqliteRuleStore) -> None:
        service.call("PUT", "/v1/rules/alice", {"capacity": 1, "rate": 1})
        assert service.call("PUT", "/v1/rules/alice", {"capacity": 2, "rate": 0.5}).status == 200
        assert store.get_rule("alice") == Rule("alice", 2, 0.5)
        assert service.changes == [["alice"], ["alice"]]

    def test_key_is_percent_decoded_from_the_path(self, service: Service, store: SqliteRuleStore) -> None:
        response = service.call("PUT", "/v1/rules/team%2Falice%20%C3%A9", {"capacity": 5, "rate": 1})
        assert response.status == 200
        assert payload(response)["key"] == "team/alice é"
        assert store.get_rule("team/alice é") == Rule("team/alice é", 5, 1)
        assert payload(service.call("GET", "/v1/rules/team%2Falice%20%C3%A9"))["key"] == "team/alice é"
        assert service.changes == [["team/alice é"]]

    @pytest.mark.parametrize(
        ("body", "message"),
        [
            (b"{not json", "body is not JSON"),
            (b"", "body is not JSON"),
            (b"\xff\xfe", "body is not JSON"),
            (b"[1, 2]", "body must be an object"),
            (b'"capacity"', "body must be an object"),
            ({"capacity": -1, "rate": 1}, "capacity"),
            ({"capacity": 1.5, "rate": 1}, "capacity"),
            ({"capacity": 10, "rate": "fast"}, "rate"),
            ({"capacity": 10}, "rate is required"),
            ({"rate": 10}, "capacity is required"),
            ({"capacity": 10, "rate": 1, "burst": 5}, "unknown rule field"),
            ({"capacity": int("9" * 400), "rate": 1}, "capacity"),
        ],
    )
    def test_put_invalid_is_400_with_a_message(
        self, service: Service, store: SqliteRuleStore, body: object, message: str
    ) -> None:
        response = service.call("PUT", "/v1/rules/alice", body)
        assert response.status == 400
        assert message in payload(response)["error"]
        assert store.get_rule("alice") is None
        assert service.changes == []

    def test_put_deeply_nested_json_is_400_not_500(self, service: Service, store: SqliteRuleStore) -> None:
        deep = b"[" * 100_000 + b"]" * 100_000
        for body in (deep, b'{"capacity": ' + deep + b', "rate": 1}'):
            response = service.call("PUT", "/v1/rules/alice", body)
            assert response.status == 400
            assert "nested too deeply" in payload(response)["error"]
        assert store.get_rule("alice") is None
        assert service.changes == []

    @pytest.mark.parametrize(
        ("path", "message"), [("/v1/rules/", "empty"), ("/v1/rules/" + "x" * 257, "longer")], ids=["empty", "long"]
    )
    def test_bad_key_in_path_is_400(self, service: Service, path: str, message: str) -> None:
        for method in ("GET", "PUT", "DELETE"):
            response = service.call(method, path, {"capacity": 1, "rate": 1})
            assert response.status == 400
            assert message in payload(response)["error"]

    def test_get(self, service: Service, store: SqliteRuleStore) -> None:
        missing = service.call("GET", "/v1/rules/alice")
        assert missing.status == 404
        assert "alice" in payload(missing)["error"]
        store.put_rule(Rule("alice", 7, 0.25))
        found = service.call("GET", "/v1/rules/alice")
        assert found.status == 200
        assert payload(found) == {"key": "alice", "capacity": 7, "rate": 0.25}

    def test_delete(self, service: Service, store: SqliteRuleStore) -> None:
        store.put_rules([Rule("alice", 7, 1), Rule("bob", 1, 1)])
        deleted = service.call("DELETE", "/v1/rules/alice")
        assert deleted.status == 204
        assert deleted.body == b""
        assert store.get_rule("alice") is None
        assert store.get_rule("bob") is not None
        assert service.changes == [["alice"]]
        again = service.call("DELETE", "/v1/rules/alice")
        assert again.status == 404
        assert service.changes == [["alice"]]

    @pytest.mark.parametrize(("method", "path"), [("POST", "/v1/rules/alice"), ("PATCH", "/v1/rules/alice")])
    def test_other_methods_on_a_key_are_405(self, service: Service, method: str, path: str) -> None:
        response = service.call(method, path, {"capacity": 1, "rate": 1})
        assert response.status == 405
        assert ("Allow", "GET, PUT, DELETE") in response.headers

    def test_store_failure_is_503(self, service: Service, store: SqliteRuleStore) -> None:
        store.close()
        response = service.call("GET", "/v1/rules/alice")
        assert response.status == 503
        assert "rule store" in payload(response)["error"]


class TestPolicy:
    """The rule fields beyond the main bucket through PUT and GET, and 400 with the rule model's message."""

    PATTERN = {
        "capacity": 100,
        "rate": 10.0,
        "limits": [
            {"name": "daily", "quota": 250, "per": "day", "offset": "+02:00"},
            {"name": "burst", "capacity": 20, "rate": 5.0, "shadow": True},
        ],
        "precedence": 5,
    }

    def test_pattern_rule_round_trips(self, service: Service, store: SqliteRuleStore) -> None:
        response = service.call("PUT", "/v1/rules/tenant%3Aacme%3A%2A", self.PATTERN)
        assert response.status == 200
        assert payload(response) == {"key": "tenant:acme:*", **self.PATTERN}
        assert payload(service.call("GET", "/v1/rules/tenant:acme:*")) == {"key": "tenant:acme:*", **self.PATTERN}
        assert store.get_rule("tenant:acme:*") == Rule.from_dict(self.PATTERN, key="tenant:acme:*")
        assert service.changes == [["tenant:acme:*"]]

    def test_parent_and_children_round_trip_and_list(self, service: Service) -> None:
        parent = {"capacity": 250, "rate": 250.0, "share": "strict", "level_weights": {"0": 1.0, "1": 2.0, "2": 4.0}}
        child = {"capacity": 100, "rate": 100.0, "shadow": True, "parent": "{acme}", "weight": 6.0, "priority": 2}
        assert service.call("PUT", "/v1/rules/%7Bacme%7D", parent).status == 200
        assert service.call("PUT", "/v1/rules/%7Bacme%7D:batch", child).status == 200
        body = payload(service.call("GET", "/v1/rules", query="prefix=%7Bacme%7D"))
        assert body["rules"] == [{"key": "{acme}", **parent}, {"key": "{acme}:batch", **child}]

    def test_default_fields_are_left_out_and_old_rules_stay_plain(
        self, service: Service, store: SqliteRuleStore
    ) -> None:
        body = {"capacity": 5, "rate": 1, "shadow": False, "precedence": 0, "weight": 1, "share": "weighted"}
        assert payload(service.call("PUT", "/v1/rules/alice", body)) == {"key": "alice", "capacity": 5, "rate": 1.0}
        stored = store.get_rule("alice")
        assert stored == Rule("alice", 5, 1)
        assert stored is not None and stored.is_plain

    def test_the_path_names_the_key_not_the_body(self, service: Service, store: SqliteRuleStore) -> None:
        response = service.call("PUT", "/v1/rules/alice", {"key": "mallory", "capacity": 5, "rate": 1})
        assert payload(response)["key"] == "alice"
        assert store.get_rule("mallory") is None

    @pytest.mark.parametrize(
        ("fields", "message"),
        [
            ({"limits": {"quota": 5, "per": "day"}}, "limits must be a list"),
            ({"limits": [{"quota": 5}]}, "limits: a quota limit needs per"),
            ({"limits": [{"quota": 5, "per": "fortnight"}]}, "per must be one of minute, hour, day, week, month"),
            ({"limits": [{"quota": 5, "per": "day", "offset": "+25:00"}]}, "offset must be within"),
            ({"limits": [{"quota": 5, "per": "day", "offset": "noon"}]}, "offset must be like +02:00"),
            ({"limits": [{"capacity": 5}]}, "a bucket limit needs rate"),
            (
                {"limits": [{"capacity": 5, "rate": 1, "quota": 2}]},
                "a bucket (capacity, rate) or a quota (quota, per), not both",
            ),
            ({"limits": [{"capacity": 5, "rate": 1, "burst": 2}]}, "unknown limit field(s): burst"),
            ({"limits": [{"name": "rate", "capacity": 5, "rate": 1}]}, "limit names must differ"),
            ({"limits": [{"name": "x" * 17, "capacity": 5, "rate": 1}]}, "1 to 16 UTF-8 bytes"),
            ({"limits": [{"capacity": 1, "rate": 1}] * 9}, "at most 8 limits"),
            ({"shadow": "yes"}, "shadow must be true or false"),
            ({"precedence": "5"}, "precedence must be a whole number"),
            ({"parent": "bob"}, "parent and child must share a routing key"),
            ({"parent": "alice"}, "cannot be its own parent"),
            ({"parent": "ali*"}, "parent must be an exact key"),
            ({"weight": 0}, "weight must be above 0"),
            ({"priority": 256}, "priority must be a whole number from 0 to 255"),
            ({"share": "fair"}, "share must be one of weighted, strict"),
            ({"level_weights": [4, 2, 1]}, "level_weights must be an object"),
            ({"level_weights": {"high": 4}}, "'high' is not a priority"),
        ],
    )
    def test_bad_policy_field_is_400_with_its_message(
        self, service: Service, store: SqliteRuleStore, fields: dict[str, object], message: str
    ) -> None:
        response = service.call("PUT", "/v1/rules/alice", {"capacity": 10, "rate": 1, **fields})
        assert response.status == 400
        assert message in payload(response)["error"]
        assert store.get_rule("alice") is None
        assert service.changes == []


class TestList:
    @pytest.fixture(autouse=True)
    def rules(self, store: SqliteRuleStore) -> None:
        store.put_rules(Rule(key, 1, 1) for key in ["b/2", "a", "b/1", "c", "b/3", "b%", "b_x"])

    def test_all_in_key_order(self, service: Service) -> None:
        response = service.call("GET", "/v1/rules")
        assert response.status == 200
        body = payload(response)
        assert [rule["key"] for rule in body["rules"]] == ["a", "b%", "b/1", "b/2", "b/3", "b_x", "c"]
        assert body["rules"][0] == {"key": "a", "capacity": 1, "rate": 1.0}
        assert body["next"] is None

    def test_prefix(self, service: Service) -> None:
        body = payload(service.call("GET", "/v1/rules", query="prefix=b%2F"))
        assert [rule["key"] for rule in body["rules"]] == ["b/1", "b/2", "b/3"]
        body = payload(service.call("GET", "/v1/rules", query="prefix=b%25"))
        assert [rule["key"] for rule in body["rules"]] == ["b%"]

    def test_paging_with_next(self, service: Service) -> None:
        keys: list[str] = []
        query = "limit=2"
        pages = 0
        while True:
            body = payload(service.call("GET", "/v1/rules", query=query))
            pages += 1
            keys += [rule["key"] for rule in body["rules"]]
            if body["next"] is None:
                break
            assert body["next"] == keys[-1]
            query = f"limit=2&after={body['next']}"
        assert keys == ["a", "b%", "b/1", "b/2", "b/3", "b_x", "c"]
        assert pages == 4

    def test_paging_with_prefix(self, service: Service) -> None:
        first = payload(service.call("GET", "/v1/rules", query="prefix=b/&limit=2"))
        assert [rule["key"] for rule in first["rules"]] == ["b/1", "b/2"]
        second = payload(service.call("GET", "/v1/rules", query=f"prefix=b/&limit=2&after={first['next']}"))
        assert [rule["key"] for rule in second["rules"]] == ["b/3"]
        assert second["next"] is None

    @pytest.mark.parametrize(
        "limit",
        ["0", "1001", "-1", "ten", "2.5", "%C2%B2", "9" * 5000],
        ids=lambda v: v if len(v) < 20 else f"{len(v)}-digits",
    )
    def test_bad_limit_is_400(self, service: Service, limit: str) -> None:
        response = service.call("GET", "/v1/rules", query=f"limit={limit}")
        assert response.status == 400
        assert "limit" in payload(response)["error"]

    def test_only_get_on_the_collection(self, service: Service) -> None:
        response = service.call("POST", "/v1/rules", {"key": "d", "capacity": 1, "rate": 1})
        assert response.status == 405
        assert ("Allow", "GET") in response.headers


def test_without_admin_the_rules_api_is_not_served(store: SqliteRuleStore) -> None:
    service = Service(store, admin=False)
    for path in ("/v1/rules", "/v1/rules/alice"):
        response = service.call("GET", path)
        assert response.status == 404
        assert "not served" in payload(response)["error"]


def test_other_paths_do_not_reach_the_admin(service: Service) -> None:
    response = service.call("GET", "/v1/rulesets")
    assert response.status == 404
    assert service.call("GET", "/healthz").status == 200
