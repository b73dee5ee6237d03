"""WSGI middleware: rate-limit every request of a WSGI application (Flask, Django, ...).

Example (Flask)::

    from sluicegate_sdk import Client
    from sluicegate_sdk.wsgi import RateLimitMiddleware

    app.wsgi_app = RateLimitMiddleware(app.wsgi_app, Client("http://127.0.0.1:8080"))
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from sluicegate_sdk.checks import CheckError
from sluicegate_sdk.keys import CostFunc, KeyFunc, RequestInfo, client_ip
from sluicegate_sdk.limits import Limit, Reply, bad_key, rejection, response_headers

StartResponse = Callable[..., Any]
WsgiApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]


class RateLimitMiddleware:
    """Checks each request with ``client`` (a :class:`Client` or :class:`DirectClient`) before ``app`` runs.

    ``key(request)`` picks the key (default: the client IP; see
    :mod:`sluicegate_sdk.keys`; None leaves a request unlimited) and ``cost``
    what it spends (a number or ``cost(request)``). A throttled request gets
    429 with ``Retry-After``, ``RateLimit`` and ``RateLimit-Policy``; allowed
    responses carry ``RateLimit`` and ``RateLimit-Policy``.

    Example::

        application = RateLimitMiddleware(application, Client(), key=keys.header("X-Api-Key"))
    """

    def __init__(self, app: WsgiApp, client: Any, *, key: KeyFunc = client_ip, cost: int | CostFunc = 1) -> None:
        self.app = app
        self.limit = Limit(client, key=key, cost=cost, asynchronous=False)

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        try:
            target = self.limit.target(RequestInfo.from_wsgi(environ))
        except CheckError as exc:
            return _send(bad_key(exc), start_response)
        if target is None:
            return self.app(environ, start_response)
        decision = self.limit.client.check(*target)
        if not decision.allowed:
            return _send(rejection(decision), start_response)
        extra = response_headers(decision)
        if not extra:
            return self.app(environ, start_response)

        def start_with_headers(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            return start_response(status, [*headers, *extra], exc_info)

        return self.app(environ, start_with_headers)


def _send(reply: Reply, start_response: StartResponse) -> list[bytes]:
    start_response(f"{reply.status} {reply.reason}", [*reply.headers, ("Content-Length", str(len(reply.body)))])
    return [reply.body]
