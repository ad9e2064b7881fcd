"""The functions' entry points as functions of typed input: what each thin handler calls.

One function per workflow step, and every handler calls one of them; each takes the parsed
input (record: the raw one, which it salvages) and the settings and returns the step's output
model. The three services are here too, each handing over to its own logic module: the
sweeper (``sweep``), the canary (``canary_start``, ``canary_check``) and the approve
function's URL (``approve``). A per-node step resolves its node target once
(``targets.target_for``: a HyperPod node, or the live canary's reserved node) and leaves to it
what differs. Kubernetes access is passed as a factory so steps that may not need it (localize
without pods to resolve, replace in api mode) never connect.
"""

from __future__ import annotations

from typing import Any

from ..clients import hyperpod
from ..clients.kube import KubeApi
from ..config import Settings
from ..dal.approvals import Approvals
from ..dal.ledger import Ledger
from ..errors import InvalidStepInput
from ..models import (
    Admission,
    AlarmStateChangeEvent,
    ApprovalRequestInput,
    CordonResult,
    HealthResult,
    ItemState,
    LateInput,
    LocalizeResult,
    PollInput,
    RecordResult,
    ReplaceResult,
    ScreenResult,
    Suspect,
)
from ..models.canary import Run
from ..observability import logger
from ..targets import KubeFactory, target_for
from . import canary, decision, health, notify, operator_api, recording, sweeper
from . import localize as localize_mod
from . import replace as replace_mod
from . import screen as screen_mod
from .admission import AdmitRequest
from .approval import PendingApproval
from .canary.watch import Stop
from .sweeper import SweepResult


def kube_factory(settings: Settings) -> KubeFactory:
    """A factory that connects on first call (token, endpoint and CA resolved then)."""
    return lambda: KubeApi.from_settings(settings)


def localize(event: AlarmStateChangeEvent, settings: Settings, kube: KubeFactory) -> LocalizeResult:
    """Localize step."""
    return localize_mod.localize(event, settings, kube)


def localize_late(state: LateInput, settings: Settings, kube: KubeFactory) -> Suspect:
    """LocalizeLate step (a pending node's Map item): its suspect once its report is visible."""
    return localize_mod.localize_late(state, settings, kube)


def admit(state: ItemState, settings: Settings) -> Admission:
    """Admit step: one open remediation per node, under the blast-radius guard."""
    cluster = settings.hyperpod_cluster_name
    request = AdmitRequest(
        cluster=cluster,
        instance_id=state.suspect.instance_id,
        node_name=state.suspect.node_name,
        execution=state.execution,
        cluster_nodes=hyperpod.cluster_size(cluster),
        max_nodes_per_hour=settings.max_nodes_per_hour,
        max_fraction=settings.max_fraction,
        suspects_in_alarm=state.suspects_in_alarm,
        item=state.item,
        report=state.suspect.report_key if state.suspect.report_time else None,
    )
    return target_for(state.suspect).admit(state, request, settings)


def cordon(state: ItemState, settings: Settings, kube: KubeFactory) -> CordonResult:
    """Cordon step."""
    return target_for(state.suspect).cordon(state, settings, kube)


def uncordon(state: ItemState, settings: Settings, kube: KubeFactory) -> CordonResult:
    """Uncordon step (only after a rejection that asked for release)."""
    if state.approval is None or state.approval.decision != "reject" or not state.approval.release:
        raise InvalidStepInput("uncordon needs $.approval with decision 'reject' and release true")
    decision.verify(settings, state, state.approval)
    return target_for(state.suspect).uncordon(state, state.approval.approver, settings, kube)


def start_health_check(state: ItemState, settings: Settings, kube: KubeFactory) -> HealthResult:
    """StartHealthCheck step (Kubernetes only for a shadowed node, which cordon did not read)."""
    settings = target_for(state.suspect).settings(settings)
    shadowed = state.admission is not None and state.admission.mode == "shadow"
    return health.start(settings, state.suspect, state.cordon, kube if shadowed else None)


