"""The live canary (lambdas/sdc_remediation/logic/canary/): its schedule, the SDC alarm its datum
fires, the alarm that says when a canary did not complete, and where it stopped; the grants on
those alarms."""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_cloudwatch_actions as actions
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_scheduler as scheduler
from aws_cdk import aws_sns as sns
from constructs import Construct

import sdc_contract as contract
from infra.config import SdcConfig
from infra.constructs.alarms import job_alarm
from infra.constructs.schedules import invoke_on_schedule
from infra.grants import allow

START = {"action": "start"}
"""What the schedule sends the canary function (an alarm action's event carries `alarmData`)."""


def canary_alarm_name(config: SdcConfig) -> str:
    """The canary's SDC alarm: this stack's alarm prefix, so localize accepts its events."""
    return f"{config.resource_prefix}-{contract.CANARY_ALARM_SUFFIX}"


class Canary(Construct):
    """The schedule that starts a canary run, the canary's SDC alarm (routed by the stack's one
    EventBridge rule like every SDC alarm), and the not-completed alarm.

    The not-completed alarm watches `canary_completed` (put by the record step when a canary
    closes) over one schedule period plus `canaryTimeout`; no datum is the failure it exists
    for (missing data breaches). It notifies the topic and invokes the canary function, which
    publishes the step where the newest run stopped.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: SdcConfig,
        function: lambda_.Function,
        topic: sns.ITopic,
    ) -> None:
        super().__init__(scope, construct_id)
        cluster = config.hyperpod_cluster_name
        self.namespace = contract.canary_namespace(config.namespace)
        """The canary's datum and alarm live here, apart from the training pods' namespace."""
        # A run is open this long: after it, its report and approval are refused (runs expire).
        function.add_environment(
            contract.CANARY_TIMEOUT_SECONDS, str(config.canary_timeout_seconds)
        )
        # A per-job alarm like the SDC alarms (the canary job's contributor only), so the canary
        # proves the same route: a contributor's ALARM, the rule, the workflow.
        self.sdc_alarm = job_alarm(
            self,
            "SdcAlarm",
            alarm_name=canary_alarm_name(config),
            description=(
                f"sdc-guard canary: the synthetic SDC finding of job {contract.CANARY_JOB} on "
                f"{cluster}; ALARM starts the remediation workflow in dry run for the reserved "
                "canary node"
            ),
            query=contract.job_alarm_query(
                self.namespace,
                contract.CANARY_METRIC,
                cluster,
                only_job=contract.CANARY_JOB,
            ),
            threshold=1,
            period_seconds=config.alarm_period_seconds,
        )

        self.role, self.schedule = invoke_on_schedule(
            self,
            function,
            what="canary function",
            description="sdc-guard: start a canary run (a synthetic SDC event on the reserved node)",
            schedule=scheduler.ScheduleExpression.rate(
                cdk.Duration.seconds(config.canary_schedule_seconds)
            ),
            payload=START,
        )

        window = cdk.Duration.seconds(config.canary_window_seconds)
        self.not_completed = cloudwatch.Alarm(
            self,
            "NotCompleted",
            alarm_name=f"{config.resource_prefix}-canary-not-completed",
            alarm_description=(
                f"sdc-guard canary: no canary completed on {cluster} within "
                f"{window.to_human_string()} (schedule + canaryTimeout). A second message names "
                "the step where it stopped; `sdc-remediation canary` shows the newest run's steps"
            ),
            metric=cloudwatch.Metric(
                namespace=contract.POWERTOOLS_METRICS_NAMESPACE,
                metric_name=contract.CANARY_COMPLETED_METRIC,
                dimensions_map={"ClusterName": cluster},
                statistic=cloudwatch.Stats.SUM,
                period=window,
            ),
            threshold=1,
            comparison_operator=cloudwatch.ComparisonOperator.LESS_THAN_THRESHOLD,
            evaluation_periods=1,
            treat_missing_data=cloudwatch.TreatMissingData.BREACHING,
        )
        self.not_completed.add_alarm_action(actions.SnsAction(topic))
        self.not_completed.add_alarm_action(actions.LambdaAction(function))
        # By name, not the alarm's Arn attribute: the alarm's Lambda action depends on the
        # canary function, whose role's policy would then depend on the alarm (a cycle).
        self.sdc_alarm_arn = cdk.Stack.of(self).format_arn(
            service="cloudwatch",
            resource="alarm",
            resource_name=canary_alarm_name(config),
            arn_format=cdk.ArnFormat.COLON_RESOURCE_NAME,
        )

    def grant_put_datum(self, grantee: iam.IGrantable) -> iam.PolicyStatement:
        """Put the canary's synthetic finding into the canary's own namespace, and no other
        (the canary function). The training pods' policy puts data into the SDC namespace
        only, so nothing a pod writes reaches the canary's alarm."""
        return allow(
            grantee,
            sid="CanaryDatum",
            actions=["cloudwatch:PutMetricData"],
            resources=["*"],
            conditions={"StringEquals": {"cloudwatch:namespace": self.namespace}},
            wildcard_reason=(
                "cloudwatch:PutMetricData has no resource-level permissions; the "
                f"cloudwatch:namespace condition limits it to the canary's {self.namespace}"
            ),
        )

    def grant_where_it_stopped(self, grantee: iam.IGrantable) -> iam.PolicyStatement:
        """Read the canary's SDC alarm, to say where a run stopped (the canary function)."""
        return allow(
            grantee,
            sid="WhereTheCanaryStopped",
            actions=["cloudwatch:DescribeAlarms"],
            resources=[self.sdc_alarm_arn],
        )

    def grant_complete(self, grantee: iam.IGrantable) -> iam.PolicyStatement:
        """Put `canary_completed`, the datum the not-completed alarm waits for (record, when a
        canary run closes), in the functions' own namespace only."""
        return allow(
            grantee,
            sid="CanaryCompleted",
            actions=["cloudwatch:PutMetricData"],
            resources=["*"],
            conditions={
                "StringEquals": {"cloudwatch:namespace": contract.POWERTOOLS_METRICS_NAMESPACE}
            },
            wildcard_reason=(
                "cloudwatch:PutMetricData has no resource-level permissions; the "
                "cloudwatch:namespace condition limits it to one namespace"
            ),
        )
