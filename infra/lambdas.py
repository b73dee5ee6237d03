"""What our Python Lambdas share: runtime, architecture, the Powertools layer, a log group with retention.

Example:
    >>> function = python_function(stack, "Router", code_directory=staged.router, service="sluicegate-router",
    ...                            environment={}, log_retention=logs.RetentionDays.ONE_MONTH)  # doctest: +SKIP
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aws_cdk import Duration, RemovalPolicy, Stack
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_ssm as ssm
from aws_lambda_powertools.shared.version import VERSION as POWERTOOLS_VERSION
from constructs import Construct

from infra.nag import acknowledge

RUNTIME = lambda_.Runtime.PYTHON_3_12
ARCHITECTURE = lambda_.Architecture.ARM_64
HANDLER = "handler.handler"
METRICS_NAMESPACE = "Sluicegate"
# The public Powertools for AWS Lambda (Python) layer (with the tracer's aws-xray-sdk). AWS publishes its ARN per
# region, runtime, architecture and release in public SSM parameters; we deploy the release our tests ran with
# (the version installed from requirements-dev.txt). CloudFormation resolves the parameter at deploy time, so
# synth makes no AWS call.
POWERTOOLS_PARAMETER = "/aws/service/powertools/python/arm64/{runtime}/{version}"


def powertools_layer(scope: Construct, *, version: str = POWERTOOLS_VERSION) -> lambda_.ILayerVersion:
    """The Powertools layer of the stack's region (one per stack, shared by our functions)."""
    stack = Stack.of(scope)
    existing = stack.node.try_find_child("PowertoolsLayer")
    if existing is not None:
        return existing  # type: ignore[return-value]
    parameter = POWERTOOLS_PARAMETER.format(runtime=RUNTIME.name, version=version)
    arn = ssm.StringParameter.value_for_string_parameter(stack, parameter)
    return lambda_.LayerVersion.from_layer_version_arn(stack, "PowertoolsLayer", arn)


def python_function(
    scope: Construct,
    construct_id: str,
    *,
    code_directory: Path,
    service: str,
    environment: dict[str, str],
    log_retention: logs.RetentionDays,
    layers: list[lambda_.ILayerVersion] | None = None,
    **options: Any,
) -> lambda_.Function:
    """An arm64 Python 3.12 function running ``handler.handler`` from ``code_directory``, with Powertools."""
    log_group = logs.LogGroup(
        scope, f"{construct_id}Logs", retention=log_retention, removal_policy=RemovalPolicy.DESTROY
    )
    function = lambda_.Function(
        scope,
        construct_id,
        runtime=RUNTIME,
        architecture=ARCHITECTURE,
        handler=HANDLER,
        code=lambda_.Code.from_asset(str(code_directory)),
        layers=[powertools_layer(scope), *(layers or [])],
        environment={
            "POWERTOOLS_SERVICE_NAME": service,
            "POWERTOOLS_METRICS_NAMESPACE": METRICS_NAMESPACE,
            **environment,
        },
        log_group=log_group,
        timeout=options.pop("timeout", Duration.seconds(10)),
        **options,
    )
    acknowledge(
        function,
        "AwsSolutions-L1",
        "pinned to Python 3.12, the newest runtime the Powertools layer and our tested core both support",
    )
    return function
