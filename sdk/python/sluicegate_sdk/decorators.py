"""``@rate_limited``: limit one view (Flask, Django) or endpoint (Starlette), sync or async.

Example (Flask)::

    from sluicegate_sdk import Client
    from sluicegate_sdk.decorators import rate_limited

    @app.post("/search")
    @rate_limited(Client("http://127.0.0.1:8080"), cost=5)
    def search(): ...
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

from sluicegate.decision import Decision
from sluicegate_sdk.checks import CheckError
from sluicegate_sdk.frameworks import Framework, find_request
from sluicegate_sdk.keys import CostFunc, KeyFunc, client_ip
from sluicegate_sdk.limits import Limit, bad_key, rejection, response_headers

View = TypeVar("View", bound=Callable[..., Any])


def rate_limited(client: Any, *, key: KeyFunc = client_ip, cost: int | CostFunc = 1) -> Callable[[View], View]:
    """Check each call of the view with ``client`` first; answers as the middleware does.

    A sync view needs a :class:`Client` or :class:`DirectClient`, an ``async
    def`` one an :class:`AsyncClient` or :class:`AsyncDirectClient`. ``key``
    and ``cost`` as for :class:`sluicegate_sdk.wsgi.RateLimitMiddleware`.

    Example (Django)::

        @rate_limited(client, key=keys.user)
        def report(request): ...
    """

    def decorate(view: View) -> View:
        asynchronous = inspect.iscoroutinefunction(view)
        limit = Limit(client, key=key, cost=cost, asynchronous=asynchronous)

        if asynchronous:

            @functools.wraps(view)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                framework, request = find_request(args)
                try:
                    target = limit.target(framework.info(request))
                except CheckError as exc:
                    return framework.reply(bad_key(exc))
                if target is None:
                    return await view(*args, **kwargs)
                decision = await limit.client.check(*target)
                if not decision.allowed:
                    return framework.reply(rejection(decision))
                return _with_headers(framework, await view(*args, **kwargs), decision)

            return async_wrapper  # type: ignore[return-value]

        @functools.wraps(view)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            framework, request = find_request(args)
            try:
                target = limit.target(framework.info(request))
            except CheckError as exc:
                return framework.reply(bad_key(exc))
            if target is None:
                return view(*args, **kwargs)
            decision = limit.client.check(*target)
            if not decision.allowed:
                return framework.reply(rejection(decision))
            return _with_headers(framework, view(*args, **kwargs), decision)

        return wrapper  # type: ignore[return-value]

    return decorate


def _with_headers(framework: Framework, response: Any, decision: Decision) -> Any:
    headers = response_headers(decision)
    return framework.add_headers(response, headers) if headers else response
