"""The rules admin API (``PUT|GET|DELETE /v1/rules/{key}``, ``GET /v1/rules``).

Never open to the world: locally it needs ``Authorization: Bearer <token>``
(``SLUICEGATE_ADMIN_TOKEN``); without a configured token it answers 401 to
everything. In the cloud the admin Lambda sits behind IAM instead.

A successful ``PUT``/``DELETE`` (200/204) means the store holds the change.
The owning partition is then told to reload the key: when it confirms, keys
it already holds use the new rule at once; when it does not answer (it is
restarting, or the datagram was lost), they pick it up within the rule sync
interval (``SLUICEGATE_SYNC_INTERVAL_MS``). Keys a partition does not hold
yet always load the stored rule on first use.
"""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import Awaitable, Callable, Sequence
from urllib.parse import parse_qs

from sluicegate.router.api import (
    RULES_PREFIX,
    BadRequest,
    HttpRequest,
    HttpResponse,
    ascii_digits,
    decode_path_key,
    error_response,
    json_response,
    parse_json_body,
)
from sluicegate.rules import Rule, RuleError
from sluicegate.store import RuleStore, StoreError

OnChange = Callable[[Sequence[str]], Awaitable[None]]


class RulesAdmin:
    """Serves rule CRUD from ``store``; ``on_change(keys)`` tells partitions to reload."""

    def __init__(self, store: RuleStore, token: str, *, on_change: OnChange | None = None) -> None:
        self.store = store
        self.token = token
        self.on_change = on_change

    def __call__(self, request: HttpRequest) -> HttpResponse | Awaitable[HttpResponse]:
        if not self.token:
            return error_response(401, "the admin API is disabled: set SLUICEGATE_ADMIN_TOKEN to enable it")
        supplied = request.headers.get("authorization", "")
        if not hmac.compare_digest(supplied.encode(), f"Bearer {self.token}".encode()):
            return error_response(401, "missing or wrong admin token", [("WWW-Authenticate", "Bearer")])
        return self.serve(request)

    async def serve(self, request: HttpRequest) -> HttpResponse:
        """Answer an already authenticated request (the admin Lambda authenticates by IAM instead)."""
        try:
            if request.path == RULES_PREFIX:
                if request.method != "GET":
                    return error_response(405, "use GET /v1/rules", [("Allow", "GET")])
                return await self._list(request.query)
            key = decode_path_key(request.path[len(RULES_PREFIX) + 1 :])
            if request.method == "GET":
                rule = await self._run(self.store.get_rule, key)
                return json_response(200, rule.to_dict()) if rule else error_response(404, f"no rule for {key!r}")
            if request.method == "PUT":
                payload = parse_json_body(request.body)
                if not isinstance(payload, dict):
                    raise BadRequest('body must be an object like {"capacity": 100, "rate": 10}')
                rule = Rule.from_dict(payload, key=key)
                await self._run(self.store.put_rule, rule)
                await self._changed(key)
                return json_response(200, rule.to_dict())
            if request.method == "DELETE":
                if not await self._run(self.store.delete_rule, key):
                    return error_response(404, f"no rule for {key!r}")
                await self._changed(key)
                return HttpResponse(204)
            return error_response(405, "use GET, PUT or DELETE", [("Allow", "GET, PUT, DELETE")])
        except (BadRequest, RuleError) as exc:
            return error_response(400, str(exc))
        except StoreError as exc:
            return error_response(503, f"rule store error: {exc}")

    async def _list(self, query: str) -> HttpResponse:
        params = {name: values[-1] for name, values in parse_qs(query).items()}
        limit = ascii_digits(params.get("limit", "100"))
        if limit is None:
            raise BadRequest("limit must be a whole number")
        rules = await self._run(
            lambda: self.store.list_rules(prefix=params.get("prefix", ""), after=params.get("after"), limit=limit)
        )
        next_key = rules[-1].key if len(rules) == limit else None
        return json_response(200, {"rules": [rule.to_dict() for rule in rules], "next": next_key})

    async def _changed(self, key: str) -> None:
        if self.on_change is not None:
            await self.on_change([key])

    @staticmethod
    async def _run(function, *args):  # type: ignore[no-untyped-def]
        # The store blocks; keep it off the event loop that answers checks.
        return await asyncio.get_running_loop().run_in_executor(None, function, *args)
