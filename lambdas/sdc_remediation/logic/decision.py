"""A decision the workflow received, checked against the approvals table before a step acts on
it (replace; uncordon after a reject-with-release).

The task token sits in the execution's history, so a principal that may read it and call
SendTaskSuccess could resume the workflow with any message. Only what the approve function
claimed in the table (a person's decision, or the auto-approval policy's through the same claim)
replaces or uncordons a node.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import botocore.exceptions

from .. import clock
from ..config import Settings
from ..dal.approvals import Approvals
from ..errors import ApprovalNotVerified, ConfigurationError
from ..models import ApprovalDecision, ItemState

__all__ = ["CLAIMED", "RecordedDecision", "recorded_decision", "verify", "verify_decision"]

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


@dataclass(frozen=True)
class RecordedDecision:
    """What the record step writes of an approval: the table's decision and approver when the
    table holds one claimed for this node and execution, else nothing (`decision` None) and why."""

    decision: ApprovalDecision | None
    """The decision with the table's ``decision``, ``release`` and ``approver``; the message's
    ``reason`` only when the message named the table's approver (else empty)."""
    unverified: str | None = None
    """Why the message's decision is not recorded as a decision (None when it is)."""


def recorded_decision(
    settings: Settings,
    approval: ApprovalDecision,
    *,
    instance_id: str | None,
    execution: str | None,
) -> RecordedDecision:
    """The decision the ledger records for ``approval`` (the workflow's ``$.approval``): the one
    the approvals table holds, never the message's approver.

    The message reached the workflow through SendTaskSuccess, which anyone holding the task
    token may call naming any approver; the approve function's claim in the table (status
    ``CLAIMED``) names the IAM caller it authenticated. When the table holds no claimed
    decision of this id for this node (``instance_id``) and execution, nobody decided it
    through the approve function: nothing is recorded as decided, and ``unverified`` says why
    (with the approver the message claimed, for the investigation). A throttled read raises
    ``AwsApiUnavailable`` (the record task retries it); a denied or malformed one is recorded
    as unverified rather than failing the workflow's last step.
    """
    claimed_by = approval.approver[:200]
    try:
        record = Approvals(settings.approvals_table).decision_record(approval.approval_id)
    except (ConfigurationError, botocore.exceptions.ClientError) as exc:
        return RecordedDecision(
            None,
            f"the approvals table could not be read ({str(exc)[:200]}); claimed {claimed_by!r}",
        )
    if record is None:
        return RecordedDecision(
            None, f"no such request in the approvals table; claimed {claimed_by!r}"
        )
    decision = record.get("decision")
    if decision not in CLAIMED or record.get("status") not in CLAIMED[decision]:
        return RecordedDecision(
            None,
            f"the table holds status {str(record.get('status'))[:20]!r}, not a claimed decision; "
            f"claimed {claimed_by!r}",
        )
    expected = {"instance_id": instance_id, "execution": execution}
    for key, value in expected.items():
        if value and record.get(key) != value:
            return RecordedDecision(
                None,
                f"the request is for {key} {str(record.get(key))[:200]!r}, not {value!r}; "
                f"claimed {claimed_by!r}",
            )
    approver = str(record.get("approver") or "")
    if not approver:
        return RecordedDecision(None, f"the table names no approver; claimed {claimed_by!r}")
    same = approver == approval.approver and decision == approval.decision
    return RecordedDecision(
        ApprovalDecision(
            decision=decision,
            release=bool(record.get("release")),
            approver=approver,
            reason=approval.reason if same else "",
            approval_id=approval.approval_id,
        ),
        None
        if same
        else f"the workflow was sent {approval.decision!r} by {claimed_by!r}; the table's is recorded",
    )
