"""The HyperPod cluster the stack protects (it is not created here), and every grant on it.

Its ARN ends in an id HyperPod generates, not the cluster's name. With the `hyperPodClusterArn`
context key the grants name that ARN; without it the stack looks the ARN up at deploy time (a
custom resource calling SageMaker DescribeCluster on the named cluster), so the health-check and
replace roles act on this one cluster, never on `cluster/*` of the account. Synth needs no
credentials either way: the lookup runs when CloudFormation creates the stack.
"""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_iam as iam
from aws_cdk import custom_resources as cr
from constructs import Construct

from infra import nag
from infra.grants import allow

LOOKUP_TYPE = "Custom::HyperPodClusterArn"
"""The custom resource that looks the cluster's ARN up (DescribeCluster) at deploy time."""


class HyperPodCluster(Construct):
    """The cluster's ARN (`cluster_arn`, or looked up at deploy time by `cluster_name`) and the
    SageMaker actions each step may take on it."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cluster_name: str,
        cluster_arn: str | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
        self.lookup: cr.AwsCustomResource | None = None
        self.arn = cluster_arn or self._looked_up_arn(cluster_name)

    def _looked_up_arn(self, cluster_name: str) -> str:
        """The ARN DescribeCluster gives for `cluster_name`, when CloudFormation deploys (a
        cluster that does not exist fails the deployment, as it should: there is nothing to
        protect)."""
        stack = cdk.Stack.of(self)
        call = cr.AwsSdkCall(
            service="SageMaker",
            action="describeCluster",
            parameters={"ClusterName": cluster_name},
            physical_resource_id=cr.PhysicalResourceId.of(f"hyperpod-cluster-{cluster_name}"),
            output_paths=["ClusterArn"],
        )
        any_cluster = stack.format_arn(service="sagemaker", resource="cluster", resource_name="*")
        self.lookup = cr.AwsCustomResource(
            self,
            "ArnLookup",
            resource_type=LOOKUP_TYPE,
            on_create=call,
            on_update=call,
            install_latest_aws_sdk=False,
            policy=cr.AwsCustomResourcePolicy.from_statements(
                [
                    iam.PolicyStatement(
                        sid="LookUpTheClusterArn",
                        actions=["sagemaker:DescribeCluster"],
                        resources=[any_cluster],
                    )
                ]
            ),
        )
        _acknowledge_lookup(stack, self.lookup, any_cluster)
        return self.lookup.get_response_field("ClusterArn")

    def grant_describe_nodes(self, grantee: iam.IGrantable) -> iam.PolicyStatement:
        """Map a node to its instance and instance group (localize): one node at a time, so no
        listing of the cluster."""
        return self._allow(grantee, "DescribeHyperPodNodes", ["sagemaker:DescribeClusterNode"])

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
        return allow(grantee, sid=sid, actions=actions, resources=[self.arn])


def _acknowledge_lookup(stack: cdk.Stack, lookup: Construct, any_cluster: str) -> None:
    """The lookup's function is CDK's own (one per stack): acknowledge its findings there, each
    with its reason; the lookup's one statement (DescribeCluster, read only, on any cluster of
    this account and region: the ARN is what it looks up) on the lookup."""
    nag.acknowledge(
        lookup,
        nag.wildcard_resource_finding(lookup, any_cluster),
        "sagemaker:DescribeCluster (read only) on this account and region's clusters: the "
        "lookup finds the protected cluster's ARN, which ends in a generated id, by its name",
    )
    function = stack.node.try_find_child("AWS679f53fac002430cb0da5b7982bd2287")
    scope = function if function is not None else stack
    nag.acknowledge(
        scope,
        "AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/AWSLambdaBasicExecutionRole]",
        "CDK's AwsCustomResource provider writes its own logs with the basic execution role; it "
        "runs once per deployment to look the HyperPod cluster's ARN up",
    )
    nag.acknowledge(
        scope,
        "AwsSolutions-L1",
        "CDK's AwsCustomResource provider picks its Node.js runtime; it runs once per "
        "deployment (DescribeCluster) and handles no data of the pipeline",
    )
