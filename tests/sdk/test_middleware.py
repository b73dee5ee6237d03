"""WSGI/ASGI middleware and the decorator on real Flask, Django and Starlette apps and test clients."""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import flask
import pytest
import werkzeug.test
from django.http import HttpResponse
from sluicegate_sdk import AsyncClient, AsyncDirectClient, Client, DirectClient, keys
from sluicegate_sdk.asgi import RateLimitMiddleware as AsgiRateLimit
from sluicegate_sdk.decorators import rate_limited
from sluicegate_sdk.wsgi import RateLimitMiddleware as WsgiRateLimit
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from tests.sdk import django_site
from tests.sdk.conftest import CAPACITY, Service
from tests.sdk.sfv import check_rate_limit_headers

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", "Using `httpx`")  # Starlette would rather use httpx2, which is not installed
    from starlette.testclient import TestClient

NAMES = ("RateLimit", "RateLimit-Policy", "Retry-After", "Content-Type")


def header_dict(headers: Any) -> dict[str, str]:
    """The headers that matter here, by their canonical names, from any framework's (case-insensitive) headers."""
    return {name: headers.get(name) for name in NAMES if headers.get(name) is not None}


def assert_limited(responses: list[tuple[int, dict[str, str], bytes]], *, body: bytes, cost: int = 1) -> None:
    """``CAPACITY // cost`` answers 200 with ``body`` and RateLimit headers, then 429 as the draft says."""
    allowed = CAPACITY // cost
    assert [status for status, _, _ in responses] == [200] * allowed + [429] * (len(responses) - allowed)
    for index, (_, headers, content) in enumerate(responses[:allowed]):
        policy = check_rate_limit_headers(headers)["default"]
        remaining = CAPACITY - cost * (index + 1)
        assert policy == {"q": CAPACITY, "w": 60, "r": remaining, "t": 20 * (CAPACITY - remaining)}
        assert "Retry-After" not in headers and content == body
    for _, headers, content in responses[allowed:]:
        policy = check_rate_limit_headers(headers)["default"]
        assert policy["r"] == CAPACITY - cost * allowed
        assert headers["Content-Type"] == "application/json"
        retry_after = int(headers["Retry-After"])
        assert 1 <= retry_after <= 20 * cost
        assert json.loads(content) == {"error": "too many requests", "retry_after": retry_after}


# --------------------------------------------------------------------------- Flask (WSGI)


def flask_app() -> flask.Flask:
    app = flask.Flask("sdk-test")
    app.add_url_rule("/hello", "hello", lambda: "hello from flask")
    return app


def flask_get(app: flask.Flask, path: str = "/hello", **options: Any) -> tuple[int, dict[str, str], bytes]:
    response = app.test_client().get(path, **options)
    return response.status_code, header_dict(response.headers), response.data


def test_flask_wsgi_middleware_limits_by_client_ip(service: Service, key: str) -> None:
    app = flask_app()
    app.wsgi_app = WsgiRateLimit(app.wsgi_app, Client(service.endpoint))  # type: ignore[method-assign]
    ip = f"10.{len(key)}.{sum(map(ord, key)) % 250}.{sum(map(ord, key[::2])) % 250}"
    responses = [flask_get(app, environ_base={"REMOTE_ADDR": ip}) for _ in range(CAPACITY + 2)]
    assert_limited(responses, body=b"hello from flask")
    status, headers, _ = flask_get(app, environ_base={"REMOTE_ADDR": "10.255.255.254"})
    assert status == 200 and check_rate_limit_headers(headers)["default"]["r"] == CAPACITY - 1  # its own quota


def test_flask_decorator_with_a_header_key_and_a_cost(service: Service, key: str) -> None:
    app = flask_app()
    limit = rate_limited(DirectClient(service.partitions), key=keys.header("X-Api-Key"), cost=2)
    app.add_url_rule("/search", "search", limit(lambda: flask.jsonify(found=1)))
    responses = [flask_get(app, "/search", headers={"X-Api-Key": key}) for _ in range(3)]
    assert_limited(responses, body=b'{"found":1}\n', cost=2)
    unkeyed = flask_get(app, "/search")
    assert unkeyed[0] == 200 and "RateLimit" not in unkeyed[1]  # no key: not limited


def test_the_user_key_gives_each_user_a_quota(service: Service, key: str) -> None:
    app = flask_app()
    app.wsgi_app = WsgiRateLimit(app.wsgi_app, Client(service.endpoint), key=keys.user)  # type: ignore[method-assign]
    for user in (f"{key}-ann", f"{key}-bob"):
        statuses = [flask_get(app, environ_base={"REMOTE_USER": user})[0] for _ in range(CAPACITY + 1)]
        assert statuses == [200] * CAPACITY + [429]


# --------------------------------------------------------------------------- Django (WSGI and decorator)


def hello_django(request: Any) -> HttpResponse:
    return HttpResponse("hello from django", content_type="text/plain")


@pytest.fixture(scope="module")
def django_views(service: Service) -> Iterator[Callable[[], Any]]:
    """Django serving /hello (plain) and /limited (decorated, keyed by client IP); the WSGI application."""
    django_site.install(
        {
            "hello": hello_django,
            "limited": rate_limited(Client(service.endpoint))(hello_django),
        }
    )
    from django.core.wsgi import get_wsgi_application

    yield get_wsgi_application


