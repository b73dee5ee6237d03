"""The Sluicegate stack: network, store, bucket fleet, router, front, admin and observability composed.

Environment-agnostic (no account/region at synth): availability zones and the
Powertools layer's region resolve at deploy, so synth makes no AWS calls.

Example:
    >>> app = App()  # doctest: +SKIP
    >>> SluicegateStack(app, "Sluicegate", settings=DeploySettings(partitions=4),
    ...                 assets=stage_assets(build_dir=BUILD), build_dir=BUILD)  # doctest: +SKIP
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aws_cdk import CfnOutput, Stack, Tags
from aws_cdk import aws_logs as logs
from constructs import Construct

from infra.admin import Admin
from infra.assets import StagedAssets
from infra.fleet import BucketFleet
from infra.front import AlbFront, Route53Front
from infra.network import Network
from infra.observability import Observability
from infra.router import SERVICE as ROUTER_SERVICE
from infra.router import Router
from infra.settings import DeploySettings
from infra.storage import Storage

LOG_RETENTION = logs.RetentionDays.ONE_MONTH


class SluicegateStack(Stack):
    """Everything one Sluicegate deployment needs, shaped by ``settings``."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        settings: DeploySettings,
        assets: StagedAssets,
        build_dir: Path,
        **stack_options: Any,
    ) -> None:
        super().__init__(
            scope,
            construct_id,
            description=f"Sluicegate quota service: {settings.partitions} partitions, front={settings.front}, "
            f"store={'aurora-postgresql' if settings.aurora else 'dynamodb'}",
            **stack_options,
        )
        Tags.of(self).add("application", "sluicegate")
        alb = settings.front == "alb"
        network = Network(
            self,
            "Network",
            public=alb and settings.internet_facing,
            dynamodb=not settings.aurora,
            secrets=settings.aurora,
        )
        storage = Storage(self, "Storage", vpc=network.vpc, aurora=settings.aurora)
        fleet = BucketFleet(
            self,
            "Fleet",
            vpc=network.vpc,
            partitions=settings.partitions,
            image_directory=assets.bucket_server,
            storage=storage,
            log_retention=LOG_RETENTION,
        )
        # The router runs in both fronts, so switching front never touches the fleet or its alarms.
        checks = Router(
            self, "Router", vpc=network.vpc, fleet=fleet, code_directory=assets.router, log_retention=LOG_RETENTION
        )
        if alb:
            AlbFront(
                self,
                "Front",
                vpc=network.vpc,
                router=checks.function,
                internet_facing=settings.internet_facing,
                certificate_arn=settings.certificate_arn,
                domain=settings.domain,
                hosted_zone_id=settings.hosted_zone,
            )
        else:
            Route53Front(
                self,
                "Front",
                vpc=network.vpc,
                fleet=fleet,
                domain=settings.domain,
                hosted_zone_id=settings.hosted_zone,
            )
        rules = Admin(
            self,
            "Admin",
            storage=storage,
            vpc=network.vpc,
            code_directory=assets.admin,
            log_retention=LOG_RETENTION,
            build_dir=build_dir,
        )
        Observability(self, "Observability", fleet=fleet, storage=storage, router_service=ROUTER_SERVICE)
        CfnOutput(self, "AdminUrl", value=rules.url.url, description="Rules admin API (IAM-signed requests only)")
        CfnOutput(self, "VpcId", value=network.vpc.vpc_id)
        if storage.rules_table is not None:
            # Retained by `make destroy` (rules are user data): delete it by this name when no longer wanted.
            CfnOutput(self, "RulesTableName", value=storage.rules_table.table_name)
