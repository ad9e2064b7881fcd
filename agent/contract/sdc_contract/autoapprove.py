"""The opt-in auto-approval policy's shape: context key ``autoApprove`` (infra validates it at
synth) and the functions' ``AUTO_APPROVE`` (the same object as JSON).

The policy approves a replacement without a person when the deep health check failed, and/or
when the check x verdict's measured precision over at least N decided remediations is at or
above a threshold; off by default. The functions apply it (``sdc_remediation.logic.autoapprove``)
and record the policy as the approver (``APPROVER_PREFIX/<rule>``), so the ledger, the message
and ``history`` say that no person decided.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ._json import json_object

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
    value = json_object(
        value, '{"onHealthCheckFailed": true, "minPrecision": 0.95, "minEvents": 20}'
    )
    if value is None:
        return AutoApprovePolicy()
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


__all__ = ["APPROVER_PREFIX", "AutoApprovePolicy", "parse_policy"]
