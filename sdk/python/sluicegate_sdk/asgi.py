"""ASGI middleware: rate-limit every HTTP request of an ASGI application (Starlette, FastAPI, ...).

Example (Starlette or FastAPI)::

    from sluicegate_sdk import AsyncClient
    from sluicegate_sdk.asgi import RateLimitMiddleware

    app.add_middleware(RateLimitMiddleware, client=AsyncClient("http://127.0.0.1:8080"))
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from sluicegate_sdk.checks import CheckError
from sluicegate_sdk.keys import CostFunc, KeyFunc, RequestInfo, client_ip
from sluicegate_sdk.limits import Limit, Reply, bad_key, rejection, response_headers

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
AsgiApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class RateLimitMiddleware:
    """Checks each HTTP request with ``client`` (an :class:`AsyncClient` or :class:`AsyncDirectClient`).

    Same options and answers as :class:`sluicegate_sdk.wsgi.RateLimitMiddleware`;
    websocket and lifespan traffic pass through unchecked.

    Example::

        app = RateLimitMiddleware(app, AsyncClient(), key=keys.user)
    """

    def __init__(self, app: AsgiApp, client: Any, *, key: KeyFunc = client_ip, cost: int | CostFunc = 1) -> None:
        self.app = app
        self.limit = Limit(client, key=key, cost=cost, asynchronous=True)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            target = self.limit.target(RequestInfo.from_asgi(scope))
        except CheckError as exc:
            await _send(bad_key(exc), send)
            return
        if target is None:
            await self.app(scope, receive, send)
            return
        decision = await self.limit.client.check(*target)
        if not decision.allowed:
            await _send(rejection(decision), send)
            return
        extra = _encode(response_headers(decision))
        if not extra:
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), *extra]}
            await send(message)

        await self.app(scope, receive, send_with_headers)


async def _send(reply: Reply, send: Send) -> None:
    headers = _encode([*reply.headers, ("Content-Length", str(len(reply.body)))])
    await send({"type": "http.response.start", "status": reply.status, "headers": headers})
    await send({"type": "http.response.body", "body": reply.body})


def _encode(headers: list[tuple[str, str]]) -> list[tuple[bytes, bytes]]:
    return [(name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in headers]
