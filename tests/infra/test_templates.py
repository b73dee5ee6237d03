"""What each synthesized variant deploys: fleet, store, front, router, admin, network, observability."""

from __future__ import annotations

import json
from typing import Any

from aws_lambda_powertools.shared.version import VERSION as POWERTOOLS_VERSION

from sluicegate.store import dynamodb_schema as schema
from tests.infra.conftest import DOMAIN, ZONE, Synthesized


def ref_name(value: Any) -> str:
    """The logical id a ``Ref`` / ``Fn::GetAtt`` points at."""
    if "Ref" in value:
        return value["Ref"]
    return value["Fn::GetAtt"][0]


def environment(function: dict[str, Any]) -> dict[str, Any]:
    return function["Properties"]["Environment"]["Variables"]


def function_of(variant: Synthesized, service: str) -> tuple[str, dict[str, Any]]:
    found = [
        (name, resource)
        for name, resource in variant.resources("AWS::Lambda::Function").items()
        if environment(resource).get("POWERTOOLS_SERVICE_NAME") == service
    ]
    assert len(found) == 1, f"{variant.name}: one {service} function expected, found {len(found)}"
    return found[0]


def security_group_of_fleet(variant: Synthesized) -> str:
    groups = {
        ref_name(g)
        for s in variant.props("AWS::ECS::Service")
        for g in s["NetworkConfiguration"]["AwsvpcConfiguration"]["SecurityGroups"]
    }
    assert len(groups) == 1
    return groups.pop()


def ingress_rules(variant: Synthesized, group: str) -> list[dict[str, Any]]:
    """Every ingress rule of ``group``: inline ones and separate SecurityGroupIngress resources."""
    rules = list(variant.template["Resources"][group]["Properties"].get("SecurityGroupIngress", []))
    rules += [p for p in variant.props("AWS::EC2::SecurityGroupIngress") if ref_name(p["GroupId"]) == group]
    return rules


def test_one_fargate_service_per_partition_never_two_tasks(variant: Synthesized) -> None:
    services = variant.props("AWS::ECS::Service")
    assert len(services) == variant.settings.partitions
    for service in services:
        assert service["LaunchType"] == "FARGATE"
        assert service["DesiredCount"] == 1
        deployment = service["DeploymentConfiguration"]
        assert (deployment["MinimumHealthyPercent"], deployment["MaximumPercent"]) == (0, 100)
        assert deployment["DeploymentCircuitBreaker"] == {"Enable": True, "Rollback": True}
        assert service["NetworkConfiguration"]["AwsvpcConfiguration"]["AssignPublicIp"] == "DISABLED"
    names = sorted(p["Name"] for p in variant.props("AWS::ServiceDiscovery::Service"))
    assert names == sorted(f"p{i}" for i in range(variant.settings.partitions))
    for discovery in variant.props("AWS::ServiceDiscovery::Service"):
        assert discovery["DnsConfig"]["DnsRecords"] == [{"TTL": 10, "Type": "A"}]
    (namespace,) = variant.props("AWS::ServiceDiscovery::PrivateDnsNamespace")
    assert namespace["Name"] == "sluicegate.internal"
    (cluster,) = variant.props("AWS::ECS::Cluster")
    assert {"Name": "containerInsights", "Value": "enabled"} in cluster["ClusterSettings"]


def test_each_task_runs_its_partition_on_arm64_with_health_check_and_final_checkpoint_time(
    variant: Synthesized,
) -> None:
    partitions = variant.settings.partitions
    seen = set()
    for task in variant.props("AWS::ECS::TaskDefinition"):
        assert task["RuntimePlatform"] == {"CpuArchitecture": "ARM64", "OperatingSystemFamily": "LINUX"}
        assert task["RequiresCompatibilities"] == ["FARGATE"]
        (container,) = task["ContainerDefinitions"]
        env = {item["Name"]: item["Value"] for item in container["Environment"]}
        seen.add(int(env["SLUICEGATE_PARTITION"]))
        assert env["SLUICEGATE_PARTITIONS"] == str(partitions)
        assert env["SLUICEGATE_PARTITION_PORT"] == "7000"
        assert container["PortMappings"] == [{"ContainerPort": 7000, "Protocol": "udp"}]
        assert container["HealthCheck"]["Command"] == ["CMD", "python", "/app/healthcheck.py"]
        assert container["StopTimeout"] == 120
        assert container["LogConfiguration"]["LogDriver"] == "awslogs"
        secrets = {item["Name"] for item in container.get("Secrets", [])}
        if variant.settings.aurora:
            assert env["SLUICEGATE_STORE"] == "postgres"
            assert secrets == {"SLUICEGATE_POSTGRES_SECRET"}
        else:
            assert env["SLUICEGATE_STORE"] == "dynamodb"
            assert "SLUICEGATE_DYNAMODB_RULES_TABLE" in env and "SLUICEGATE_DYNAMODB_CHECKPOINTS_TABLE" in env
            assert not secrets
    assert seen == set(range(partitions))
    retention = [p.get("RetentionInDays") for p in variant.props("AWS::Logs::LogGroup")]
    assert retention and all(days == 30 for days in retention)


