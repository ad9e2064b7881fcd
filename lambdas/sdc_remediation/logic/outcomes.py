"""What became of each remediation: the ledger's transitions folded into one outcome per
remediation, against the check and verdict that raised it (the precision ledger).

The ledger keeps one event per transition (``ledger.Ledger.record``); since the record step
writes the suspect's ``check``, ``verdict`` and ``job`` on every event, a remediation's events
say which detector raised it and how it ended. This module is pure (no AWS): ``summarise``
turns events into :class:`Remediation` summaries, ``mark_recurrences`` finds repeat offenders,
and ``classify`` says whether the alarm was right, wrong, or not yet known (``stats`` counts
them).

What counts is what someone decided about a node the guard admitted: a failed deep health check
(hardware confirmed), or a person's approval, rejection or release. Nothing a pod can produce
decides: a shadowed alarm, a refused (``circuit_open``) or ``duplicate`` one, an approval by the
auto-approval policy (it reads these numbers: counting its own decisions would feed itself), and
a recurrence (a pod can write another report about the same node at will) decide nothing.

Recurrence: among admitted remediations only, and from another report (the ledger admits one
remediation per report and node; a report naming two nodes is one report): the same instance
alarming again within the window, or, after a replacement, another instance of the same job
alarming within the window. The ledger does not know which instance replaced which, so the
second rule counts any other node of that job: a replacement that did not stop the job's alarms
suggests the wrong node was blamed. It turns a person's approval into "wrong"; it never makes
anything "right".

Screen agreement (``screen_agreement``): whether the node screen agreed with the job's finding.
``reproduced`` agreed; ``clean`` disagreed (the screen did not find it: not an exoneration, and
it decides nothing about right or wrong); any other outcome (inconclusive, failed, not
configured, skipped, none) is no screen evidence.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal

import sdc_contract as contract
from sdc_contract.autoapprove import APPROVER_PREFIX

from ..clock import parse_iso

CANARY_APPROVER = "sdc-guard canary"
"""How the canary's approval names its approver (``logic.canary.approval.APPROVER``): no person."""

DEFAULT_RECURRENCE_WINDOW = timedelta(days=7)
"""How soon a second alarm must follow for the first remediation to count as a recurrence."""

UNKNOWN = "-"
"""Check or verdict of events recorded before the ledger kept them."""

Verdict = Literal["right", "wrong", "undecided"]
ScreenAgreement = Literal["agreed", "disagreed", "no_evidence"]

_SCREEN_LINE_STATUS = (
    # The ledger's `screen` line (``ScreenResult.line``) by its start, for events recorded
    # before the ledger kept `screen_status`.
    ("reproduced", "reproduced"),
    ("clean", "clean"),
    ("inconclusive", "inconclusive"),
    ("failed", "failed"),
    ("not configured", "not_configured"),
    ("skipped", "skipped"),
)


def screen_agreement(status: str | None) -> ScreenAgreement:
    """Whether a screen of ``status`` agreed with the job's finding (module docstring)."""
    if status == "reproduced":
        return "agreed"
    if status == "clean":
        return "disagreed"
    return "no_evidence"


