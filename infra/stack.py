"""The sdc-guard stack: composes the constructs, wires them, declares the outputs.

Nothing here builds a resource by itself; each concern lives in `infra/constructs/`.
"""

from __future__ import annotations

from typing import Any

import aws_cdk as cdk
from constructs import Construct

from infra.config import SdcConfig
from infra.constructs.agent_access import AgentPolicy
from infra.constructs.alarms import LivenessAlarm, PipelineAlarms, SdcAlarms
from infra.constructs.approval import Approvals, OperatorPolicy
from infra.constructs.canary import Canary
from infra.constructs.dashboard import Dashboard
from infra.constructs.eks_access import EksAccess
from infra.constructs.functions import SWEEP_RATE, Functions, log_retention
from infra.constructs.ledger import Ledger
from infra.constructs.notifications import Notifications
from infra.constructs.rule import AlarmRule
from infra.constructs.sweeper import SweeperSchedule
from infra.constructs.workflow import Workflow

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
        # Known before the state machine exists, so the functions can name it in messages
        # without a dependency cycle (the state machine depends on the functions).
        state_machine_arn = self.format_arn(
            service="states",
            resource="stateMachine",
            resource_name=state_machine_name,
            arn_format=cdk.ArnFormat.COLON_RESOURCE_NAME,
        )

        self.ledger = Ledger(self, "Ledger")
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
            topic_key=self.notifications.key,
            state_machine_arn=state_machine_arn,
        )
        self.workflow = Workflow(
            self,
            "Workflow",
            functions={folder: step.function for folder, step in self.functions.steps.items()},
            state_machine_name=state_machine_name,
            approval_timeout=cdk.Duration.seconds(config.approval_timeout_seconds),
            health_check_poll=cdk.Duration.seconds(config.health_check_poll_seconds),
            execution_timeout=cdk.Duration.seconds(
                config.health_check_timeout_seconds + config.approval_timeout_seconds
            ).plus(EXECUTION_TIMEOUT_MARGIN),
            log_retention=log_retention(config.log_retention_days),
            shadow_health_check=config.shadow_health_check,
        )
        state_machine = self.workflow.state_machine
        self.sweeper = SweeperSchedule(
            self,
            "Sweeper",
            function=self.functions.services["sweeper"].function,
            rate=SWEEP_RATE,
        )

        self.sdc_alarms = SdcAlarms(self, "SdcAlarms", config=config)
        self.canary = (
            Canary(
                self,
                "Canary",
                config=config,
                function=self.functions.services["canary"].function,
                topic=self.notifications.topic,
            )
            if config.canary_enabled
            else None
        )
        self.rule = AlarmRule(
            self,
            "AlarmRule",
            # The canary's alarm takes the same rule: the canary proves this route too.
            alarms=[
                *self.sdc_alarms.alarms.values(),
                *([self.canary.sdc_alarm] if self.canary else []),
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
        self.eks_access = EksAccess(
            self,
            "EksAccess",
            cluster_name=config.eks_cluster_name,
            roles=self.functions.kubernetes_roles,
        )
        self.operator_policy = OperatorPolicy(
            self,
            "Operators",
            approve_function=self.functions.services["approve"].function,
            ledger=self.ledger.table,
        )
        self.agent_policy = AgentPolicy(self, "Agent", config=config)
        self._outputs()

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
                self.functions.approval_url.url,
                "The approve function's AWS_IAM URL (SDC_APPROVAL_URL for the CLI)",
            ),
            "ApproveCommand": (
                cdk.Fn.join(
                    "",
                    [
                        "sdc-remediation --approval-url ",
                        self.functions.approval_url.url,
                        " --ledger-table ",
                        ledger,
                        " approve APPROVAL_ID",
                    ],
                ),
                "Approve a pending replacement (the id is in the notification; list with `pending`)",
            ),
            "KubernetesRbacCommand": (
                "kubectl apply -f infra/k8s/rbac.yaml -f infra/k8s/admission-policy.yaml",
                "Run once against the EKS cluster: the sdc-reader/sdc-cordoner/sdc-replacer groups "
                "and the admission policy limiting what they may change on a node",
            ),
        }
        if self.canary is not None:
            outputs["CanaryCommand"] = (
                cdk.Fn.join(
                    "",
                    [
                        "aws lambda invoke --function-name ",
                        self.functions.services["canary"].function.function_name,
                        """ --cli-binary-format raw-in-base64-out --payload '{"action": "start"}' """,
                        "/dev/stdout",
                    ],
                ),
                "Start a canary run now (the schedule starts one every canarySchedule)",
            )
        for name, (value, description) in outputs.items():
            cdk.CfnOutput(self, name, value=value, description=description)
