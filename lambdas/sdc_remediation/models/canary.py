"""A canary run as the ledger holds it, and the steps a run walks through (the live canary:
``logic/canary``; docs/deploy.md, "The canary")."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sdc_contract.environment import DEFAULT_CANARY_TIMEOUT_SECONDS

STEPS: tuple[tuple[str, str], ...] = (
    ("scheduled", "the schedule started a canary run (the canary function recorded it)"),
    ("published", "the canary report and metric datum were written"),
    ("alarm", "the canary's SDC alarm went to ALARM (written by localize)"),
    ("workflow", "the EventBridge rule started a workflow execution (written by localize)"),
    ("localized", "localize accepted the canary report"),
    ("admitted", "admit read the blast-radius guard (nothing claimed)"),
    ("cordoned", "cordon ran (dry run)"),
    ("health_checked", "the deep health check ran (dry run)"),
    ("approval_requested", "the approval was requested"),
    ("approved", "the approve function settled the canary's approval and resumed the workflow"),
    ("replaced", "replace ran (dry run)"),
    ("closed", "the record step closed the canary and put canary_completed"),
)
"""The canary's steps in order, each with what reaching it proves."""
STEP_NAMES: tuple[str, ...] = tuple(name for name, _ in STEPS)
FAILED = "failed"
"""Not a step: written on a run when a step of it failed (with the error)."""

HINTS: dict[str, str] = {
    "scheduled": "no canary run started since the last one completed: is the schedule enabled, "
    "and does the canary function run (its log group)?",
    "published": "the canary function did not finish writing its report and datum (its logs)",
    "alarm": "the canary's SDC alarm did not fire on the datum (the alarm, its metric)",
    "workflow": "the alarm fired but no workflow execution started: is the EventBridge rule "
    "enabled, and is its dead-letter queue empty?",
    "localized": "the execution started but localize did not accept the canary report "
    "(the execution's history, localize's logs)",
}
"""What to look at when the canary stopped before a step (the others: the execution's history)."""

TRANSITION_STEPS: dict[str, str] = {
    "cordoned": "cordoned",
    "health_check_passed": "health_checked",
    "health_check_failed": "health_checked",
    "health_check_timed_out": "health_checked",
    "awaiting_approval": "approval_requested",
    "approved": "approved",
    "replaced": "replaced",
}
"""The record step's transitions that mark a canary step."""


@dataclass
class Run:
    """One canary run as the ledger holds it."""

    run_id: str
    started_at: str
    steps: list[dict[str, str]] = field(default_factory=list)
    completed: bool = False
    error: str | None = None
    stopped_at: str | None = None
    open_until: int | None = None
    """Epoch seconds after which the run is expired (its start plus ``canaryTimeout``): its
    report and its approval are no longer accepted. None: a run recorded before runs expired,
    open for the default timeout after its start."""

    def is_open(self, now: datetime) -> bool:
        """Not completed and not expired: a report or approval of it may still be accepted."""
        if self.completed:
            return False
        until = self.open_until
        if until is None:
            started = datetime.fromisoformat(self.started_at.replace("Z", "+00:00"))
            until = int(started.timestamp()) + DEFAULT_CANARY_TIMEOUT_SECONDS
        return now.timestamp() < until

    @property
    def reached(self) -> list[str]:
        """The step names the run recorded, in the order they were reached."""
        return [s["step"] for s in self.steps]

    @classmethod
    def from_item(cls, item: dict[str, Any]) -> Run:
        """From its ledger item."""
        return cls(
            run_id=str(item["run_id"]),
            started_at=str(item["started_at"]),
            steps=list(item.get("steps") or []),
            completed=bool(item.get("completed")),
            error=item.get("error"),
            stopped_at=item.get("stopped_at"),
            open_until=int(item["open_until"]) if item.get("open_until") is not None else None,
        )


__all__ = ["FAILED", "HINTS", "STEPS", "STEP_NAMES", "TRANSITION_STEPS", "Run"]
