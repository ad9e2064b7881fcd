"""The live canary's reserved node (``sdc_contract.canary``): no Kubernetes node, no HyperPod
instance. Every step walks the enforce path in dry run, claims nothing in the ledger's guard,
pages nobody, and writes what it reached on the canary run (``logic/canary``)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import sdc_contract as contract

from ..clients import cloudwatch
from ..clients.kube import KubeApi
from ..config import Settings
from ..dal.canary_runs import RunStore
from ..dal.ledger import Ledger
from ..logic import admission
from ..logic.admission import AdmitRequest
from ..logic.approval import PendingApproval
from ..logic.autoapprove import AutoDecision
from ..logic.canary.approval import CANARY_REMEDIATION_PREFIX, ask_approve
from ..models import Admission, ApprovalRequestInput, CordonResult, ItemState
from ..models.canary import FAILED, TRANSITION_STEPS
from ..observability import logger


class CanaryNode:
    """The reserved node of canary run ``run_id`` (see ``targets.NodeTarget``)."""

    pages = False
    """Nobody is paged for a canary that works: only the canary alarm speaks, when one does not."""
    counts_on_dashboard = False
    """The dashboard's counts and outcome table are real remediations only."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id

    def reach(self, settings: Settings, step: str, *, error: str | None = None) -> None:
        """Write ``step`` on the run."""
        RunStore(settings.ledger_table, settings.hyperpod_cluster_name).reach(
            self.run_id, step, error=error
        )

    def settings(self, settings: Settings) -> Settings:
        """DRY_RUN forced on, whatever the deployment's own."""
        return settings.dry_run_only()

    def localized(self, settings: Settings) -> None:
        """The alarm fired and the rule started this execution: localize is the first of ours
        to see either, so it writes them on the run with its own step."""
        for step in ("alarm", "workflow", "localized"):
            self.reach(settings, step)

    def admit(self, state: ItemState, request: AdmitRequest, settings: Settings) -> Admission:
        """Read the guard as a real admission would, claim nothing (no slot, no node STATE),
        and walk the enforce path whatever CHECK_MODES says."""
        would = Ledger(settings.ledger_table).would_admit(request, admission.decide)
        key = f"{request.execution}#{request.item}#{self.run_id}".encode()
        self.reach(settings, "admitted")
        return Admission(
            decision="admitted",
            remediation_id=f"{CANARY_REMEDIATION_PREFIX}{hashlib.sha256(key).hexdigest()[:16]}",
            reason=(
                f"canary {self.run_id}: dry run, nothing claimed (the guard would answer "
                f"{would.decision})"
            ),
            mode="enforce",
        )

    def _dry_run(self, state: ItemState) -> CordonResult:
        logger.info("canary: dry run, no node to cordon", extra={"node": state.suspect.node_name})
        return CordonResult(
            node_name=state.suspect.node_name, cordoned=False, changed=False, dry_run=True
        )

    def cordon(
        self, state: ItemState, settings: Settings, kube: Callable[[], KubeApi]
    ) -> CordonResult:
        """Its node is no Kubernetes node: nothing is read or patched (a dry run's result)."""
        return self._dry_run(state)

    def uncordon(
        self, state: ItemState, approver: str, settings: Settings, kube: Callable[[], KubeApi]
    ) -> CordonResult:
        """As ``cordon``: nothing to release."""
        return self._dry_run(state)

    def approval_evidence(self) -> dict[str, Any]:
        """The run, which the approve function checks before it settles the approval."""
        return {"canary_run": self.run_id}

    def auto_decision(
        self, state: ApprovalRequestInput, settings: Settings, ledger: Ledger
    ) -> AutoDecision | None:
        """No policy: the approve function settles a canary's approval."""
        return None

    def ask_for_decision(self, pending: PendingApproval, settings: Settings) -> None:
        """No person is asked and nobody is paged: the approve function settles it, so it
        stays the only sender of task results."""
        ask_approve(settings, pending.approval_id)

    def recorded(self, transition: str, error: str | None, settings: Settings) -> None:
        """A step of the run, its close (with ``canary_completed``, the canary alarm's metric),
        or its failure."""
        if transition == FAILED:
            self.reach(settings, FAILED, error=error or FAILED)
            return
        step = TRANSITION_STEPS.get(transition)
        if step is not None:
            self.reach(settings, step)
        if transition == "replaced":
            self.reach(settings, "closed")
            cloudwatch.put_metric_data(
                contract.POWERTOOLS_METRICS_NAMESPACE,
                [
                    {
                        "MetricName": contract.CANARY_COMPLETED_METRIC,
                        "Dimensions": [
                            {
                                "Name": contract.CLUSTER_DIMENSION,
                                "Value": settings.hyperpod_cluster_name,
                            }
                        ],
                        "Value": 1.0,
                        "Unit": "Count",
                    }
                ],
            )
            logger.info("canary completed", extra={"run": self.run_id})


__all__ = ["CanaryNode"]
