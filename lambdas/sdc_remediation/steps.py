"""The workflow steps as functions of typed input: what each thin handler calls.

One function per step; each takes the parsed input and the settings and returns the step's
output model. Kubernetes access is passed as a factory so steps that may not need it (localize
without pods to resolve, replace in api mode) never connect.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import approvals as approvals_mod
from . import autoapprove, aws, canary, health, notify, outcomes, recording, shadow
from . import cordon as cordon_mod
from . import localize as localize_mod
from . import replace as replace_mod
from . import stats as precision_mod
from .config import Settings
from .errors import ApprovalAlreadyDecided, InvalidStepInput
from .kube import KubeApi
from .ledger import AdmitRequest, Ledger
from .models import (
    Admission,
    AlarmStateChangeEvent,
    ApprovalRequestInput,
    CordonResult,
    HealthResult,
    ItemState,
    LocalizeResult,
    PollInput,
    RecordInput,
    RecordResult,
    ReplaceResult,
)
from .observability import logger
from .recording import CLOSING_TRANSITIONS, NOT_ADMITTED

KubeFactory = Callable[[], KubeApi]


def kube_factory(settings: Settings) -> KubeFactory:
    """A factory that connects on first call (token, endpoint and CA resolved then)."""
    return lambda: KubeApi.from_settings(settings)


def localize(event: AlarmStateChangeEvent, settings: Settings, kube: KubeFactory) -> LocalizeResult:
    """Localize step."""
    return localize_mod.localize(event, settings, kube)


def cluster_size(cluster: str) -> int:
    """How many nodes the HyperPod cluster has (the base of MAX_FRACTION)."""
    sm = aws.client("sagemaker")
    count = 0
    with aws.aws_errors("sagemaker:ListClusterNodes"):
        for page in sm.get_paginator("list_cluster_nodes").paginate(ClusterName=cluster):
            count += len(page.get("ClusterNodeSummaries", []))
    return count


def admit(state: ItemState, settings: Settings) -> Admission:
    """Admit step: one open remediation per node, under the blast-radius guard."""
    cluster = settings.hyperpod_cluster_name
    request = AdmitRequest(
        cluster=cluster,
        instance_id=state.suspect.instance_id,
        node_name=state.suspect.node_name,
        execution=state.execution,
        cluster_nodes=cluster_size(cluster),
        max_nodes_per_hour=settings.max_nodes_per_hour,
        max_fraction=settings.max_fraction,
        suspects_in_alarm=state.suspects_in_alarm,
        item=state.item,
    )
    if canary.is_canary(state.suspect):
        # Before the modes: a canary walks the enforce path (in dry run) whatever they say.
        return canary.admit(Ledger(settings.ledger_table), request, state.suspect, settings)
    if settings.mode_for(state.suspect.check, state.suspect.verdict) == "shadow":
        return shadow.admit(Ledger(settings.ledger_table), request)
    decision = Ledger(settings.ledger_table).admit(request)
    logger.info("admission", extra={"decision": decision.decision, "reason": decision.reason})
    return Admission(
        decision=decision.decision, remediation_id=decision.remediation_id, reason=decision.reason
    )  # type: ignore[arg-type]


def for_suspect(settings: Settings, state: ItemState) -> Settings:
    """The settings a step runs under for this suspect: a canary's are always dry run."""
    return settings.dry_run_only() if canary.is_canary(state.suspect) else settings


def cordon(state: ItemState, settings: Settings, kube: KubeFactory) -> CordonResult:
    """Cordon step (a canary's reserved node is no Kubernetes node: nothing is read or sent)."""
    if canary.is_canary(state.suspect):
        return canary.cordon_result(state.suspect)
    return cordon_mod.cordon(kube(), state.alarm, state.suspect, settings.dry_run)


def uncordon(state: ItemState, settings: Settings, kube: KubeFactory) -> CordonResult:
    """Uncordon step (only after a rejection that asked for release)."""
    if state.approval is None or state.approval.decision != "reject" or not state.approval.release:
        raise InvalidStepInput("uncordon needs $.approval with decision 'reject' and release true")
    if canary.is_canary(state.suspect):
        return canary.cordon_result(state.suspect)
    return cordon_mod.uncordon(kube(), state.suspect, state.approval.approver, settings.dry_run)


def start_health_check(state: ItemState, settings: Settings) -> HealthResult:
    """StartHealthCheck step."""
    return health.start(for_suspect(settings, state), state.suspect, state.cordon)


def poll_health_check(state: PollInput, settings: Settings, kube: KubeFactory) -> HealthResult:
    """PollHealthCheck step."""
    return health.poll(for_suspect(settings, state), state, kube)


