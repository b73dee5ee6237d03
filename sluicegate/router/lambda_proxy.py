"""Between Lambda proxy events (ALB, function URL) and :class:`HttpRequest`/:class:`HttpResponse`.

Plain data in and out, so the core needs no Powertools: the functions pass
``response_fields(answer)`` to Powertools' ``Response(**...)``.

Example:
    >>> response_fields(HttpResponse(429, b"{}", [("Content-Type", "application/json"), ("Retry-After", "2")]))
    {'status_code': 429, 'content_type': 'application/json', 'body': '{}', 'headers': {'Retry-After': '2'}}
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sluicegate.router.api import HttpRequest, HttpResponse


def http_request(
    *, method: str, path: str, query: str, headers: Mapping[str, str] | None, body: str | bytes | None
) -> HttpRequest:
    """A request from an event's fields (the body already base64-decoded)."""
    return HttpRequest(
        method=method,
        path=path,
        query=query,
        headers={name.lower(): value for name, value in (headers or {}).items()},
        body=(body or "").encode("utf-8") if isinstance(body, str | None) else body,
    )


def response_fields(answer: HttpResponse) -> dict[str, Any]:
    """Keyword arguments for Powertools' ``Response``."""
    headers = dict(answer.headers)
    return {
        "status_code": answer.status,
        "content_type": headers.pop("Content-Type", None),
        "body": answer.body.decode("utf-8"),
        "headers": headers,
    }


def proxy_result(answer: HttpResponse) -> dict[str, Any]:
    """A proxy-integration result built directly (for answers given before any routing)."""
    return {
        "statusCode": answer.status,
        "headers": dict(answer.headers),
        "body": answer.body.decode("utf-8"),
        "isBase64Encoded": False,
    }