def poll_health_check(state: PollInput, settings: Settings, kube: KubeFactory) -> HealthResult:
    """PollHealthCheck step."""
    return health.poll(target_for(state.suspect).settings(settings), state, kube)


def screen(state: ItemState, settings: Settings, kube: KubeFactory) -> ScreenResult:
    """Screen step: the node screen as a Kubernetes Job on the cordoned node, started on the
    first call and polled on the next ones (a canary's reserved node: a dry run, no Job)."""
    return screen_mod.screen(state, target_for(state.suspect).settings(settings), kube)


def request_approval(state: ApprovalRequestInput, settings: Settings) -> str:
    """RequestApproval step: store the token under an approval id with the evidence, then have
    it decided (a person, the auto-approval policy, or for the canary the approve function);
    returns the approval id."""
    target = target_for(state.suspect)
    ledger = Ledger(settings.ledger_table)
    remediation_id = state.admission.remediation_id if state.admission else None
    history = [
        h
        for h in ledger.offender_history(state.suspect.instance_id)
        if not state.admission or h["remediation_id"] != remediation_id
    ]
    evidence = notify.evidence(state, history) | target.approval_evidence()
    auto = target.auto_decision(state, settings, ledger)
    if auto is not None:
        evidence["auto_approval"] = {"approve": auto.approve, "reason": auto.reason}
    approvals = Approvals(settings.approvals_table)
    approval_id, announce = approvals.create(
        task_token=state.task_token,
        remediation_id=remediation_id,
        instance_id=state.suspect.instance_id,
        node_name=state.suspect.node_name,
        evidence=evidence,
        ttl_seconds=settings.approval_ttl_seconds,
        execution=state.execution,
        timeout_seconds=settings.approval_timeout_seconds,
    )
    pending = PendingApproval(approvals, approval_id, evidence, auto, announce)
    target.ask_for_decision(pending, settings)
    logger.info(
        "approval requested", extra={"approval_id": approval_id, "node": state.suspect.node_name}
    )
    return approval_id


def replace(state: ItemState, settings: Settings, kube: KubeFactory) -> ReplaceResult:
    """Replace step (api mode never connects to Kubernetes)."""
    settings = target_for(state.suspect).settings(settings)
    needs_kube = settings.replace_mode == "label" and not settings.dry_run
    return replace_mod.replace(settings, state, kube() if needs_kube else None)


def record(event: object, settings: Settings) -> RecordResult:
    """Record step: the raw input parsed by salvage, never refused (``recording.
    parse_record_input``: this is where every failure ends), then ``recording.record``: ledger
    entry, metric, notification when asked; a terminal transition closes this execution's own
    remediation of the node."""
    inp, node = recording.parse_record_input(event)
    return recording.record(inp, settings, node)


# -- the services -----------------------------------------------------------------------------


def sweep(settings: Settings) -> SweepResult:
    """The sweeper (scheduled): close remediations whose execution is no longer running."""
    return sweeper.sweep(settings)


def canary_start(settings: Settings) -> Run:
    """The canary's schedule: start a run (``canary.start_run``)."""
    return canary.start_run(settings)


def canary_check(settings: Settings) -> Stop:
    """The canary alarm's action: where the newest run stopped (``canary.check``)."""
    return canary.check(settings)


def approve(event: dict[str, Any], settings: Settings) -> dict[str, Any]:
    """The approve function: a function URL request (payload format 2.0) -> its HTTP response
    (``operator_api.handle``, which answers every domain error itself)."""
    return operator_api.handle(event, settings, kube_factory(settings))


__all__ = [
    "admit",
    "approve",
    "canary_check",
    "canary_start",
    "cordon",
    "kube_factory",
    "localize",
    "localize_late",
    "poll_health_check",
    "record",
    "replace",
    "request_approval",
    "screen",
    "start_health_check",
    "sweep",
    "uncordon",
]
