"""Opt-in auto-approval: a policy (context key ``autoApprove``, environment ``AUTO_APPROVE``)
that approves a replacement without a person when the deep health check failed, and/or when
the check x verdict's measured precision (``stats``) over at least N decided remediations is
at or above a threshold. Off by default.

The policy decides only where a person would: at RequestApproval, after the blast-radius guard
admitted the node, it was cordoned and its health check ended. The approver recorded is the
policy (``policy:sdc-guard-auto-approve/<rule>``) and the reason its inputs, so the ledger, the
message and ``history`` say that no person decided. Parsing is standard library only (infra
validates the same object at synth).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

APPROVER_PREFIX = "policy:sdc-guard-auto-approve"
"""What the ledger records as the approver of an auto-approval (``/<rule>`` follows)."""
_KEYS = ("onHealthCheckFailed", "minPrecision", "minEvents")


@dataclass(frozen=True)
class AutoApprovePolicy:
    """When a replacement is approved without a person (both rules off: never)."""

    on_health_check_failed: bool = False
    """Approve when this remediation's deep health check failed (hardware confirmed)."""
    min_precision: float | None = None
    """Approve when the check x verdict's precision is at least this (None: rule off)."""
    min_events: int = 20
    """... measured over at least this many decided remediations."""

    @property
    def enabled(self) -> bool:
        """Whether any rule can approve."""
        return self.on_health_check_failed or self.min_precision is not None

    def as_json(self) -> str:
        """The policy as ``AUTO_APPROVE`` carries it."""
        return json.dumps(
            {
                "onHealthCheckFailed": self.on_health_check_failed,
                "minPrecision": self.min_precision,
                "minEvents": self.min_events,
            },
            sort_keys=True,
            separators=(",", ":"),
        )


def parse_policy(value: Any) -> AutoApprovePolicy:
    """Validate ``{"onHealthCheckFailed": bool, "minPrecision": 0..1 | null, "minEvents": int
    >= 1}`` (or its JSON text; empty: off); ValueError names the field."""
    if isinstance(value, str):
        if not value.strip():
            return AutoApprovePolicy()
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"invalid JSON object: {exc}") from None
    if not isinstance(value, Mapping):
        raise ValueError(
            'expected an object like {"onHealthCheckFailed": true, "minPrecision": 0.95, '
            f'"minEvents": 20}}, got {value!r}'
        )
    unknown = sorted(set(value) - set(_KEYS))
    if unknown:
        raise ValueError(f"unknown field(s) {unknown}; expected some of {list(_KEYS)}")
    on_failed = value.get("onHealthCheckFailed", False)
    if not isinstance(on_failed, bool):
        raise ValueError(f"onHealthCheckFailed must be true or false, got {on_failed!r}")
    precision = value.get("minPrecision")
    if precision is not None and (
        isinstance(precision, bool)
        or not isinstance(precision, int | float)
        or not 0 < precision <= 1
    ):
        raise ValueError(f"minPrecision must be a number in (0, 1] or null, got {precision!r}")
    events = value.get("minEvents", 20)
    if isinstance(events, bool) or not isinstance(events, int) or events < 1:
        raise ValueError(f"minEvents must be an integer >= 1, got {events!r}")
    return AutoApprovePolicy(
        on_health_check_failed=on_failed,
        min_precision=None if precision is None else float(precision),
        min_events=events,
    )


@dataclass(frozen=True)
class Precision:
    """A check x verdict's measured precision (``stats.CheckStats`` carries these)."""

    right: int
    wrong: int
    low: float | None
    high: float | None

    @property
    def decided(self) -> int:
        """Remediations the estimate counts."""
        return self.right + self.wrong

    @property
    def estimate(self) -> float | None:
        """right / decided (None without any decided remediation)."""
        return self.right / self.decided if self.decided else None


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
) -> AutoDecision:
    """Apply the policy to one remediation waiting for approval; pure.

    The health-check rule comes first (it is evidence about this very node); the precision
    rule needs ``min_events`` decided remediations of the same check x verdict, and compares
    the point estimate with ``min_precision`` (the Wilson interval is part of the reason).
    """
    if policy.on_health_check_failed and health_status == "failed":
        return AutoDecision(
            True,
            f"{APPROVER_PREFIX}/health-check-failed",
            "auto-approved by policy: the deep health check failed (hardware confirmed); "
            f"inputs: onHealthCheckFailed=true, health={health_status}",
        )
    if policy.min_precision is None:
        return AutoDecision(False, "", "no auto-approval rule applies; a person decides")
    name = f"{check}/{verdict}"
    if precision is None or precision.decided < policy.min_events:
        seen = 0 if precision is None else precision.decided
        return AutoDecision(
            False,
            "",
            f"{name} has {seen} decided remediation(s), fewer than minEvents="
            f"{policy.min_events}: a person decides",
        )
    estimate = precision.estimate or 0.0
    interval = (
        f"Wilson 95% {precision.low:.2f}-{precision.high:.2f}"
        if precision.low is not None and precision.high is not None
        else "no interval"
    )
    inputs = (
        f"{name} precision {estimate:.3f} ({precision.right} right of {precision.decided} "
        f"decided, {interval}), minPrecision={policy.min_precision}, "
        f"minEvents={policy.min_events}"
    )
    if estimate >= policy.min_precision:
        return AutoDecision(
            True, f"{APPROVER_PREFIX}/precision", f"auto-approved by policy: {inputs}"
        )
    return AutoDecision(False, "", f"below the auto-approval threshold: {inputs}; a person decides")


__all__ = [
    "APPROVER_PREFIX",
    "AutoApprovePolicy",
    "AutoDecision",
    "Precision",
    "evaluate",
    "parse_policy",
]
