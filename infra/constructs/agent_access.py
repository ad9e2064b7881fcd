"""What the training job's agent may do: publish the SDC metrics and write its reports.

Attach the managed policy to the role the training pods run as (EKS Pod Identity or IRSA), then
`pip install "sdc-agent[aws]"` in the training image.
"""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_iam as iam
from constructs import Construct

from infra import nag
from infra.config import SdcConfig


class AgentPolicy(Construct):
    """Managed policy for the training pods' role."""

    def __init__(self, scope: Construct, construct_id: str, *, config: SdcConfig) -> None:
        super().__init__(scope, construct_id)
        stack = cdk.Stack.of(self)
        reports = stack.format_arn(
            service="logs",
            resource="log-group",
            resource_name=config.report_log_group,
            arn_format=cdk.ArnFormat.COLON_RESOURCE_NAME,
        )
        self.policy = iam.ManagedPolicy(
            self,
            "Policy",
            description=f"sdc-guard agent in training jobs on {config.hyperpod_cluster_name}: publish SDC metrics and reports",
            statements=[
                iam.PolicyStatement(
                    sid="PublishSdcMetrics",
                    actions=["cloudwatch:PutMetricData"],
                    # PutMetricData has no resource-level permissions; the namespace
                    # condition is what scopes it.
                    resources=["*"],
                    conditions={"StringEquals": {"cloudwatch:namespace": config.namespace}},
                ),
                iam.PolicyStatement(
                    sid="WriteSdcReports",
                    actions=[
                        "logs:CreateLogGroup",
                        "logs:CreateLogStream",
                        "logs:PutLogEvents",
                        "logs:DescribeLogStreams",
                    ],
                    resources=[reports, f"{reports}:log-stream:*"],
                ),
            ],
        )
        nag.acknowledge(
            self.policy,
            nag.ANY_RESOURCE,
            "cloudwatch:PutMetricData has no resource-level permissions; the cloudwatch:namespace condition limits it to the SDC namespace",
        )
        nag.acknowledge(
            self.policy,
            nag.wildcard_resource_finding(self, f"{reports}:log-stream:*"),
            "The agent creates one log stream per training job (named at run time) in its own report group only",
        )
