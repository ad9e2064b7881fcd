"""The blast-radius guard's admission policy, as a pure function of what the ledger holds.

``decide`` reads no table and no clock: the ledger (``ledger.Ledger.admit``, which is given this
rule by its caller, so the data layer never imports logic) reads the node's STATE and the
cluster's guard item, calls it, and commits an ``admitted`` answer in one DynamoDB
transaction conditioned on the guard's version, so the policy is tested on plain values and the
transaction around it only serialises.

What counts against the limits is what is really out of service:

- **in flight**: remediations admitted and not yet ended (``open_instances``);
- **held**: nodes sdc-guard admitted (and so cordoned) that nobody has released: a remediation
  that ended rejected-and-kept, timed out, failed or abandoned leaves its node cordoned, and it
  keeps counting until ``sdc-remediation release NODE`` (or the workflow uncordoning or
  replacing it) frees it. Without that, a bug that fails every remediation would cordon
  ``MAX_NODES_PER_HOUR`` more nodes every hour, forever.

``MAX_FRACTION`` bounds in flight + held at once; ``MAX_NODES_PER_HOUR`` bounds the admissions
of the rolling hour, a rate, and nothing else: a node held for days counts against the fraction
(it is out of service) but not against the rate (counting it there made two forgotten nodes
refuse every new alarm forever). The sweeper reminds once a day of nodes held longer than a day.

One remediation per report: the same report read again (by a second alarm on another of its
metrics, a flapping contributor, a retried execution) is a ``duplicate`` of the remediation it
already raised (``GuardSnapshot.report``), so one pod's report never becomes several
remediations, nor several "right" rows in the precision ledger.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any

from ..models.admission import (
    WINDOW,
    AdmitDecision,
    AdmitRequest,
    GuardSnapshot,
    recent_admissions,
)


def max_open(cluster_nodes: int, max_fraction: float) -> int:
    """How many nodes may be out of service (in flight or held) at once.

    At least one: on a small cluster ``MAX_FRACTION`` of the nodes is below one node, and a guard
    that can never admit anything would disable the system there. ``MAX_NODES_PER_HOUR`` still
    caps the rate.
    """
    return max(1, math.floor(cluster_nodes * max_fraction))


def _same_item(entry: dict[str, Any], req: AdmitRequest) -> bool:
    """Whether an earlier admission of this execution was this very Map item (a retry)."""
    return entry.get("item") is None or req.item is None or int(entry["item"]) == req.item


def decide(req: AdmitRequest, snapshot: GuardSnapshot, now: datetime) -> AdmitDecision:
    """Admit, or say why not; pure. An ``admitted`` answer carries no id (the ledger makes one)
    unless it is this execution's own earlier admission of the node (the Lambda was retried).
    """
    node = snapshot.node
    if node and node.get("open"):
        rid = node.get("remediation_id")
        if node.get("execution") == req.execution:
            if _same_item(node, req):
                # Our own earlier attempt wrote it (the Lambda was retried): same answer.
                return AdmitDecision("admitted", rid, "already admitted by this execution")
            return AdmitDecision(
                "duplicate",
                rid,
                f"node {req.node_name} is named twice by the same alarm; remediation {rid} "
                "already covers it",
            )
        return AdmitDecision(
            "duplicate",
            rid,
            f"node {req.node_name} already has open remediation {rid} ({node.get('status')})",
        )
    claimed = snapshot.report
    if claimed and not (claimed.get("execution") == req.execution and _same_item(claimed, req)):
        rid = claimed.get("remediation_id")
        return AdmitDecision(
            "duplicate",
            rid,
            f"this report (job, step, check, time: {req.report}) already raised remediation "
            f"{rid} of node {req.node_name}: one remediation per report",
        )
    recent = recent_admissions(snapshot.admissions, now)
    twice = [
        a
        for a in recent
        if a["instance_id"] == req.instance_id
        and a.get("execution") == req.execution
        and not _same_item(a, req)
    ]
    if twice:
        return AdmitDecision(
            "duplicate",
            node.get("remediation_id") if node else None,
            f"node {req.node_name} is named twice by the same alarm; it was admitted once",
        )
    limit_open = max_open(req.cluster_nodes, req.max_fraction)
    budget = min(req.max_nodes_per_hour, limit_open)
    if req.suspects_in_alarm > budget:
        # An alarm naming more nodes than the guard would ever admit is a storm on its own:
        # cordoning the first few of them would be arbitrary. Refuse them all.
        return AdmitDecision(
            "circuit_open",
            None,
            f"one alarm names {req.suspects_in_alarm} nodes, more than the blast radius "
            f"allows ({budget}): many nodes at once is more likely software than hardware; "
            "nothing is cordoned",
        )
    held = [h for h in snapshot.held if h["instance_id"] != req.instance_id]
    in_flight = {i for i in snapshot.open_instances if i != req.instance_id}
    out_of_service = in_flight | {h["instance_id"] for h in held}
    if len(recent) >= req.max_nodes_per_hour:
        return AdmitDecision(
            "circuit_open",
            None,
            f"{len(recent)} node(s) admitted in the last hour (MAX_NODES_PER_HOUR="
            f"{req.max_nodes_per_hour}): many nodes at once is more likely software than "
            "hardware",
        )
    if len(out_of_service) + 1 > limit_open:
        return AdmitDecision(
            "circuit_open",
            None,
            f"{len(out_of_service)} of {req.cluster_nodes} node(s) already out of service "
            f"({len(in_flight)} in remediation, {len(out_of_service - in_flight)} cordoned and "
            f"not released); one more exceeds MAX_FRACTION={req.max_fraction} "
            f"(limit {limit_open})",
        )
    return AdmitDecision("admitted", None, "admitted")


__all__ = [
    "WINDOW",
    "AdmitDecision",
    "AdmitRequest",
    "GuardSnapshot",
    "decide",
    "max_open",
    "recent_admissions",
]
