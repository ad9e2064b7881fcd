"""The record step: ledger entry, metric, notification, and closing the remediation.

Recording is the workflow's last resort (every Catch ends here), so it must not fail on the
state it is given: ``parse_record_input`` keeps whatever part of a damaged state still parses
(an approval without ``approver``, a step result missing keys) and records the damage as the
error, and closing is keyed by what the execution itself knows (its id and the Map item index,
with the node's instance id), never only by a step's output that may be missing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeGuard, get_args

from aws_lambda_powertools.metrics import EphemeralMetrics, MetricUnit
from pydantic import ValidationError

from sdc_contract.metrics import (
    CLUSTER_DIMENSION,
    JOB_DIMENSION,
    OUTCOME_DIMENSIONS,
    POWERTOOLS_METRICS_NAMESPACE,
)

from .. import text
from ..clients import sns
from ..config import Settings
from ..dal import keys, shadow_guard
from ..dal.events import encode_detail
from ..dal.ledger import Ledger
from ..errors import InvalidStepInput
from ..models import RecordInput, RecordResult, RecordState, StepError, Transition, parse_step
from ..observability import logger, metrics
from ..targets import target_for
from . import decision, notify, outcomes, shadow

# Every terminal transition of an admitted remediation closes it: the node is free for a new
# admission and its place in flight is given back. Whether the node keeps counting against the
# guard afterwards (it stays cordoned) is ``dal.holds.RELEASING_TRANSITIONS``: only released,
# replaced and replaced_by_hyperpod end its hold; the others wait for `sdc-remediation release`.
CLOSING_TRANSITIONS = {
    "released",
    "replaced",
    "replaced_by_hyperpod",
    "rejected",
    "approval_timed_out",
    "failed",
    "abandoned",
}
# Transitions about an alarm that was NOT admitted: recorded in the node's history, but they must
# not overwrite the status of the remediation that is open on the node.
NOT_ADMITTED = {"duplicate", "circuit_open"}
# Transitions about the alarm rather than one admitted remediation, notified once per alarm
# episode: every item of a storm records its own `circuit_open`, and an alarm that flaps starts
# an execution every minute, each of which would otherwise send its own message. An episode is
# one alarm contributor (the alarm and its job) until it was quiet for EPISODE_QUIET_SECONDS.
ONCE_PER_EPISODE = {"circuit_open", "refused", "ambiguous", "no_suspects"}
EPISODE_QUIET_SECONDS = 3600


# Outcomes counted per check x verdict for the dashboard's table (CloudWatch dashboards cannot
# query DynamoDB; `sdc-remediation stats` computes the precision from the ledger itself).
OUTCOME_METRICS = (
    "cordoned",
    "shadow",
    "health_check_failed",
    "replaced",
    "replaced_by_hyperpod",
    "rejected",
    "released",
    "approval_timed_out",
    "failed",
)

SCREEN_AGREEMENT_TRANSITION = "awaiting_approval"
"""The transition the record step counts the screen's agreement at: recorded once per
remediation, right after the Screen step, before anyone decides."""
SCREEN_AGREEMENT_METRICS: dict[outcomes.ScreenAgreement, str] = {
    "agreed": "screen_agreed",
    "disagreed": "screen_disagreed",
    "no_evidence": "screen_no_evidence",
}
"""Whether the node screen agreed with the job's finding, counted as outcome metrics (the same
dimensions, ``OUTCOME_DIMENSIONS``: the dashboard's table shows them beside the outcomes; no
alarm reads them)."""


def screen_status(st: RecordState) -> str | None:
    """The screen's outcome in the state (None: no screen, or one still running)."""
    return st.screen.status if st.screen is not None and st.screen.done else None


