"""CloudWatch alarms: the SDC alarms that start the workflow (and who may put or read the SDC
metrics they watch), the flood alarms that page when made-up JobNames could crowd them out, the
optional liveness alarm, and alarms on the pipeline itself (so a broken pipeline is not
silent)."""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_cloudwatch_actions as actions
from aws_cdk import aws_iam as iam
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sqs as sqs
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from infra.config import LIVENESS_METRIC_NAMES, METRIC_NAMES, SdcConfig
from infra.constructs.reports import POD_NAMESPACE_TAG
from infra.grants import allow
from sdc_contract.canary import CANARY_JOB
from sdc_contract.metrics import job_alarm_query, job_count_query


def job_alarm(
    scope: Construct,
    construct_id: str,
    *,
    alarm_name: str,
    description: str,
    query: str,
    threshold: float,
    period_seconds: int,
) -> cloudwatch.Alarm:
    """A Metrics Insights alarm on `query` (one of `sdc_contract.metrics.job_alarm_query`): one
    contributor per job, each with its own ALARM/OK state.

    The agent publishes only when a check fails, so no data means healthy (notBreaching). One
    datapoint at or above the threshold is enough: each datapoint is already a confirmed
    finding. No actions: the EventBridge rule starts the workflow on a contributor's ALARM.
    """
    return cloudwatch.Alarm(
        scope,
        construct_id,
        alarm_name=alarm_name,
        alarm_description=description,
        metric=cloudwatch.MathExpression(
            expression=query,
            using_metrics={},
            period=cdk.Duration.seconds(period_seconds),
            label="per job",
        ),
        threshold=threshold,
        comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
        evaluation_periods=1,
        datapoints_to_alarm=1,
        treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
    )


class SdcAlarms(Construct):
    """One Metrics Insights alarm per SDC metric, with one contributor per training job.

    Each query sums the metric on each job's series {ClusterName, JobName}
    (`sdc_contract.metrics.job_alarm_query`, the canary job left out): one job's data can hold
    only that job's contributor in ALARM, never another job's, and a new finding of another job
    starts its own workflow. The SDC namespace is this construct's: it grants who may put data
    into it (the agent, the canary) and who may read it (localize).
    """

    def __init__(self, scope: Construct, construct_id: str, *, config: SdcConfig) -> None:
        super().__init__(scope, construct_id)
        self.namespace = config.namespace
        self.alarms: dict[str, cloudwatch.Alarm] = {}
        cluster = config.hyperpod_cluster_name
        for metric_name in METRIC_NAMES:
            self.alarms[metric_name] = job_alarm(
                self,
                metric_name,
                alarm_name=f"{config.resource_prefix}-{metric_name}",
                description=(
                    f"sdc-guard: {metric_name} per training job on HyperPod cluster {cluster}; "
                    "a job's contributor entering ALARM starts the remediation workflow"
                ),
                query=job_alarm_query(
                    config.namespace, metric_name, cluster, except_job=CANARY_JOB
                ),
                threshold=config.alarm_thresholds[metric_name],
                period_seconds=config.alarm_period_seconds,
            )

    def grant_put_metric_data(
        self,
        grantee: iam.IGrantable,
        *,
        sid: str = "PublishSdcMetrics",
        pod_namespace: str | None = None,
    ) -> iam.PolicyStatement:
        """Put data into the SDC namespace, and no other (the agent's findings and liveness).
        StringEquals: not the canary's ``<namespace>/Canary`` either (`Canary.grant_put_datum`).
        With ``pod_namespace`` (``agentIdentity: pod-identity``) only a pod of that Kubernetes
        namespace may (EKS Pod Identity's session tag); which JobName it puts is still its own
        choice: PutMetricData conditions on nothing finer than the namespace."""
        conditions: dict[str, str] = {"cloudwatch:namespace": self.namespace}
        if pod_namespace is not None:
            conditions[POD_NAMESPACE_TAG] = pod_namespace
        return allow(
            grantee,
            sid=sid,
            actions=["cloudwatch:PutMetricData"],
            # PutMetricData has no resource-level permissions; the namespace condition is what
            # scopes it.
            resources=["*"],
            conditions={"StringEquals": conditions},
            wildcard_reason=(
                "cloudwatch:PutMetricData has no resource-level permissions; the "
                f"cloudwatch:namespace condition limits it to the {self.namespace} namespace"
            ),
        )

    def grant_read_metrics(self, grantee: iam.IGrantable) -> iam.PolicyStatement:
        """List and read the per-node series behind an alarm (localize)."""
        return allow(
            grantee,
            sid="ReadSdcMetrics",
            actions=["cloudwatch:ListMetrics", "cloudwatch:GetMetricData"],
            resources=["*"],
            wildcard_reason=(
                "CloudWatch ListMetrics/GetMetricData have no resource-level permissions (read only)"
            ),
        )

    def grant_list_series(self, grantee: iam.IGrantable) -> iam.PolicyStatement:
        """List the SDC metrics' series, and read their data (the sweeper's flood watch counts
        the job series each alarm's query matches, and when they are many, how many had data
        at once: the contributors that may be in ALARM together)."""
        allow(
            grantee,
            sid="ReadCrowdedSdcSeries",
            actions=["cloudwatch:GetMetricData"],
            resources=["*"],
            wildcard_reason=(
                "CloudWatch GetMetricData has no resource-level permissions (read only: the "
                "flood watch reads the job series' data when 80 or more are active)"
            ),
        )
        return allow(
            grantee,
            sid="ListSdcSeries",
            actions=["cloudwatch:ListMetrics"],
            resources=["*"],
            wildcard_reason=(
                "CloudWatch ListMetrics has no resource-level permissions and no namespace "
                "condition (read only: series names, no data)"
            ),
        )


