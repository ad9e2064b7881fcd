"""The HyperPod (SageMaker) calls the workflow makes, and what their answers mean.

One place for: DescribeClusterNode and its error mapping (an unknown instance is ``None``, never
a guess), the labels HyperPod maintains on a node (its name, ``hyperpod-<instance id>``, is the
contract's: ``sdc_contract.names``), the instance states that mean "leaving the cluster", and the two calls that
are NOT idempotent (StartClusterHealthCheck, BatchReplaceClusterNodes).

Those two are sent once: the SageMaker client is built with a single attempt (aws.py), because
botocore's retry after a lost response would send the action a second time and report the second
attempt's refusal as if nothing had happened. An ambiguous outcome (timeout, closed connection,
5xx after sending) is settled by the caller describing the node (health.py, replace.py).
"""

from __future__ import annotations

from typing import Any

import botocore.exceptions

from .. import aws
from ..errors import InstanceNotInCluster

DHC_LABEL = "sagemaker.amazonaws.com/deep-health-check-status"
"""The deep health check's progress and verdict: InProgress | Passed | Failed."""

HEALTH_LABEL = "sagemaker.amazonaws.com/node-health-status"
"""HyperPod's node health; setting it to ``PENDING_REPLACEMENT`` asks HyperPod to replace it."""

PENDING_REPLACEMENT = "UnschedulablePendingReplacement"
FAILED_HEALTH = {"UnschedulablePendingReplacement", "UnschedulablePendingReboot"}

GONE_STATUSES = {"ShuttingDown", "NotFound"}
"""Instance states of a node that is leaving the cluster (replaced or being replaced)."""

DHC_RUNNING = "DeepHealthCheckInProgress"

_NOT_IN_CLUSTER_CODES = ("ResourceNotFound", "ValidationException")
"""HyperPod answers ResourceNotFound for an unknown node, moto ValidationException ("Could not
find node"): either way the instance is not in this cluster."""


def describe_node(cluster: str, instance_id: str) -> dict[str, Any] | None:
    """DescribeClusterNode's NodeDetails, or None when the instance is not in the cluster."""
    sm = aws.client("sagemaker")
    with aws.aws_errors("sagemaker:DescribeClusterNode"):
        try:
            return sm.describe_cluster_node(ClusterName=cluster, NodeId=instance_id)["NodeDetails"]
        except botocore.exceptions.ClientError as exc:
            if aws.error_code(exc) in _NOT_IN_CLUSTER_CODES:
                return None
            raise


def require_node(cluster: str, instance_id: str) -> dict[str, Any]:
    """NodeDetails of an instance that must be in the cluster (InstanceNotInCluster if not)."""
    details = describe_node(cluster, instance_id)
    if details is None:
        raise InstanceNotInCluster(
            f"instance {instance_id} is not a node of HyperPod cluster {cluster}"
        )
    return details


def instance_status(details: dict[str, Any] | None) -> str | None:
    """The instance's status (Running, DeepHealthCheckInProgress, ...); None when it is gone."""
    if details is None:
        return None
    return details.get("InstanceStatus", {}).get("Status")


def is_leaving(status: str | None) -> bool:
    """Whether an instance with this status (None: not in the cluster) is leaving it."""
    return status is None or status in GONE_STATUSES


def start_health_check(
    cluster: str, instance_group: str, instance_id: str, checks: list[str]
) -> None:
    """StartClusterHealthCheck for one instance, sent once.

    Raises ``AwsApiUnavailable`` when the outcome is unknown (the caller describes the node to
    settle it) and lets a refusal (ClientError) through for the caller to type.
    """
    request = {
        "ClusterName": cluster,
        "DeepHealthCheckConfigurations": [
            {
                "InstanceGroupName": instance_group,
                "InstanceIds": [instance_id],
                "DeepHealthChecks": checks,
            }
        ],
    }
    with aws.aws_errors("sagemaker:StartClusterHealthCheck"):
        aws.client("sagemaker").start_cluster_health_check(**request)


def batch_replace(cluster: str, instance_id: str) -> dict[str, Any]:
    """BatchReplaceClusterNodes for one instance, sent once; the raw response.

    Raises ``AwsApiUnavailable`` when the outcome is unknown and lets a refusal through.
    """
    with aws.aws_errors("sagemaker:BatchReplaceClusterNodes"):
        return aws.client("sagemaker").batch_replace_cluster_nodes(
            ClusterName=cluster, NodeIds=[instance_id]
        )


def cluster_size(cluster: str) -> int:
    """How many nodes the HyperPod cluster has (ListClusterNodes)."""
    sm = aws.client("sagemaker")
    count = 0
    with aws.aws_errors("sagemaker:ListClusterNodes"):
        for page in sm.get_paginator("list_cluster_nodes").paginate(ClusterName=cluster):
            count += len(page.get("ClusterNodeSummaries", []))
    return count
