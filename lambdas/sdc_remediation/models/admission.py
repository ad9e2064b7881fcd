"""What admission passes between the domain and the ledger: the request, the guard's state as
the rule reads it, and the answer (plain frozen dataclasses: they never cross the workflow as
JSON). The rule itself is ``logic.admission.decide``; the ledger receives it from its caller
(``AdmissionRule``), so ``dal`` imports only what is below it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal

WINDOW = timedelta(hours=1)

Decision = Literal["admitted", "duplicate", "circuit_open"]


@dataclass(frozen=True)
class AdmitRequest:
    """What admission needs to know about one suspect."""

    cluster: str
    instance_id: str
    node_name: str
    execution: str
    cluster_nodes: int
    max_nodes_per_hour: int
    max_fraction: float
    suspects_in_alarm: int = 1
    """How many nodes the alarm that named this one names in all."""
    item: int | None = None
    """The Map item's index in the execution (``$$.Map.Item.Index``): two items of one alarm
    naming the same instance are one admission, a retried Lambda of the same item is the same."""
    report: str | None = None
    """The identity of the report naming the node (``Suspect.report_key``: job, step, check,
    report time); None: no identity (nothing dedupes by report)."""


@dataclass(frozen=True)
class AdmitDecision:
    """The ledger's answer: admitted, duplicate or circuit_open, and why."""

    decision: Literal["admitted", "duplicate", "circuit_open"]
    remediation_id: str | None
    reason: str


@dataclass(frozen=True)
class GuardSnapshot:
    """What the guard item and the node's STATE say, as the policy reads them."""

    node: dict[str, Any] | None
    """The node's STATE item (None: never remediated)."""
    admissions: list[dict[str, Any]] = field(default_factory=list)
    """``{instance_id, at (epoch s), execution?, item?}`` of recent admissions."""
    open_instances: list[str] = field(default_factory=list)
    held: list[dict[str, Any]] = field(default_factory=list)
    """``{instance_id, remediation_id, at}`` of nodes admitted and not released."""
    report: dict[str, Any] | None = None
    """The report's claim on this node, if a remediation already took it (``remediation_id``,
    ``execution``, ``item``)."""


def recent_admissions(admissions: list[dict[str, Any]], now: datetime) -> list[dict[str, Any]]:
    """The admissions of the rolling hour before ``now``."""
    start = int((now - WINDOW).timestamp())
    return [a for a in admissions if int(a["at"]) > start]


AdmissionRule = Callable[[AdmitRequest, GuardSnapshot, datetime], AdmitDecision]
"""The guard's policy as the ledger calls it inside its optimistic transaction
(``logic.admission.decide``)."""


__all__ = [
    "WINDOW",
    "AdmissionRule",
    "AdmitDecision",
    "AdmitRequest",
    "Decision",
    "GuardSnapshot",
    "recent_admissions",
]
