"""The VPC: isolated subnets, no NAT gateway; AWS services reached through VPC endpoints.

Nothing in it can reach the internet: the bucket servers pull their image
(ECR + S3), write logs (CloudWatch Logs), and talk to DynamoDB or Secrets
Manager through endpoints. Public subnets exist only for an internet-facing ALB.

Example:
    >>> network = Network(stack, "Network", public=False, secrets=True)  # doctest: +SKIP
    >>> network.vpc.select_subnets(subnet_type=ec2.SubnetType.PRIVATE_ISOLATED)  # doctest: +SKIP
"""

from __future__ import annotations

from aws_cdk import RemovalPolicy
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_logs as logs
from constructs import Construct

ISOLATED = ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_ISOLATED)
PUBLIC = ec2.SubnetSelection(subnet_type=ec2.SubnetType.PUBLIC)
# A literal CIDR (not the VPC's token) so security-group rules and their checks see the real range.
CIDR = "10.42.0.0/16"


class Network(Construct):
    """VPC over two AZs with the endpoints our tasks and functions need; ``vpc`` and ``isolated`` for others."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        public: bool,
        dynamodb: bool,
        secrets: bool,
        max_azs: int = 2,
    ) -> None:
        super().__init__(scope, construct_id)
        subnets = [ec2.SubnetConfiguration(name="isolated", subnet_type=ec2.SubnetType.PRIVATE_ISOLATED, cidr_mask=22)]
        if public:  # only an internet-facing ALB lives here; no NAT, so nothing else gets out
            subnets.append(ec2.SubnetConfiguration(name="public", subnet_type=ec2.SubnetType.PUBLIC, cidr_mask=24))
        self.vpc = ec2.Vpc(
            self,
            "Vpc",
            ip_addresses=ec2.IpAddresses.cidr(CIDR),
            max_azs=max_azs,
            nat_gateways=0,
            subnet_configuration=subnets,
        )
        self.isolated = ISOLATED
        # Rejected packets only: what you need to debug a security group, at a fraction of full logs' cost.
        flow_logs = logs.LogGroup(
            self, "FlowLogs", retention=logs.RetentionDays.ONE_MONTH, removal_policy=RemovalPolicy.DESTROY
        )
        self.vpc.add_flow_log(
            "RejectedFlows",
            destination=ec2.FlowLogDestination.to_cloud_watch_logs(flow_logs),
            traffic_type=ec2.FlowLogTrafficType.REJECT,
        )

        # Gateway endpoints are free: S3 (ECR keeps image layers there) and DynamoDB (the store).
        self.vpc.add_gateway_endpoint("S3", service=ec2.GatewayVpcEndpointAwsService.S3, subnets=[ISOLATED])
        if dynamodb:
            self.vpc.add_gateway_endpoint(
                "DynamoDb", service=ec2.GatewayVpcEndpointAwsService.DYNAMODB, subnets=[ISOLATED]
            )

        # Interface endpoints, reachable over HTTPS from inside the VPC only.
        self.endpoint_security_group = ec2.SecurityGroup(
            self, "EndpointSecurityGroup", vpc=self.vpc, allow_all_outbound=False, description="VPC interface endpoints"
        )
        self.endpoint_security_group.add_ingress_rule(
            ec2.Peer.ipv4(CIDR), ec2.Port.tcp(443), "HTTPS from inside the VPC"
        )
        services = {
            "EcrApi": ec2.InterfaceVpcEndpointAwsService.ECR,
            "EcrDocker": ec2.InterfaceVpcEndpointAwsService.ECR_DOCKER,
            "Logs": ec2.InterfaceVpcEndpointAwsService.CLOUDWATCH_LOGS,  # the awslogs driver of the tasks
        }
        if secrets:  # ECS injects the Aurora secret into tasks; the admin Lambda reads it
            services["SecretsManager"] = ec2.InterfaceVpcEndpointAwsService.SECRETS_MANAGER
        for name, service in services.items():
            self.vpc.add_interface_endpoint(
                name,
                service=service,
                subnets=ISOLATED,
                security_groups=[self.endpoint_security_group],
                private_dns_enabled=True,
                open=False,  # the security group above admits the VPC (the default rule uses a CIDR token)
            )
