"""The sdc-guard stack: composes the constructs, wires them, declares the outputs.

Nothing here builds a resource or writes a policy statement by itself; each concern lives in
`infra/constructs/`, and the construct that owns a resource grants on it (`ledger.grant_admit`).
`_grant` is the one table of who may do what.
"""

from __future__ import annotations

from typing import Any

import aws_cdk as cdk
from constructs import Construct

from infra.config import SdcConfig
from infra.constructs.agent_access import AgentPolicy
from infra.constructs.alarms import LivenessAlarm, PipelineAlarms, SdcAlarms, SeriesFloodAlarms
from infra.constructs.approval import Approvals, ApprovalUrl, OperatorPolicy
from infra.constructs.canary import Canary
from infra.constructs.dashboard import Dashboard
from infra.constructs.eks_access import EksAccess, kubernetes_rbac_command
from infra.constructs.encryption import LogsKey
from infra.constructs.functions import SWEEP_RATE, Functions, log_retention
from infra.constructs.hyperpod import HyperPodCluster
from infra.constructs.idle_screen import IdleScreen
from infra.constructs.ledger import Ledger
from infra.constructs.notifications import Notifications
from infra.constructs.reports import ReportLogGroup
from infra.constructs.rule import AlarmRule
from infra.constructs.sweeper import SweeperSchedule
from infra.constructs.workflow import Workflow, log_group_name, state_machine_arn
from sdc_contract.environment import SCREEN_GRACE_SECONDS

# Margin on top of the health-check and approval windows before the execution itself times out:
# retries, waits and the record steps; generous so it never cuts a legitimate run short.
EXECUTION_TIMEOUT_MARGIN = cdk.Duration.hours(6)


