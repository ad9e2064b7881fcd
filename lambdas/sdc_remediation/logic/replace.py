"""Replace an approved suspect node: BatchReplaceClusterNodes, or HyperPod's replacement label."""

from __future__ import annotations

import botocore.exceptions

from .. import aws
from ..clients import hyperpod
from ..clients.hyperpod import HEALTH_LABEL, PENDING_REPLACEMENT
from ..clients.kube import KubeApi, node_labels
from ..config import Settings
from ..errors import AwsApiUnavailable, InvalidStepInput, ReplaceFailed
from ..models import ItemState, ReplaceResult
from ..observability import logger
from .decision import verify

__all__ = ["PENDING_REPLACEMENT", "replace"]


def replace(settings: Settings, state: ItemState, kube: KubeApi | None) -> ReplaceResult:
    """Request the node's replacement; only ever after the approvals table shows that a person
    (or the auto-approval policy, through the same claim) approved it (``decision.verify``)."""
    if state.approval is None or state.approval.decision != "approve":
        raise InvalidStepInput("replace needs an approval with decision 'approve' in $.approval")
    verify(settings, state, state.approval)
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


def _already_leaving(cluster: str, instance_id: str) -> ReplaceResult | None:
    """A result when HyperPod shows the instance leaving the cluster (None: it is not)."""
    status = hyperpod.instance_status(hyperpod.describe_node(cluster, instance_id))
    if not hyperpod.is_leaving(status):
        return None
    return ReplaceResult(
        mode="api",
        requested=True,
        dry_run=False,
        detail=f"instance already leaving the cluster (status {status})",
    )


def _replace_by_api(cluster: str, instance_id: str) -> ReplaceResult:
    # Our own earlier call (a retried Lambda) or HyperPod got there first.
    already = _already_leaving(cluster, instance_id)
    if already is not None:
        return already
    try:
        resp = hyperpod.batch_replace(cluster, instance_id)
    except botocore.exceptions.ClientError as exc:
        raise ReplaceFailed(
            f"BatchReplaceClusterNodes refused {instance_id}: {aws.error_code(exc)}: {exc}"
        ) from exc
    except AwsApiUnavailable as exc:
        # Sent once, answer lost or 5xx: the replacement may have been accepted. If HyperPod
        # shows the instance leaving, it was; otherwise the workflow retries the step.
        settled = _already_leaving(cluster, instance_id)
        if settled is None:
            raise
        logger.info(
            "BatchReplaceClusterNodes's answer was lost but the instance is leaving",
            extra={"instance": instance_id, "error": str(exc)[:300]},
        )
        return settled
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
