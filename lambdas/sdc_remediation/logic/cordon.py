"""Cordon and uncordon a suspect node through the Kubernetes API (idempotent, dry-run aware)."""

from __future__ import annotations

from typing import Any

from .. import clock
from ..clients.hyperpod import DHC_LABEL
from ..clients.kube import KubeApi, node_labels, node_unschedulable
from ..models import Alarm, CordonResult, Suspect
from ..observability import logger

__all__ = ["DHC_LABEL", "cordon", "uncordon"]

SUSPECT_LABEL = "sdc.guard/suspect"
ALARM_ANNOTATION = "sdc.guard/alarm"
# Set when the node was already unschedulable before we cordoned it (someone else's cordon):
# releasing our suspicion must not undo theirs.
PRIOR_CORDON_ANNOTATION = "sdc.guard/was-unschedulable"
RELEASED_ANNOTATION = "sdc.guard/released"


def alarm_summary(alarm: Alarm, suspect: Suspect) -> str:
    """One line for the node annotation: which alarm, which check, which step and ranks."""
    ranks = ",".join(sorted(suspect.ranks, key=int))
    return (
        f"{alarm.alarm_name} at {alarm.time}: check={suspect.check} verdict={suspect.verdict} "
        f"step={suspect.step} window={suspect.suspect_window} job={suspect.job} ranks={ranks}"
    )


def cordon_body(summary: str, was_unschedulable: bool) -> dict[str, Any]:
    """The strategic-merge patch that cordons and marks a node."""
    annotations = {ALARM_ANNOTATION: summary}
    if was_unschedulable:
        annotations[PRIOR_CORDON_ANNOTATION] = "true"
    return {
        "spec": {"unschedulable": True},
        "metadata": {"labels": {SUSPECT_LABEL: "true"}, "annotations": annotations},
    }


def cordon(kube: KubeApi, alarm: Alarm, suspect: Suspect, dry_run: bool) -> CordonResult:
    """Cordon the suspect's node; a node that already carries our mark is left untouched."""
    name = suspect.node_name
    node = kube.get_node(name)  # also in dry run: a missing node is an error either way
    labels = node_labels(node)
    # The deep-health-check verdict already on the node, for start_health_check (which has no
    # Kubernetes access) to tell a stale verdict from the one of the check it starts.
    dhc_before = labels.get(DHC_LABEL)
    if node_unschedulable(node) and labels.get(SUSPECT_LABEL) == "true":
        logger.info("node already cordoned by sdc-guard", extra={"node": name})
        return CordonResult(
            node_name=name,
            cordoned=True,
            changed=False,
            dry_run=dry_run,
            health_check_label=dhc_before,
        )
    body = cordon_body(alarm_summary(alarm, suspect), node_unschedulable(node))
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


def uncordon(kube: KubeApi, suspect: Suspect, released_by: str, dry_run: bool) -> CordonResult:
    """Release a node we cordoned. A node without our label is left exactly as it is."""
    name = suspect.node_name
    node = kube.get_node(name)
    labels = node_labels(node)
    annotations = (node.get("metadata") or {}).get("annotations") or {}
    if labels.get(SUSPECT_LABEL) != "true":
        logger.info("node carries no sdc-guard mark; leaving it", extra={"node": name})
        return CordonResult(
            node_name=name, cordoned=node_unschedulable(node), changed=False, dry_run=dry_run
        )
    keep_cordon = annotations.get(PRIOR_CORDON_ANNOTATION) == "true"
    body = {
        "spec": {"unschedulable": keep_cordon},
        "metadata": {
            "labels": {SUSPECT_LABEL: None},
            "annotations": {
                ALARM_ANNOTATION: None,
                PRIOR_CORDON_ANNOTATION: None,
                RELEASED_ANNOTATION: f"{clock.iso(clock.now())} by {released_by}",
            },
        },
    }
    if dry_run:
        logger.info("dry run: would uncordon node", extra={"node": name, "patch": body})
        return CordonResult(
            node_name=name, cordoned=node_unschedulable(node), changed=False, dry_run=True
        )
    kube.patch_node(name, body)
    logger.info("released node", extra={"node": name, "patch": body})
    return CordonResult(node_name=name, cordoned=keep_cordon, changed=True, dry_run=False)
