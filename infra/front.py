"""How applications reach Sluicegate: an ALB in front of the router, or DNS records for direct-mode SDKs.

Example:
    >>> AlbFront(stack, "Front", vpc=vpc, router=router.function, internet_facing=False)  # doctest: +SKIP
    >>> Route53Front(stack, "Front", fleet=fleet, domain="quota.example.com",
    ...              hosted_zone="Z0123456789ABC")  # doctest: +SKIP
"""

from __future__ import annotations

from aws_cdk import CfnOutput, Duration
from aws_cdk import aws_certificatemanager as acm
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_elasticloadbalancingv2 as elbv2
from aws_cdk import aws_elasticloadbalancingv2_targets as targets
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_route53 as route53
from aws_cdk import aws_route53_targets as route53_targets
from constructs import Construct

from infra.fleet import PARTITION_PORT, BucketFleet
from infra.nag import acknowledge
from infra.network import CIDR, ISOLATED, PUBLIC

RECORD_TTL = Duration.minutes(5)
# The discovery records direct-mode SDKs read: SRV names each partition (priority = partition index, since
# SRV answers come in any order), TXT says the namespace, partition count and port in one answer.
SRV_PREFIX = "_sluicegate._udp"
TXT_PREFIX = "_sluicegate"


def hosted_zone(scope: Construct, *, zone_id: str, domain: str) -> route53.IHostedZone:
    """The given zone, imported without a lookup; record names are passed fully qualified (trailing dot)."""
    return route53.HostedZone.from_hosted_zone_attributes(scope, "Zone", hosted_zone_id=zone_id, zone_name=domain)


class AlbFront(Construct):
    """An ALB (internal unless ``internet_facing``) forwarding every request to the router function."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        vpc: ec2.IVpc,
        router: lambda_.IFunction,
        internet_facing: bool,
        certificate_arn: str = "",
        domain: str = "",
        hosted_zone_id: str = "",
    ) -> None:
        super().__init__(scope, construct_id)
        self.security_group = ec2.SecurityGroup(
            self, "SecurityGroup", vpc=vpc, allow_all_outbound=False, description="Sluicegate ALB"
        )
        clients = ec2.Peer.any_ipv4() if internet_facing else ec2.Peer.ipv4(CIDR)
        self.load_balancer = elbv2.ApplicationLoadBalancer(
            self,
            "LoadBalancer",
            vpc=vpc,
            internet_facing=internet_facing,
            vpc_subnets=PUBLIC if internet_facing else ISOLATED,
            security_group=self.security_group,
            drop_invalid_header_fields=True,
        )
        target = targets.LambdaTarget(router)
        if certificate_arn:
            certificate = acm.Certificate.from_certificate_arn(self, "Certificate", certificate_arn)
            https = self.load_balancer.add_listener(
                "Https",
                port=443,
                protocol=elbv2.ApplicationProtocol.HTTPS,
                certificates=[elbv2.ListenerCertificate.from_certificate_manager(certificate)],
                ssl_policy=elbv2.SslPolicy.RECOMMENDED_TLS,
                open=False,
            )
            https.add_targets("Router", targets=[target])
            self.security_group.add_ingress_rule(clients, ec2.Port.tcp(443), "HTTPS from clients")
            self.load_balancer.add_redirect(source_port=80, target_port=443, open=False)
            scheme = "https"
        else:
            http = self.load_balancer.add_listener("Http", port=80, protocol=elbv2.ApplicationProtocol.HTTP, open=False)
            http.add_targets("Router", targets=[target])
            scheme = "http"
        self.security_group.add_ingress_rule(clients, ec2.Port.tcp(80), "HTTP from clients")
        if internet_facing:
            acknowledge(
                self.security_group,
                "AwsSolutions-EC23",
                "internet_facing=true asks for a public check API; the ALB only forwards to the router Lambda",
            )
        acknowledge(
            self.load_balancer,
            "AwsSolutions-ELB2",
            "every request reaches the router Lambda, whose structured log records it with the ALB trace id; "
            "ALB access logs would duplicate that",
        )
        host = self.load_balancer.load_balancer_dns_name
        if domain and hosted_zone_id:
            zone = hosted_zone(self, zone_id=hosted_zone_id, domain=domain)
            route53.ARecord(
                self,
                "Alias",
                zone=zone,
                record_name=f"{domain}.",
                target=route53.RecordTarget.from_alias(route53_targets.LoadBalancerTarget(self.load_balancer)),
            )
            host = domain
        CfnOutput(scope, "Endpoint", value=f"{scheme}://{host}", description="The check API (HTTP front)")


class Route53Front(Construct):
    """SRV and TXT records under ``domain`` naming the partitions, and a security group for direct clients."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        vpc: ec2.IVpc,
        fleet: BucketFleet,
        domain: str,
        hosted_zone_id: str,
    ) -> None:
        super().__init__(scope, construct_id)
        self.client_security_group = ec2.SecurityGroup(
            self,
            "DirectClientSecurityGroup",
            vpc=vpc,
            allow_all_outbound=False,
            description="Attach to app tasks/instances that check quotas over UDP (direct mode)",
        )
        self.client_security_group.add_egress_rule(
            fleet.security_group, ec2.Port.udp(PARTITION_PORT), "checks to the bucket servers"
        )
        fleet.allow_clients(self.client_security_group, "direct-mode clients")
        namespace = fleet.namespace.namespace_name
        zone = hosted_zone(self, zone_id=hosted_zone_id, domain=domain)
        route53.SrvRecord(
            self,
            "Partitions",
            zone=zone,
            record_name=f"{SRV_PREFIX}.{domain}.",
            values=[
                route53.SrvRecordValue(host_name=f"p{index}.{namespace}", port=PARTITION_PORT, priority=index, weight=1)
                for index in range(fleet.partitions)
            ],
            ttl=RECORD_TTL,
        )
        route53.TxtRecord(
            self,
            "Discovery",
            zone=zone,
            record_name=f"{TXT_PREFIX}.{domain}.",
            values=[f"v=sluicegate1 namespace={namespace} partitions={fleet.partitions} port={PARTITION_PORT}"],
            ttl=RECORD_TTL,
        )
        CfnOutput(scope, "Namespace", value=namespace, description="Cloud Map namespace: partition i is p<i>.<ns>")
        CfnOutput(scope, "Partitions", value=str(fleet.partitions), description="SLUICEGATE_PARTITIONS for SDKs")
        CfnOutput(scope, "PartitionPort", value=str(PARTITION_PORT), description="UDP port of every partition")
        CfnOutput(
            scope,
            "DirectClientSecurityGroupId",
            value=self.client_security_group.security_group_id,
            description="Attach to app tasks/instances in the VPC that talk to the partitions directly",
        )
        CfnOutput(scope, "DiscoveryRecords", value=f"{SRV_PREFIX}.{domain} (SRV), {TXT_PREFIX}.{domain} (TXT)")
