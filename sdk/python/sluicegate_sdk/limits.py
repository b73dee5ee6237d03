"""What the WSGI and ASGI middleware and the decorator share: a request's key and cost, and the answers.

A throttled request gets 429 with ``Retry-After``, ``RateLimit``,
``RateLimit-Policy`` and a small JSON body; an allowed one goes on and its
response gets ``RateLimit`` and ``RateLimit-Policy`` (the IETF httpapi draft's
header fields, as the service itself sends them). A fallback decision (the
service unreachable) follows the client's ``on_error``: allowed without
headers, or 429 with ``Retry-After``.

Example:
    >>> from sluicegate.decision import Decision
    >>> reply = rejection(Decision("k", False, 0, 1500, capacity=10, window_ms=10_000))
    >>> reply.status, reply.body
    (429, b'{"error":"too many requests","retry_after":2}')
"""

from __future__ import annotations

import inspect
import json
from typing import Any, NamedTuple

from sluicegate.decision import Decision
from sluicegate.headers import rate_limit_headers
from sluicegate_sdk.checks import CheckError, validate_check
from sluicegate_sdk.keys import CostFunc, KeyFunc, RequestInfo, client_ip

Headers = list[tuple[str, str]]


class Reply(NamedTuple):
    """A response the middleware sends itself instead of calling the application."""

    status: int
    reason: str
    headers: Headers
    body: bytes


class Limit:
    """The key and cost of each request: ``key(request) -> str | None`` (None: not limited),
    ``cost`` a whole number or ``cost(request) -> int``.
    """

    def __init__(self, client: Any, *, key: KeyFunc = client_ip, cost: int | CostFunc = 1, asynchronous: bool) -> None:
        if not callable(getattr(client, "check", None)):
            raise TypeError(f"client must have a check(key, cost) method, got {type(client).__name__}")
        if inspect.iscoroutinefunction(client.check) != asynchronous:
            wanted = "AsyncClient or AsyncDirectClient" if asynchronous else "Client or DirectClient"
            raise TypeError(f"this integration needs a {wanted}, got {type(client).__name__}")
        if not callable(key):
            raise TypeError("key must be a function of the request (see sluicegate_sdk.keys)")
        if not callable(cost):
            validate_check("k", cost)  # a bad fixed cost is a configuration error: say so at start
        self.client = client
        self.key = key
        self.cost = cost

    def target(self, request: RequestInfo) -> tuple[str, int] | None:
        """``(key, cost)`` to check for ``request``, None if it is not limited; CheckError if unusable."""
        key = self.key(request)
        if key is None:
            return None
        cost = self.cost(request) if callable(self.cost) else self.cost
        return validate_check(key, cost)


def response_headers(decision: Decision) -> Headers:
    """The headers an allowed response gets (none after a fallback: nothing is known)."""
    return rate_limit_headers(decision)


def rejection(decision: Decision) -> Reply:
    """The 429 for a denied ``decision``."""
    headers = rate_limit_headers(decision)
    retry = next((int(value) for name, value in headers if name == "Retry-After"), None)
    body = json.dumps({"error": "too many requests", "retry_after": retry}, separators=(",", ":")).encode()
    return Reply(429, "Too Many Requests", [("Content-Type", "application/json"), *headers], body)


def bad_key(error: CheckError) -> Reply:
    """The 400 for a request whose key cannot be checked (e.g. an over-long header value)."""
    body = json.dumps({"error": f"rate-limit key: {error}"}, separators=(",", ":")).encode()
    return Reply(400, "Bad Request", [("Content-Type", "application/json")], body)
