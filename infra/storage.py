"""The store: DynamoDB rules and checkpoints tables, or an Aurora Serverless v2 PostgreSQL cluster.

The tables are built from the same specs the store code creates locally
(:func:`sluicegate.store.dynamodb_schema.rules_table_spec` and
:func:`~sluicegate.store.dynamodb_schema.checkpoints_table_spec`), so keys,
index and projection cannot drift from what :class:`DynamoRuleStore` expects.

Example:
    >>> storage = Storage(stack, "Storage", vpc=network.vpc, aurora=False)  # doctest: +SKIP
    >>> storage.environment()["SLUICEGATE_STORE"]  # doctest: +SKIP
    'dynamodb'
"""

from __future__ import annotations

from typing import Any

from aws_cdk import Duration, RemovalPolicy, Stack
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_rds as rds
from constructs import Construct

from infra.nag import acknowledge
from infra.network import ISOLATED
from sluicegate.store import dynamodb_schema as schema

_TYPES = {"S": dynamodb.AttributeType.STRING, "N": dynamodb.AttributeType.NUMBER, "B": dynamodb.AttributeType.BINARY}
POSTGRES_PORT = 5432


def logical_id(construct: Construct) -> str:
    """The CloudFormation logical id of an L2 construct's resource, as cdk-nag names it in findings."""
    stack = Stack.of(construct)
    return str(stack.resolve(stack.get_logical_id(construct.node.default_child)))  # type: ignore[arg-type]


def table_from_spec(scope: Construct, construct_id: str, spec: dict[str, Any], **options: Any) -> dynamodb.Table:
    """A CDK table with the key schema, billing mode and indexes of a ``CreateTable`` spec (its name is CDK's)."""
    types = {item["AttributeName"]: _TYPES[item["AttributeType"]] for item in spec["AttributeDefinitions"]}

    def keys(schema_items: list[dict[str, str]]) -> dict[str, dynamodb.Attribute]:
        names = {"HASH": "partition_key", "RANGE": "sort_key"}
        return {
            names[item["KeyType"]]: dynamodb.Attribute(name=item["AttributeName"], type=types[item["AttributeName"]])
            for item in schema_items
        }

    if spec["BillingMode"] != "PAY_PER_REQUEST":
        raise ValueError(f"{spec['TableName']}: only on-demand tables are deployed, not {spec['BillingMode']}")
    table = dynamodb.Table(
        scope, construct_id, billing_mode=dynamodb.BillingMode.PAY_PER_REQUEST, **keys(spec["KeySchema"]), **options
    )
    for index in spec.get("GlobalSecondaryIndexes", []):
        projection = index["Projection"]
        table.add_global_secondary_index(
            index_name=index["IndexName"],
            projection_type=dynamodb.ProjectionType(projection["ProjectionType"]),
            non_key_attributes=projection.get("NonKeyAttributes"),
            **keys(index["KeySchema"]),
        )
    return table