def test_dynamodb_tables_match_the_store_schema_unless_aurora(variant: Synthesized) -> None:
    tables = variant.resources("AWS::DynamoDB::Table")
    if variant.settings.aurora:
        assert tables == {}
        return
    by_index = {bool(t["Properties"].get("GlobalSecondaryIndexes")): name for name, t in tables.items()}
    rules, checkpoints = tables[by_index[True]], tables[by_index[False]]
    assert ref_name(variant.template["Outputs"]["RulesTableName"]["Value"]) == by_index[True]
    rules_spec, checkpoints_spec = schema.rules_table_spec(), schema.checkpoints_table_spec()
    for table, spec in ((rules, rules_spec), (checkpoints, checkpoints_spec)):
        props = table["Properties"]
        assert props["BillingMode"] == "PAY_PER_REQUEST"
        assert props["KeySchema"] == spec["KeySchema"] == [{"AttributeName": "key", "KeyType": "HASH"}]
        assert sorted(props["AttributeDefinitions"], key=str) == sorted(spec["AttributeDefinitions"], key=str)
    # The update-time index (rule sync) and the sparse pattern index, exactly as the store creates them.
    assert rules["Properties"]["GlobalSecondaryIndexes"] == rules_spec["GlobalSecondaryIndexes"]
    assert [index["IndexName"] for index in rules_spec["GlobalSecondaryIndexes"]] == [
        schema.RULES_BY_UPDATE_INDEX,
        schema.RULES_PATTERN_INDEX,
    ]
    assert rules["Properties"]["PointInTimeRecoverySpecification"] == {"PointInTimeRecoveryEnabled": True}
    assert rules["DeletionPolicy"] == "Retain"  # rules survive `make destroy`
    assert checkpoints["Properties"]["TimeToLiveSpecification"] == {"AttributeName": schema.TTL, "Enabled": True}
    assert variant.resources("AWS::RDS::DBCluster") == {}


def test_aurora_cluster_only_when_asked(variant: Synthesized) -> None:
    clusters = variant.props("AWS::RDS::DBCluster")
    if not variant.settings.aurora:
        assert clusters == [] and variant.resources("AWS::SecretsManager::Secret") == {}
        return
    (cluster,) = clusters
    assert cluster["Engine"] == "aurora-postgresql"
    assert cluster["StorageEncrypted"] is True
    assert cluster["ServerlessV2ScalingConfiguration"]["MinCapacity"] == 0
    (instance,) = variant.props("AWS::RDS::DBInstance")
    assert instance["DBInstanceClass"] == "db.serverless"
    assert len(variant.resources("AWS::SecretsManager::Secret")) == 1
    # Only the bucket servers and the admin function may connect.
    (db_group,) = [ref_name(g) for g in cluster["VpcSecurityGroupIds"]]
    sources = {ref_name(rule["SourceSecurityGroupId"]) for rule in ingress_rules(variant, db_group)}
    assert len(sources) == 2 and security_group_of_fleet(variant) in sources
    assert all(rule["FromPort"] == rule["ToPort"] == 5432 for rule in ingress_rules(variant, db_group))


