"""The remediation ledger (DynamoDB): one open remediation per node, the blast-radius guard,
and a transition history per node (repeat offenders).

``Ledger`` is the one object the rest of the package holds; it composes the table's concerns,
each in its own module (the items each one owns are described there, every key is
``keys``', and docs/CONTRACT.md, "DynamoDB tables", lists them):

- ``admission_store``: the node's STATE and the cluster's guard item, read and claimed
  together under the guard's version (``admit``, ``would_admit``, ``state``, ``guard``,
  ``held``, ``open_remediations``);
- ``claims``: one remediation per report (``report_claim``, ``claim_report``,
  ``release_report``);
- ``holds``: the end of a remediation and of the node's hold (``close``,
  ``close_execution``, ``release``; ``RELEASING_TRANSITIONS``);
- ``events``: the transition history (``record``, ``events``, ``all_events``,
  ``offender_history``; ``encode_detail``);
- ``notices``: what is said once (``first_in_episode``, ``due``);
- ``report_outcomes``: a report the admission refused, one the sweeper's backstop started,
  and where the backstop stands (``refuse_report``, ``report_refusal``, ``report_taken``,
  ``backstop_started``, ``mark_backstop_started``, ``backstop_cursor``,
  ``save_backstop_cursor``).
"""

from __future__ import annotations

from typing import Any

from ..models.admission import AdmissionRule, AdmitDecision, AdmitRequest
from .admission_store import AdmissionStore
from .claims import ReportClaims
from .dynamo import Table
from .events import Events
from .holds import Holds
from .notices import Notices
from .report_outcomes import ReportOutcomes


