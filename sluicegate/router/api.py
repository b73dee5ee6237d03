"""The HTTP check API, independent of any HTTP server.

``CheckApi.handle(request)`` returns an :class:`HttpResponse` at once (errors,
health) or an awaitable of one (checks). The asyncio server of
``sluicegate local`` and the router Lambda both call it.

* ``GET /v1/check/{key}?cost=N&max_wait_ms=M``: 200 allowed / 429 denied, JSON decision.
  ``HEAD`` is accepted too and is a real check: it charges the bucket exactly
  like ``GET`` (only the body is left out), so it is not a free "peek". With
  ``max_wait_ms`` the partition may hold the check until the credit is there.
* ``POST /v1/check`` ``{"checks": [{"key": ..., "cost": ...}]}``: 200, ``{"results": [...]}``.
* ``POST /v1/acquire`` ``{"key", "cost", "ttl_ms", "max_wait_ms"}``: 200 with the decision and its
  ``lease`` / 429. ``POST /v1/release`` ``{"key", "lease", "wait_ms", "service_ms"}``: 200
  ``{"released": true, ...}``, 409 for a lease that is not held, 503 when the partition did not answer.
* ``GET /healthz``; ``GET /v1/stats``: each partition's counters and the router's.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import parse_qs, unquote

from sluicegate.codec import MAX_COST
from sluicegate.headers import most_restrictive, rate_limit_headers
from sluicegate.router.client import Decision, PartitionClient
from sluicegate.rules import RuleError, validate_key

MAX_BATCH = 100
CHECK_PREFIX = "/v1/check/"
RULES_PREFIX = "/v1/rules"
MAX_WAIT_MS = 60_000  # a longer wait is a job queue, not admission control
DEFAULT_TTL_MS = 30_000
MAX_TTL_MS = 3_600_000
MAX_LEASE = 2**64 - 1
MAX_REPORTED_MS = 2**32 - 1  # wait_ms / service_ms: what the wire carries
ACQUIRE_FIELDS = frozenset({"key", "cost", "ttl_ms", "max_wait_ms"})
RELEASE_FIELDS = frozenset({"key", "lease", "wait_ms", "service_ms"})


@dataclass(slots=True)
class HttpRequest:
    method: str
    path: str  # still percent-encoded
    query: str = ""
    headers: Mapping[str, str] = field(default_factory=dict)  # lower-case names
    body: bytes = b""


@dataclass(slots=True)
class HttpResponse:
    status: int
    body: bytes = b""
    headers: list[tuple[str, str]] = field(default_factory=list)


class BadRequest(ValueError):
    """Input the caller must fix; becomes a 400 with this message."""


def json_response(status: int, payload: Any, headers: list[tuple[str, str]] | None = None) -> HttpResponse:
    body = json.dumps(payload, separators=(",", ":")).encode()
    return HttpResponse(status, body, [("Content-Type", "application/json"), *(headers or [])])


def error_response(status: int, message: str, headers: list[tuple[str, str]] | None = None) -> HttpResponse:
    return json_response(status, {"error": message}, headers)


def ascii_digits(text: str) -> int | None:
    """``text`` as a whole number if it is one or more ASCII digits, else None.

    ``str.isdigit()`` alone is not enough: ``"²".isdigit()`` is True but ``int("²")`` fails.
    """
    if not (text.isascii() and text.isdigit()):
        return None
    try:
        return int(text)
    except ValueError:  # more digits than int() accepts (sys.get_int_max_str_digits)
        return None


def parse_json_body(body: bytes) -> Any:
    """Decode a JSON request body; anything undecodable (or nested too deeply) is a :class:`BadRequest`."""
    try:
        return json.loads(body)
    except RecursionError as exc:
        raise BadRequest("body JSON is nested too deeply") from exc
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"body is not JSON: {exc}") from exc


def parse_cost(value: object) -> int:
    """A positive whole number of credits (``"3"``, ``3`` or ``3.0``)."""
    if isinstance(value, str):
        number = ascii_digits(value.strip())
        if number is None:
            raise BadRequest(f"cost must be a positive whole number, got {value!r}")
        value = number
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"cost must be a positive whole number, got {value!r}")
    if not 1 <= value <= MAX_COST:
        raise BadRequest(f"cost must be from 1 to {MAX_COST}, got {value}")
    return value


def whole_number(name: str, value: object, low: int, high: int) -> int:
    """``value`` (an int, a whole float or a string of ASCII digits) if it is from ``low`` to ``high``."""
    number = ascii_digits(value.strip()) if isinstance(value, str) else value
    if isinstance(number, float) and number.is_integer():
        number = int(number)
    if isinstance(number, bool) or not isinstance(number, int):
        raise BadRequest(f"{name} must be a whole number from {low} to {high}, got {value!r}")
    if not low <= number <= high:
        raise BadRequest(f"{name} must be from {low} to {high}, got {number}")
    return number


def parse_key(value: object) -> str:
    try:
        return validate_key(value)
    except RuleError as exc:
        raise BadRequest(str(exc)) from exc


def decode_path_key(raw: str) -> str:
    try:
        return parse_key(unquote(raw, errors="strict"))
    except UnicodeDecodeError as exc:
        raise BadRequest("key is not valid UTF-8") from exc


def parse_checks(body: bytes) -> list[tuple[str, int]]:
    payload = parse_json_body(body)
    checks = payload.get("checks") if isinstance(payload, dict) else None
    if not isinstance(checks, list) or not checks:
        raise BadRequest('body must be {"checks": [{"key": ..., "cost": ...}, ...]} with at least one check')
    if len(checks) > MAX_BATCH:
        raise BadRequest(f"at most {MAX_BATCH} checks per request, got {len(checks)}")
    parsed = []
    for index, item in enumerate(checks):
        if not isinstance(item, dict):
            raise BadRequest(f"checks[{index}] must be an object")
        try:
            parsed.append((parse_key(item.get("key")), parse_cost(item.get("cost", 1))))
        except BadRequest as exc:
            raise BadRequest(f"checks[{index}]: {exc}") from exc
    return parsed


def _json_object(body: bytes, allowed: frozenset[str], example: str) -> dict[str, Any]:
    payload = parse_json_body(body)
    if not isinstance(payload, dict):
        raise BadRequest(f"body must be a JSON object like {example}")
    unknown = sorted(set(payload) - allowed)
    if unknown:
        raise BadRequest(f"unknown field {unknown[0]!r}: the fields are {', '.join(sorted(allowed))}")
    return payload


def parse_acquire(body: bytes) -> tuple[str, int, int, int]:
    """``(key, cost, ttl_ms, max_wait_ms)`` of a ``POST /v1/acquire`` body."""
    payload = _json_object(body, ACQUIRE_FIELDS, '{"key": "db", "ttl_ms": 30000, "max_wait_ms": 250}')
    return (
        parse_key(payload.get("key")),
        parse_cost(payload.get("cost", 1)),
        whole_number("ttl_ms", payload.get("ttl_ms", DEFAULT_TTL_MS), 1, MAX_TTL_MS),
        whole_number("max_wait_ms", payload.get("max_wait_ms", 0), 0, MAX_WAIT_MS),
    )


def parse_release(body: bytes) -> tuple[str, int, int, int]:
    """``(key, lease, wait_ms, service_ms)`` of a ``POST /v1/release`` body."""
    payload = _json_object(body, RELEASE_FIELDS, '{"key": "db", "lease": 4294967297, "service_ms": 42}')
    if "lease" not in payload:
        raise BadRequest("lease is required: the lease of the acquire's answer")
    return (
        parse_key(payload.get("key")),
        whole_number("lease", payload["lease"], 1, MAX_LEASE),
        whole_number("wait_ms", payload.get("wait_ms", 0), 0, MAX_REPORTED_MS),
        whole_number("service_ms", payload.get("service_ms", 0), 0, MAX_REPORTED_MS),
    )


Handler = Callable[[HttpRequest], "HttpResponse | Awaitable[HttpResponse]"]


class CheckApi:
    """Routes requests; ``admin`` handles ``/v1/rules`` when given.

    ``wait_limit_ms`` caps how long a request is held (``max_wait_ms``): a
    front that must answer sooner (the router Lambda, within its timeout)
    lowers it, and a longer wait asked for is cut to it.

    Example::

        api = CheckApi(client)
        response = await api.handle(HttpRequest("POST", "/v1/acquire", body=b'{"key": "db"}'))
    """

    def __init__(
        self, client: PartitionClient, *, admin: Handler | None = None, wait_limit_ms: int = MAX_WAIT_MS
    ) -> None:
        self.client = client
        self.admin = admin
        self.wait_limit_ms = wait_limit_ms

    def handle(self, request: HttpRequest) -> HttpResponse | Awaitable[HttpResponse]:
        path = request.path
        try:
            if path.startswith(CHECK_PREFIX):
                if request.method not in ("GET", "HEAD"):
                    return error_response(405, "use GET /v1/check/{key} or POST /v1/check", [("Allow", "GET, HEAD")])
                return self._check_one(path[len(CHECK_PREFIX) :], request.query)
            if path == "/v1/check":
                if request.method != "POST":
                    return error_response(405, "use POST /v1/check with a JSON body", [("Allow", "POST")])
                return self._check_batch(parse_checks(request.body))
            if path in ("/v1/acquire", "/v1/release"):
                if request.method != "POST":
                    return error_response(405, f"use POST {path} with a JSON body", [("Allow", "POST")])
                if path == "/v1/acquire":
                    return self._acquire(*parse_acquire(request.body))
                return self._release(*parse_release(request.body))
            if path == "/healthz":
                return json_response(200, {"status": "ok", "partitions": len(self.client.addresses)})
            if path == "/v1/stats":
                return self._stats()
            if path == RULES_PREFIX or path.startswith(RULES_PREFIX + "/"):
                if self.admin is None:
                    return error_response(404, "the rules admin API is not served here")
                return self.admin(request)
        except BadRequest as exc:
            return error_response(400, str(exc))
        return error_response(404, f"no such resource: {path}")

    def _check_one(self, raw_key: str, query: str) -> Awaitable[HttpResponse]:
        key = decode_path_key(raw_key)
        params = parse_qs(query, keep_blank_values=True)
        cost = parse_cost(params["cost"][-1]) if "cost" in params else 1
        max_wait_ms = (
            whole_number("max_wait_ms", params["max_wait_ms"][-1], 0, MAX_WAIT_MS) if "max_wait_ms" in params else 0
        )
        if max_wait_ms and self.wait_limit_ms:
            return self._check_waiting(key, cost, min(max_wait_ms, self.wait_limit_ms))
        future = self.client.submit(key, cost)
        return _map_future(future, _single_response)

    async def _check_waiting(self, key: str, cost: int, max_wait_ms: int) -> HttpResponse:
        return _single_response(await self.client.check(key, cost, max_wait_ms=max_wait_ms))

    async def _acquire(self, key: str, cost: int, ttl_ms: int, max_wait_ms: int) -> HttpResponse:
        max_wait_ms = min(max_wait_ms, self.wait_limit_ms)
        decision = await self.client.acquire(key, cost, ttl_ms=ttl_ms, max_wait_ms=max_wait_ms)
        # A concurrency limit has no window (window_ms 0): its headers give the limit and what is free, no w/t.
        for_headers = replace(decision, window_ms=None) if decision.window_ms == 0 else decision
        status = 200 if decision.allowed else 429
        return json_response(status, decision.to_json(), rate_limit_headers(for_headers))

    async def _release(self, key: str, lease: int, wait_ms: int, service_ms: int) -> HttpResponse:
        outcome = await self.client.release_outcome(key, lease, wait_ms=wait_ms, service_ms=service_ms)
        answer: dict[str, Any] = {"key": key, "lease": lease, "released": bool(outcome and outcome.released)}
        if outcome is None:
            # Not confirmed: the lease is still reclaimed at the end of its ttl.
            error = "the partition did not answer; the lease ends at its ttl if the release was lost"
            return json_response(503, {**answer, "fallback": True, "error": error})
        answer["concurrency"] = outcome.concurrency or None
        if not outcome.released:
            error = "no such lease: released before, reclaimed after its ttl, or never granted for this key"
            return json_response(409, {**answer, "error": error})
        return json_response(200, answer)

    async def _check_batch(self, checks: list[tuple[str, int]]) -> HttpResponse:
        decisions = await self.client.check_many(checks)
        return json_response(
            200,
            {"results": [d.to_json() for d in decisions]},
            rate_limit_headers(most_restrictive(decisions)),
        )

    async def _stats(self) -> HttpResponse:
        client = self.client
        counters = await asyncio.gather(*(client.stats(index) for index in range(len(client.addresses))))
        return json_response(
            200,
            {
                "partitions": [c if c is not None else {"unreachable": True} for c in counters],
                "router": {"fallbacks": client.fallbacks, "timeouts": client.timeouts},
            },
        )


def _single_response(decision: Decision) -> HttpResponse:
    return json_response(200 if decision.allowed else 429, decision.to_json(), rate_limit_headers(decision))


def _map_future(
    future: asyncio.Future[Decision], build: Callable[[Decision], HttpResponse]
) -> asyncio.Future[HttpResponse]:
    # A plain future + callback is cheaper than a task per request on the hot path.
    # A failed or cancelled source must fail the mapped future too: a future that
    # never resolves would stall every later pipelined answer on the connection.
    mapped: asyncio.Future[HttpResponse] = future.get_loop().create_future()

    def done(source: asyncio.Future[Decision]) -> None:
        if mapped.done():
            return
        if source.cancelled():
            mapped.cancel()
            return
        error = source.exception()
        if error is not None:
            mapped.set_exception(error)
            return
        try:
            mapped.set_result(build(source.result()))
        except Exception as exc:
            mapped.set_exception(exc)

    future.add_done_callback(done)
    return mapped
