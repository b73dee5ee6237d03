"""The router Lambda: in the VPC, it hashes each key and asks the owning partition over UDP.

Its security group may send UDP to the bucket servers and nothing else: the
function needs no other network (Cloud Map names resolve through the VPC
resolver, logs/metrics/traces leave through Lambda itself).

Example:
    >>> router = Router(stack, "Router", vpc=vpc, fleet=fleet, code_directory=staged.router,
    ...                 log_retention=logs.RetentionDays.ONE_MONTH)  # doctest: +SKIP
    >>> router.function.function_name  # doctest: +SKIP
"""

from __future__ import annotations

from pathlib import Path

from aws_cdk import Duration
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from constructs import Construct

from infra.fleet import PARTITION_PORT, BucketFleet
from infra.lambdas import python_function
from infra.nag import acknowledge, acknowledge_lambda_role
from infra.network import ISOLATED

SERVICE = "sluicegate-router"
# A VPC round trip is well under 1 ms: 20 ms x 3 attempts bounds a check's wait for a lost partition to 60 ms.
TIMEOUT_MS = 20
ATTEMPTS = 3


class Router(Construct):
    """The router function (``function``) and its security group (``security_group``)."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        vpc: ec2.IVpc,
        fleet: BucketFleet,
        code_directory: Path,
        log_retention: logs.RetentionDays,
        fallback: str = "allow",
        memory_mib: int = 512,
        reserved_concurrency: int | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
        if fallback not in ("allow", "deny"):
            raise ValueError(f"Router fallback must be 'allow' or 'deny', not {fallback!r}")
        self.security_group = ec2.SecurityGroup(
            self, "SecurityGroup", vpc=vpc, allow_all_outbound=False, description="Sluicegate router Lambda"
        )
        self.security_group.add_egress_rule(
            fleet.security_group, ec2.Port.udp(PARTITION_PORT), "checks to the bucket servers"
        )
        fleet.allow_clients(self.security_group, "router Lambda")
        self.function = python_function(
            self,
            "Function",
            code_directory=code_directory,
            service=SERVICE,
            environment={
                **fleet.router_environment(),
                "SLUICEGATE_FALLBACK": fallback,
                "SLUICEGATE_TIMEOUT_MS": str(TIMEOUT_MS),
                "SLUICEGATE_ATTEMPTS": str(ATTEMPTS),
            },
            log_retention=log_retention,
            vpc=vpc,
            vpc_subnets=ISOLATED,
            security_groups=[self.security_group],
            memory_size=memory_mib,  # CPU grows with memory; 512 MB keeps the hashing and JSON fast
            timeout=Duration.seconds(5),
            tracing=lambda_.Tracing.ACTIVE,
            reserved_concurrent_executions=reserved_concurrency,
        )
        acknowledge_lambda_role(self.function, in_vpc=True)
        acknowledge(
            self.function,
            "AwsSolutions-IAM5[Resource::*]",
            "X-Ray PutTraceSegments and PutTelemetryRecords, which active tracing needs, "
            "have no resource-level permissions",
        )