class Storage(Construct):
    """DynamoDB tables (default) or, with ``aurora=True``, an Aurora PostgreSQL cluster and its secret.

    Rules are data users typed in: the rules table is retained when the stack is
    destroyed (and the cluster leaves a final snapshot). Checkpoints are
    short-lived credit levels and go with the stack.
    """

    def __init__(self, scope: Construct, construct_id: str, *, vpc: ec2.IVpc, aurora: bool) -> None:
        super().__init__(scope, construct_id)
        self.aurora = aurora
        self.rules_table: dynamodb.Table | None = None
        self.checkpoints_table: dynamodb.Table | None = None
        self.cluster: rds.DatabaseCluster | None = None
        self.database_security_group: ec2.SecurityGroup | None = None
        if aurora:
            self._postgres(vpc)
        else:
            self._dynamodb()

    def _dynamodb(self) -> None:
        self.rules_table = table_from_spec(
            self,
            "Rules",
            schema.rules_table_spec(),
            point_in_time_recovery_specification=dynamodb.PointInTimeRecoverySpecification(
                point_in_time_recovery_enabled=True
            ),
            removal_policy=RemovalPolicy.RETAIN,
        )
        self.checkpoints_table = table_from_spec(
            self,
            "Checkpoints",
            schema.checkpoints_table_spec(),
            time_to_live_attribute=schema.TTL,
            removal_policy=RemovalPolicy.DESTROY,
        )
        acknowledge(
            self.checkpoints_table,
            "AwsSolutions-DDB3",
            "checkpoints are credit levels that expire within minutes and a missing one means a full bucket, "
            "so restoring an old copy would only be wrong",
        )

    def _postgres(self, vpc: ec2.IVpc) -> None:
        self.database_security_group = ec2.SecurityGroup(
            self, "DatabaseSecurityGroup", vpc=vpc, allow_all_outbound=False, description="Aurora PostgreSQL"
        )
        self.cluster = rds.DatabaseCluster(
            self,
            "Cluster",
            engine=rds.DatabaseClusterEngine.aurora_postgres(version=rds.AuroraPostgresEngineVersion.VER_16_13),
            writer=rds.ClusterInstance.serverless_v2("Writer"),
            serverless_v2_min_capacity=0,  # pauses when idle: no compute cost without checks
            serverless_v2_max_capacity=4,
            credentials=rds.Credentials.from_generated_secret("sluicegate"),
            default_database_name="sluicegate",
            vpc=vpc,
            vpc_subnets=ISOLATED,
            security_groups=[self.database_security_group],
            storage_encrypted=True,
            backup=rds.BackupProps(retention=Duration.days(7)),
            removal_policy=RemovalPolicy.SNAPSHOT,
        )
        acknowledge(
            self.cluster,
            "AwsSolutions-RDS10",
            "deletion protection would make `make destroy` fail; the cluster leaves a final snapshot instead",
        )
        acknowledge(
            self.cluster,
            "AwsSolutions-RDS6",
            "the store connects with the generated password from Secrets Manager; IAM tokens expire every "
            "15 minutes and the long-lived bucket-server connections cannot renew them",
        )
        acknowledge(
            self.cluster,
            "AwsSolutions-SMG4",
            "ECS injects the secret into a task only when it starts: rotating it would break running partitions "
            "until they restart; rotate by a rolling redeploy instead",
        )

    def allow_connections(self, peer: ec2.ISecurityGroup, description: str) -> None:
        """Let ``peer`` reach the PostgreSQL port (nothing to do for DynamoDB: IAM decides)."""
        if self.database_security_group is not None:
            self.database_security_group.add_ingress_rule(peer, ec2.Port.tcp(POSTGRES_PORT), description)

    def grant(self, grantee: Construct, *, secret: bool) -> None:
        """Read/write on the tables; with ``secret``, reading the database secret (whoever fetches it itself).

        ``grantee`` is a role or a function (an ``IGrantable`` construct).
        """
        if self.rules_table is not None and self.checkpoints_table is not None:
            self.rules_table.grant_read_write_data(grantee)  # type: ignore[arg-type]
            self.checkpoints_table.grant_read_write_data(grantee)  # type: ignore[arg-type]
            acknowledge(
                grantee,
                f"AwsSolutions-IAM5[Resource::<{logical_id(self.rules_table)}.Arn>/index/*]",
                "rule sync queries the rules table's update-time index and partitions list patterns from its "
                "pattern index; CDK grants a table's indexes as index/*",
            )
        if secret and self.cluster is not None and self.cluster.secret is not None:
            self.cluster.secret.grant_read(grantee)

    def environment(self) -> dict[str, str]:
        """The ``SLUICEGATE_*`` store settings every process that opens the store needs."""
        if self.rules_table is not None and self.checkpoints_table is not None:
            return {
                "SLUICEGATE_STORE": "dynamodb",
                "SLUICEGATE_DYNAMODB_RULES_TABLE": self.rules_table.table_name,
                "SLUICEGATE_DYNAMODB_CHECKPOINTS_TABLE": self.checkpoints_table.table_name,
            }
        return {"SLUICEGATE_STORE": "postgres"}