def screen_status_of_line(line: str | None) -> str | None:
    """The screen's status from its ledger line (None: no line, or one this cannot read)."""
    text = (line or "").strip()
    return next((status for start, status in _SCREEN_LINE_STATUS if text.startswith(start)), None)


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
    report: str | None = None
    """The identity of the report that raised it (job, step, check, report time)."""
    check: str = UNKNOWN
    verdict: str = UNKNOWN
    first_at: str = ""
    last_at: str = ""
    transitions: list[dict[str, Any]] = field(default_factory=list)
    """``{at, transition, approver?, reason?, decision?}`` in order."""
    dry_run: bool = False
    screen: str | None = None
    """The node screen's outcome (``reproduced on GPU 3 (UUID ...)``, ``clean (ran: ...)``,
    ``failed (...)``), from the latest event that carries one; None: no screen recorded."""
    screen_status: str | None = None
    """Its status (``reproduced``, ``clean``, ...), from the same event (or, on an event recorded
    before the ledger kept it, read from the line)."""
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
        """Whether the blast-radius guard admitted it (enforced: the ledger wrote its
        ``admitted`` event); shadowed, refused and duplicate alarms were not."""
        return "admitted" in self.names

    def _by_person(self, transition: dict[str, Any]) -> bool:
        approver = str(transition.get("approver") or "")
        return bool(approver) and not approver.startswith((APPROVER_PREFIX, CANARY_APPROVER))

    @property
    def person_approved(self) -> bool:
        """A person (not the auto-approval policy) approved the replacement."""
        return any(t.get("decision") == "approve" and self._by_person(t) for t in self.transitions)

    @property
    def person_rejected(self) -> bool:
        """A person rejected the replacement, or released the node from the guard."""
        return any(
            (t.get("decision") == "reject" or t["transition"] == "released") and self._by_person(t)
            for t in self.transitions
        )

    def person_rejected_at(self) -> str | None:
        """When a person first rejected (or released) it, if one did."""
        return next(
            (
                str(t.get("at"))
                for t in self.transitions
                if (t.get("decision") == "reject" or t["transition"] == "released")
                and self._by_person(t)
            ),
            None,
        )

    @property
    def screen_agreement(self) -> ScreenAgreement:
        """Whether the node screen agreed with the job's finding (``screen_agreement``)."""
        return screen_agreement(self.screen_status)

    @property
    def decided(self) -> bool:
        """Admitted, and decided by the health check or a person: what precision counts."""
        return classify(self) != "undecided"


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
        entry.report = entry.report or event.get("report")
        if entry.check == UNKNOWN and event.get("check"):
            entry.check = str(event["check"])
        if entry.verdict == UNKNOWN and event.get("verdict"):
            # A verdict outside the contract's list (a row another version wrote) counts as
            # `unknown`, the name the record step writes for it now.
            entry.verdict = contract.verdict_name(event["verdict"])
        entry.dry_run = entry.dry_run or bool(event.get("dry_run"))
        if event.get("screen"):
            entry.screen = str(event["screen"])
            entry.screen_status = (
                str(event["screen_status"])
                if event.get("screen_status")
                else screen_status_of_line(entry.screen)
            )
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
    """Set ``repeat_same_instance`` / ``repeat_after_replacement`` on each admitted remediation
    that a later admitted one, from another report, followed within ``window``; returns the same
    list. A shadowed, refused or duplicate alarm is no recurrence, nor is the same report read
    again."""
    admitted = [r for r in remediations if r.first_at and r.admitted]
    for index, earlier in enumerate(admitted):
        start = parse_iso(earlier.first_at)
        for later in admitted[index + 1 :]:
            if later is earlier:
                continue
            if parse_iso(later.first_at) - start > window:
                break
            if earlier.report and later.report == earlier.report:
                continue
            if later.instance_id == earlier.instance_id:
                earlier.repeat_same_instance = True
            elif earlier.replaced and earlier.job and later.job == earlier.job:
                earlier.repeat_after_replacement = True
    return remediations


def classify(remediation: Remediation) -> Verdict:
    """Whether the alarm that raised it was right (the node was bad), wrong, or undecided.

    Only an admitted remediation is decided, by the health check or a person. Right: the deep
    health check failed (or HyperPod replaced the node after it); or a person approved the
    replacement and the job's alarms stopped. Wrong: a person rejected it or released the node;
    or a person approved it and the job alarmed again on another node within the window.
    Undecided: anything else (not admitted: shadow, refused, duplicate; in flight, timed out,
    failed, abandoned; approved by the policy alone; a recurrence alone).
    """
    if not remediation.admitted:
        return "undecided"
    if remediation.confirmed or "replaced_by_hyperpod" in remediation.names:
        return "right"
    if remediation.person_rejected:
        return "wrong"
    if remediation.person_approved:
        return "wrong" if remediation.repeat_after_replacement else "right"
    return "undecided"


def since(remediations: Iterable[Remediation], start: datetime) -> list[Remediation]:
    """The remediations that began at or after ``start``."""
    return [r for r in remediations if r.first_at and parse_iso(r.first_at) >= start]


__all__ = [
    "DEFAULT_RECURRENCE_WINDOW",
    "UNKNOWN",
    "Remediation",
    "ScreenAgreement",
    "Verdict",
    "classify",
    "mark_recurrences",
    "screen_agreement",
    "screen_status_of_line",
    "since",
    "summarise",
]
