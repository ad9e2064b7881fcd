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

    def grant_write_job_reports(self, grantee: iam.IGrantable) -> iam.PolicyStatement:
        """Create the group and write a report into any training job's stream (the agent in the
        training pods), never the canary's: a pod that could write there could forge canary
        reports and page the on-call with a false "canary stopped"."""
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
                "logs:DescribeLogStreams",
            ],
            resources=[self.arn, self.stream_arn("*")],
            wildcard_reason=(
                "The agent creates one log stream per training job (named at run time) in its "
                "own report group only"
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
