"""What the sync and async HTTP clients share: the endpoint, the requests, reading the answers.

Example:
    >>> endpoint = Endpoint.parse("http://quota.internal:8080/api")
    >>> endpoint.check_target("a b", 2)
    '/api/v1/check/a%20b?cost=2'
    >>> endpoint.check_target("db", 1, max_wait_ms=250)
    '/api/v1/check/db?max_wait_ms=250'
    >>> decisions(200, b'{"key":"a","allowed":true,"remaining":4,"retry_after_ms":0,"fallback":false}', 1)[0].remaining
    4
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import quote, urlsplit

from sluicegate.decision import Decision
from sluicegate_sdk.checks import CheckError, OnError

MAX_BATCH = 100  # checks per POST /v1/check (the service's limit)
USER_AGENT = "sluicegate-sdk-python/0.1"


class Unavailable(Exception):
    """The service did not give a usable answer (down, slow, or a 5xx): the check falls back."""


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where the check API is: ``http(s)://host[:port][/base path]``."""

    scheme: str
    host: str
    port: int
    base_path: str

    @classmethod
    def parse(cls, url: str) -> Endpoint:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"endpoint must be an http:// or https:// URL with a host, got {url!r}")
        if parts.query or parts.fragment:
            raise ValueError(f"endpoint must not have a query or fragment, got {url!r}")
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError as exc:
            raise ValueError(f"endpoint has a bad port: {url!r}") from exc
        return cls(parts.scheme, parts.hostname, port, parts.path.rstrip("/"))

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.scheme == "https" else 80
        return host if self.port == default else f"{host}:{self.port}"

    def check_target(self, key: str, cost: int, max_wait_ms: int = 0) -> str:
        """The request target of ``GET /v1/check/{key}?cost=N&max_wait_ms=M`` (the key percent-encoded)."""
        target = f"{self.base_path}/v1/check/{quote(key, safe='')}"
        query = [f"cost={cost}"] if cost != 1 else []
        if max_wait_ms:
            query.append(f"max_wait_ms={max_wait_ms}")
        return f"{target}?{'&'.join(query)}" if query else target

    @property
    def batch_target(self) -> str:
        return f"{self.base_path}/v1/check"

    @property
    def acquire_target(self) -> str:
        return f"{self.base_path}/v1/acquire"

    @property
    def release_target(self) -> str:
        return f"{self.base_path}/v1/release"


@dataclass(frozen=True)
class ClientOptions:
    """What both HTTP clients are built from, checked once: bad values raise ValueError."""

    endpoint: Endpoint
    timeout: float
    on_error: OnError
    pool_size: int
    headers: dict[str, str]  # sent with every request

    @classmethod
    def parse(
        cls, endpoint: str, *, timeout: float, on_error: str, pool_size: int, headers: Mapping[str, str] | None
    ) -> ClientOptions:
        if not timeout > 0:
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
        if pool_size < 1:
            raise ValueError(f"pool_size must be at least 1, got {pool_size!r}")
        parsed = Endpoint.parse(endpoint)
        fields = {"Host": parsed.host_header, "User-Agent": USER_AGENT, "Accept": "application/json", **(headers or {})}
        return cls(parsed, timeout, OnError(on_error), pool_size, fields)


def batch_body(checks: Sequence[tuple[str, int]]) -> bytes:
    return json.dumps({"checks": [{"key": key, "cost": cost} for key, cost in checks]}).encode()


def batches(checks: Sequence[tuple[str, int]]) -> list[Sequence[tuple[str, int]]]:
    """``checks`` in request-sized chunks, in order."""
    return [checks[i : i + MAX_BATCH] for i in range(0, len(checks), MAX_BATCH)]


def acquire_body(key: str, cost: int, ttl_ms: int, max_wait_ms: int) -> bytes:
    return json.dumps({"key": key, "cost": cost, "ttl_ms": ttl_ms, "max_wait_ms": max_wait_ms}).encode()


def release_body(key: str, lease: int, wait_ms: int, service_ms: int) -> bytes:
    return json.dumps({"key": key, "lease": lease, "wait_ms": wait_ms, "service_ms": service_ms}).encode()


def released(status: int, body: bytes) -> bool:
    """The answer to a release: True (given back) or False (the service holds no such lease).

    A 400 is our caller's mistake (:class:`CheckError`); anything else
    (503: the partition did not confirm it) raises :class:`Unavailable`.
    """
    if status == 400:
        raise CheckError(f"the service refused the release: {_error_message(body)}")
    if status not in (200, 409):
        raise Unavailable(f"HTTP {status}: {_error_message(body)}")
    try:
        return json.loads(body)["released"] is True
    except (ValueError, TypeError, KeyError) as exc:
        raise Unavailable(f"HTTP {status} with a body that is not a release's answer: {body[:200]!r}") from exc


def decisions(status: int, body: bytes, expected: int) -> list[Decision]:
    """The decisions of an answer to a check request of ``expected`` checks.

    A 400 is our caller's mistake (:class:`CheckError`); anything else that
    is not a well-formed 200/429 means the service is not answering properly
    (:class:`Unavailable`: the checks fall back).
    """
    if status == 400:
        raise CheckError(f"the service refused the check: {_error_message(body)}")
    if status not in (200, 429):
        raise Unavailable(f"HTTP {status}: {_error_message(body)}")
    try:
        payload = json.loads(body)
        results = payload["results"] if "results" in payload else [payload]
        found = [Decision.from_json(result) for result in results]
    except (ValueError, TypeError, KeyError) as exc:
        raise Unavailable(f"HTTP {status} with a body that is not a check result: {body[:200]!r}") from exc
    if len(found) != expected:
        raise Unavailable(f"asked {expected} checks, got {len(found)} results")
    return found


def _error_message(body: bytes) -> str:
    try:
        return str(json.loads(body)["error"])
    except (ValueError, TypeError, KeyError):
        return body[:200].decode("utf-8", "replace") or "(no body)"
