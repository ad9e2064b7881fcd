"""Replace an approved suspect node: BatchReplaceClusterNodes, or HyperPod's replacement label."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import botocore.exceptions

from .. import aws, clock
from ..clients import hyperpod
from ..clients.hyperpod import HEALTH_LABEL, PENDING_REPLACEMENT
from ..clients.kube import KubeApi, node_labels
from ..config import Settings
from ..dal.approvals import Approvals
from ..errors import ApprovalNotVerified, AwsApiUnavailable, InvalidStepInput, ReplaceFailed
from ..models import ApprovalDecision, ItemState, ReplaceResult
from ..observability import logger

__all__ = ["PENDING_REPLACEMENT", "replace", "verify_decision"]

CLAIMED = ("sending", "approved")
"""The statuses of a claimed approval: ``sending`` while (or after) SendTaskSuccess resumed
the workflow and before the approve function wrote ``approved``, which may be after this step
already runs."""


def verify_decision(
    record: dict[str, Any] | None, approval: ApprovalDecision, state: ItemState
) -> None:
    """The decision the workflow received must be the one the approvals table holds.

    ``record`` is the approval as the table holds it (``Approvals.decision_record``): it must
    exist, be claimed (``CLAIMED``) with the same decision, before its ``decide_by``, by the same
    approver (the IAM ARN the approve function recorded, or the auto-approval policy's name),
    for this suspect's node and instance and this execution. Anything else is
    ``ApprovalNotVerified``: a message a principal with the task token (it is in the
    execution's history) sent itself, naming whomever it likes.
    """
    where = f"approval {approval.approval_id!r} of node {state.suspect.node_name}"
    if record is None:
        raise ApprovalNotVerified(f"{where}: no such request in the approvals table")
    if record.get("status") not in CLAIMED or record.get("decision") != approval.decision:
        raise ApprovalNotVerified(
            f"{where}: the table holds status {str(record.get('status'))[:20]!r} with decision "
            f"{str(record.get('decision'))[:20]!r}, not a claimed {approval.decision!r}: nobody "
            "decided it through the approve function"
        )
    if record.get("approver") != approval.approver:
        raise ApprovalNotVerified(
            f"{where}: decided by {str(record.get('approver'))[:200]!r} in the table, but the "
            f"workflow was sent {approval.approver[:200]!r}"
        )
    expected = {
        "node_name": state.suspect.node_name,
        "instance_id": state.suspect.instance_id,
        "execution": state.execution,
    }
    for key, value in expected.items():
        if record.get(key) != value:
            raise ApprovalNotVerified(
                f"{where}: the request is for {key} {str(record.get(key))[:200]!r}, not {value!r}"
            )
    try:
        decided_at = int(clock.parse_iso(str(record.get("decided_at"))).timestamp())
        deadline = min(int(record["decide_by"]), int(record["expires_at"]))
    except (KeyError, TypeError, ValueError):
        raise ApprovalNotVerified(
            f"{where}: the request has no decision time or deadline"
        ) from None
    if decided_at >= deadline:
        raise ApprovalNotVerified(
            f"{where}: claimed at {record.get('decided_at')}, after its deadline "
            f"{clock.iso(datetime.fromtimestamp(deadline, UTC))}"
        )


def replace(settings: Settings, state: ItemState, kube: KubeApi | None) -> ReplaceResult:
    """Request the node's replacement; only ever after the approvals table shows that a person
    (or the auto-approval policy, through the same claim) approved it (``verify_decision``)."""
    if state.approval is None or state.approval.decision != "approve":
        raise InvalidStepInput("replace needs an approval with decision 'approve' in $.approval")
    record = Approvals(settings.approvals_table).decision_record(state.approval.approval_id)
    verify_decision(record, state.approval, state)
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
