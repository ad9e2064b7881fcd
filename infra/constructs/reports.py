"""The agent's report log group (`/sdc/<cluster>`, one stream per training job), and every grant
on it.

The stack creates the group (issue 33): with a retention (`reportRetentionDays`), under the
stack's logs key, and retained when the stack is deleted, so deleting the stack never loses the
evidence of past alarms. Nobody else may create it (no role has logs:CreateLogGroup on it): a
group made by a pod would have neither retention nor key. A deployment whose group an agent of
an earlier release already created adopts it (`adoptReportLogGroup`): CloudFormation cannot
create a group that exists, so the stack only names it, and docs/deploy.md gives the two
commands that set its retention and key.
"""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_logs as logs
from constructs import Construct

import sdc_contract as contract
from infra.grants import allow, deny

POD_NAMESPACE_TAG = "aws:PrincipalTag/kubernetes-namespace"
"""The session tag EKS Pod Identity sets to the pod's namespace (it cannot be chosen by the pod)."""
POD_NAME_TAG = "aws:PrincipalTag/kubernetes-pod-name"
"""The session tag EKS Pod Identity sets to the pod's name."""


class ReportLogGroup(Construct):
    """The report group (unless adopted), who may write which stream of it, and who may read
    it."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        log_group_name: str,
        retention: logs.RetentionDays,
        logs_key: kms.IKey,
        adopt: bool = False,
    ) -> None:
        super().__init__(scope, construct_id)
        self.log_group_name = log_group_name
        # The ARN is formatted, never the resource's attribute: every grant reads the same
        # whether the stack created the group or adopted it.
        self.arn = cdk.Stack.of(self).format_arn(
            service="logs",
            resource="log-group",
            resource_name=log_group_name,
            arn_format=cdk.ArnFormat.COLON_RESOURCE_NAME,
        )
        self.log_group: logs.LogGroup | None = None
        """The group, when this stack created it (None: adopted)."""
        if not adopt:
            self.log_group = logs.LogGroup(
                self,
                "Group",
                log_group_name=log_group_name,
                retention=retention,
                encryption_key=logs_key,
                # The evidence of past alarms outlives the stack (and so does its key:
                # infra/constructs/encryption.py).
                removal_policy=cdk.RemovalPolicy.RETAIN,
            )

    def stream_arn(self, stream: str) -> str:
        """The ARN of one stream (`*`: any) of the group."""
        return f"{self.arn}:log-stream:{stream}"

    def grant_read(self, grantee: iam.IGrantable) -> iam.PolicyStatement:
        """Read the jobs' reports (localize; the sweeper's backstop)."""
        return allow(
            grantee,
            sid="ReadAgentReports",
            actions=["logs:FilterLogEvents"],
            resources=[f"{self.arn}:*"],
            wildcard_reason=(
                "Read-only on the agent's report log group; the agent names one stream per "
                "training job at run time"
            ),
        )

    def grant_write_job_reports(
        self, grantee: iam.IGrantable, *, pod_namespace: str | None = None
    ) -> iam.PolicyStatement:
        """Write a training job's report (the agent in the training pods), never into the
        canary's stream (a pod that could write there could forge canary reports and page the
        on-call with a false "canary stopped") nor the idle screener's (it could forge a
        reproduced screen naming any node).

        ``pod_namespace`` None (``agentIdentity: shared``): any job's stream ``<job>``.
        ``pod_namespace`` set (``pod-identity``): EKS Pod Identity's session tags scope the
        grant to a pod of that namespace, and to the streams ``<namespace>/<job>/<pod>`` that
        end in the pod's own name (``sdc_contract.metrics.pod_report_stream``): a pod writes no
        other pod's stream, and localize reads a job's reports only from its own pods'."""
        if pod_namespace is not None:
            return self._grant_write_own_pod_stream(grantee, pod_namespace)
        # The reserved jobs' streams are the pipeline's own: the canary's, and the idle
        # screener's (a pod that wrote there could forge a reproduced screen naming any node).
        deny(
            grantee,
            sid="NotTheReservedStreams",
            actions=["logs:CreateLogStream", "logs:PutLogEvents"],
            resources=[
                self.stream_arn(contract.CANARY_JOB),
                self.stream_arn(contract.IDLE_SCREEN_JOB),
            ],
        )
        return allow(
            grantee,
            sid="WriteSdcReports",
            actions=["logs:CreateLogStream", "logs:PutLogEvents"],
            resources=[self.arn, self.stream_arn("*")],
            wildcard_reason=(
                "The agent creates one log stream per training job (named at run time) in its "
                "own report group only"
            ),
        )

    def _grant_write_own_pod_stream(
        self, grantee: iam.IGrantable, pod_namespace: str
    ) -> iam.PolicyStatement:
        """The pod-identity form of ``grant_write_job_reports``. A policy variable names the
        stream's namespace and pod, so no two pods share a writable stream; the condition on
        the namespace tag keeps out a pod of another namespace (and a principal without Pod
        Identity's tags, for which the variables would not resolve)."""
        in_namespace = {"StringEquals": {POD_NAMESPACE_TAG: pod_namespace}}
        # CloudWatch Logs may authorize CreateLogStream on the group rather than the stream: a
        # pod may then create an empty stream of any name, which is no report; events go only
        # into its own stream (PutLogEvents is authorized on the stream).
        allow(
            grantee,
            sid="CreateSdcReportStream",
            actions=["logs:CreateLogStream"],
            resources=[self.arn],
            conditions=in_namespace,
        )
        own_stream = self.stream_arn(f"${{{POD_NAMESPACE_TAG}}}/*/${{{POD_NAME_TAG}}}")
        return allow(
            grantee,
            sid="WriteOwnPodReports",
            actions=["logs:CreateLogStream", "logs:PutLogEvents"],
            resources=[own_stream],
            conditions=in_namespace,
            wildcard_reason=(
                "Pod Identity session tags name the stream's namespace and pod "
                "(<namespace>/<job>/<pod>); the job in the middle is the pod's to name, and "
                "localize checks the pod is that job's"
            ),
        )

    def grant_write_idle_screen_report(self, grantee: iam.IGrantable) -> iam.PolicyStatement:
        """Write a reproduced idle screen's report, into the idle-screen job's stream only (the
        idle screener)."""
        return allow(
            grantee,
            sid="IdleScreenReport",
            actions=["logs:CreateLogStream", "logs:PutLogEvents"],
            resources=[self.arn, self.stream_arn(contract.IDLE_SCREEN_JOB)],
        )

    def grant_write_canary_report(self, grantee: iam.IGrantable) -> iam.PolicyStatement:
        """Write the canary job's report, into its own stream only (the canary function)."""
        return allow(
            grantee,
            sid="CanaryReport",
            actions=["logs:CreateLogStream", "logs:PutLogEvents"],
            resources=[self.arn, self.stream_arn(contract.CANARY_JOB)],
        )
