"""A HyperPod node: cordoned through the Kubernetes API, admitted under the ledger's guard (or
shadowed, per ``CHECK_MODES``), approved by a person or the opt-in policy."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..clients.kube import KubeApi
from ..config import Settings
from ..dal.ledger import Ledger
from ..logic import admission, approval, cordon, shadow
from ..logic.admission import AdmitRequest
from ..logic.autoapprove import AutoDecision
from ..models import Admission, ApprovalRequestInput, CordonResult, ItemState
from ..observability import logger


class HyperPodNode:
    """A node of the HyperPod cluster (see ``targets.NodeTarget``)."""

    pages = True
    counts_on_dashboard = True

    def settings(self, settings: Settings) -> Settings:
        """The deployment's own settings (DRY_RUN as configured)."""
        return settings

    def localized(self, settings: Settings) -> None:
        """Nothing to write: the ledger starts at admission."""

    def admit(self, state: ItemState, request: AdmitRequest, settings: Settings) -> Admission:
        """One open remediation per node under the blast-radius guard; a shadowed check x
        verdict only reads the guard."""
        ledger = Ledger(settings.ledger_table)
        if settings.mode_for(state.suspect.check, state.suspect.verdict) == "shadow":
            return shadow.admit(ledger, request, health_check=settings.shadow_health_check)
        decision = ledger.admit(request, admission.decide)
        logger.info("admission", extra={"decision": decision.decision, "reason": decision.reason})
        if decision.decision == "circuit_open" and request.report:
            # The report's refusal, so the sweeper's backstop does not start it again every
            # sweep (a claim says the same of an admitted or shadowed report).
            ledger.refuse_report(
                request.cluster,
                request.report,
                reason=decision.reason,
                instance_id=request.instance_id,
            )
        return Admission(
            decision=decision.decision,
            remediation_id=decision.remediation_id,
            reason=decision.reason,
        )

    def cordon(
        self, state: ItemState, settings: Settings, kube: Callable[[], KubeApi]
    ) -> CordonResult:
        """Cordon the node (spec.unschedulable, sdc-guard's label and annotations, the
        remediation's id among them)."""
        return cordon.cordon(
            kube(), state.alarm, state.suspect, settings.dry_run, _remediation_id(state)
        )

    def uncordon(
        self, state: ItemState, approver: str, settings: Settings, kube: Callable[[], KubeApi]
    ) -> CordonResult:
        """Release the node, as ``approver`` (who rejected and asked for it), when this
        remediation cordoned it."""
        return cordon.uncordon(
            kube(), state.suspect, approver, settings.dry_run, _remediation_id(state)
        )

    def approval_evidence(self) -> dict[str, Any]:
        """Nothing beyond the suspect's evidence."""
        return {}

    def auto_decision(
        self, state: ApprovalRequestInput, settings: Settings, ledger: Ledger
    ) -> AutoDecision | None:
        """The opt-in auto-approval policy's answer (None: no policy configured)."""
        return approval.auto_decision(state, settings, ledger)

    def ask_for_decision(self, pending: approval.PendingApproval, settings: Settings) -> None:
        """The policy approves by itself when it says so; otherwise a person is asked."""
        if pending.auto is not None and pending.auto.approve:
            approval.auto_approve(pending, pending.auto, settings)
        else:
            approval.ask_a_person(pending, settings)

    def recorded(self, transition: str, error: str | None, settings: Settings) -> None:
        """Nothing beyond the ledger event the record step writes."""


def _remediation_id(state: ItemState) -> str | None:
    """The remediation this item admitted (None: no admission in the state)."""
    return state.admission.remediation_id if state.admission else None


HYPERPOD = HyperPodNode()
"""Every HyperPod node behaves alike: one stateless target serves them all."""

__all__ = ["HYPERPOD", "HyperPodNode"]
