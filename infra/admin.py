"""The rules admin Lambda behind a function URL that only IAM-signed requests pass.

With DynamoDB it stays outside the VPC (IAM decides what it may touch). With
Aurora it joins the VPC, reads the database secret itself from Secrets Manager
(``SLUICEGATE_POSTGRES_SECRET_ARN``: a Lambda environment cannot hold a secret
reference safely) and loads psycopg from a layer.

Example:
    >>> admin = Admin(stack, "Admin", storage=storage, vpc=vpc, code_directory=staged.admin,
    ...               log_retention=logs.RetentionDays.ONE_MONTH, build_dir=Path("build"))  # doctest: +SKIP
    >>> admin.url.url  # doctest: +SKIP
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from constructs import Construct

from infra.assets import psycopg_layer
from infra.lambdas import RUNTIME, python_function
from infra.nag import acknowledge_lambda_role
from infra.network import ISOLATED
from infra.storage import POSTGRES_PORT, Storage

SERVICE = "sluicegate-admin"


class Admin(Construct):
    """The admin function (``function``) and its IAM-only URL (``url``)."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        storage: Storage,
        vpc: ec2.IVpc,
        code_directory: Path,
        log_retention: logs.RetentionDays,
        build_dir: Path,
    ) -> None:
        super().__init__(scope, construct_id)
        environment = storage.environment()
        options: dict[str, Any] = {}
        if storage.cluster is not None and storage.cluster.secret is not None:
            security_group = ec2.SecurityGroup(
                self, "SecurityGroup", vpc=vpc, allow_all_outbound=False, description="Sluicegate admin Lambda"
            )
            security_group.add_egress_rule(ec2.Peer.any_ipv4(), ec2.Port.tcp(443), "Secrets Manager via its endpoint")
            if storage.database_security_group is not None:
                security_group.add_egress_rule(
                    storage.database_security_group, ec2.Port.tcp(POSTGRES_PORT), "Aurora PostgreSQL"
                )
            storage.allow_connections(security_group, "admin Lambda")
            layer = lambda_.LayerVersion(
                self,
                "Psycopg",
                code=lambda_.Code.from_asset(str(psycopg_layer(build_dir=build_dir))),
                compatible_runtimes=[RUNTIME],
                compatible_architectures=[lambda_.Architecture.ARM_64],
                description="psycopg 3 with its binary libpq, for the admin Lambda's PostgreSQL store",
            )
            environment["SLUICEGATE_POSTGRES_SECRET_ARN"] = storage.cluster.secret.secret_arn
            options = {"vpc": vpc, "vpc_subnets": ISOLATED, "security_groups": [security_group], "layers": [layer]}
        self.function = python_function(
            self,
            "Function",
            code_directory=code_directory,
            service=SERVICE,
            environment=environment,
            log_retention=log_retention,
            memory_size=256,
            **options,
        )
        storage.grant(self.function, secret=True)
        self.url = self.function.add_function_url(auth_type=lambda_.FunctionUrlAuthType.AWS_IAM)
        acknowledge_lambda_role(self.function, in_vpc="vpc" in options)
