"""The agent's report log group (`/sdc/<cluster>`, one stream per training job), and every grant
on it.

The group is not created by the stack: the agent creates it on its first report (its policy
allows logs:CreateLogGroup on this group only), so a stack can be deployed before any job runs
and deleted without losing the evidence of past alarms.
"""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_iam as iam
from constructs import Construct

import sdc_contract as contract
from infra.grants import allow, deny

POD_NAMESPACE_TAG = "aws:PrincipalTag/kubernetes-namespace"
"""The session tag EKS Pod Identity sets to the pod's namespace (it cannot be chosen by the pod)."""
POD_NAME_TAG = "aws:PrincipalTag/kubernetes-pod-name"
"""The session tag EKS Pod Identity sets to the pod's name."""


class ReportLogGroup(Construct):
    """Who may write which stream of the report group, and who may read it."""

    def __init__(self, scope: Construct, construct_id: str, *, log_group_name: str) -> None:
        super().__init__(scope, construct_id)
        self.log_group_name = log_group_name
        self.arn = cdk.Stack.of(self).format_arn(
            service="logs",
            resource="log-group",
            resource_name=log_group_name,
            arn_format=cdk.ArnFormat.COLON_RESOURCE_NAME,
        )

    def stream_arn(self, stream: str) -> str:
        """The ARN of one stream (`*`: any) of the group."""
        return f"{self.arn}:log-stream:{stream}"

    def grant_read(self, grantee: iam.IGrantable) -> iam.PolicyStatement:
        """Read the jobs' reports (localize)."""
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
        """Create the group and write a training job's report (the agent in the training pods),
        never into the canary's stream: a pod that could write there could forge canary reports
        and page the on-call with a false "canary stopped".

        ``pod_namespace`` None (``agentIdentity: shared``): any job's stream ``<job>``.
        ``pod_namespace`` set (``pod-identity``): EKS Pod Identity's session tags scope the
        grant to a pod of that namespace, and to the streams ``<namespace>/<job>/<pod>`` that
        end in the pod's own name (``sdc_contract.metrics.pod_report_stream``): a pod writes no
        other pod's stream, and localize reads a job's reports only from its own pods'."""
        if pod_namespace is not None:
            return self._grant_write_own_pod_stream(grantee, pod_namespace)
        deny(
            grantee,
            sid="NotTheCanarysStream",
            actions=["logs:CreateLogStream", "logs:PutLogEvents"],
            resources=[self.stream_arn(contract.CANARY_JOB)],
        )
        return allow(
            grantee,
            sid="WriteSdcReports",
            actions=[
                "logs:CreateLogGroup",
                "logs:CreateLogStream",
                "logs:PutLogEvents",
            ],
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
            sid="CreateSdcReportGroup",
            actions=["logs:CreateLogGroup", "logs:CreateLogStream"],
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

    def grant_write_canary_report(self, grantee: iam.IGrantable) -> iam.PolicyStatement:
        """Create the group and write the canary job's report, into its own stream only (the
        canary function)."""
        return allow(
            grantee,
            sid="CanaryReport",
            actions=["logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents"],
            resources=[self.arn, self.stream_arn(contract.CANARY_JOB)],
        )