class SeriesFloodAlarms(Construct):
    """One alarm per SDC metric on how many job data points it has in a minute, all jobs
    together (`sdc_contract.metrics.job_count_query`): a flood of made-up JobNames, which any
    pod may put (PutMetricData conditions on the namespace only), pages the on-call.

    Why it matters: a Metrics Insights alarm puts at most 100 contributors in ALARM, its query
    returns at most 500 series and reads the first 10,000 metrics it matches (AWS documents
    these limits), so such a flood can keep a real job's contributor out of the SDC alarms,
    silently. These alarms detect it; they prevent nothing, and start no remediation (the
    EventBridge rule lists the SDC alarms only).
    """

    def __init__(
        self, scope: Construct, construct_id: str, *, config: SdcConfig, topic: sns.ITopic
    ) -> None:
        super().__init__(scope, construct_id)
        self.alarms: dict[str, cloudwatch.Alarm] = {}
        cluster = config.hyperpod_cluster_name
        for metric_name in METRIC_NAMES:
            alarm = cloudwatch.Alarm(
                self,
                metric_name,
                alarm_name=f"{config.resource_prefix}-{metric_name}-flood",
                alarm_description=(
                    f"sdc-guard: {config.flood_threshold} or more job data points of "
                    f"{metric_name} in one minute on cluster {cluster}, more than real findings "
                    "give: made-up JobNames may be keeping real jobs' contributors out of the "
                    "SDC alarms (at most 100 contributors in ALARM, 500 series, the first "
                    "10,000 metrics). Find the pod that puts them; this alarm starts no "
                    "remediation"
                ),
                metric=cloudwatch.MathExpression(
                    expression=job_count_query(
                        config.namespace, metric_name, cluster, except_job=CANARY_JOB
                    ),
                    using_metrics={},
                    # One minute whatever alarmPeriod is: floodThreshold is per minute.
                    period=cdk.Duration.seconds(60),
                    label="job data points",
                ),
                threshold=config.flood_threshold,
                comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
                evaluation_periods=1,
                datapoints_to_alarm=1,
                treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
            )
            alarm.add_alarm_action(actions.SnsAction(topic))
            self.alarms[metric_name] = alarm


class LivenessAlarm(Construct):
    """Fires when the named job published no passing audit or weight check for a whole window:
    a job whose checks stopped running is unprotected. Notifies; never starts the workflow."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: SdcConfig,
        job_name: str,
        topic: sns.ITopic,
    ) -> None:
        super().__init__(scope, construct_id)
        window = cdk.Duration.seconds(config.liveness_window_seconds)
        passes = {
            f"m{i}": cloudwatch.Metric(
                namespace=config.namespace,
                metric_name=name,
                dimensions_map={"ClusterName": config.hyperpod_cluster_name, "JobName": job_name},
                statistic=cloudwatch.Stats.SUM,
                period=window,
            )
            for i, name in enumerate(LIVENESS_METRIC_NAMES)
        }
        self.alarm = cloudwatch.Alarm(
            self,
            "Alarm",
            alarm_name=f"{config.resource_prefix}-liveness-{job_name}"[:255],
            alarm_description=f"sdc-guard: no SDC check passed in job {job_name} for {window.to_human_string()}",
            metric=cloudwatch.MathExpression(
                expression=" + ".join(f"FILL({key}, 0)" for key in passes),
                using_metrics=passes,
                label="checks passed",
                period=window,
            ),
            threshold=1,
            comparison_operator=cloudwatch.ComparisonOperator.LESS_THAN_THRESHOLD,
            evaluation_periods=1,
            # No data at all is exactly the failure this alarm exists for.
            treat_missing_data=cloudwatch.TreatMissingData.BREACHING,
        )
        self.alarm.add_alarm_action(actions.SnsAction(topic))


class PipelineAlarms(Construct):
    """Alarms on the remediation pipeline: failed executions and undelivered alarm events."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: SdcConfig,
        state_machine: sfn.IStateMachine,
        dead_letter_queue: sqs.IQueue,
        topic: sns.ITopic,
    ) -> None:
        super().__init__(scope, construct_id)
        five_minutes = cdk.Duration.minutes(5)
        self.workflow_failed = cloudwatch.Alarm(
            self,
            "WorkflowFailed",
            alarm_name=f"{config.resource_prefix}-workflow-failed",
            alarm_description="sdc-guard: a remediation execution failed, timed out or was aborted",
            metric=cloudwatch.MathExpression(
                expression="FILL(failed, 0) + FILL(timedout, 0) + FILL(aborted, 0)",
                using_metrics={
                    "failed": state_machine.metric_failed(period=five_minutes, statistic="Sum"),
                    "timedout": state_machine.metric_timed_out(
                        period=five_minutes, statistic="Sum"
                    ),
                    "aborted": state_machine.metric_aborted(period=five_minutes, statistic="Sum"),
                },
                label="unsuccessful executions",
                period=five_minutes,
            ),
            threshold=1,
            comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            evaluation_periods=1,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
        )
        self.undelivered = cloudwatch.Alarm(
            self,
            "UndeliveredAlarmEvents",
            alarm_name=f"{config.resource_prefix}-undelivered-alarm-events",
            alarm_description=(
                "sdc-guard: an SDC alarm event could not start the workflow (see the rule's dead-letter queue)"
            ),
            metric=dead_letter_queue.metric_approximate_number_of_messages_visible(
                period=five_minutes, statistic="Maximum"
            ),
            threshold=1,
            comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            evaluation_periods=1,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
        )
        for alarm in (self.workflow_failed, self.undelivered):
            alarm.add_alarm_action(actions.SnsAction(topic))
