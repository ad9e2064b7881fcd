"""What the per-node steps act on: a HyperPod node, or the live canary's reserved node.

A step resolves the target once from the suspect (``target_for``) and asks it for what differs;
no step branches on the canary. ``HyperPodNode`` is the real thing (Kubernetes, HyperPod, the
ledger's guard, a person's approval); ``CanaryNode`` is the reserved node of a canary run
(``logic/canary``): nothing is claimed or touched, every step runs in dry run, the approve
function settles its approval, and each step is written on the run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from ..clients.kube import KubeApi
from ..config import Settings
from ..dal.ledger import Ledger
from ..logic.admission import AdmitRequest
from ..logic.approval import PendingApproval
from ..logic.autoapprove import AutoDecision
from ..models import Admission, ApprovalRequestInput, CordonResult, ItemState, Suspect
from .canary import CanaryNode
from .hyperpod import HYPERPOD, HyperPodNode

KubeFactory = Callable[[], KubeApi]


class NodeTarget(Protocol):
    """What differs between acting on a HyperPod node and on the canary's reserved node."""

    pages: bool
    """Whether the record step notifies people about it."""
    counts_on_dashboard: bool
    """Whether the record step counts its transitions in the dashboard's metrics."""

    def settings(self, settings: Settings) -> Settings:
        """The settings a step runs under for this node (a canary's: always dry run)."""
        ...

    def localized(self, settings: Settings) -> None:
        """Localize named this node (the canary writes the alarm and the execution on its run)."""
        ...

    def admit(self, state: ItemState, request: AdmitRequest, settings: Settings) -> Admission:
        """Admit a remediation of this node (or shadow it, or walk a canary through)."""
        ...

    def cordon(self, state: ItemState, settings: Settings, kube: KubeFactory) -> CordonResult:
        """Cordon the node."""
        ...

    def uncordon(
        self, state: ItemState, approver: str, settings: Settings, kube: KubeFactory
    ) -> CordonResult:
        """Release the node after ``approver`` rejected and asked for it."""
        ...

    def approval_evidence(self) -> dict[str, Any]:
        """What the approval's evidence carries besides the suspect's."""
        ...

    def auto_decision(
        self, state: ApprovalRequestInput, settings: Settings, ledger: Ledger
    ) -> AutoDecision | None:
        """The auto-approval policy's answer (None: nothing to apply)."""
        ...

    def ask_for_decision(self, pending: PendingApproval, settings: Settings) -> None:
        """Have the stored approval decided: by a person, the policy, or the approve function."""
        ...

    def recorded(self, transition: str, error: str | None, settings: Settings) -> None:
        """The record step recorded ``transition`` about this node."""
        ...


def target_for(suspect: Suspect | None) -> NodeTarget:
    """The target a suspect names: the canary's reserved node when it carries a canary run
    (``models.Suspect`` allows that for the reserved node only), else a HyperPod node (also
    for a state that names no node, as the record step gets at the cluster level)."""
    if suspect is not None and suspect.canary_run is not None:
        return CanaryNode(suspect.canary_run)
    return HYPERPOD


__all__ = ["CanaryNode", "HyperPodNode", "KubeFactory", "NodeTarget", "target_for"]