def outcome_metric(cluster: str, check: str, verdict: str, transition: str) -> None:
    """One EMF metric named after the transition, by cluster, check and verdict (its own
    dimension set, beside the per-cluster transition count; ``OUTCOME_DIMENSIONS``, which
    infra/constructs/dashboard.py searches). The suspect's verdict is one of the contract's, so
    the dimension never takes free text.

    An ephemeral Metrics object flushed at once, not Powertools' ``single_metric``: that prints
    its EMF line even under POWERTOOLS_METRICS_DISABLED, which the local chain sets so that no
    EMF blob interleaves with the demo's timeline."""
    metric = EphemeralMetrics(namespace=POWERTOOLS_METRICS_NAMESPACE)
    for name, value in zip(OUTCOME_DIMENSIONS, (cluster, check, verdict), strict=True):
        metric.add_dimension(name=name, value=value)
    metric.add_metric(name=transition, unit=MetricUnit.Count, value=1)
    metric.flush_metrics()


def _is_transition(value: object) -> TypeGuard[Transition]:
    """Whether ``value`` is one of the contract's transitions."""
    return value in get_args(Transition)


@dataclass(frozen=True)
class NodeKey:
    """The node a damaged state still names (its suspect did not parse)."""

    instance_id: str
    node_name: str | None


def parse_record_input(event: Any) -> tuple[RecordInput, NodeKey | None]:
    """Parse record's input; a damaged state is salvaged, never refused.

    Returns the input (on damage: the parts that parse, and the parse problem added to the
    error) and, when the suspect itself did not parse, the node it names from the raw state. An
    unknown transition is still ``InvalidStepInput``: that is a wiring error of the definition,
    which the workflow's Catch then records as ``failed``.
    """
    try:
        return parse_step(event, RecordInput), None
    except InvalidStepInput as exc:
        problem = str(exc)
    raw: dict[str, Any] = event if isinstance(event, dict) else {}
    raw_state_value = raw.get("state")
    raw_state: dict[str, Any] = raw_state_value if isinstance(raw_state_value, dict) else {}
    state: dict[str, Any] = {}
    for name in RecordState.model_fields:
        if name not in raw_state:
            continue
        try:
            RecordState.model_validate({name: raw_state[name]})
        except ValidationError:
            continue
        state[name] = raw_state[name]
    transition = raw.get("transition")
    if not _is_transition(transition):
        raise InvalidStepInput(f"RecordInput: unknown transition {transition!r}")
    error_value = raw.get("error")
    error: dict[str, Any] = error_value if isinstance(error_value, dict) else {}
    step_error = StepError.model_validate(
        {
            "Error": str(error.get("Error") or "InvalidStepInput"),
            "Cause": f"{error.get('Cause') or ''} [record salvaged a damaged state: {problem}]",
        }
    )
    inp = RecordInput(
        transition=transition,
        notify=bool(raw.get("notify", True)),
        state=RecordState.model_validate(state),
        error=step_error,
        execution=str(raw.get("execution") or ""),
    )
    node = None
    suspect = raw_state.get("suspect")
    if inp.state.suspect is None and isinstance(suspect, dict):
        instance_id = suspect.get("instance_id")
        if isinstance(instance_id, str) and instance_id:
            node_name = suspect.get("node_name")
            node = NodeKey(instance_id, node_name if isinstance(node_name, str) else None)
    logger.warning("record input salvaged", extra={"problem": problem})
    return inp, node


def episode_of(state: RecordState, execution: str) -> str:
    """The alarm episode a cluster-level transition belongs to: the alarm and its contributor's
    job (from localize's alarm, else the raw event); the execution when neither is known."""
    if state.alarm is not None:
        return f"{state.alarm.alarm_name}#{state.alarm.job or '-'}"
    if state.detail is not None and state.detail.alarm_name:
        contributor = state.detail.alarm_contributor
        job = contributor.attributes.get(JOB_DIMENSION, "-") if contributor else "-"
        return f"{state.detail.alarm_name}#{text.printable(job, 80, ascii_only=True)}"
    return execution or "unknown"


