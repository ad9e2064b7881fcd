"""What each per-node step returns (added to the item state under its own key)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from sdc_contract.modes import Mode

from .base import Model as _Model


class Admission(_Model):
    """Output of admit."""

    decision: Literal["admitted", "duplicate", "circuit_open"]
    remediation_id: str | None
    reason: str
    mode: Mode = "enforce"
    """``shadow``: the check x verdict is not enforced (CHECK_MODES); the workflow records and
    notifies what it would have done and touches nothing. Nothing was claimed in the ledger."""
    shadow_health_check: bool = False
    """A shadowed alarm whose deep health check may run (``shadowHealthCheck`` on, and the
    shadow guard had room): the workflow runs it before recording the shadow."""


class CordonResult(_Model):
    """Output of cordon and uncordon."""

    node_name: str
    cordoned: bool
    changed: bool
    dry_run: bool
    health_check_label: str | None = None
    """The node's ``sagemaker.amazonaws.com/deep-health-check-status`` label when cordon read
    it (None: no label): the verdict of an EARLIER check, which start_health_check passes on as
    ``label_before`` so the poll does not take it for this check's verdict."""


HealthStatus = Literal["in_progress", "passed", "failed", "replaced_by_hyperpod", "timed_out"]


class HealthResult(_Model):
    """Output of start_health_check / poll_health_check."""

    status: HealthStatus
    started_at: str
    checks: list[str] = Field(default_factory=list)
    dry_run: bool = False
    detail: str = ""
    label_before: str | None = None
    """The deep-health-check label before this check was started (None: none): a Passed/Failed
    label equal to it may be an earlier check's verdict."""
    seen_in_progress: bool = False
    """Whether this check was observed running (label InProgress or instance status
    DeepHealthCheckInProgress); after that, a Passed/Failed label is this check's verdict."""


class ApprovalDecision(_Model):
    """What the CLI sends with SendTaskSuccess: the request_approval task's output."""

    decision: Literal["approve", "reject"]
    release: bool = False
    approver: str
    reason: str = ""
    approval_id: str


class ReplaceResult(_Model):
    """Output of replace."""

    mode: Literal["api", "label"]
    requested: bool
    dry_run: bool
    detail: str


class StepResults(_Model):
    """What the per-node steps added to the item state, each under its own key (ResultPath)."""

    admission: Admission | None = None
    cordon: CordonResult | None = None
    health: HealthResult | None = None
    approval: ApprovalDecision | None = None
    replacement: ReplaceResult | None = None
    uncordon: CordonResult | None = None


__all__ = [
    "Admission",
    "ApprovalDecision",
    "CordonResult",
    "HealthResult",
    "HealthStatus",
    "ReplaceResult",
    "StepResults",
]
