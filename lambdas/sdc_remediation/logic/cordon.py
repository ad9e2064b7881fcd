"""Cordon and uncordon a suspect node through the Kubernetes API (idempotent, dry-run aware)."""

from __future__ import annotations

from typing import Any

from .. import clock
from ..clients.hyperpod import DHC_LABEL
from ..clients.kube import KubeApi, node_labels, node_unschedulable
from ..models import Alarm, CordonResult, Suspect
from ..observability import logger

__all__ = ["DHC_LABEL", "cordon", "mark_removal", "uncordon"]

SUSPECT_LABEL = "sdc.guard/suspect"
ALARM_ANNOTATION = "sdc.guard/alarm"
# Set when the node was already unschedulable before we cordoned it (someone else's cordon):
# releasing our suspicion must not undo theirs.
PRIOR_CORDON_ANNOTATION = "sdc.guard/was-unschedulable"
RELEASED_ANNOTATION = "sdc.guard/released"
# The remediation that set the cordon: a cordon is ours only in the remediation that wrote this.
# The label alone says nothing: it outlives a `kubectl uncordon` by hand, and a later cordon by
# an operator or HyperPod's agent on a node that still carries it is not ours to lift.
REMEDIATION_ANNOTATION = "sdc.guard/remediation"


def ours(node: dict[str, Any], remediation_id: str | None) -> bool:
    """Whether ``node`` carries sdc-guard's mark set by the remediation ``remediation_id``."""
    annotations = (node.get("metadata") or {}).get("annotations") or {}
    return (
        bool(remediation_id)
        and node_labels(node).get(SUSPECT_LABEL) == "true"
        and annotations.get(REMEDIATION_ANNOTATION) == remediation_id
    )


def mark_removal() -> dict[str, Any]:
    """The strategic-merge patch fragment that removes sdc-guard's label and annotations (a
    ``None`` value deletes the key), leaving ``spec`` alone."""
    return {
        "labels": {SUSPECT_LABEL: None},
        "annotations": {
            ALARM_ANNOTATION: None,
            PRIOR_CORDON_ANNOTATION: None,
            REMEDIATION_ANNOTATION: None,
        },
    }


def alarm_summary(alarm: Alarm, suspect: Suspect) -> str:
    """One line for the node annotation: which alarm, which check, which step and ranks."""
    ranks = ",".join(sorted(suspect.ranks, key=int))
    return (
        f"{alarm.alarm_name} at {alarm.time}: check={suspect.check} verdict={suspect.verdict} "
        f"step={suspect.step} window={suspect.suspect_window} job={suspect.job} ranks={ranks}"
    )


def cordon_body(
    summary: str, was_unschedulable: bool, remediation_id: str | None = None
) -> dict[str, Any]:
    """The strategic-merge patch that cordons and marks a node as this remediation's."""
    annotations = {ALARM_ANNOTATION: summary, REMEDIATION_ANNOTATION: remediation_id or ""}
    if was_unschedulable:
        annotations[PRIOR_CORDON_ANNOTATION] = "true"
    return {
        "spec": {"unschedulable": True},
        "metadata": {"labels": {SUSPECT_LABEL: "true"}, "annotations": annotations},
    }


def cordon(
    kube: KubeApi,
    alarm: Alarm,
    suspect: Suspect,
    dry_run: bool,
    remediation_id: str | None = None,
) -> CordonResult:
    """Cordon the suspect's node for the remediation ``remediation_id``; a node this
    remediation already cordoned (a retried step) is left untouched. A node that was already
    unschedulable otherwise (someone's cordon, even on a node that still carries our label from
    an earlier remediation) is recorded as cordoned before us (``PRIOR_CORDON_ANNOTATION``), so
    this remediation never lifts it."""
    name = suspect.node_name
    node = kube.get_node(name)  # also in dry run: a missing node is an error either way
    labels = node_labels(node)
    # The deep-health-check verdict already on the node, for start_health_check (which has no
    # Kubernetes access) to tell a stale verdict from the one of the check it starts.
    dhc_before = labels.get(DHC_LABEL)
    if node_unschedulable(node) and ours(node, remediation_id):
        logger.info("node already cordoned by this remediation", extra={"node": name})
        return CordonResult(
            node_name=name,
            cordoned=True,
            changed=False,
            dry_run=dry_run,
            health_check_label=dhc_before,
        )
    body = cordon_body(alarm_summary(alarm, suspect), node_unschedulable(node), remediation_id)
    if dry_run:
        logger.info("dry run: would cordon node", extra={"node": name, "patch": body})
        return CordonResult(
            node_name=name,
            cordoned=False,
            changed=False,
            dry_run=True,
            health_check_label=dhc_before,
        )
    kube.patch_node(name, body)
    logger.info("cordoned node", extra={"node": name, "patch": body})
    return CordonResult(
        node_name=name, cordoned=True, changed=True, dry_run=False, health_check_label=dhc_before
    )


def uncordon(
    kube: KubeApi,
    suspect: Suspect,
    released_by: str,
    dry_run: bool,
    remediation_id: str | None = None,
) -> CordonResult:
    """Release a node this remediation cordoned. A node without the mark of this remediation
    (``ours``: our label and ``REMEDIATION_ANNOTATION`` = ``remediation_id``) is left exactly as
    it is: its cordon, if any, is someone else's or an earlier remediation's."""
    name = suspect.node_name
    node = kube.get_node(name)
    annotations = (node.get("metadata") or {}).get("annotations") or {}
    if not ours(node, remediation_id):
        logger.info(
            "node carries no mark of this remediation; leaving it",
            extra={"node": name, "remediation": remediation_id},
        )
        return CordonResult(
            node_name=name, cordoned=node_unschedulable(node), changed=False, dry_run=dry_run
        )
    keep_cordon = annotations.get(PRIOR_CORDON_ANNOTATION) == "true"
    metadata = mark_removal()
    metadata["annotations"][RELEASED_ANNOTATION] = f"{clock.iso(clock.now())} by {released_by}"
    body = {"spec": {"unschedulable": keep_cordon}, "metadata": metadata}
    if dry_run:
        logger.info("dry run: would uncordon node", extra={"node": name, "patch": body})
        return CordonResult(
            node_name=name, cordoned=node_unschedulable(node), changed=False, dry_run=True
        )
    kube.patch_node(name, body)
    logger.info("released node", extra={"node": name, "patch": body})
    return CordonResult(node_name=name, cordoned=keep_cordon, changed=True, dry_run=False)
