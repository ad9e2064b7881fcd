"""What each per-node step returns (added to the item state under its own key)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from sdc_contract.modes import Mode

from .. import text
from .base import LedgerInt
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


ScreenStatus = Literal[
    "in_progress", "reproduced", "clean", "inconclusive", "failed", "not_configured", "skipped"
]
"""The Screen step's outcome: ``in_progress`` (its Job runs; the workflow polls again),
``reproduced`` / ``clean`` / ``inconclusive`` (the screen's own verdict, read from its pod's
termination message), ``failed`` (no usable result: ``reason`` says why), ``not_configured``
(no screenImage), ``skipped`` (a dry run: no Job created)."""
SCREEN_DONE: tuple[ScreenStatus, ...] = (
    "reproduced",
    "clean",
    "inconclusive",
    "failed",
    "not_configured",
    "skipped",
)
"""Every status but ``in_progress``: the step is over, its Job deleted."""
MAX_SCREEN_TEXT = 400
"""The longest text the screen's result carries into the state (reason, what it ran)."""


class ScreenResult(_Model):
    """Output of screen: where the node screen stands, and once over, its verdict.

    A ``clean`` screen is not an exoneration (it says what it ran) and never releases a node; a
    ``failed`` one fails nothing: the workflow goes on to the approval with it recorded.
    """

    status: ScreenStatus
    reason: str = Field(default="", max_length=MAX_SCREEN_TEXT)
    """Why it failed, or the screen's own summary."""
    job: str | None = Field(default=None, max_length=63)
    """The Job's name (None: no Job was created)."""
    namespace: str | None = Field(default=None, max_length=63)
    started_at: str | None = None
    """When the Job was created (ISO 8601): the deadline counts from it."""
    deadline_seconds: LedgerInt = 0
    gpus: LedgerInt = 0
    """How many GPUs the Job asked for (the node's allocatable ``nvidia.com/gpu``)."""
    gpu_index: LedgerInt | None = None
    """``reproduced``: the GPU the screen named (its index on the node)..."""
    gpu_uuid: str | None = Field(default=None, max_length=80)
    """... and its UUID (``GPU-...``)."""
    ran: str = Field(default="", max_length=MAX_SCREEN_TEXT)
    """What the screen exercised (op kinds and counts) and what it did not."""
    deleted: bool = False
    """Whether the Job was deleted once the step was over."""

    @model_validator(mode="before")
    @classmethod
    def _caught_error(cls, value: object) -> object:
        # The workflow's Catch of the Screen step puts its {Error, Cause} at $.screen: that is
        # a failed screen, never a reason to refuse the state (the approval must go on).
        if isinstance(value, dict) and "status" not in value and "Error" in value:
            return {
                "status": "failed",
                "reason": f"the Screen step failed: {value.get('Error')}: {value.get('Cause')}",
            }
        return value

    @field_validator("reason", "ran", mode="before")
    @classmethod
    def _printable(cls, value: object) -> object:
        # Read from a pod's termination message: it reaches messages and terminals.
        return text.printable(value, MAX_SCREEN_TEXT)

    @field_validator("gpu_uuid", mode="before")
    @classmethod
    def _printable_uuid(cls, value: object) -> object:
        return None if value is None else text.printable(value, 80)

    @property
    def done(self) -> bool:
        """Whether the step is over (anything but ``in_progress``)."""
        return self.status in SCREEN_DONE

    def line(self) -> str:
        """The one line the approval message, the ledger and ``history`` show."""
        if self.status == "reproduced":
            return f"reproduced on GPU {self.gpu_index} (UUID {self.gpu_uuid or 'unknown'})"
        if self.status == "clean":
            return f"clean (ran: {self.ran or 'not stated'}; not an exoneration)"
        if self.status == "inconclusive":
            return f"inconclusive ({self.reason or 'no GPU could be named'})"
        if self.status == "failed":
            return f"failed ({self.reason or 'no reason given'})"
        if self.status == "not_configured":
            return "not configured (no screenImage)"
        if self.status == "skipped":
            return f"skipped ({self.reason or 'dry run'})"
        return f"in progress (Job {self.namespace}/{self.job})"


class StepResults(_Model):
    """What the per-node steps added to the item state, each under its own key (ResultPath)."""

    admission: Admission | None = None
    cordon: CordonResult | None = None
    health: HealthResult | None = None
    screen: ScreenResult | None = None
    approval: ApprovalDecision | None = None
    replacement: ReplaceResult | None = None
    uncordon: CordonResult | None = None


__all__ = [
    "SCREEN_DONE",
    "Admission",
    "ApprovalDecision",
    "CordonResult",
    "HealthResult",
    "HealthStatus",
    "ReplaceResult",
    "ScreenResult",
    "ScreenStatus",
    "StepResults",
]
