"""Replace an approved suspect node: BatchReplaceClusterNodes, or HyperPod's replacement label."""

from __future__ import annotations

import botocore.exceptions

from . import aws
from .config import Settings
from .errors import AwsApiUnavailable, InvalidStepInput, ReplaceFailed
from .health import HEALTH_LABEL, describe_node
from .kube import KubeApi, node_labels
from .models import ItemState, ReplaceResult
from .observability import logger

PENDING_REPLACEMENT = "UnschedulablePendingReplacement"
_ALREADY_GOING = {"ShuttingDown", "NotFound"}


def replace(settings: Settings, state: ItemState, kube: KubeApi | None) -> ReplaceResult:
    """Request the node's replacement; only ever after a human approved it."""
    if state.approval is None or state.approval.decision != "approve":
        raise InvalidStepInput("replace needs an approval with decision 'approve' in $.approval")
    mode = settings.replace_mode
    suspect = state.suspect
    if settings.dry_run:
        what = (
            f"BatchReplaceClusterNodes {suspect.instance_id}"
            if mode == "api"
            else f"label {suspect.node_name} {HEALTH_LABEL}={PENDING_REPLACEMENT}"
        )
        logger.info("dry run: would replace node", extra={"action": what})
        return ReplaceResult(
            mode=mode, requested=False, dry_run=True, detail=f"dry run: would {what}"
        )
    if mode == "label":
        if kube is None:
            raise InvalidStepInput("replace mode 'label' needs the Kubernetes API")
        return _replace_by_label(kube, suspect.node_name)
    return _replace_by_api(settings.hyperpod_cluster_name, suspect.instance_id)


def _replace_by_label(kube: KubeApi, node_name: str) -> ReplaceResult:
    if node_labels(kube.get_node(node_name)).get(HEALTH_LABEL) == PENDING_REPLACEMENT:
        return ReplaceResult(
            mode="label", requested=True, dry_run=False, detail="label already set"
        )
    kube.patch_node(node_name, {"metadata": {"labels": {HEALTH_LABEL: PENDING_REPLACEMENT}}})
    return ReplaceResult(
        mode="label",
        requested=True,
        dry_run=False,
        detail=f"labelled {HEALTH_LABEL}={PENDING_REPLACEMENT}",
    )


def _replace_by_api(cluster: str, instance_id: str) -> ReplaceResult:
    details = describe_node(cluster, instance_id)
    status = None if details is None else details.get("InstanceStatus", {}).get("Status")
    if status is None or status in _ALREADY_GOING:
        # Our own earlier call (a retried Lambda) or HyperPod got there first.
        return ReplaceResult(
            mode="api",
            requested=True,
            dry_run=False,
            detail=f"instance already leaving the cluster (status {status})",
        )
    sm = aws.client("sagemaker")
    with aws.aws_errors("sagemaker:BatchReplaceClusterNodes"):
        try:
            resp = sm.batch_replace_cluster_nodes(ClusterName=cluster, NodeIds=[instance_id])
        except botocore.exceptions.ClientError as exc:
            raise ReplaceFailed(
                f"BatchReplaceClusterNodes refused {instance_id}: {aws.error_code(exc)}: {exc}"
            ) from exc
    if instance_id in resp.get("Successful", []):
        logger.info("replacement requested", extra={"instance": instance_id})
        return ReplaceResult(
            mode="api", requested=True, dry_run=False, detail="BatchReplaceClusterNodes accepted"
        )
    for failure in resp.get("Failed", []):
        if failure.get("NodeId") != instance_id:
            continue
        code, message = failure.get("ErrorCode", ""), failure.get("Message", "")
        if code == "InternalServerError":
            raise AwsApiUnavailable(f"BatchReplaceClusterNodes {instance_id}: {code}: {message}")
        raise ReplaceFailed(f"BatchReplaceClusterNodes {instance_id}: {code}: {message}")
    raise ReplaceFailed(f"BatchReplaceClusterNodes did not report {instance_id} at all: {resp}")
