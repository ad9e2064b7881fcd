"""RequestApproval for a HyperPod node: the opt-in auto-approval policy, or a person.

The step (``steps.request_approval``) stores the task token under an approval id with the
evidence; who decides is the node target's (``targets``): for a HyperPod node, this module. The
policy (``AUTO_APPROVE``) may approve by itself; its decision goes through the same claim and
SendTaskSuccess as a person's, recorded with the policy as the approver, and the on-call is told
that no person decided. Otherwise a person is asked: the message carries the evidence and the
command to approve (never the token).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .. import clock
from ..clients import sns
from ..config import Settings
from ..dal.approvals import Approvals
from ..dal.ledger import Ledger
from ..errors import ApprovalAlreadyDecided
from ..models import ApprovalRequestInput
from ..observability import logger
from . import autoapprove, notify, outcomes, stats
from .screen import job_name


@dataclass(frozen=True)
class PendingApproval:
    """A stored approval request waiting to be decided."""

    approvals: Approvals
    approval_id: str
    evidence: dict[str, Any]
    """What the approver sees (stored with the request)."""
    auto: autoapprove.AutoDecision | None
    """The auto-approval policy's answer (None: no policy applies)."""
    announce: bool
    """Whether its message is still due (False when a retried step finds it sent)."""


def auto_decision(
    state: ApprovalRequestInput, settings: Settings, ledger: Ledger
) -> autoapprove.AutoDecision | None:
    """The auto-approval policy's answer for this request (None: no policy configured).

    The precision rule reads the whole ledger (the table is small) the way ``stats`` does.
    """
    policy = settings.auto_approve
    if not policy.enabled:
        return None
    check, verdict = state.suspect.check, state.suspect.verdict
    precision = None
    rejected_at = None
    if policy.min_precision is not None:
        every = outcomes.mark_recurrences(outcomes.summarise(ledger.all_events()))
        # One decided remediation per job: no one job (a pod writes reports at will) makes up
        # the evidence that lets the policy replace nodes with nobody deciding.
        row = stats.check_stats(check, verdict, stats.one_per_job(every))
        precision = autoapprove.Precision(row.right, row.wrong, row.low, row.high, row.jobs)
        rejected_at = _rejected_recently(every, state.suspect.instance_id)
    decision = autoapprove.evaluate(
        policy,
        check=check,
        verdict=verdict,
        health_status=state.health.status if state.health else None,
        precision=precision,
        rejected_at=rejected_at,
        requires_screen=settings.auto_approve_requires_screen,
        screen=screen_on_this_node(state),
        screen_line=state.screen.line() if state.screen is not None else "",
    )
    logger.info(
        "auto-approval policy", extra={"approve": decision.approve, "reason": decision.reason}
    )
    return decision


def screen_on_this_node(state: ApprovalRequestInput) -> str | None:
    """This node's screen outcome as the policy reads it (None: no screen ran). A ``reproduced``
    result counts only from this item's own Job (``screen.job_name``: execution, item and
    instance), so a result carried from anywhere else is no reproduction on this node."""
    result = state.screen
    if result is None:
        return None
    if result.status == autoapprove.SCREEN_REPRODUCED and result.job != job_name(state):
        return "reproduced by a Job that is not this node's"
    return result.status


def _rejected_recently(remediations: list[outcomes.Remediation], instance_id: str) -> str | None:
    """When a person last rejected (or released) this node within the recurrence window."""
    start = clock.now() - outcomes.DEFAULT_RECURRENCE_WINDOW
    times = [
        at
        for r in remediations
        if r.instance_id == instance_id and (at := r.person_rejected_at()) is not None
        if clock.parse_iso(at) >= start
    ]
    return max(times, default=None)


def ask_a_person(pending: PendingApproval, settings: Settings) -> None:
    """Publish the approval request (unless a retried step already did)."""
    if not pending.announce:
        return
    prefix = (
        f"sdc-remediation --approval-url {settings.approval_url}"
        if settings.approval_url
        else f"sdc-remediation --approvals-table {settings.approvals_table}"
    )
    subject, body = notify.approval_message(
        pending.approval_id, pending.evidence, prefix, dry_run=settings.dry_run
    )
    try:
        sns.publish(settings.topic_arn, subject, body)
    except Exception:
        # Nobody was told of it: no pending request may be left for someone to find and
        # decide. The step fails; its retry stores and announces it again, or the workflow
        # records the failure (the node stays cordoned).
        withdrawn = pending.approvals.withdraw(pending.approval_id)
        logger.warning(
            "approval announcement failed",
            extra={"approval_id": pending.approval_id, "withdrawn": withdrawn},
        )
        raise
    pending.approvals.mark_notified(pending.approval_id)


def auto_approve(
    pending: PendingApproval, auto: autoapprove.AutoDecision, settings: Settings
) -> None:
    """Resume the workflow with the policy's approval (recorded as the approver) and tell the
    on-call that no person decided. A retried step re-sends or finds it already decided."""
    approval_id = pending.approval_id
    try:
        pending.approvals.decide(approval_id, "approve", reason=auto.reason, approver=auto.approver)
    except ApprovalAlreadyDecided:
        logger.info("auto-approval already sent", extra={"approval_id": approval_id})
    if not pending.announce:
        return
    subject, body = notify.auto_approval_message(
        approval_id, auto, pending.evidence, dry_run=settings.dry_run
    )
    sns.publish(settings.topic_arn, subject, body)
    pending.approvals.mark_notified(approval_id)


__all__ = [
    "PendingApproval",
    "ask_a_person",
    "auto_approve",
    "auto_decision",
    "screen_on_this_node",
]