def test_bucket_servers_admit_udp_only_from_router_and_direct_clients(variant: Synthesized) -> None:
    group = security_group_of_fleet(variant)
    rules = ingress_rules(variant, group)
    router_name, router = function_of(variant, "sluicegate-router")
    (router_group,) = [ref_name(g) for g in router["Properties"]["VpcConfig"]["SecurityGroupIds"]]
    expected = {router_group}
    if variant.settings.front == "route53":
        outputs = variant.template["Outputs"]
        expected.add(ref_name(outputs["DirectClientSecurityGroupId"]["Value"]))
    sources = {
        ref_name(rule["SourceSecurityGroupId"]) if "SourceSecurityGroupId" in rule else rule.get("CidrIp", "?")
        for rule in rules
    }
    assert sources == expected  # no CIDR, no other group
    for rule in rules:
        assert (rule["IpProtocol"], rule["FromPort"], rule["ToPort"]) == ("udp", 7000, 7000)
    # The router itself may send only that.
    egress = variant.template["Resources"][router_group]["Properties"].get("SecurityGroupEgress", [])
    egress += [p for p in variant.props("AWS::EC2::SecurityGroupEgress") if ref_name(p["GroupId"]) == router_group]
    assert [(e["IpProtocol"], e["FromPort"], ref_name(e["DestinationSecurityGroupId"])) for e in egress] == [
        ("udp", 7000, group)
    ]


def test_router_lambda_in_the_vpc_on_arm64_with_powertools(variant: Synthesized) -> None:
    _, router = function_of(variant, "sluicegate-router")
    props = router["Properties"]
    assert props["Runtime"] == "python3.12" and props["Architectures"] == ["arm64"]
    assert props["Handler"] == "handler.handler"
    assert props["TracingConfig"] == {"Mode": "Active"}
    assert len(props["VpcConfig"]["SubnetIds"]) == 2
    env = environment(router)
    assert env["SLUICEGATE_PARTITIONS"] == str(variant.settings.partitions)
    assert env["SLUICEGATE_NAMESPACE"] == "sluicegate.internal"
    assert (env["SLUICEGATE_PARTITION_PORT"], env["SLUICEGATE_FALLBACK"]) == ("7000", "allow")
    assert (env["SLUICEGATE_TIMEOUT_MS"], env["SLUICEGATE_ATTEMPTS"], env["SLUICEGATE_DNS_TTL_S"]) == ("20", "3", "10")
    assert env["POWERTOOLS_METRICS_NAMESPACE"] == "Sluicegate"
    # The layer of the Powertools release the tests ran with, from AWS's public SSM parameter (resolved at deploy).
    (layer,) = props["Layers"]
    parameter = variant.template["Parameters"][layer["Ref"]]
    assert parameter["Type"] == "AWS::SSM::Parameter::Value<String>"
    assert parameter["Default"] == f"/aws/service/powertools/python/arm64/python3.12/{POWERTOOLS_VERSION}"
    assert "LoggingConfig" in props  # its own log group, with retention


def test_admin_behind_an_iam_only_function_url(variant: Synthesized) -> None:
    admin_name, admin = function_of(variant, "sluicegate-admin")
    (url,) = variant.props("AWS::Lambda::Url")
    assert url["AuthType"] == "AWS_IAM"
    assert ref_name(url["TargetFunctionArn"]) == admin_name
    assert "AdminUrl" in variant.template["Outputs"]
    env = environment(admin)
    props = admin["Properties"]
    if variant.settings.aurora:
        assert env["SLUICEGATE_STORE"] == "postgres"
        assert "SLUICEGATE_POSTGRES_SECRET_ARN" in env and "SLUICEGATE_POSTGRES_SECRET" not in env
        assert "VpcConfig" in props and len(props["Layers"]) == 2  # Powertools and psycopg
    else:
        assert env["SLUICEGATE_STORE"] == "dynamodb"
        assert "VpcConfig" not in props


def test_alb_front_forwards_to_the_router(variant: Synthesized) -> None:
    balancers = variant.props("AWS::ElasticLoadBalancingV2::LoadBalancer")
    if variant.settings.front != "alb":
        assert balancers == []
        return
    (balancer,) = balancers
    assert balancer["Scheme"] == ("internet-facing" if variant.settings.internet_facing else "internal")
    router_name, _ = function_of(variant, "sluicegate-router")
    (group_name, group), *more = variant.resources("AWS::ElasticLoadBalancingV2::TargetGroup").items()
    assert not more
    assert group["Properties"]["TargetType"] == "lambda"
    assert [ref_name(t["Id"]) for t in group["Properties"]["Targets"]] == [router_name]
    listeners = {p["Port"]: p for p in variant.props("AWS::ElasticLoadBalancingV2::Listener")}
    if variant.settings.certificate_arn:
        https = listeners[443]
        assert https["Protocol"] == "HTTPS"
        assert https["Certificates"] == [{"CertificateArn": variant.settings.certificate_arn}]
        assert [ref_name(a["TargetGroupArn"]) for a in https["DefaultActions"]] == [group_name]
        (redirect,) = listeners[80]["DefaultActions"]
        assert redirect["Type"] == "redirect" and redirect["RedirectConfig"]["Protocol"] == "HTTPS"
        assert variant.template["Outputs"]["Endpoint"]["Value"] == f"https://{DOMAIN}"
    else:
        assert list(listeners) == [80]
        assert [ref_name(a["TargetGroupArn"]) for a in listeners[80]["DefaultActions"]] == [group_name]
    records = variant.props("AWS::Route53::RecordSet")
    if variant.settings.domain:
        (alias,) = records
        assert (alias["Name"], alias["Type"], alias["HostedZoneId"]) == (f"{DOMAIN}.", "A", ZONE)
        assert "AliasTarget" in alias
    else:
        assert records == []


