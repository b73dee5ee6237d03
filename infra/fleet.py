"""The bucket fleet: one Fargate service per partition, each registered in Cloud Map as ``p<i>.<namespace>``.

Why one service per partition, desired count 1, min healthy 0 % / max 100 %:
a partition's buckets live in one process's memory. Two tasks of the same
partition would each admit a key's full quota (DNS would spread checks over
both) and overwrite each other's checkpoints. So a deployment or a replacement
first stops the old task (SIGTERM: it writes its last checkpoints within the
stop timeout) and only then starts the new one; the router answers the
configured fallback for that partition meanwhile (seconds to a minute).

Example:
    >>> fleet = BucketFleet(stack, "Fleet", vpc=vpc, partitions=4, image_directory=staged.bucket_server,
    ...                     storage=storage, log_retention=logs.RetentionDays.ONE_MONTH)  # doctest: +SKIP
    >>> fleet.allow_clients(router_security_group, "router Lambda")  # doctest: +SKIP
"""

from __future__ import annotations

from pathlib import Path

from aws_cdk import Duration, RemovalPolicy
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_ecr_assets as ecr_assets
from aws_cdk import aws_ecs as ecs
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from aws_cdk import aws_servicediscovery as servicediscovery
from constructs import Construct

from infra.nag import acknowledge
from infra.network import ISOLATED
from infra.storage import POSTGRES_PORT, Storage

PARTITION_PORT = 7000
NAMESPACE = "sluicegate.internal"
DNS_TTL = Duration.seconds(10)  # the router re-resolves as often (SLUICEGATE_DNS_TTL_S)
STOP_TIMEOUT = Duration.seconds(120)  # Fargate's maximum: time for the final checkpoint round
HEALTH_CHECK = ["CMD", "python", "/app/healthcheck.py"]


