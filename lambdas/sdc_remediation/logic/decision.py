"""A decision the workflow received, checked against the approvals table before a step acts on
it (replace; uncordon after a reject-with-release).

The task token sits in the execution's history, so a principal that may read it and call
SendTaskSuccess could resume the workflow with any message. Only what the approve function
claimed in the table (a person's decision, or the auto-approval policy's through the same claim)
replaces or uncordons a node.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from .. import clock
from ..config import Settings
from ..dal.approvals import Approvals
from ..errors import ApprovalNotVerified
from ..models import ApprovalDecision, ItemState

__all__ = ["CLAIMED", "verify", "verify_decision"]

CLAIMED = {"approve": ("sending", "approved"), "reject": ("sending", "rejected")}
"""The statuses of a claimed decision: ``sending`` while (or after) SendTaskSuccess resumed the
workflow and before the approve function wrote ``approved``/``rejected``, which may be after
the next step already runs."""


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
    claimed = CLAIMED[approval.decision]
    if record.get("status") not in claimed or record.get("decision") != approval.decision:
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
    if approval.decision == "reject" and bool(record.get("release")) != approval.release:
        raise ApprovalNotVerified(
            f"{where}: the table holds a rejection with release={bool(record.get('release'))}, "
            f"the workflow was sent release={approval.release}"
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


def verify(settings: Settings, state: ItemState, approval: ApprovalDecision) -> None:
    """Read the approval's decision (never its token) and ``verify_decision`` it."""
    record = Approvals(settings.approvals_table).decision_record(approval.approval_id)
    verify_decision(record, approval, state)
