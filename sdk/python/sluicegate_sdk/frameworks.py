"""How the decorator finds the request and builds responses in Django, Starlette and Flask.

Each framework is imported only when a view of it is called, so the SDK
itself needs none of them.
"""

from __future__ import annotations

import sys
from typing import Any

from sluicegate_sdk.keys import RequestInfo
from sluicegate_sdk.limits import Headers, Reply


class Django:
    """A view called as ``view(request, ...)`` (also a method: ``view(self, request, ...)``)."""

    @staticmethod
    def matches(obj: Any) -> bool:
        return hasattr(obj, "META") and hasattr(obj, "method")

    @staticmethod
    def info(request: Any) -> RequestInfo:
        user = getattr(request, "user", None)
        name = user.get_username() if user is not None and getattr(user, "is_authenticated", False) else None
        return RequestInfo.from_wsgi(request.META, user=name or None, raw=request)

    @staticmethod
    def reply(reply: Reply) -> Any:
        from django.http import HttpResponse

        response = HttpResponse(reply.body, status=reply.status)
        return Django.add_headers(response, reply.headers)

    @staticmethod
    def add_headers(response: Any, headers: Headers) -> Any:
        for name, value in headers:
            response[name] = value
        return response


class Starlette:
    """An endpoint called as ``endpoint(request)`` with a Starlette ``Request``."""

    @staticmethod
    def matches(obj: Any) -> bool:
        return hasattr(obj, "scope") and hasattr(obj, "receive")

    @staticmethod
    def info(request: Any) -> RequestInfo:
        return RequestInfo.from_asgi(request.scope, raw=request)

    @staticmethod
    def reply(reply: Reply) -> Any:
        from starlette.responses import Response

        return Response(reply.body, status_code=reply.status, headers=dict(reply.headers))

    @staticmethod
    def add_headers(response: Any, headers: Headers) -> Any:
        for name, value in headers:
            response.headers[name] = value
        return response


class Flask:
    """A view called without the request (it is ``flask.request``); it may return anything Flask accepts."""

    @staticmethod
    def current() -> Any:
        flask = sys.modules.get("flask")
        return flask.request if flask is not None and flask.has_request_context() else None

    @staticmethod
    def info(request: Any) -> RequestInfo:
        return RequestInfo.from_wsgi(request.environ, raw=request)

    @staticmethod
    def reply(reply: Reply) -> Any:
        import flask

        return flask.Response(reply.body, status=reply.status, headers=reply.headers)

    @staticmethod
    def add_headers(response: Any, headers: Headers) -> Any:
        import flask

        response = flask.make_response(response)
        for name, value in headers:
            response.headers[name] = value
        return response


Framework = type[Django] | type[Starlette] | type[Flask]


def find_request(args: tuple[Any, ...]) -> tuple[Framework, Any]:
    """The framework and the request of a view call, from its positional arguments (or Flask's context)."""
    for arg in args[:2]:  # (request, ...) or (self, request, ...)
        for framework in (Django, Starlette):
            if framework.matches(arg):
                return framework, arg
    request = Flask.current()
    if request is not None:
        return Flask, request
    raise TypeError(
        "rate_limited: no request found; decorate a Django view (request first), "
        "a Starlette endpoint (request first) or a Flask view"
    )