def test_django_wsgi_middleware_through_a_wsgi_client(
    service: Service, key: str, django_views: Callable[[], Any]
) -> None:
    application = WsgiRateLimit(django_views(), Client(service.endpoint), key=keys.header("X-Client"))
    client = werkzeug.test.Client(application)
    responses = []
    for _ in range(CAPACITY + 1):
        response = client.get("/hello", headers={"X-Client": key})
        responses.append((response.status_code, header_dict(response.headers), response.data))
    assert_limited(responses, body=b"hello from django")


def test_django_decorator_through_the_django_test_client(django_views: Callable[[], Any], key: str) -> None:
    from django.test import Client as DjangoClient

    client = DjangoClient(REMOTE_ADDR=f"192.0.2.{sum(map(ord, key)) % 250}")
    responses = []
    for _ in range(CAPACITY + 1):
        response = client.get("/limited")
        responses.append((response.status_code, header_dict(response.headers), response.content))
    assert_limited(responses, body=b"hello from django")


# --------------------------------------------------------------------------- Starlette (ASGI and decorator)


async def hello_starlette(request: Any) -> PlainTextResponse:
    return PlainTextResponse("hello from starlette")


def starlette_get(client: TestClient, path: str, **options: Any) -> tuple[int, dict[str, str], bytes]:
    response = client.get(path, **options)
    return response.status_code, header_dict(response.headers), response.content


def test_starlette_asgi_middleware(service: Service, key: str) -> None:
    app = Starlette(routes=[Route("/hello", hello_starlette)])
    app.add_middleware(AsgiRateLimit, client=AsyncClient(service.endpoint), key=keys.header("X-Client"))
    with TestClient(app) as client:
        responses = [starlette_get(client, "/hello", headers={"X-Client": key}) for _ in range(CAPACITY + 1)]
    assert_limited(responses, body=b"hello from starlette")


def test_starlette_decorator_on_async_and_sync_endpoints(service: Service, key: str) -> None:
    by_header = keys.header("X-Client")

    @rate_limited(AsyncDirectClient(service.partitions), key=by_header)
    async def async_endpoint(request: Any) -> PlainTextResponse:
        return PlainTextResponse("async")

    @rate_limited(DirectClient(service.partitions), key=by_header)
    def sync_endpoint(request: Any) -> PlainTextResponse:
        return PlainTextResponse("sync")

    app = Starlette(routes=[Route("/async", async_endpoint), Route("/sync", sync_endpoint)])
    with TestClient(app) as client:
        for path, body in (("/async", b"async"), ("/sync", b"sync")):
            headers = {"X-Client": f"{key}{path}"}
            assert_limited([starlette_get(client, path, headers=headers) for _ in range(CAPACITY + 1)], body=body)


# --------------------------------------------------------------------------- fallbacks, bad keys, wrong clients


@pytest.mark.parametrize("on_error", ["allow", "deny"])
def test_service_down_follows_on_error_in_wsgi_and_asgi(on_error: str) -> None:
    dead = "http://127.0.0.1:9"
    app = flask_app()
    app.wsgi_app = WsgiRateLimit(app.wsgi_app, Client(dead, timeout=0.2, on_error=on_error))  # type: ignore[method-assign]
    starlette = Starlette(routes=[Route("/hello", hello_starlette)])
    starlette.add_middleware(AsgiRateLimit, client=AsyncClient(dead, timeout=0.2, on_error=on_error))
    with TestClient(starlette) as client:
        answers = [flask_get(app), starlette_get(client, "/hello")]
    for status, headers, content in answers:
        assert "RateLimit" not in headers and "RateLimit-Policy" not in headers  # nothing is known about the quota
        if on_error == "allow":
            assert status == 200 and content.startswith(b"hello")
        else:
            assert status == 429 and headers["Retry-After"] == "1"
            assert json.loads(content) == {"error": "too many requests", "retry_after": 1}


def test_a_key_the_service_cannot_take_is_a_400(service: Service) -> None:
    app = flask_app()
    app.wsgi_app = WsgiRateLimit(app.wsgi_app, Client(service.endpoint), key=keys.header("X-Api-Key"))  # type: ignore[method-assign]
    status, headers, content = flask_get(app, headers={"X-Api-Key": "k" * 300})
    assert status == 400 and headers["Content-Type"] == "application/json"
    assert "longer than 256" in json.loads(content)["error"]


def test_a_client_of_the_wrong_kind_is_refused_at_setup(service: Service) -> None:
    with pytest.raises(TypeError, match="Client or DirectClient"):
        WsgiRateLimit(flask_app().wsgi_app, AsyncClient(service.endpoint))
    with pytest.raises(TypeError, match="AsyncClient or AsyncDirectClient"):
        AsgiRateLimit(Starlette(), DirectClient(service.partitions))
    with pytest.raises(TypeError, match="AsyncClient or AsyncDirectClient"):
        rate_limited(Client(service.endpoint))(hello_starlette)
