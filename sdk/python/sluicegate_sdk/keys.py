"""Which key a request spends: the client IP by default; a header, the user or the path as options.

A key function takes a :class:`RequestInfo` (the same for WSGI, ASGI and the
decorator) and returns the key, or None to leave the request unlimited.

Example:
    >>> request = RequestInfo("GET", "/search", "10.0.0.7", {"x-api-key": "k-42"}, None, raw=None)
    >>> client_ip(request), header("X-Api-Key")(request), path(request)
    ('10.0.0.7', 'k-42', '/search')
    >>> forwarded_for(hops=1)(RequestInfo("GET", "/", "10.0.0.1", {"x-forwarded-for": "1.2.3.4, 10.9.9.9"}, None, None))
    '10.9.9.9'
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class RequestInfo:
    """What key and cost functions see of a request. ``headers`` has lower-case names."""

    method: str
    path: str
    client_ip: str | None
    headers: Mapping[str, str]
    user: str | None
    raw: Any  # the WSGI environ, the ASGI scope, or the framework's request object

    @classmethod
    def from_wsgi(cls, environ: Mapping[str, Any], *, user: str | None = None, raw: Any = None) -> RequestInfo:
        headers = {name[5:].replace("_", "-").lower(): value for name, value in environ.items() if name[:5] == "HTTP_"}
        for name in ("CONTENT_TYPE", "CONTENT_LENGTH"):
            if environ.get(name):
                headers[name.replace("_", "-").lower()] = environ[name]
        return cls(
            environ.get("REQUEST_METHOD", "GET"),
            environ.get("PATH_INFO", "") or "/",
            environ.get("REMOTE_ADDR") or None,
            headers,
            user if user is not None else environ.get("REMOTE_USER") or None,
            environ if raw is None else raw,
        )

    @classmethod
    def from_asgi(cls, scope: Mapping[str, Any], *, raw: Any = None) -> RequestInfo:
        headers: dict[str, str] = {}
        for name, value in scope.get("headers", ()):
            key = name.decode("latin-1").lower()
            text = value.decode("latin-1")
            headers[key] = f"{headers[key]}, {text}" if key in headers else text
        client = scope.get("client")
        return cls(
            scope.get("method", "GET"),
            scope.get("path", "/") or "/",
            client[0] if client else None,
            headers,
            _asgi_user(scope.get("user")),
            scope if raw is None else raw,
        )


KeyFunc = Callable[[RequestInfo], "str | None"]
CostFunc = Callable[[RequestInfo], int]


def client_ip(request: RequestInfo) -> str | None:
    """The address of the peer (``REMOTE_ADDR``, the ASGI ``client``): the default key."""
    return request.client_ip


def header(name: str) -> KeyFunc:
    """The value of header ``name`` (e.g. an API key); requests without it are not limited."""
    lower = name.lower()

    def key(request: RequestInfo) -> str | None:
        return request.headers.get(lower) or None

    return key


def user(request: RequestInfo) -> str | None:
    """The authenticated user (WSGI ``REMOTE_USER``, ASGI ``scope["user"]``, Django's ``request.user``)."""
    return request.user


def path(request: RequestInfo) -> str | None:
    """The request path: one quota per endpoint, shared by every caller."""
    return request.path


def forwarded_for(hops: int = 1) -> KeyFunc:
    """The client IP behind ``hops`` trusted proxies (e.g. one ALB): that many entries from the right of
    ``X-Forwarded-For``; the peer address when the header is missing or shorter.
    """
    if hops < 1:
        raise ValueError("hops must be at least 1")

    def key(request: RequestInfo) -> str | None:
        chain = [part.strip() for part in request.headers.get("x-forwarded-for", "").split(",") if part.strip()]
        return chain[-hops] if len(chain) >= hops else request.client_ip

    return key


def _asgi_user(value: Any) -> str | None:
    # Starlette's AuthenticationMiddleware puts a BaseUser there; unauthenticated users have no name.
    if value is None or not getattr(value, "is_authenticated", True):
        return None
    for attribute in ("username", "display_name", "identity"):
        try:
            name = getattr(value, attribute, None)
        except NotImplementedError:  # BaseUser.identity unless a subclass defines it
            continue
        if isinstance(name, str) and name:
            return name
    return str(value)