class SdcGuardStack(cdk.Stack):
    """The remediation pipeline for one HyperPod cluster."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: SdcConfig,
        **kwargs: Any,
    ) -> None:
        super().__init__(scope, construct_id, **kwargs)
        self.config = config
        state_machine_name = config.resource_prefix

        # What the functions act on and do not create: the clusters.
        self.hyperpod = HyperPodCluster(
            self,
            "HyperPodCluster",
            cluster_name=config.hyperpod_cluster_name,
            cluster_arn=config.hyperpod_cluster_arn,
        )
        self.eks_access = EksAccess(self, "EksAccess", cluster_name=config.eks_cluster_name)
        self.ledger = Ledger(self, "Ledger", cluster_name=config.hyperpod_cluster_name)
        # The stack's log groups: the functions' (CloudFormation names them "<stack>-<id>-<n>"),
        # the state machine's and the agent's report group (created here unless adopted).
        self.logs_key = LogsKey(
            self,
            "LogsKey",
            log_group_names=[
                f"{self.stack_name}-*",
                log_group_name(state_machine_name),
                config.report_log_group,
            ],
        )
        self.reports = ReportLogGroup(
            self,
            "Reports",
            log_group_name=config.report_log_group,
            retention=log_retention(config.report_retention_days),
            logs_key=self.logs_key.key,
            adopt=config.adopt_report_log_group,
        )
        self.approvals = Approvals(self, "Approvals")
        self.notifications = Notifications(
            self,
            "Notifications",
            emails=config.notification_emails,
            alarm_name_prefix=config.resource_prefix,
        )
        self.functions = Functions(
            self,
            "Functions",
            config=config,
            ledger=self.ledger.table,
            approvals=self.approvals.table,
            topic=self.notifications.topic,
            # Known before the state machine exists, so the functions can name it in messages
            # without a dependency cycle (the state machine depends on the functions).
            state_machine_arn=state_machine_arn(self, state_machine_name),
            logs_key=self.logs_key.key,
        )
        self.approval_url = ApprovalUrl(
            self, "ApproveFunctionUrl", function=self.functions.function("approve")
        )
        self.workflow = Workflow(
            self,
            "Workflow",
            functions={folder: step.function for folder, step in self.functions.steps.items()},
            state_machine_name=state_machine_name,
            approval_timeout=cdk.Duration.seconds(config.approval_timeout_seconds),
            health_check_poll=cdk.Duration.seconds(config.health_check_poll_seconds),
            execution_timeout=cdk.Duration.seconds(
                config.health_check_timeout_seconds
                + config.screen_deadline_seconds
                + SCREEN_GRACE_SECONDS
                + config.approval_timeout_seconds
            ).plus(EXECUTION_TIMEOUT_MARGIN),
            log_retention=log_retention(config.log_retention_days),
            logs_key=self.logs_key.key,
            shadow_health_check=config.shadow_health_check,
        )
        state_machine = self.workflow.state_machine
        self.sweeper = SweeperSchedule(
            self,
            "Sweeper",
            function=self.functions.function("sweeper"),
            rate=SWEEP_RATE,
            flood_watch_fraction=config.flood_watch_fraction,
            alarm_period_seconds=config.alarm_period_seconds,
        )

        self.sdc_alarms = SdcAlarms(self, "SdcAlarms", config=config)
        # Pages on a flood of made-up JobNames; not routed to the workflow (AlarmRule below).
        self.flood_alarms = SeriesFloodAlarms(
            self, "FloodAlarms", config=config, topic=self.notifications.topic
        )
        self.canary = (
            Canary(
                self,
                "Canary",
                config=config,
                function=self.functions.function("canary"),
                topic=self.notifications.topic,
            )
            if config.canary_enabled
            else None
        )
        self.idle_screen = (
            IdleScreen(
                self, "IdleScreen", config=config, function=self.functions.function("screen_idle")
            )
            if config.idle_screen_enabled
            else None
        )
        self.rule = AlarmRule(
            self,
            "AlarmRule",
            # The canary's alarm takes the same rule: the canary proves this route too. So does
            # a reproduced idle screen's: it is remediated as a job's finding is.
            alarms=[
                *self.sdc_alarms.alarms.values(),
                *([self.canary.sdc_alarm] if self.canary else []),
                *([self.idle_screen.alarm] if self.idle_screen else []),
            ],
            state_machine=state_machine,
        )
        self.pipeline_alarms = PipelineAlarms(
            self,
            "PipelineAlarms",
            config=config,
            state_machine=state_machine,
            dead_letter_queue=self.rule.dead_letter_queue,
            topic=self.notifications.topic,
        )
        self.liveness = (
            LivenessAlarm(
                self,
                "Liveness",
                config=config,
                job_name=config.liveness_job_name,
                topic=self.notifications.topic,
            )
            if config.liveness_job_name
            else None
        )
        self.dashboard = Dashboard(
            self,
            "Dashboard",
            config=config,
            alarms=self.sdc_alarms.alarms,
            state_machine=state_machine,
            functions=[
                f.function
                for f in (*self.functions.steps.values(), *self.functions.services.values())
            ],
            dead_letter_queue=self.rule.dead_letter_queue,
            record_log_group=self.functions.steps["record"].log_group,
        )
        self.operator_policy = OperatorPolicy(self, "Operators")
        self.agent_policy = AgentPolicy(self, "Agent", config=config)
        self._grant()
        self._outputs()

    def _grant(self) -> None:
        """Who may do what: each line is one grant of the construct that owns the resource,
        which says exactly which actions on which resource (docs/architecture.md, "The
        stack"). Nothing is granted anywhere else, except each function's own log group and
        network (infra/constructs/functions.py) and the service roles CDK makes for the
        schedules, the rule and the state machine."""
        fn = self.functions.function
        ledger, approvals, hyperpod = self.ledger, self.approvals, self.hyperpod
        workflow, reports, sdc = self.workflow, self.reports, self.sdc_alarms
        notify = self.notifications.grant_publish

        sdc.grant_read_metrics(fn("localize"))
        reports.grant_read(fn("localize"))
        hyperpod.grant_describe_nodes(fn("localize"))

        ledger.grant_admit(fn("admit"))
        hyperpod.grant_count_nodes(fn("admit"))

        hyperpod.grant_start_health_check(fn("start_health_check"))
        hyperpod.grant_poll_health_check(fn("poll_health_check"))

        approvals.grant_request(fn("request_approval"))
        ledger.grant_read(fn("request_approval"))
        notify(fn("request_approval"))
        self.approval_url.announce_url(fn("request_approval"))
        if self.config.auto_approve.enabled:
            # Opt-in auto-approval: the policy reads every check's outcomes (precision) and
            # resumes the workflow itself. Without the policy, approve alone sends results.
            ledger.grant_read_outcomes(fn("request_approval"))
            workflow.grant_auto_approve(fn("request_approval"))

        hyperpod.grant_replace(fn("replace"))
        # Replace, and uncordon after a reject-with-release, act only on the decision the
        # approvals table holds (never reading the token).
        approvals.grant_read_decision(fn("replace"))
        approvals.grant_read_decision(fn("uncordon"))

        ledger.grant_record(fn("record"))
        # The ledger records the approver the approvals table holds, not the message's.
        approvals.grant_read_decision(fn("record"))
        notify(fn("record"))

        # The approve function is the only principal that reads task tokens and sends task
        # results (operators reach it through its AWS_IAM function URL).
        approvals.grant_decide(fn("approve"))
        workflow.grant_send_decision(fn("approve"))
        ledger.grant_release(fn("approve"))

        ledger.grant_sweep(fn("sweeper"))
        workflow.grant_describe_executions(fn("sweeper"))
        notify(fn("sweeper"))
        # The backstop: reports no remediation took up (a flood of made-up JobNames can keep a
        # real job's contributor out of ALARM) start the same workflow.
        reports.grant_read(fn("sweeper"))
        workflow.grant_start_backstop(fn("sweeper"))
        # The flood watch: how many job series each SDC alarm's query matches (ListMetrics).
        sdc.grant_list_series(fn("sweeper"))

        for step in self.functions.kubernetes_steps:
            self.eks_access.grant_kubernetes(step, fn(step))

        if self.canary is not None:
            # The canary function writes its runs, its report and its datum; the steps it
            # passes write its progress; nothing of it reaches a node.
            ledger.grant_canary_runs(fn("canary"))
            reports.grant_write_canary_report(fn("canary"))
            self.canary.grant_put_datum(fn("canary"))
            self.canary.grant_where_it_stopped(fn("canary"))
            workflow.grant_list_executions(fn("canary"))
            notify(fn("canary"))
            for step in ("localize", "admit", "record"):
                ledger.grant_canary_progress(fn(step))
            self.canary.grant_complete(fn("record"))
            # The canary's approval is settled through the approve function's URL, as a
            # person's decision is: no role invokes that function any other way.
            self.approval_url.grant_settle_canary(fn("request_approval"))

        if self.idle_screen is not None:
            # The idle screener keeps its screens in the ledger (its own items only), writes a
            # reproduced screen's report and datum, and reaches Kubernetes through its own group
            # (the loop above); a reproduced screen reaches a node only through the workflow.
            ledger.grant_screens(fn("screen_idle"))
            reports.grant_write_idle_screen_report(fn("screen_idle"))
            self.idle_screen.grant_put_datum(fn("screen_idle"))
            # `sdc-remediation screen NODE`: operators may screen one node by hand.
            self.idle_screen.grant_screen_by_hand(self.operator_policy.policy)

        # The people who decide, and the training pods (managed policies the user attaches).
        self.approval_url.grant_invoke_url(self.operator_policy.policy)
        ledger.grant_history(self.operator_policy.policy)
        # Under Pod Identity, the pods' session tags scope the agent's grants to the training
        # namespace and each pod to its own report stream.
        pods = self.config.pod_identity_namespace
        sdc.grant_put_metric_data(self.agent_policy.policy, pod_namespace=pods)
        reports.grant_write_job_reports(self.agent_policy.policy, pod_namespace=pods)

    def _outputs(self) -> None:
        approvals = self.approvals.table.table_name
        ledger = self.ledger.table.table_name
        outputs = {
            "StateMachineArn": (
                self.workflow.state_machine.state_machine_arn,
                "The remediation workflow",
            ),
            "LedgerTableName": (ledger, "Remediation ledger (SDC_LEDGER_TABLE for the CLI)"),
            "ApprovalsTableName": (
                approvals,
                "Pending approvals (SDC_APPROVALS_TABLE for the CLI)",
            ),
            "TopicArn": (
                self.notifications.topic.topic_arn,
                "Notifications; subscribe more endpoints here",
            ),
            "DashboardUrl": (self.dashboard.url, "CloudWatch dashboard"),
            "OperatorPolicyArn": (
                self.operator_policy.policy.managed_policy_arn,
                "Attach to the people or roles who approve replacements",
            ),
            "AgentPolicyArn": (
                self.agent_policy.policy.managed_policy_arn,
                "Attach to the training pods' role so the agent can publish",
            ),
            "ApprovalUrl": (
                self.approval_url.url,
                "The approve function's AWS_IAM URL (SDC_APPROVAL_URL for the CLI)",
            ),
            "ApproveCommand": (
                cdk.Fn.join(
                    "",
                    [
                        "sdc-remediation --approval-url ",
                        self.approval_url.url,
                        " --ledger-table ",
                        ledger,
                        " approve APPROVAL_ID",
                    ],
                ),
                "Approve a pending replacement (the id is in the notification; list with `pending`)",
            ),
            "LogsKeyArn": (
                self.logs_key.key.key_arn,
                "The key of the stack's log groups and of the report group (retained with it); "
                "an adopted report group is associated with it (docs/deploy.md)",
            ),
            "KubernetesRbacCommand": (
                kubernetes_rbac_command(self.config),
                "Run once against the EKS cluster: the sdc-reader/sdc-cordoner/sdc-releaser/"
                "sdc-replacer/sdc-screener groups (the reader's pod access in the training "
                "namespace only) and the admission policy limiting what they may change on a "
                "node; with screenImage, the screening namespace and the screen's RBAC in it "
                "(and the idle screener's, where idle screening is on)",
            ),
        }
        if self.idle_screen is not None:
            outputs["IdleScreenCommand"] = (
                cdk.Fn.join(
                    "",
                    [
                        "sdc-remediation screen --function ",
                        self.idle_screen.function.function_name,
                        " NODE",
                    ],
                ),
                "Screen one idle node now (the schedule screens idle nodes every "
                "screenIdleSchedule)",
            )
        if self.canary is not None:
            outputs["CanaryCommand"] = (
                cdk.Fn.join(
                    "",
                    [
                        "aws lambda invoke --function-name ",
                        self.functions.function("canary").function_name,
                        """ --cli-binary-format raw-in-base64-out --payload '{"action": "start"}' """,
                        "/dev/stdout",
                    ],
                ),
                "Start a canary run now (the schedule starts one every canarySchedule)",
            )
        for name, (value, description) in outputs.items():
            cdk.CfnOutput(self, name, value=value, description=description)