def notice_episode(inp: RecordInput, execution: str, node: NodeKey | None) -> str | None:
    """The episode under which this transition is notified once, or None: notified every time.

    Cluster-level transitions (``ONCE_PER_EPISODE``, a failure before any node) are one message
    per alarm contributor. A node's ``failed`` is one message per report, node and error: a
    failed remediation gives its report back (nothing was decided), so while the failure lasts
    (RBAC denied, the API down) every execution of a flapping alarm admits the same report again
    and fails the same way; the on-call hears it once, and the ledger keeps every one."""
    st = inp.state
    if inp.transition in ONCE_PER_EPISODE or (
        inp.transition == "failed" and st.suspect is None and node is None
    ):
        return episode_of(st, execution)
    if inp.transition == "failed" and st.suspect is not None and st.suspect.report_time:
        error = inp.error.error if inp.error else "-"
        return f"{st.suspect.instance_id}#{st.suspect.report_key}#{error}"
    return None


def record(inp: RecordInput, settings: Settings, node: NodeKey | None = None) -> RecordResult:
    """Record a transition: ledger event, metric, and a notification when asked.

    A terminal transition (``CLOSING_TRANSITIONS``) closes this execution's own remediation of
    the node (admitted by this execution and Map item: a ``duplicate`` closes nothing), which
    frees the node for a new admission and its place in flight.
    """
    st = inp.state
    target = target_for(st.suspect)
    settings = target.settings(settings)
    cluster = st.alarm.cluster_name if st.alarm else settings.hyperpod_cluster_name
    execution = st.execution or inp.execution
    instance_id = st.suspect.instance_id if st.suspect else (node.instance_id if node else None)
    unverified_approval = None
    if st.approval is not None:
        # The approver (and decision) recorded are the approvals table's, never the message's:
        # whoever holds the task token may send any name (issue 32).
        recorded = decision.recorded_decision(
            settings, st.approval, instance_id=instance_id, execution=execution
        )
        unverified_approval = recorded.unverified
        st = st.model_copy(update={"approval": recorded.decision})
        inp = inp.model_copy(update={"state": st})
        if unverified_approval:
            logger.warning("approval not as the table holds it", extra={"why": unverified_approval})
    node_name = st.suspect.node_name if st.suspect else (node.node_name if node else None)
    remediation_id = (
        st.admission.remediation_id if st.admission else None
    ) or f"x-{execution or 'unknown'}"
    pk = instance_id or keys.cluster_pk(cluster)
    detail = {
        key: getattr(st, key).model_dump(by_alias=True)
        for key in ("admission", "cordon", "health", "screen", "replacement", "uncordon")
        if getattr(st, key) is not None
    }
    if unverified_approval:
        detail["unverified_approval"] = unverified_approval
    if st.suspects:
        detail["suspects"] = [s.node_name for s in st.suspects]
    if st.refused:
        detail["refused"] = [r.model_dump(exclude_none=True) for r in st.refused]
        detail["refused_count"] = max(st.refused_count, len(st.refused))
    resume = notify.resume_summary(st.suspect) if st.suspect else None
    attrs = {
        "cluster": cluster,
        "node_name": node_name,
        "execution": execution or None,
        "alarm": st.alarm.alarm_name if st.alarm else None,
        # The precision ledger (`sdc-remediation stats`): which check and verdict raised the
        # remediation, on every event of it, and a person's decision.
        "check": st.suspect.check if st.suspect else None,
        "verdict": st.suspect.verdict if st.suspect else None,
        "job": st.suspect.job if st.suspect else None,
        # The report's identity: the precision ledger counts a report once (recurrences come
        # from other reports only).
        "report": st.suspect.report_key if st.suspect and st.suspect.report_time else None,
        "decision": st.approval.decision if st.approval else None,
        "approver": st.approval.approver if st.approval else None,
        "reason": st.approval.reason if st.approval else None,
        "error": f"{inp.error.error}: {inp.error.cause[:1000]}" if inp.error else None,
        "dry_run": settings.dry_run,
        # The agent's resume rule for this alarm (`sdc-remediation history` states it).
        "resume": resume["sentence"] if resume else None,
        "resume_step": resume["max_step"] if resume else None,
        # The node screen's outcome, once there is one (`sdc-remediation history` shows it).
        "screen": st.screen.line() if st.screen is not None and st.screen.done else None,
        # ... and its status: whether the screen agreed with the job (the precision ledger).
        "screen_status": screen_status(st),
        "detail": encode_detail(detail),
    }
    # Only this execution's own remediation may change the node's STATE: a `duplicate`
    # admission carries the id of the OTHER, still running remediation, whose status and open
    # flag a failure of this execution must leave alone.
    own = st.admission is None or st.admission.decision == "admitted"
    ledger = Ledger(settings.ledger_table)
    closed = None
    if inp.transition in CLOSING_TRANSITIONS and instance_id and own:
        # Dry run cordons nothing, so nothing stays out of service after it.
        release_hold = True if settings.dry_run else None
        closed = ledger.close_execution(
            cluster, instance_id, execution, st.item, inp.transition, release_hold=release_hold
        )
        rid = st.admission.remediation_id if st.admission else None
        # A STATE written before the execution id was kept on the node: the admission's id.
        if (
            closed is None
            and rid
            and ledger.close(cluster, instance_id, rid, inp.transition, release_hold=release_hold)
        ):
            closed = rid
        if closed is not None:
            remediation_id = closed
            if inp.transition == "failed" and st.suspect and st.suspect.report_time:
                # Nothing was decided about the node (a step could not run): its report may
                # raise a remediation again, with the next alarm that reads it.
                ledger.release_report(instance_id, st.suspect.report_key, closed)
    ledger.record(
        pk,
        remediation_id,
        inp.transition,
        attrs,
        update_status=own and inp.transition not in NOT_ADMITTED and closed is None,
    )
    admission = st.admission
    if (
        admission is not None
        and admission.mode == "shadow"
        and admission.shadow_health_check
        and instance_id
        and inp.transition in ("shadow", "failed")
    ):
        # The shadowed alarm's health check is over: its slot of the shadow guard is free.
        shadow_guard.release(ledger.table, cluster, instance_id, execution, st.item)
    if target.counts_on_dashboard:
        # Dimensions only from fixed values: the deployment's cluster (never the state's),
        # the contract's check and verdict names (a verdict outside the list reads `unknown`).
        metrics.add_dimension(name=CLUSTER_DIMENSION, value=settings.hyperpod_cluster_name)
        metrics.add_metric(name=inp.transition, unit="Count", value=1)
        if st.suspect is not None and inp.transition in OUTCOME_METRICS:
            outcome_metric(
                settings.hyperpod_cluster_name,
                st.suspect.check,
                st.suspect.verdict,
                inp.transition,
            )
        if st.suspect is not None and inp.transition == SCREEN_AGREEMENT_TRANSITION:
            # Once per remediation, when the screen is over: whether it agreed with the job.
            outcome_metric(
                settings.hyperpod_cluster_name,
                st.suspect.check,
                st.suspect.verdict,
                SCREEN_AGREEMENT_METRICS[outcomes.screen_agreement(screen_status(st))],
            )
    if st.suspect is not None:
        error = f"{inp.error.error}: {inp.error.cause[:500]}" if inp.error else None
        target.recorded(inp.transition, error, settings)
    episode = notice_episode(inp, execution, node)
    notify_now = (
        target.pages
        and inp.notify
        and (
            episode is None
            or ledger.first_in_episode(cluster, episode, inp.transition, EPISODE_QUIET_SECONDS)
        )
    )
    if notify_now:
        if inp.transition == "shadow":
            subject, body = shadow.message(inp, cluster, dry_run=settings.dry_run)
        elif inp.transition == "refused":
            subject, body = notify.refused_message(inp, cluster, dry_run=settings.dry_run)
        else:
            subject, body = notify.transition_message(inp, cluster, dry_run=settings.dry_run)
        if node is not None:
            subject = subject.replace(f"cluster {cluster}", node.node_name or node.instance_id)
        sns.publish(settings.topic_arn, subject, body)
    logger.info(
        "recorded", extra={"transition": inp.transition, "pk": pk, "remediation_id": remediation_id}
    )
    return RecordResult(recorded=True)