def test_route53_front_publishes_what_direct_mode_sdks_need(variant: Synthesized) -> None:
    if variant.settings.front != "route53":
        assert "DirectClientSecurityGroupId" not in variant.template["Outputs"]
        return
    records = {p["Type"]: p for p in variant.props("AWS::Route53::RecordSet")}
    assert set(records) == {"SRV", "TXT"}
    partitions = variant.settings.partitions
    srv = records["SRV"]
    assert (srv["Name"], srv["HostedZoneId"]) == (f"_sluicegate._udp.{DOMAIN}.", ZONE)
    assert sorted(srv["ResourceRecords"]) == sorted(f"{i} 1 7000 p{i}.sluicegate.internal" for i in range(partitions))
    txt = records["TXT"]
    assert txt["Name"] == f"_sluicegate.{DOMAIN}."
    assert txt["ResourceRecords"] == [
        f'"v=sluicegate1 namespace=sluicegate.internal partitions={partitions} port=7000"'
    ]
    outputs = variant.template["Outputs"]
    assert outputs["Namespace"]["Value"] == "sluicegate.internal"
    assert outputs["Partitions"]["Value"] == str(partitions)
    assert outputs["PartitionPort"]["Value"] == "7000"


def test_network_has_no_nat_and_endpoints_for_what_the_tasks_use(variant: Synthesized) -> None:
    assert variant.resources("AWS::EC2::NatGateway") == {}
    gateways = variant.resources("AWS::EC2::InternetGateway")
    assert len(gateways) == (1 if variant.settings.internet_facing else 0)
    services = [json.dumps(p["ServiceName"]) for p in variant.props("AWS::EC2::VPCEndpoint")]
    wanted = ["ecr.api", "ecr.dkr", "logs", ".s3"]
    wanted += ["secretsmanager"] if variant.settings.aurora else [".dynamodb"]
    for service in wanted:
        assert sum(service in name for name in services) == 1, f"{service} endpoint in {services}"
    (flow_log,) = variant.props("AWS::EC2::FlowLog")
    assert flow_log["TrafficType"] == "REJECT"


def test_dashboard_and_alarms(variant: Synthesized) -> None:
    (dashboard,) = variant.props("AWS::CloudWatch::Dashboard")
    body = json.dumps(dashboard["DashboardBody"])
    for metric in ("Checks", "Allowed", "Denied", "Fallbacks", "CheckLatency", "PartitionChecks", "StoreErrors"):
        assert metric in body
    assert "p50" in body and "p99" in body
    alarms = {name: r["Properties"] for name, r in variant.resources("AWS::CloudWatch::Alarm").items()}
    by_kind = {
        kind: [p for name, p in alarms.items() if kind in name]
        for kind in ("FallbackRate", "RunningTasksBelowPartitions", "StoreErrors", "StoreThrottling")
    }
    (fallback,) = by_kind["FallbackRate"]
    assert "100 * fallbacks / checks" in json.dumps(fallback["Metrics"])
    (running,) = by_kind["RunningTasksBelowPartitions"]
    assert running["Threshold"] == variant.settings.partitions
    assert running["ComparisonOperator"] == "LessThanThreshold"
    assert running["TreatMissingData"] == "breaching"
    assert "RunningTaskCount" in json.dumps(running["Metrics"])
    assert len(by_kind["StoreErrors"]) == 1
    assert len(by_kind["StoreThrottling"]) == (0 if variant.settings.aurora else 1)
    for alarm in alarms.values():
        assert alarm["AlarmActions"], "every alarm notifies the topic"
