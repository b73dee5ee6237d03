"""Key functions see the same request whether it comes from WSGI, ASGI or a framework."""

from __future__ import annotations

import pytest
from sluicegate_sdk import keys
from sluicegate_sdk.keys import RequestInfo
from starlette.authentication import SimpleUser, UnauthenticatedUser

ENVIRON = {
    "REQUEST_METHOD": "POST",
    "PATH_INFO": "/v2/search",
    "REMOTE_ADDR": "10.0.0.1",
    "REMOTE_USER": "ann",
    "HTTP_X_API_KEY": "key-42",
    "HTTP_X_FORWARDED_FOR": "203.0.113.9, 198.51.100.7",
    "CONTENT_TYPE": "application/json",
}
SCOPE = {
    "type": "http",
    "method": "POST",
    "path": "/v2/search",
    "client": ("10.0.0.1", 50000),
    "headers": [(b"x-api-key", b"key-42"), (b"x-forwarded-for", b"203.0.113.9, 198.51.100.7")],
    "user": SimpleUser("ann"),
}


@pytest.mark.parametrize(
    "request_info", [RequestInfo.from_wsgi(ENVIRON), RequestInfo.from_asgi(SCOPE)], ids=["wsgi", "asgi"]
)
def test_key_functions(request_info: RequestInfo) -> None:
    assert keys.client_ip(request_info) == "10.0.0.1"
    assert keys.header("X-API-Key")(request_info) == "key-42"
    assert keys.header("X-Missing")(request_info) is None
    assert keys.user(request_info) == "ann"
    assert keys.path(request_info) == "/v2/search"
    assert keys.forwarded_for(1)(request_info) == "198.51.100.7"  # the address our one proxy saw
    assert keys.forwarded_for(2)(request_info) == "203.0.113.9"
    assert keys.forwarded_for(3)(request_info) == "10.0.0.1"  # shorter than the trusted chain: the peer


def test_unauthenticated_and_missing_users_have_no_key() -> None:
    assert keys.user(RequestInfo.from_asgi({**SCOPE, "user": UnauthenticatedUser()})) is None
    assert keys.user(RequestInfo.from_asgi({k: v for k, v in SCOPE.items() if k != "user"})) is None
    assert keys.user(RequestInfo.from_wsgi({k: v for k, v in ENVIRON.items() if k != "REMOTE_USER"})) is None


def test_repeated_asgi_headers_are_joined_as_http_says() -> None:
    scope = {**SCOPE, "headers": [(b"x-forwarded-for", b"203.0.113.9"), (b"x-forwarded-for", b"198.51.100.7")]}
    assert keys.forwarded_for(1)(RequestInfo.from_asgi(scope)) == "198.51.100.7"
