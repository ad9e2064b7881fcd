"""What became of each remediation: the ledger's transitions folded into one outcome per
remediation, against the check and verdict that raised it (the precision ledger).

The ledger keeps one event per transition (``ledger.Ledger.record``); since the record step
writes the suspect's ``check``, ``verdict`` and ``job`` on every event, a remediation's events
say which detector raised it and how it ended. This module is pure (no AWS): ``summarise``
turns events into :class:`Remediation` summaries, ``mark_recurrences`` finds repeat offenders,
and ``classify`` says whether the alarm was right, wrong, or not yet known (``stats`` counts
them).

Recurrence: the same instance alarming again within the window after a remediation, or, after
a replacement, another instance of the same job alarming within the window. The ledger does not
know which instance replaced which, so the second rule counts any other node of that job: a
replacement that did not stop the job's alarms suggests the wrong node was blamed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal

import sdc_contract as contract

from ..clock import parse_iso

DEFAULT_RECURRENCE_WINDOW = timedelta(days=7)
"""How soon a second alarm must follow for the first remediation to count as a recurrence."""

UNKNOWN = "-"
"""Check or verdict of events recorded before the ledger kept them."""

Verdict = Literal["right", "wrong", "undecided"]

# Terminal transitions, most telling first: a remediation's outcome is the first one it has.
_OUTCOME_ORDER = (
    "replaced",
    "replaced_by_hyperpod",
    "shadow",
    "rejected",
    "released",
    "approval_timed_out",
    "failed",
    "abandoned",
    "circuit_open",
    "duplicate",
)


@dataclass
class Remediation:
    """One remediation (one alarm on one node) as the ledger tells it."""

    remediation_id: str
    instance_id: str
    node_name: str | None = None
    job: str | None = None
    check: str = UNKNOWN
    verdict: str = UNKNOWN
    first_at: str = ""
    last_at: str = ""
    transitions: list[dict[str, Any]] = field(default_factory=list)
    """``{at, transition, approver?, reason?, decision?}`` in order."""
    dry_run: bool = False
    repeat_same_instance: bool = False
    """The same instance alarmed again within the recurrence window."""
    repeat_after_replacement: bool = False
    """Replaced, and another node of the same job alarmed again within the window."""

    @property
    def names(self) -> set[str]:
        """The transitions it went through."""
        return {t["transition"] for t in self.transitions}

    @property
    def outcome(self) -> str:
        """Its terminal transition (``in_flight`` when it has none yet)."""
        names = self.names
        return next((name for name in _OUTCOME_ORDER if name in names), "in_flight")

    @property
    def confirmed(self) -> bool:
        """The deep health check failed: the hardware is confirmed bad."""
        return "health_check_failed" in self.names

    @property
    def replaced(self) -> bool:
        """The node was replaced (by us or by HyperPod's own recovery)."""
        return bool(self.names & {"replaced", "replaced_by_hyperpod"})

    @property
    def rejected(self) -> bool:
        """A person rejected the replacement (kept cordoned or released)."""
        return "rejected" in self.names or any(
            t.get("decision") == "reject" for t in self.transitions
        )

    @property
    def repeat(self) -> bool:
        """A repeat offender: the alarm came back (see the module docstring)."""
        return self.repeat_same_instance or self.repeat_after_replacement

    @property
    def admitted(self) -> bool:
        """Whether the guard admitted it (not a duplicate or a circuit_open only)."""
        return not self.names <= {"duplicate", "circuit_open"}


def summarise(events: Iterable[Mapping[str, Any]]) -> list[Remediation]:
    """Fold ledger events into one :class:`Remediation` per remediation id, oldest first.

    Only node events count (``pk`` an instance id); cluster-level ones (ambiguous, no suspects)
    name no node, and the canary's reserved node is no real alarm (``contract.CANARY_*``).
    Check, verdict and job come from whichever event carries them (the sweeper's
    ``abandoned`` and an operator's ``release`` do not).
    """
    # Keyed by node and id: alarms the guard refused carry an execution-wide `x-<execution>` id.
    by_id: dict[tuple[str, str], Remediation] = {}
    for event in sorted(events, key=lambda e: (str(e.get("at", "")), str(e.get("sk", "")))):
        pk = str(event.get("pk", ""))
        if not pk.startswith("i-") or pk == contract.CANARY_INSTANCE_ID:
            continue  # cluster-level events name no node; the canary's are no real alarm
        rid = str(event.get("remediation_id") or f"x-{pk}")
        entry = by_id.get((pk, rid))
        if entry is None:
            entry = by_id[pk, rid] = Remediation(remediation_id=rid, instance_id=pk)
            entry.first_at = str(event.get("at", ""))
        entry.last_at = str(event.get("at", entry.last_at))
        entry.node_name = entry.node_name or event.get("node_name")
        entry.job = entry.job or event.get("job")
        if entry.check == UNKNOWN and event.get("check"):
            entry.check = str(event["check"])
        if entry.verdict == UNKNOWN and event.get("verdict"):
            # A verdict outside the contract's list (a row another version wrote) counts as
            # `unknown`, the name the record step writes for it now.
            entry.verdict = contract.verdict_name(event["verdict"])
        entry.dry_run = entry.dry_run or bool(event.get("dry_run"))
        entry.transitions.append(
            {
                key: event[key]
                for key in ("at", "transition", "approver", "reason", "decision", "error")
                if event.get(key) is not None
            }
        )
    return sorted(by_id.values(), key=lambda r: r.first_at)


def mark_recurrences(
    remediations: list[Remediation], window: timedelta = DEFAULT_RECURRENCE_WINDOW
) -> list[Remediation]:
    """Set ``repeat_same_instance`` / ``repeat_after_replacement`` on each remediation that a
    later alarm followed within ``window``; returns the same list."""
    admitted = [r for r in remediations if r.first_at]
    for index, earlier in enumerate(admitted):
        start = parse_iso(earlier.first_at)
        for later in admitted[index + 1 :]:
            if later is earlier:
                continue
            if parse_iso(later.first_at) - start > window:
                break
            if later.instance_id == earlier.instance_id:
                earlier.repeat_same_instance = True
            elif earlier.replaced and earlier.job and later.job == earlier.job:
                earlier.repeat_after_replacement = True
    return remediations


def classify(remediation: Remediation) -> Verdict:
    """Whether the alarm that raised it was right (the node was bad), wrong, or undecided.

    Right: the deep health check failed; or the same instance alarmed again (a repeat offender);
    or it was replaced and the job's alarms stopped. Wrong: replaced and the job alarmed again
    on another node within the window; or a person rejected it (kept or released) and it did not
    come back. Undecided: anything else (in flight, timed out, failed, abandoned, shadow without
    a health verdict, a duplicate or a circuit_open).
    """
    if remediation.confirmed or remediation.repeat_same_instance:
        return "right"
    if remediation.replaced:
        return "wrong" if remediation.repeat_after_replacement else "right"
    if remediation.rejected or remediation.outcome == "released":
        return "wrong"
    return "undecided"


def since(remediations: Iterable[Remediation], start: datetime) -> list[Remediation]:
    """The remediations that began at or after ``start``."""
    return [r for r in remediations if r.first_at and parse_iso(r.first_at) >= start]


__all__ = [
    "DEFAULT_RECURRENCE_WINDOW",
    "UNKNOWN",
    "Remediation",
    "Verdict",
    "classify",
    "mark_recurrences",
    "since",
    "summarise",
]
