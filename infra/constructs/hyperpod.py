"""The HyperPod cluster the stack protects (it is not created here), and every grant on it.

Its ARN ends in an id HyperPod generates, not the cluster's name: with the `hyperPodClusterArn`
context key the grants name the one cluster; without it they name `cluster/*` of this account
and region, acknowledged as a cdk-nag finding on each grantee.
"""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_iam as iam
from constructs import Construct

from infra.grants import allow

WILDCARD_REASON = (
    "HyperPod cluster ARNs end in a generated id, not the name; this account and region only. "
    "Set the hyperPodClusterArn context key to scope it to the one cluster"
)


class HyperPodCluster(Construct):
    """The cluster's ARN (`cluster_arn`, or every cluster of the account and region) and the
    SageMaker actions each step may take on it."""

    def __init__(
        self, scope: Construct, construct_id: str, *, cluster_arn: str | None = None
    ) -> None:
        super().__init__(scope, construct_id)
        self.arn = cluster_arn or cdk.Stack.of(self).format_arn(
            service="sagemaker", resource="cluster", resource_name="*"
        )

    def grant_describe_nodes(self, grantee: iam.IGrantable) -> iam.PolicyStatement:
        """Map a node to its instance and instance group (localize)."""
        return self._allow(
            grantee,
            "DescribeHyperPodNodes",
            ["sagemaker:DescribeClusterNode", "sagemaker:ListClusterNodes"],
        )

    def grant_count_nodes(self, grantee: iam.IGrantable) -> iam.PolicyStatement:
        """Count the cluster's nodes for the guard's out-of-service fraction (admit)."""
        return self._allow(grantee, "CountClusterNodes", ["sagemaker:ListClusterNodes"])

    def grant_start_health_check(self, grantee: iam.IGrantable) -> iam.PolicyStatement:
        """Start a deep health check on a node (start_health_check)."""
        return self._allow(
            grantee,
            "StartDeepHealthCheck",
            ["sagemaker:StartClusterHealthCheck", "sagemaker:DescribeClusterNode"],
        )

    def grant_poll_health_check(self, grantee: iam.IGrantable) -> iam.PolicyStatement:
        """Read a node's deep health check status (poll_health_check)."""
        return self._allow(grantee, "PollDeepHealthCheck", ["sagemaker:DescribeClusterNode"])

    def grant_replace(self, grantee: iam.IGrantable) -> iam.PolicyStatement:
        """Replace a node through the API (replace)."""
        return self._allow(
            grantee,
            "ReplaceNode",
            ["sagemaker:BatchReplaceClusterNodes", "sagemaker:DescribeClusterNode"],
        )

    def _allow(self, grantee: iam.IGrantable, sid: str, actions: list[str]) -> iam.PolicyStatement:
        return allow(
            grantee,
            sid=sid,
            actions=actions,
            resources=[self.arn],
            wildcard_reason=WILDCARD_REASON,
        )
