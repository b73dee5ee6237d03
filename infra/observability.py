"""The CloudWatch dashboard and alarms, over the metrics the router and bucket servers publish as EMF.

Router (Powertools, dimension ``service``): Checks, Allowed, Denied, Fallbacks,
PartitionErrors, WouldDeny, CheckLatency. Bucket servers (one EMF line a minute, dimension
``Partition``): PartitionChecks, StoreErrors, WouldDeny, Keys. ECS Container Insights:
RunningTaskCount per service. DynamoDB: read/write throttle events per table.
Alarms notify an SNS topic (subscribe to it after deploying).

Example:
    >>> Observability(stack, "Observability", fleet=fleet, storage=storage,
    ...               router_service="sluicegate-router")  # doctest: +SKIP
"""

from __future__ import annotations

from aws_cdk import CfnOutput, Duration, Stack
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_cloudwatch_actions as actions
from aws_cdk import aws_sns as sns
from constructs import Construct

from infra.fleet import BucketFleet
from infra.lambdas import METRICS_NAMESPACE
from infra.storage import Storage

PERIOD = Duration.minutes(1)
FALLBACK_PERCENT = 1.0  # of checks, over 3 of 5 minutes: partitions are unreachable, decisions are defaults
WIDTH = 12


class Observability(Construct):
    """Dashboard ``dashboard``, alarms ``alarms`` (by name) and their topic ``topic``."""

    def __init__(
        self, scope: Construct, construct_id: str, *, fleet: BucketFleet, storage: Storage, router_service: str
    ) -> None:
        super().__init__(scope, construct_id)
        self._router_service = router_service
        self.topic = sns.Topic(self, "Alarms", display_name="Sluicegate alarms", enforce_ssl=True)
        self.alarms: dict[str, cloudwatch.Alarm] = {}

        checks, fallbacks = self._router("Checks"), self._router("Fallbacks")
        fallback_rate = cloudwatch.MathExpression(
            expression="IF(checks > 0, 100 * fallbacks / checks, 0)",
            using_metrics={"checks": checks, "fallbacks": fallbacks},
            label="fallbacks (% of checks)",
            period=PERIOD,
        )
        self._alarm(
            "FallbackRate",
            fallback_rate,
            threshold=FALLBACK_PERCENT,
            comparison=cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD,
            description=f"More than {FALLBACK_PERCENT:g}% of checks got the fallback answer (partitions unreachable)",
            missing=cloudwatch.TreatMissingData.NOT_BREACHING,
        )
        running = self._query(
            f'SELECT SUM(RunningTaskCount) FROM SCHEMA("ECS/ContainerInsights", ClusterName, ServiceName) '
            f"WHERE ClusterName = '{fleet.cluster.cluster_name}'",
            label="running bucket servers",
        )
        self._alarm(
            "RunningTasksBelowPartitions",
            running,
            threshold=fleet.partitions,
            comparison=cloudwatch.ComparisonOperator.LESS_THAN_THRESHOLD,
            description=f"Fewer than {fleet.partitions} bucket servers run: some partitions answer only fallbacks",
            missing=cloudwatch.TreatMissingData.BREACHING,  # no data at all: no task is running
        )
        store_errors = self._query(
            f'SELECT SUM(StoreErrors) FROM SCHEMA("{METRICS_NAMESPACE}", Partition)', label="store errors"
        )
        self._alarm(
            "StoreErrors",
            store_errors,
            threshold=0,
            comparison=cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD,
            description="Bucket servers fail to read rules or write checkpoints (store down or throttled)",
            missing=cloudwatch.TreatMissingData.NOT_BREACHING,
        )
        throttles = self._dynamodb_throttles(storage)
        if throttles is not None:
            self._alarm(
                "StoreThrottling",
                throttles,
                threshold=0,
                comparison=cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD,
                description="DynamoDB throttles the rules or checkpoints table",
                missing=cloudwatch.TreatMissingData.NOT_BREACHING,
            )
        self.dashboard = self._dashboard(fleet, checks, fallbacks, running, store_errors, throttles)
        CfnOutput(scope, "AlarmTopicArn", value=self.topic.topic_arn, description="Subscribe to get alarms")
        CfnOutput(scope, "DashboardName", value=self.dashboard.dashboard_name)

    def _router(self, name: str, statistic: str = "Sum") -> cloudwatch.Metric:
        return cloudwatch.Metric(
            namespace=METRICS_NAMESPACE,
            metric_name=name,
            dimensions_map={"service": self._router_service},
            statistic=statistic,
            period=PERIOD,
        )

    @staticmethod
    def _query(sql: str, *, label: str) -> cloudwatch.MathExpression:
        """A Metrics Insights query: one series however many partitions there are."""
        return cloudwatch.MathExpression(expression=sql, using_metrics={}, label=label, period=PERIOD)

    @staticmethod
    def _dynamodb_throttles(storage: Storage) -> cloudwatch.MathExpression | None:
        if storage.rules_table is None or storage.checkpoints_table is None:
            return None
        metrics: dict[str, cloudwatch.IMetric] = {}
        for prefix, table in (("rules", storage.rules_table), ("checkpoints", storage.checkpoints_table)):
            for kind in ("Read", "Write"):
                metrics[f"{prefix}{kind.lower()}"] = table.metric(
                    f"{kind}ThrottleEvents", statistic="Sum", period=PERIOD
                )
        return cloudwatch.MathExpression(
            expression=" + ".join(f"FILL({name}, 0)" for name in metrics),
            using_metrics=metrics,
            label="DynamoDB throttle events",
            period=PERIOD,
        )

    def _alarm(
        self,
        name: str,
        metric: cloudwatch.IMetric,
        *,
        threshold: float,
        comparison: cloudwatch.ComparisonOperator,
        description: str,
        missing: cloudwatch.TreatMissingData,
    ) -> None:
        alarm = cloudwatch.Alarm(
            self,
            name,
            metric=metric,
            threshold=threshold,
            comparison_operator=comparison,
            evaluation_periods=5,
            datapoints_to_alarm=3,
            treat_missing_data=missing,
            alarm_description=description,
        )
        alarm.add_alarm_action(actions.SnsAction(self.topic))
        alarm.add_ok_action(actions.SnsAction(self.topic))
        self.alarms[name] = alarm

    def _dashboard(
        self,
        fleet: BucketFleet,
        checks: cloudwatch.Metric,
        fallbacks: cloudwatch.Metric,
        running: cloudwatch.IMetric,
        store_errors: cloudwatch.IMetric,
        throttles: cloudwatch.IMetric | None,
    ) -> cloudwatch.Dashboard:
        per_second = cloudwatch.MathExpression(
            expression="checks / PERIOD(checks)", using_metrics={"checks": checks}, label="checks/s", period=PERIOD
        )
        latency = [
            self._router("CheckLatency", statistic=quantile).with_(label=f"{quantile} (ms)")
            for quantile in ("p50", "p99")
        ]
        dashboard = cloudwatch.Dashboard(self, "Dashboard", dashboard_name=Stack.of(self).stack_name)
        dashboard.add_widgets(
            cloudwatch.GraphWidget(title="Checks per second", left=[per_second], width=WIDTH),
            cloudwatch.GraphWidget(
                title="Allowed vs denied",
                left=[self._router("Allowed"), self._router("Denied")],
                stacked=True,
                width=WIDTH,
            ),
            cloudwatch.GraphWidget(
                title="Fallbacks and partition errors",
                left=[fallbacks, self._router("PartitionErrors")],
                width=WIDTH,
            ),
            cloudwatch.GraphWidget(title="Check latency (router)", left=latency, width=WIDTH),
            cloudwatch.GraphWidget(
                title="Shadow limits: checks they would deny", left=[self._router("WouldDeny")], width=WIDTH
            ),
            cloudwatch.GraphWidget(
                title="Checks per partition", left=[self._search("PartitionChecks", "Sum")], width=WIDTH
            ),
            cloudwatch.GraphWidget(title="Keys per partition", left=[self._search("Keys", "Maximum")], width=WIDTH),
            cloudwatch.GraphWidget(
                title="Store errors and throttling",
                left=[store_errors, *([throttles] if throttles is not None else [])],
                width=WIDTH,
            ),
            cloudwatch.GraphWidget(
                title="Running bucket servers",
                left=[running],
                left_annotations=[cloudwatch.HorizontalAnnotation(value=fleet.partitions, label="partitions")],
                width=WIDTH,
            ),
            cloudwatch.AlarmStatusWidget(title="Alarms", alarms=list(self.alarms.values()), width=2 * WIDTH),
        )
        return dashboard

    @staticmethod
    def _search(metric_name: str, statistic: str) -> cloudwatch.MathExpression:
        """One line per partition, whatever their number (the bucket servers' EMF dimension)."""
        return cloudwatch.MathExpression(
            expression=(f"SEARCH('{{{METRICS_NAMESPACE},Partition}} MetricName=\"{metric_name}\"', '{statistic}', 60)"),
            using_metrics={},
            label="",
            period=PERIOD,
        )