class BucketFleet(Construct):
    """ECS cluster (Container Insights on), Cloud Map namespace, ``partitions`` Fargate services on arm64."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        vpc: ec2.IVpc,
        partitions: int,
        image_directory: Path,
        storage: Storage,
        log_retention: logs.RetentionDays,
        cpu: int = 512,
        memory_mib: int = 1024,
        namespace: str = NAMESPACE,
    ) -> None:
        super().__init__(scope, construct_id)
        self.partitions = partitions
        # Container Insights publishes RunningTaskCount per service, for the "a partition is down" alarm.
        self.cluster = ecs.Cluster(self, "Cluster", vpc=vpc, container_insights_v2=ecs.ContainerInsights.ENABLED)
        self.namespace = servicediscovery.PrivateDnsNamespace(
            self, "Namespace", name=namespace, vpc=vpc, description="Sluicegate partitions: p<i>.<namespace>"
        )
        self.security_group = ec2.SecurityGroup(
            self,
            "SecurityGroup",
            vpc=vpc,
            allow_all_outbound=False,
            description=f"Sluicegate bucket servers: UDP {PARTITION_PORT} from the router and direct clients only",
        )
        # No route leaves the VPC, so HTTPS "anywhere" only reaches the VPC endpoints (ECR, Logs, DynamoDB...).
        self.security_group.add_egress_rule(ec2.Peer.any_ipv4(), ec2.Port.tcp(443), "AWS APIs via VPC endpoints")
        if storage.database_security_group is not None:
            self.security_group.add_egress_rule(
                storage.database_security_group, ec2.Port.tcp(POSTGRES_PORT), "Aurora PostgreSQL"
            )
            storage.allow_connections(self.security_group, "bucket servers")

        image = ecr_assets.DockerImageAsset(
            self, "Image", directory=str(image_directory), platform=ecr_assets.Platform.LINUX_ARM64
        )
        self.log_group = logs.LogGroup(self, "Logs", retention=log_retention, removal_policy=RemovalPolicy.DESTROY)
        # One task role and one execution role for all partitions: same permissions, fewer resources.
        self.task_role = iam.Role(self, "TaskRole", assumed_by=iam.ServicePrincipal("ecs-tasks.amazonaws.com"))
        storage.grant(self.task_role, secret=False)  # ECS itself reads the database secret (execution role)
        self.execution_role = iam.Role(
            self, "ExecutionRole", assumed_by=iam.ServicePrincipal("ecs-tasks.amazonaws.com")
        )
        acknowledge(
            self.execution_role,
            "AwsSolutions-IAM5[Resource::*]",
            "ecr:GetAuthorizationToken, which pulling the image needs, has no resource-level permissions",
        )
        self.services: list[ecs.FargateService] = []
        for index in range(partitions):
            task = self._task_definition(index, image, storage, cpu=cpu, memory_mib=memory_mib)
            service = ecs.FargateService(
                self,
                f"Partition{index}",
                cluster=self.cluster,
                task_definition=task,
                desired_count=1,
                min_healthy_percent=0,  # never two tasks of one partition (see the module docstring)
                max_healthy_percent=100,
                circuit_breaker=ecs.DeploymentCircuitBreaker(enable=True, rollback=True),
                security_groups=[self.security_group],
                vpc_subnets=ISOLATED,
                assign_public_ip=False,
                cloud_map_options=ecs.CloudMapOptions(
                    name=f"p{index}",
                    cloud_map_namespace=self.namespace,
                    dns_record_type=servicediscovery.DnsRecordType.A,
                    dns_ttl=DNS_TTL,
                ),
            )
            self.services.append(service)

    def _task_definition(
        self,
        index: int,
        image: ecr_assets.DockerImageAsset,
        storage: Storage,
        *,
        cpu: int,
        memory_mib: int,
    ) -> ecs.FargateTaskDefinition:
        task = ecs.FargateTaskDefinition(
            self,
            f"Task{index}",
            task_role=self.task_role,
            execution_role=self.execution_role,
            cpu=cpu,
            memory_limit_mib=memory_mib,
            runtime_platform=ecs.RuntimePlatform(
                cpu_architecture=ecs.CpuArchitecture.ARM64, operating_system_family=ecs.OperatingSystemFamily.LINUX
            ),
        )
        environment = {
            "SLUICEGATE_PARTITION": str(index),
            "SLUICEGATE_PARTITIONS": str(self.partitions),
            "SLUICEGATE_PARTITION_PORT": str(PARTITION_PORT),
            **storage.environment(),
        }
        secrets = {}
        if storage.cluster is not None and storage.cluster.secret is not None:
            # The whole secret JSON (host, port, dbname, username, password), injected at task start.
            secrets["SLUICEGATE_POSTGRES_SECRET"] = ecs.Secret.from_secrets_manager(storage.cluster.secret)
        task.add_container(
            "BucketServer",
            image=ecs.ContainerImage.from_docker_image_asset(image),
            environment=environment,
            secrets=secrets or None,
            port_mappings=[ecs.PortMapping(container_port=PARTITION_PORT, protocol=ecs.Protocol.UDP)],
            health_check=ecs.HealthCheck(
                command=HEALTH_CHECK,
                interval=Duration.seconds(10),
                timeout=Duration.seconds(5),
                retries=3,
                start_period=Duration.seconds(30),
            ),
            stop_timeout=STOP_TIMEOUT,
            readonly_root_filesystem=True,
            logging=ecs.LogDrivers.aws_logs(stream_prefix=f"p{index}", log_group=self.log_group),
            essential=True,
        )
        acknowledge(
            task,
            "AwsSolutions-ECS2",
            "the environment holds only non-secret settings (partition index, table names, port); "
            "the database secret is injected through ECS secrets",
        )
        return task

    def allow_clients(self, peer: ec2.ISecurityGroup, description: str) -> None:
        """Admit UDP to the partition port from ``peer`` (the router, or apps in direct mode)."""
        self.security_group.add_ingress_rule(peer, ec2.Port.udp(PARTITION_PORT), description)

    def router_environment(self) -> dict[str, str]:
        """How a router (or a direct-mode SDK) finds the partitions."""
        return {
            "SLUICEGATE_PARTITIONS": str(self.partitions),
            "SLUICEGATE_NAMESPACE": self.namespace.namespace_name,
            "SLUICEGATE_PARTITION_PORT": str(PARTITION_PORT),
            "SLUICEGATE_DNS_TTL_S": str(int(DNS_TTL.to_seconds())),
        }