def request_approval(state: ApprovalRequestInput, settings: Settings) -> str:
    """RequestApproval step: store the token, publish the evidence; returns the approval id."""
    ledger = Ledger(settings.ledger_table)
    history = [
        h
        for h in ledger.offender_history(state.suspect.instance_id)
        if not state.admission or h["remediation_id"] != state.admission.remediation_id
    ]
    ev = notify.evidence(state, history)
    is_canary = canary.is_canary(state.suspect)
    if is_canary:
        # No person is asked and nobody is paged: the approve function settles the canary's
        # approval (below), so it stays the only sender of task results.
        ev["canary_run"] = state.suspect.canary_run
        auto: autoapprove.AutoDecision | None = None
    else:
        auto = auto_decision(state, settings, ledger)
    if auto is not None:
        ev["auto_approval"] = {"approve": auto.approve, "reason": auto.reason}
    approvals = approvals_mod.Approvals(settings.approvals_table)
    approval_id, announce = approvals.create(
        task_token=state.task_token,
        remediation_id=state.admission.remediation_id if state.admission else None,
        instance_id=state.suspect.instance_id,
        node_name=state.suspect.node_name,
        evidence=ev,
        ttl_seconds=settings.approval_ttl_seconds,
        execution=state.execution,
        timeout_seconds=settings.approval_timeout_seconds,
    )
    if is_canary:
        canary.ask_approve(settings, approval_id)
        return approval_id
    if auto is not None and auto.approve:
        _auto_approve(approvals, approval_id, auto, ev, settings, announce=announce)
        return approval_id
    if announce:
        prefix = (
            f"sdc-remediation --approval-url {settings.approval_url}"
            if settings.approval_url
            else f"sdc-remediation --approvals-table {settings.approvals_table}"
        )
        subject, body = notify.approval_message(approval_id, ev, prefix, dry_run=settings.dry_run)
        notify.publish(settings.topic_arn, subject, body)
        approvals.mark_notified(approval_id)
    logger.info(
        "approval requested", extra={"approval_id": approval_id, "node": state.suspect.node_name}
    )
    return approval_id


def auto_decision(
    state: ApprovalRequestInput, settings: Settings, ledger: Ledger
) -> autoapprove.AutoDecision | None:
    """The auto-approval policy's answer for this request (None: no policy configured).

    The precision rule reads the whole ledger (the table is small) the way ``stats`` does.
    """
    policy = settings.auto_approve
    if not policy.enabled:
        return None
    check, verdict = state.suspect.check, state.suspect.verdict
    precision = None
    if policy.min_precision is not None:
        every = outcomes.mark_recurrences(outcomes.summarise(ledger.all_events()))
        row = precision_mod.check_stats(check, verdict, every)
        precision = autoapprove.Precision(row.right, row.wrong, row.low, row.high)
    decision = autoapprove.evaluate(
        policy,
        check=check,
        verdict=verdict,
        health_status=state.health.status if state.health else None,
        precision=precision,
    )
    logger.info(
        "auto-approval policy", extra={"approve": decision.approve, "reason": decision.reason}
    )
    return decision


def _auto_approve(
    approvals: approvals_mod.Approvals,
    approval_id: str,
    auto: autoapprove.AutoDecision,
    ev: dict[str, Any],
    settings: Settings,
    *,
    announce: bool,
) -> None:
    """Resume the workflow with the policy's approval (recorded as the approver) and tell the
    on-call that no person decided. A retried step re-sends or finds it already decided."""
    try:
        approvals.decide(approval_id, "approve", reason=auto.reason, approver=auto.approver)
    except ApprovalAlreadyDecided:
        logger.info("auto-approval already sent", extra={"approval_id": approval_id})
    if not announce:
        return
    subject = (
        f"{notify.subject_prefix(settings.dry_run)} auto-approved replacing {ev['node_name']} "
        f"({ev['check']}, {ev['verdict']})"
    )
    body = "\n".join(
        [
            f"sdc-guard's auto-approval policy approved replacing {ev['node_name']} "
            f"({ev['instance_id']}) in cluster {ev['cluster']}; no person decided.",
            "",
            f"Approver recorded: {auto.approver}",
            f"Why: {auto.reason}",
            f"Health check: {(ev.get('health_check') or {}).get('status', 'not run')}",
            f"Job: {ev['job']}, check {ev['check']} at step {ev['step']}, verdict {ev['verdict']}",
            f"Resume rule: {(ev.get('resume') or {}).get('sentence', '-')}",
            f"Approval id: {approval_id} (the blast-radius guard admitted this node first)",
        ]
    )
    notify.publish(settings.topic_arn, subject[:100], body)
    approvals.mark_notified(approval_id)


def replace(state: ItemState, settings: Settings, kube: KubeFactory) -> ReplaceResult:
    """Replace step (api mode never connects to Kubernetes)."""
    settings = for_suspect(settings, state)
    needs_kube = settings.replace_mode == "label" and not settings.dry_run
    return replace_mod.replace(settings, state, kube() if needs_kube else None)


def record(inp: RecordInput, settings: Settings) -> RecordResult:
    """Record step (``recording.record``): ledger entry, metric, notification when asked; a
    terminal transition closes this execution's own remediation of the node."""
    return recording.record(inp, settings)


__all__ = [
    "CLOSING_TRANSITIONS",
    "NOT_ADMITTED",
    "admit",
    "cordon",
    "kube_factory",
    "localize",
    "poll_health_check",
    "record",
    "replace",
    "request_approval",
    "start_health_check",
    "uncordon",
]
