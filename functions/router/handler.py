"""The router Lambda: the HTTP check API behind an ALB, over UDP to the partitions.

Every request goes to :class:`sluicegate.router.api.CheckApi`, the code
``sluicegate local`` serves, so both answer alike. What is Lambda-specific:

* Settings are read and validated once, at cold start (a bad setting fails
  the init with a message naming the variable).
* The event loop, the UDP socket and the resolved partition addresses live
  across invocations; partition names (Cloud Map ``p<i>.<namespace>``) are
  resolved again after ``SLUICEGATE_DNS_TTL_S`` and after a fallback.
* Powertools: ``ALBResolver``, ``Logger`` with the ALB trace id as the
  correlation id, ``Metrics`` (EMF: Checks, Allowed, Denied, Fallbacks,
  PartitionErrors, WouldDeny, CheckLatency; acquires and waiting checks count
  as checks), ``Tracer``.
* A request may be held (``max_wait_ms`` of an acquire or a check) only as
  long as the invocation has time left, less the partitions' retry budget and
  a margin: a longer wait asked for is cut to that.
"""

from __future__ import annotations

import asyncio
import math
import time
import warnings
from typing import Any

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.event_handler import ALBResolver, Response
from aws_lambda_powertools.event_handler.exceptions import NotFoundError
from aws_lambda_powertools.logging import correlation_paths
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext
from metered import MeteredClient

from sluicegate.config import Config
from sluicegate.directory import PartitionDirectory
from sluicegate.router.api import MAX_WAIT_MS, CheckApi, HttpRequest, HttpResponse
from sluicegate.router.lambda_proxy import http_request, response_fields

# Health checks and refused requests decide nothing: an invocation without metrics is normal.
warnings.filterwarnings("ignore", "No application metrics to publish", UserWarning)
logger = Logger()
metrics = Metrics()
tracer = Tracer()
app = ALBResolver()

# Cold start: everything below lives as long as the execution environment.
config = Config.from_env()
directory = PartitionDirectory(config.partition_endpoints(), ttl_s=config.dns_ttl_s)
loop = asyncio.new_event_loop()
client = MeteredClient(
    directory.addresses(),
    timeout_s=config.timeout_ms / 1000,
    attempts=config.attempts,
    fail_open=config.fail_open,
    max_datagram=config.max_datagram,
)
loop.run_until_complete(client.start())
api = CheckApi(client)
# Kept back from a held request's wait: the retries after it, and answering before the timeout.
WAIT_RESERVE_MS = math.ceil(config.timeout_ms * config.attempts) + 500
logger.info(
    "router ready",
    partitions=config.partitions,
    endpoints=[f"{host}:{port}" for host, port in directory.endpoints],
    unresolved=directory.unresolved(),
)


def _raw_query(event: dict[str, Any]) -> str:
    # The ALB passes query parameters as the client sent them (still percent-encoded).
    multi = event.get("multiValueQueryStringParameters")
    if multi:
        return "&".join(f"{name}={value}" for name, values in multi.items() for value in values)
    single = event.get("queryStringParameters") or {}
    return "&".join(f"{name}={value}" for name, value in single.items())


def _request() -> HttpRequest:
    event = app.current_event
    raw = event.raw_event
    return http_request(
        method=event.http_method,
        path=event.path,
        query=_raw_query(raw),
        headers=raw.get("headers"),
        body=event.decoded_body,
    )


async def _answer(request: HttpRequest) -> HttpResponse:
    answer = api.handle(request)  # checks are submitted here, so inside the running loop
    return answer if isinstance(answer, HttpResponse) else await answer


def _serve() -> Response:
    request = _request()
    # Between invocations nothing is in flight, so the addresses can change here.
    client.addresses[:] = directory.addresses()
    api.wait_limit_ms = max(0, min(MAX_WAIT_MS, app.lambda_context.get_remaining_time_in_millis() - WAIT_RESERVE_MS))
    started = time.perf_counter()
    answer = loop.run_until_complete(_answer(request))
    tally = client.take_tally()
    if tally.checks:
        metrics.add_metric(name="Checks", unit=MetricUnit.Count, value=tally.checks)
        metrics.add_metric(name="Allowed", unit=MetricUnit.Count, value=tally.allowed)
        metrics.add_metric(name="Denied", unit=MetricUnit.Count, value=tally.denied)
        metrics.add_metric(name="Fallbacks", unit=MetricUnit.Count, value=tally.fallbacks)
        metrics.add_metric(name="PartitionErrors", unit=MetricUnit.Count, value=tally.partition_errors)
        metrics.add_metric(name="WouldDeny", unit=MetricUnit.Count, value=tally.would_deny)
        metrics.add_metric(
            name="CheckLatency", unit=MetricUnit.Milliseconds, value=(time.perf_counter() - started) * 1000
        )
    if tally.fallbacks:
        # A partition did not answer: its task may have moved; look it up again next time.
        directory.expire()
        logger.warning("partitions did not answer; answered the fallback", fallbacks=tally.fallbacks)
    if request.method == "HEAD":
        answer.body = b""
    return Response(**response_fields(answer))


@app.get("/v1/check/<key>")
@app.route("/v1/check/<key>", method="HEAD")
@app.post("/v1/check")
@app.post("/v1/acquire")
@app.post("/v1/release")
@app.get("/healthz")
@app.get("/v1/stats")
def check(**_path_params: str) -> Response:
    return _serve()


@app.not_found
def other(_: NotFoundError) -> Response:
    # Unknown paths, other methods and keys the route pattern does not match: CheckApi answers them too.
    return _serve()


@logger.inject_lambda_context(correlation_id_path=correlation_paths.APPLICATION_LOAD_BALANCER)
@metrics.log_metrics
@tracer.capture_lambda_handler
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    return app.resolve(event, context)
