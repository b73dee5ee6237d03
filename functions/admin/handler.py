"""The rules admin Lambda: ``PUT|GET|DELETE /v1/rules/{key}`` and ``GET /v1/rules``.

Reached only through a function URL with ``AWS_IAM`` auth: AWS checks the
caller's SigV4 signature and policy before we run, and passes the caller's
identity in ``requestContext.authorizer.iam``. An event without it did not
come through that URL (or the URL was reconfigured to ``NONE``), so it is
refused (403) rather than trusted.

The API itself is :class:`sluicegate.router.admin.RulesAdmin`, the code
``sluicegate local`` serves: same validation, same 400 messages. The bucket
servers pick a change up within their rule sync interval.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from aws_lambda_powertools import Logger, Tracer
from aws_lambda_powertools.event_handler import LambdaFunctionUrlResolver, Response
from aws_lambda_powertools.event_handler.exceptions import NotFoundError
from aws_lambda_powertools.utilities.typing import LambdaContext

from sluicegate.config import Config, ConfigError
from sluicegate.router.admin import RulesAdmin
from sluicegate.router.api import HttpRequest, error_response
from sluicegate.router.lambda_proxy import http_request, proxy_result, response_fields
from sluicegate.store import store_from_config

logger = Logger()
tracer = Tracer()
app = LambdaFunctionUrlResolver()


def load_config(environ: dict[str, str]) -> Config:
    """The settings; with ``SLUICEGATE_POSTGRES_SECRET_ARN``, the Aurora secret fetched once."""
    arn = environ.get("SLUICEGATE_POSTGRES_SECRET_ARN")
    if arn and not environ.get("SLUICEGATE_POSTGRES_SECRET"):
        from aws_lambda_powertools.utilities.parameters import get_secret

        try:
            environ = {**environ, "SLUICEGATE_POSTGRES_SECRET": str(get_secret(arn))}
        except Exception as exc:  # Powertools wraps boto3's errors in its own
            raise ConfigError(f"SLUICEGATE_POSTGRES_SECRET_ARN: cannot read {arn}: {exc}") from exc
    return Config.from_env(environ)


# Cold start: settings checked once; the store client is reused by every invocation.
config = load_config(dict(os.environ))
store = store_from_config(config)
if config.store == "postgres":
    store.migrate()  # idempotent; an Aurora cluster starts with an empty database
admin = RulesAdmin(store, token="")  # IAM authenticates, not a token: see caller()
loop = asyncio.new_event_loop()


def caller(event: dict[str, Any]) -> str | None:
    """The IAM principal AWS verified for this request, or None."""
    identity = ((event.get("requestContext") or {}).get("authorizer") or {}).get("iam") or {}
    return identity.get("userArn") or identity.get("callerId") or None


def _request() -> HttpRequest:
    event = app.current_event
    raw = event.raw_event
    return http_request(
        method=event.http_method,
        path=raw.get("rawPath") or event.path,
        query=raw.get("rawQueryString") or "",
        headers=raw.get("headers"),
        body=event.decoded_body,
    )


def _serve() -> Response:
    request = _request()
    if request.path != "/v1/rules" and not request.path.startswith("/v1/rules/"):
        return Response(**response_fields(error_response(404, f"no such resource: {request.path}")))
    answer = loop.run_until_complete(admin.serve(request))
    if request.method in ("PUT", "DELETE") and answer.status < 300:
        who = caller(app.current_event.raw_event)
        logger.info("rule changed", method=request.method, path=request.path, caller=who)
    return Response(**response_fields(answer))


@app.route("/v1/rules", method=["GET", "PUT", "DELETE", "POST"])
@app.route("/v1/rules/<key>", method=["GET", "PUT", "DELETE", "POST"])
def rules(**_path_params: str) -> Response:
    return _serve()


@app.not_found
def other(_: NotFoundError) -> Response:
    return _serve()


@logger.inject_lambda_context
@tracer.capture_lambda_handler
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    if caller(event) is None:
        logger.warning("refused a request without IAM identity")
        return proxy_result(error_response(403, "the rules admin API needs IAM authentication (AWS_IAM function URL)"))
    return app.resolve(event, context)
