"""Opt-in auto-approval, applied: at RequestApproval, after the blast-radius guard admitted the
node, it was cordoned and its health check ended, the policy (``sdc_contract.autoapprove``,
``AUTO_APPROVE``) may approve the replacement without a person. Pure: the caller reads the
health check's status, the check x verdict's precision (``stats``) and whether a person
rejected this node lately, and passes them in.

The precision rule counts only evidence a pod cannot make up: remediations the guard admitted
and the health check or a person decided, one per report, at most one per job (``stats.
one_per_job``); and it never approves by precision alone a node a person rejected (or released)
within the recurrence window.

With ``requires_screen`` (``AUTO_APPROVE_REQUIRES_SCREEN``, context key
``autoApproveRequiresScreen``) neither rule approves unless the node screen reproduced the fault
on this very node (``screen`` = ``reproduced``): a clean, inconclusive, failed, not configured or
skipped screen (or none) means a person decides, and the reason says so. A ``clean`` screen never
releases a node either way: it only withholds the policy's approval.
"""

from __future__ import annotations

from dataclasses import dataclass

from sdc_contract.autoapprove import APPROVER_PREFIX, AutoApprovePolicy


@dataclass(frozen=True)
class Precision:
    """A check x verdict's measured precision (``stats.CheckStats`` carries these)."""

    right: int
    wrong: int
    low: float | None
    high: float | None
    jobs: int = 0
    """Distinct jobs the decided remediations come from (one each, see the module docstring)."""

    @property
    def decided(self) -> int:
        """Remediations the estimate counts."""
        return self.right + self.wrong

    @property
    def estimate(self) -> float | None:
        """right / decided (None without any decided remediation)."""
        return self.right / self.decided if self.decided else None


SCREEN_REPRODUCED = "reproduced"
"""The one screen outcome that lets the policy approve when it requires a screen."""


@dataclass(frozen=True)
class AutoDecision:
    """The policy's answer: approve (with the approver and reason to record) or why not."""

    approve: bool
    approver: str
    reason: str


def evaluate(
    policy: AutoApprovePolicy,
    *,
    check: str,
    verdict: str,
    health_status: str | None,
    precision: Precision | None,
    rejected_at: str | None = None,
    requires_screen: bool = False,
    screen: str | None = None,
    screen_line: str = "",
) -> AutoDecision:
    """Apply the policy to one remediation waiting for approval; pure.

    The health-check rule comes first (it is evidence about this very node); the precision
    rule needs ``min_events`` decided remediations of the same check x verdict (from as many
    distinct jobs), compares the point estimate with ``min_precision`` (the Wilson interval is
    part of the reason), and never applies to a node a person rejected at ``rejected_at``
    (within the recurrence window). With ``requires_screen``, both rules need ``screen`` (this
    node's screen outcome: a ``ScreenStatus``, None when none ran) to be ``reproduced`` first;
    ``screen_line`` (what it found) joins an approval's reason.
    """
    if requires_screen and screen != SCREEN_REPRODUCED:
        shown = "not run" if screen is None else screen.replace("_", " ")
        return AutoDecision(
            False,
            "",
            f"auto-approval needs a reproduced screen: screen {shown} "
            "(autoApproveRequiresScreen=true); a person decides",
        )
    also = (
        f"; screen {screen_line or SCREEN_REPRODUCED}, autoApproveRequiresScreen=true"
        if requires_screen
        else ""
    )
    if policy.on_health_check_failed and health_status == "failed":
        return AutoDecision(
            True,
            f"{APPROVER_PREFIX}/health-check-failed",
            "auto-approved by policy: the deep health check failed (hardware confirmed); "
            f"inputs: onHealthCheckFailed=true, health={health_status}{also}",
        )
    if policy.min_precision is None:
        return AutoDecision(False, "", "no auto-approval rule applies; a person decides")
    name = f"{check}/{verdict}"
    if rejected_at is not None:
        return AutoDecision(
            False,
            "",
            f"a person rejected (or released) this node at {rejected_at}: the precision rule "
            "never overrides a person's decision about the same node; a person decides",
        )
    if precision is None or precision.decided < policy.min_events:
        seen = 0 if precision is None else precision.decided
        return AutoDecision(
            False,
            "",
            f"{name} has {seen} decided remediation(s) of distinct jobs, fewer than "
            f"minEvents={policy.min_events}: a person decides",
        )
    estimate = precision.estimate or 0.0
    interval = (
        f"Wilson 95% {precision.low:.2f}-{precision.high:.2f}"
        if precision.low is not None and precision.high is not None
        else "no interval"
    )
    inputs = (
        f"{name} precision {estimate:.3f} ({precision.right} right of {precision.decided} "
        f"decided, one per job, {interval}), minPrecision={policy.min_precision}, "
        f"minEvents={policy.min_events}"
    )
    if estimate >= policy.min_precision:
        return AutoDecision(
            True, f"{APPROVER_PREFIX}/precision", f"auto-approved by policy: {inputs}{also}"
        )
    return AutoDecision(False, "", f"below the auto-approval threshold: {inputs}; a person decides")


__all__ = ["SCREEN_REPRODUCED", "AutoDecision", "Precision", "evaluate"]
