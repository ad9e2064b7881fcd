"""Screening idle and standby nodes (lambdas/screen_idle/): the idle screener's settings, its
schedule, the SDC alarm a reproduced screen raises, and the grants on those.

The screener runs the same node screen as the workflow's Screen step (a Kubernetes Job running
``python -m sdc_agent.screen`` on all of a node's GPUs) on HyperPod nodes that run no training
pod. A ``reproduced`` screen enters the workflow as an agent's finding does: the screener writes
an ``sdc.alarm/v1`` report for the reserved job ``IDLE_SCREEN_JOB`` and puts one datum into the
screener's own namespace (``idle_screen_namespace``), which no training pod may put into, so
only the screener can raise this alarm; its name carries the stack's alarm prefix, so the
stack's one EventBridge rule routes it and localize accepts it, and the same admission guard,
cordon, health check, approval and replacement follow.
"""

from __future__ import annotations

from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_scheduler as scheduler
from constructs import Construct

import sdc_contract as contract
from infra.config import SdcConfig
from infra.constructs.alarms import job_alarm
from infra.constructs.functions import screen_environment
from infra.constructs.schedules import invoke_on_schedule
from infra.grants import allow

RUN = {"action": "run"}
"""What the schedule sends the screener: start screens of idle nodes, collect finished ones."""


def idle_screen_alarm_name(config: SdcConfig) -> str:
    """The idle screen's SDC alarm: this stack's alarm prefix, so localize accepts its events."""
    return f"{config.resource_prefix}-{contract.IDLE_SCREEN_ALARM_SUFFIX}"


def idle_screen_environment(config: SdcConfig) -> dict[str, str]:
    """What the idle screener reads besides the common environment: the screen Job's image,
    namespace and deadline (the Screen step's), the rescreen age and the bound on screens at
    once."""
    return {
        **screen_environment(config),
        contract.SCREEN_RESCREEN_DAYS: str(config.screen_rescreen_days),
        contract.SCREEN_IDLE_MAX_NODES: str(config.screen_idle_max_nodes),
    }


class IdleScreen(Construct):
    """The schedule that runs the idle screener, and the idle screen's SDC alarm (routed by the
    stack's one EventBridge rule like every SDC alarm).

    Built only where idle screening is on (`SdcConfig.idle_screen_enabled`); `function` is the
    screener that `Functions` built with the project's defaults (its own role, log group, the
    VPC where the EKS endpoint is private). The screener's Kubernetes access is the stack's
    `EksAccess` grant, in its own group `sdc-idle-screener` (infra/k8s/idle-screen-rbac.yaml).
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: SdcConfig,
        function: lambda_.Function,
    ) -> None:
        super().__init__(scope, construct_id)
        if not config.idle_screen_enabled or config.screen_idle_schedule is None:
            raise ValueError(
                "IdleScreen needs idle screening on (context keys 'screenImage' set and "
                "'screenIdleSchedule' not off)"
            )
        cluster = config.hyperpod_cluster_name
        self.function = function
        self.namespace = contract.idle_screen_namespace(config.namespace)
        """The reproduced screens' datum and alarm live here, apart from the pods' namespace."""
        for name, value in idle_screen_environment(config).items():
            function.add_environment(name, value)

        # A per-job alarm like the SDC alarms (the idle-screen job's contributor only): a
        # reproduced screen takes the same route as a job's finding, a contributor's ALARM.
        self.alarm = job_alarm(
            self,
            "Alarm",
            alarm_name=idle_screen_alarm_name(config),
            description=(
                f"sdc-guard idle screen: a node screen of job {contract.IDLE_SCREEN_JOB} "
                f"reproduced a fault on an idle node of {cluster}; ALARM starts the remediation "
                "workflow for that node (the report names it)"
            ),
            query=contract.job_alarm_query(
                self.namespace,
                contract.IDLE_SCREEN_METRIC,
                cluster,
                only_job=contract.IDLE_SCREEN_JOB,
            ),
            threshold=1,
            period_seconds=config.alarm_period_seconds,
        )

        # A run is idempotent (the ledger holds which screens run).
        self.role, self.schedule = invoke_on_schedule(
            self,
            function,
            what="idle screener",
            description=(
                "sdc-guard: screen idle HyperPod nodes (oldest screen first, at most "
                f"{config.screen_idle_max_nodes} at once) and collect finished screens"
            ),
            schedule=scheduler.ScheduleExpression.expression(config.screen_idle_schedule),
            payload=RUN,
        )

    def grant_put_datum(self, grantee: iam.IGrantable) -> iam.PolicyStatement:
        """Put a reproduced screen's datum into the idle screen's own namespace, and no other
        (the idle screener). The training pods' policy puts data into the SDC namespace only, so
        nothing a pod writes reaches this alarm. (The screener's outcome counts go out as
        Powertools metrics in its log output, which needs no PutMetricData.)"""
        return allow(
            grantee,
            sid="IdleScreenDatum",
            actions=["cloudwatch:PutMetricData"],
            resources=["*"],
            conditions={"StringEquals": {"cloudwatch:namespace": self.namespace}},
            wildcard_reason=(
                "cloudwatch:PutMetricData has no resource-level permissions; the "
                f"cloudwatch:namespace condition limits it to the idle screen's {self.namespace}"
            ),
        )

    def grant_screen_by_hand(self, grantee: iam.IGrantable) -> iam.PolicyStatement:
        """Invoke the idle screener, to screen one node now (`sdc-remediation screen NODE`,
        operators): this function only, none of its versions or aliases."""
        return allow(
            grantee,
            sid="ScreenANodeByHand",
            actions=["lambda:InvokeFunction"],
            resources=[self.function.function_arn],
        )