class Ledger:
    """Reads and writes the ledger table (each concern delegated to its own store)."""

    def __init__(self, table: str) -> None:
        self.table = table
        store = Table(table)
        self._events = Events(store)
        self._claims = ReportClaims(store)
        self._admissions = AdmissionStore(store, self._claims)
        self._holds = Holds(store, self._admissions, self._events)
        self._notices = Notices(store)
        self._outcomes = ReportOutcomes(store)

    # -- admission (admission_store, claims) --------------------------------------------------

    def state(self, instance_id: str) -> dict[str, Any] | None:
        """The node's STATE item, if any."""
        return self._admissions.state(instance_id)

    def guard(self, cluster: str) -> dict[str, Any]:
        """The cluster's guard item (a fresh one at version 0 when absent)."""
        return self._admissions.guard(cluster)

    def held(self, cluster: str) -> list[dict[str, Any]]:
        """Nodes admitted (cordoned) and not released, oldest first."""
        return self._admissions.held(cluster)

    def open_remediations(self) -> list[dict[str, Any]]:
        """Every open STATE item (the sweeper's work list)."""
        return self._admissions.open_remediations()

    def admit(self, req: AdmitRequest, rule: AdmissionRule) -> AdmitDecision:
        """Claim the node for a remediation, unless it is open already or the guard trips
        (``AdmissionStore.admit``)."""
        return self._admissions.admit(req, rule)

    def would_admit(self, req: AdmitRequest, rule: AdmissionRule) -> AdmitDecision:
        """What ``admit`` would decide now, without claiming anything (shadow mode)."""
        return self._admissions.would_admit(req, rule)

    def report_claim(self, req: AdmitRequest) -> dict[str, Any] | None:
        """The remediation that already took ``req``'s report on this node, if any."""
        return self._claims.get(req)

    def claim_report(self, req: AdmitRequest, remediation_id: str) -> dict[str, Any] | None:
        """Claim ``req``'s report outside an admission (``ReportClaims.claim``): None when
        claimed now or by this execution and item before, else the claim that took it."""
        return self._claims.claim(req, remediation_id)

    def release_report(self, instance_id: str, report: str, remediation_id: str) -> None:
        """Give the report back (only the claim ``remediation_id`` holds)."""
        self._claims.release(instance_id, report, remediation_id)

    # -- closing and releasing (holds) --------------------------------------------------------

    def close(
        self,
        cluster: str,
        instance_id: str,
        remediation_id: str,
        status: str,
        *,
        release_hold: bool | None = None,
    ) -> bool:
        """Mark the node's remediation closed and free its place in flight (``Holds.close``);
        False when the node's open remediation is another one."""
        return self._holds.close(
            cluster, instance_id, remediation_id, status, release_hold=release_hold
        )

    def close_execution(
        self,
        cluster: str,
        instance_id: str,
        execution: str,
        item: int | None,
        status: str,
        *,
        release_hold: bool | None = None,
    ) -> str | None:
        """Close the node's open remediation if this execution (and Map item) admitted it
        (``Holds.close_execution``); returns the closed remediation id, or None."""
        return self._holds.close_execution(
            cluster, instance_id, execution, item, status, release_hold=release_hold
        )

    def release(self, cluster: str | None, node: str, *, released_by: str, reason: str = "") -> str:
        """An operator's word that a held node is back in service or gone (``Holds.release``);
        returns the instance id."""
        return self._holds.release(cluster, node, released_by=released_by, reason=reason)

    # -- transitions (events, notices) --------------------------------------------------------

    def record(
        self,
        pk: str,
        remediation_id: str,
        transition: str,
        attrs: dict[str, Any],
        update_status: bool = True,
    ) -> str:
        """Append a transition (``Events.record``); returns its sort key."""
        return self._events.record(pk, remediation_id, transition, attrs, update_status)

    def events(self, pk: str) -> list[dict[str, Any]]:
        """Every transition recorded under ``pk`` (an instance id), oldest first."""
        return self._events.events(pk)

    def all_events(self) -> list[dict[str, Any]]:
        """Every transition in the table, oldest first."""
        return self._events.all_events()

    def offender_history(self, instance_id: str) -> list[dict[str, Any]]:
        """Past remediations of this instance: one summary per remediation id, oldest first."""
        return self._events.offender_history(instance_id)

    def first_in_episode(
        self, cluster: str, episode: str, transition: str, quiet_seconds: int
    ) -> bool:
        """Whether this ``transition`` of ``episode`` is the first of its episode
        (``Notices.first_in_episode``)."""
        return self._notices.first_in_episode(cluster, episode, transition, quiet_seconds)

    def due(self, cluster: str, what: str, every_seconds: int) -> bool:
        """Claim the ``what`` due once every ``every_seconds`` (``Notices.due``)."""
        return self._notices.due(cluster, what, every_seconds)

    def release_due(self, cluster: str, what: str) -> None:
        """Give back a :meth:`due` claim whose message was not sent (``Notices.release_due``)."""
        self._notices.release_due(cluster, what)

    # -- reports outside their claims (report_outcomes, claims) -------------------------------

    def refuse_report(self, cluster: str, report: str, *, reason: str, instance_id: str) -> None:
        """Record the admission's refusal of ``report`` (``ReportOutcomes.refuse``)."""
        self._outcomes.refuse(cluster, report, reason=reason, instance_id=instance_id)

    def report_refusal(self, cluster: str, report: str) -> dict[str, Any] | None:
        """The admission's refusal of ``report``, if any."""
        return self._outcomes.refusal(cluster, report)

    def report_taken(self, instance_id: str, report: str) -> dict[str, Any] | None:
        """The claim of ``report`` on the node, if any (``ReportClaims.taken``)."""
        return self._claims.taken(instance_id, report)

    def backstop_started(self, cluster: str, report: str) -> dict[str, Any] | None:
        """The sweeper's backstop start for ``report``, if any."""
        return self._outcomes.started(cluster, report)

    def mark_backstop_started(self, cluster: str, report: str, *, execution: str) -> None:
        """Record the backstop's start of ``execution`` for ``report``."""
        self._outcomes.mark_started(cluster, report, execution=execution)

    def backstop_cursor(self, cluster: str) -> dict[str, Any] | None:
        """Where the backstop's reading of the report group stands."""
        return self._outcomes.cursor(cluster)

    def save_backstop_cursor(
        self, cluster: str, *, start_ms: int, end_ms: int, token: str | None, done: bool
    ) -> None:
        """Store where the backstop stands (``ReportOutcomes.save_cursor``)."""
        self._outcomes.save_cursor(
            cluster, start_ms=start_ms, end_ms=end_ms, token=token, done=done
        )


__all__ = ["Ledger"]
