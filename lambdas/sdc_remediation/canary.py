"""The live canary: a synthetic SDC event that walks the deployed chain and closes itself.

A schedule invokes the canary function (``start_run``): it records a run in the ledger, writes an
``sdc.alarm/v1`` report for the reserved canary job and node (``contract.CANARY_*``) into the
agent's report log group, and puts the canary's datum on its own SDC series. From there the real
path runs: the canary's alarm fires, the EventBridge rule starts the workflow, localize accepts
the report (only for the reserved node, only for a run the ledger holds), admit reads the guard
without claiming a slot, and cordon, the deep health check, the approval and replace all run in
dry run; request_approval stores the canary's approval as for a person and invokes the approve
function to settle it (no person: ``ask_approve`` / ``settle_approval``), so the approve function
stays the only one that sends task results and the canary proves it works; the record step
closes the run and puts ``canary_completed``. Each step it passes is written on the run (``RunStore.reach``).

The canary alarm fires when no ``canary_completed`` arrived in its window. It notifies the topic
and invokes the canary function again (``check``), which reads the newest run, observes what the
run cannot record itself (did the canary alarm fire? did the rule start an execution?), and
publishes which step the canary stopped at.

Safety: the reserved instance id is never a node of the cluster; localize refuses a canary report
naming any other node and a training report naming the canary's; a suspect carries ``canary_run``
only for the reserved node (``models.Suspect``); every step runs a canary under DRY_RUN. Pods can
write reports but not the ledger, so a pod cannot pass a report off as a canary run.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from . import aws, clock, contract, notify
from .admission import AdmitRequest
from .approvals import Approvals
from .config import Settings
from .dynamo import from_item, to_item
from .errors import ApprovalAlreadyDecided, ConfigurationError, RemediationError, UntrustedReport
from .ledger import Ledger
from .models import ALARM_SCHEMA, Admission, ApprovalDecision, CordonResult, Report, Suspect
from .observability import logger

STEPS: tuple[tuple[str, str], ...] = (
    ("scheduled", "the schedule started a canary run (the canary function recorded it)"),
    ("published", "the canary report and metric datum were written"),
    ("alarm", "the canary's SDC alarm went to ALARM (written by localize)"),
    ("workflow", "the EventBridge rule started a workflow execution (written by localize)"),
    ("localized", "localize accepted the canary report"),
    ("admitted", "admit read the blast-radius guard (nothing claimed)"),
    ("cordoned", "cordon ran (dry run)"),
    ("health_checked", "the deep health check ran (dry run)"),
    ("approval_requested", "the approval was requested"),
    ("approved", "the approve function settled the canary's approval and resumed the workflow"),
    ("replaced", "replace ran (dry run)"),
    ("closed", "the record step closed the canary and put canary_completed"),
)
"""The canary's steps in order, each with what reaching it proves."""
STEP_NAMES: tuple[str, ...] = tuple(name for name, _ in STEPS)

HINTS: dict[str, str] = {
    "scheduled": "no canary run started since the last one completed: is the schedule enabled, "
    "and does the canary function run (its log group)?",
    "published": "the canary function did not finish writing its report and datum (its logs)",
    "alarm": "the canary's SDC alarm did not fire on the datum (the alarm, its metric)",
    "workflow": "the alarm fired but no workflow execution started: is the EventBridge rule "
    "enabled, and is its dead-letter queue empty?",
    "localized": "the execution started but localize did not accept the canary report "
    "(the execution's history, localize's logs)",
}
"""What to look at when the canary stopped before a step (the others: the execution's history)."""

# Record transitions that mark a canary step.
TRANSITION_STEPS: dict[str, str] = {
    "cordoned": "cordoned",
    "health_check_passed": "health_checked",
    "health_check_failed": "health_checked",
    "health_check_timed_out": "health_checked",
    "awaiting_approval": "approval_requested",
    "approved": "approved",
    "replaced": "replaced",
}

APPROVER = "sdc-guard canary (no person: a synthetic event on the reserved canary node)"
RUN_PREFIX = "RUN#"
SETTLE_ACTION = "settle_canary_approval"
"""The ``action`` of the event request_approval invokes the approve function with (directly, not
through its URL): ``{"action": SETTLE_ACTION, "approval_id": ...}``."""


def run_pk(cluster: str) -> str:
    """Partition key of a cluster's canary runs in the ledger table."""
    return f"CANARY#{cluster}"


def new_run_id(now: datetime) -> str:
    """A run id that sorts by its start time."""
    return f"c-{now.strftime('%Y%m%dT%H%M%SZ')}-{uuid.uuid4().hex[:8]}"


def is_canary(suspect: Suspect | None) -> bool:
    """Whether a suspect is a canary (``models.Suspect`` allows that for the reserved node only)."""
    return suspect is not None and suspect.canary_run is not None


@dataclass
class Run:
    """One canary run as the ledger holds it."""

    run_id: str
    started_at: str
    steps: list[dict[str, str]] = field(default_factory=list)
    completed: bool = False
    error: str | None = None
    stopped_at: str | None = None

    @property
    def reached(self) -> list[str]:
        """The step names the run recorded, in the order they were reached."""
        return [s["step"] for s in self.steps]

    @classmethod
    def from_item(cls, item: dict[str, Any]) -> Run:
        """From its ledger item."""
        return cls(
            run_id=str(item["run_id"]),
            started_at=str(item["started_at"]),
            steps=list(item.get("steps") or []),
            completed=bool(item.get("completed")),
            error=item.get("error"),
            stopped_at=item.get("stopped_at"),
        )


class RunStore:
    """Canary runs in the ledger table: ``pk=CANARY#<cluster>, sk=RUN#<run id>``.

    Apart from the nodes' items (``pk`` an instance id) and so from the precision ledger: the
    canary remediation's own events are under the reserved instance id, which ``outcomes``
    leaves out.
    """

    def __init__(self, table: str, cluster: str) -> None:
        self.table = table
        self.cluster = cluster

    @property
    def _ddb(self) -> Any:
        return aws.client("dynamodb")

    def _key(self, run_id: str) -> dict[str, Any]:
        return to_item({"pk": run_pk(self.cluster), "sk": RUN_PREFIX + run_id})

    def start(self, run_id: str, at: datetime) -> Run:
        """Record a new run (its first step, ``scheduled``)."""
        stamp = clock.iso(at)
        run = Run(run_id=run_id, started_at=stamp, steps=[{"step": "scheduled", "at": stamp}])
        item = {
            "pk": run_pk(self.cluster),
            "sk": RUN_PREFIX + run_id,
            "run_id": run_id,
            "started_at": stamp,
            "steps": run.steps,
            "last_step": "scheduled",
            "completed": False,
        }
        with aws.aws_errors("dynamodb:PutItem"):
            self._ddb.put_item(TableName=self.table, Item=to_item(item))
        return run

    def get(self, run_id: str) -> Run | None:
        """A run by id (None: the ledger has no such run)."""
        with aws.aws_errors("dynamodb:GetItem"):
            resp = self._ddb.get_item(
                TableName=self.table, Key=self._key(run_id), ConsistentRead=True
            )
        item = from_item(resp.get("Item"))
        return Run.from_item(item) if item else None

    def latest(self) -> Run | None:
        """The newest run (None: no canary ever ran)."""
        with aws.aws_errors("dynamodb:Query"):
            resp = self._ddb.query(
                TableName=self.table,
                KeyConditionExpression="pk = :pk AND begins_with(sk, :run)",
                ExpressionAttributeValues=to_item(
                    {":pk": run_pk(self.cluster), ":run": RUN_PREFIX}
                ),
                ScanIndexForward=False,
                Limit=1,
                ConsistentRead=True,
            )
        items = resp.get("Items") or []
        return Run.from_item(from_item(items[0]) or {}) if items else None

    def reach(self, run_id: str, step: str, *, error: str | None = None) -> None:
        """Append ``step`` to the run (``completed`` when it is ``closed``)."""
        if step not in STEP_NAMES and step != "failed":
            raise ValueError(f"unknown canary step {step!r}; expected one of {STEP_NAMES}")
        values: dict[str, Any] = {
            ":step": [{"step": step, "at": clock.iso(clock.now())}],
            ":name": step,
        }
        update = "SET steps = list_append(steps, :step), last_step = :name"
        if step == "closed":
            update += ", completed = :done"
            values[":done"] = True
        # Only a run the canary function recorded: a step never creates one.
        kwargs: dict[str, Any] = {"ConditionExpression": "attribute_exists(pk)"}
        if error is not None:
            update += ", #error = :error"
            values[":error"] = error[:1000]
            kwargs["ExpressionAttributeNames"] = {"#error": "error"}
        with aws.aws_errors("dynamodb:UpdateItem"):
            self._ddb.update_item(
                TableName=self.table,
                Key=self._key(run_id),
                UpdateExpression=update,
                ExpressionAttributeValues=to_item(values),
                **kwargs,
            )

    def mark_stopped(self, run_id: str, step: str) -> None:
        """Write where the canary alarm found the run stopped."""
        with aws.aws_errors("dynamodb:UpdateItem"):
            self._ddb.update_item(
                TableName=self.table,
                Key=self._key(run_id),
                UpdateExpression="SET stopped_at = :step",
                ConditionExpression="attribute_exists(pk)",
                ExpressionAttributeValues=to_item({":step": step}),
            )


# ---- starting a run (the schedule) ----------------------------------------------------------


def canary_report(cluster: str, run_id: str, at: datetime) -> dict[str, Any]:
    """The synthetic ``sdc.alarm/v1`` report: rank 0 of the canary job on the canary node,
    named a culprit by the compute check."""
    return {
        "schema": ALARM_SCHEMA,
        "cluster": cluster,
        "job": contract.CANARY_JOB,
        "time": clock.iso(at),
        "step": 0,
        "check": "compute",
        "culprits": [0],
        "suspects": [0],
        "suspect_window": [0, 0],
        "ranks": {
            "0": {
                "node_name": contract.CANARY_NODE_NAME,
                "instance_id": contract.CANARY_INSTANCE_ID,
            }
        },
        "metric": {"name": contract.CANARY_METRIC, "value": 1},
        "canary_run": run_id,
    }


def _write_report(group: str, report: dict[str, Any], at: datetime) -> None:
    logs = aws.client("logs")
    stream = contract.CANARY_JOB  # localize reads one stream per job, named after the job
    exists = logs.exceptions.ResourceAlreadyExistsException
    with aws.aws_errors("logs:CreateLogStream"):
        try:
            with contextlib.suppress(exists):
                logs.create_log_stream(logGroupName=group, logStreamName=stream)
        except logs.exceptions.ResourceNotFoundException:
            # No agent published yet: the group is the agent's to create, and the canary's too.
            with contextlib.suppress(exists):
                logs.create_log_group(logGroupName=group)
            with contextlib.suppress(exists):
                logs.create_log_stream(logGroupName=group, logStreamName=stream)
    with aws.aws_errors("logs:PutLogEvents"):
        logs.put_log_events(
            logGroupName=group,
            logStreamName=stream,
            logEvents=[{"timestamp": int(at.timestamp() * 1000), "message": json.dumps(report)}],
        )


def _put_datum(settings: Settings, at: datetime) -> None:
    """The canary's datum on the series its alarm watches and on its per-node series (which
    localize lists), as the agent publishes a finding."""
    cluster = settings.hyperpod_cluster_name
    job = [
        {"Name": "ClusterName", "Value": cluster},
        {"Name": "JobName", "Value": contract.CANARY_JOB},
    ]
    node = [*job, {"Name": "NodeName", "Value": contract.CANARY_NODE_NAME}]
    with aws.aws_errors("cloudwatch:PutMetricData"):
        aws.client("cloudwatch").put_metric_data(
            Namespace=settings.metric_namespace,
            MetricData=[
                {"MetricName": contract.CANARY_METRIC, "Dimensions": dims, "Timestamp": at,
                 "Value": 1.0, "Unit": "Count", "StorageResolution": 1}
                for dims in (job, node)
            ],
        )  # fmt: skip


def start_run(settings: Settings) -> Run:
    """Start a canary run: record it, write its report, put its datum."""
    now = clock.now()
    store = RunStore(settings.ledger_table, settings.hyperpod_cluster_name)
    run = store.start(new_run_id(now), now)
    _write_report(
        settings.report_log_group,
        canary_report(settings.hyperpod_cluster_name, run.run_id, now),
        now,
    )
    _put_datum(settings, now)
    store.reach(run.run_id, "published")
    logger.info("canary started", extra={"run": run.run_id})
    return store.get(run.run_id) or run


# ---- the workflow's side --------------------------------------------------------------------


def verify_report(report: Report, settings: Settings) -> str:
    """The run id of a canary report, refused (``UntrustedReport``) unless it names only the
    reserved canary node and belongs to an open run the canary function recorded."""
    where = f"canary report of job {report.job}"
    if report.job != contract.CANARY_JOB or report.canary_run is None:
        raise UntrustedReport(
            f"{where}: only job {contract.CANARY_JOB} reports with a canary_run are canaries",
            field="canary_run",
        )
    # Every rank it names, blamed or not: a canary report names the reserved node alone.
    for rank in sorted({*(report.suspects or []), *map(int, report.ranks)}):
        info = report.ranks.get(str(rank))
        if (
            info is None
            or info.node_name != contract.CANARY_NODE_NAME
            or info.instance_id != contract.CANARY_INSTANCE_ID
        ):
            raise UntrustedReport(
                f"{where}: rank {rank} must be on the reserved canary node "
                f"{contract.CANARY_NODE_NAME} ({contract.CANARY_INSTANCE_ID}); a canary never "
                "names a real node",
                field=f"ranks.{rank}",
            )
    run = RunStore(settings.ledger_table, settings.hyperpod_cluster_name).get(report.canary_run)
    if run is None or run.completed:
        raise UntrustedReport(
            f"{where}: run {report.canary_run!r} is not an open canary run in the ledger "
            "(only the canary function starts runs)",
            field="canary_run",
        )
    return run.run_id


def refuse_reserved_node(report: Report) -> None:
    """A training report that names the canary's node is ``UntrustedReport``."""
    for rank, info in report.ranks.items():
        if (
            info.instance_id == contract.CANARY_INSTANCE_ID
            or info.node_name == contract.CANARY_NODE_NAME
        ):
            raise UntrustedReport(
                f"job {report.job} rank {rank} names the reserved canary node "
                f"{contract.CANARY_NODE_NAME}, which only canary runs may name",
                field=f"ranks.{rank}",
            )


def reach(settings: Settings, suspect: Suspect, step: str, *, error: str | None = None) -> None:
    """Mark a step of the suspect's canary run."""
    if suspect.canary_run is None:
        raise ValueError("not a canary suspect")
    RunStore(settings.ledger_table, settings.hyperpod_cluster_name).reach(
        suspect.canary_run, step, error=error
    )


def admit(ledger: Ledger, req: AdmitRequest, suspect: Suspect, settings: Settings) -> Admission:
    """Admit a canary: read the guard as a real admission would, claim nothing (no slot, no
    node STATE), and walk the enforce path, which every step runs in dry run for a canary."""
    would = ledger.would_admit(req)
    key = f"{req.execution}#{req.item}#{suspect.canary_run}".encode()
    reach(settings, suspect, "admitted")
    return Admission(
        decision="admitted",
        remediation_id=f"c-{hashlib.sha256(key).hexdigest()[:16]}",
        reason=(
            f"canary {suspect.canary_run}: dry run, nothing claimed (the guard would answer "
            f"{would.decision})"
        ),
        mode="enforce",
    )


def progress(settings: Settings, suspect: Suspect, transition: str, error: str | None) -> None:
    """What a record step means for the canary run: a step, its close, or its failure.

    Closing puts ``canary_completed`` (the canary alarm's metric).
    """
    if transition == "failed":
        reach(settings, suspect, "failed", error=error or "failed")
        return
    step = TRANSITION_STEPS.get(transition)
    if step is not None:
        reach(settings, suspect, step)
    if transition == "replaced":
        reach(settings, suspect, "closed")
        with aws.aws_errors("cloudwatch:PutMetricData"):
            aws.client("cloudwatch").put_metric_data(
                Namespace=contract.POWERTOOLS_METRICS_NAMESPACE,
                MetricData=[
                    {
                        "MetricName": contract.CANARY_COMPLETED_METRIC,
                        "Dimensions": [
                            {"Name": "ClusterName", "Value": settings.hyperpod_cluster_name}
                        ],
                        "Value": 1.0,
                        "Unit": "Count",
                    }
                ],
            )
        logger.info("canary completed", extra={"run": suspect.canary_run})


# ---- the canary's approval, settled by the approve function ----------------------------------


class CanaryApprovalRefused(RemediationError):
    """A direct ``settle_canary_approval`` event named an approval that is not the canary's:
    nothing is sent, the record is unchanged."""


def settle_event(approval_id: str) -> dict[str, str]:
    """The event request_approval invokes the approve function with."""
    return {"action": SETTLE_ACTION, "approval_id": approval_id}


def ask_approve(settings: Settings, approval_id: str) -> None:
    """Invoke the approve function (asynchronously, ``Event``) to settle the canary's approval.

    Asynchronously: the approve function sends SendTaskSuccess after this step returned, the
    order a person's decision takes, and neither function's timeout depends on the other's. An
    invoke Lambda refuses (denied, no such function) raises here and fails the step; an approve
    function that fails writes its error on the run (``settle_approval``), and the run then
    stops at ``approved``, which the canary alarm's message names.
    """
    function = settings.approve_function
    if not function:
        raise ConfigurationError(
            f"{contract.APPROVE_FUNCTION} is not set: request_approval cannot ask the approve "
            "function to settle the canary's approval (infra sets it when the canary is on)"
        )
    with aws.aws_errors("lambda:InvokeFunction"):
        resp = aws.client("lambda").invoke(
            FunctionName=function,
            InvocationType="Event",
            Payload=json.dumps(settle_event(approval_id)).encode(),
        )
    if resp.get("StatusCode") != 202:
        raise ConfigurationError(
            f"the approve function {function} did not queue the canary approval {approval_id} "
            f"(status {resp.get('StatusCode')})"
        )
    logger.info("canary approval sent to the approve function", extra={"approval_id": approval_id})


def canary_run_of(item: dict[str, Any], settings: Settings) -> str:
    """The run id of an approval record that is the canary's: its node is the reserved canary
    node, its remediation a canary's, and its evidence names an open canary run in the ledger.
    Anything else is ``CanaryApprovalRefused``."""
    approval_id = item.get("approval_id", "?")
    refused = f"approval {approval_id} is not a canary approval"
    if (
        item.get("instance_id") != contract.CANARY_INSTANCE_ID
        or item.get("node_name") != contract.CANARY_NODE_NAME
    ):
        raise CanaryApprovalRefused(
            f"{refused}: its node is {item.get('node_name')!r} ({item.get('instance_id')!r}), "
            f"not the reserved canary node {contract.CANARY_NODE_NAME}; only a person decides it, "
            "through the approve function's URL"
        )
    evidence = json.loads(item.get("evidence") or "{}")
    run_id = evidence.get("canary_run")
    remediation = str(item.get("remediation_id") or "")
    if not isinstance(run_id, str) or not remediation.startswith("c-"):
        raise CanaryApprovalRefused(
            f"{refused}: remediation {remediation!r} with canary run {run_id!r} is no canary "
            "remediation"
        )
    run = RunStore(settings.ledger_table, settings.hyperpod_cluster_name).get(run_id)
    if run is None or run.completed:
        raise CanaryApprovalRefused(f"{refused}: run {run_id!r} is not an open canary run")
    return run.run_id


def settle_approval(settings: Settings, approval_id: str) -> ApprovalDecision | None:
    """The approve function's side: approve the canary's approval ``approval_id`` as
    ``APPROVER``, through the same claim and SendTaskSuccess a person's decision takes.

    ``CanaryApprovalRefused`` (nothing sent) unless the record is the canary's. None when it was
    already decided (a retried invoke). Any other failure is written on the run, then raised.
    """
    approvals = Approvals(settings.approvals_table)
    run_id = canary_run_of(approvals.get(approval_id), settings)
    try:
        return approvals.decide(
            approval_id, "approve", reason=f"canary run {run_id}", approver=APPROVER
        )
    except ApprovalAlreadyDecided:
        logger.info("canary approval already decided", extra={"approval_id": approval_id})
        return None
    except Exception as exc:
        try:
            RunStore(settings.ledger_table, settings.hyperpod_cluster_name).reach(
                run_id,
                "failed",
                error=f"the approve function could not settle canary approval {approval_id}: "
                f"{type(exc).__name__}: {exc}",
            )
        except Exception:  # the send's error is the one to raise; this one is only logged
            logger.exception("could not write the failed canary approval on the run")
        raise


# ---- where a run stopped (the canary alarm) ---------------------------------------------------


@dataclass(frozen=True)
class Stop:
    """Where a canary run stopped: the first step it did not reach, and why that matters."""

    run_id: str | None
    step: str
    last_reached: str | None
    error: str | None = None

    def sentence(self) -> str:
        """One line for the on-call."""
        what = dict(STEPS)[self.step]
        hint = HINTS.get(self.step, "see the canary execution's history and its step's logs")
        run = f"canary run {self.run_id}" if self.run_id else "the canary"
        text = (
            f"{run} stopped at step '{self.step}' (never: {what}); last step reached: "
            f"{self.last_reached or 'none'}. {hint}"
        )
        if self.error:
            text += f" Error recorded: {self.error}"
        return text


def stopped_at(run: Run | None, *, alarm_fired: bool, execution_started: bool) -> Stop:
    """The step after the furthest one the run reached (recorded, or observed: the alarm and
    the execution leave no record of their own). A run that completed, or none at all, means no
    new run was started: stopped at ``scheduled``."""
    if run is None or run.completed:
        return Stop(run_id=None, step="scheduled", last_reached=run.run_id if run else None)
    reached = set(run.reached)
    if alarm_fired:
        reached.add("alarm")
    if execution_started:
        reached.add("workflow")
    furthest = max((STEP_NAMES.index(s) for s in reached if s in STEP_NAMES), default=-1)
    step = STEP_NAMES[min(furthest + 1, len(STEP_NAMES) - 1)]
    return Stop(
        run_id=run.run_id,
        step=step,
        last_reached=STEP_NAMES[furthest] if furthest >= 0 else None,
        error=run.error,
    )


def _alarm_fired_since(settings: Settings, started: datetime) -> bool:
    with aws.aws_errors("cloudwatch:DescribeAlarms"):
        alarms = aws.client("cloudwatch").describe_alarms(AlarmNames=[settings.canary_alarm_name])[
            "MetricAlarms"
        ]
    # CloudWatch keeps the state and when it last changed: an ALARM entered since the run
    # started, or a change back to OK since then (which only follows an ALARM of this run).
    return any(
        a["StateUpdatedTimestamp"] >= started and a["StateValue"] in ("ALARM", "OK") for a in alarms
    )


def _execution_started_since(settings: Settings, started: datetime) -> bool:
    arn = settings.state_machine_arn
    if arn is None:
        return False
    with aws.aws_errors("states:ListExecutions"):
        page = aws.client("stepfunctions").list_executions(stateMachineArn=arn, maxResults=50)
    return any(e["startDate"] >= started for e in page.get("executions", []))


def check(settings: Settings) -> Stop:
    """The canary alarm's action: find where the newest run stopped, write it on the run, and
    publish it to the topic."""
    store = RunStore(settings.ledger_table, settings.hyperpod_cluster_name)
    run = store.latest()
    fired = started = False
    if run is not None and not run.completed:
        since = clock.parse_iso(run.started_at)
        fired = _alarm_fired_since(settings, since)
        started = _execution_started_since(settings, since)
    stop = stopped_at(run, alarm_fired=fired, execution_started=started)
    if stop.run_id is not None:
        store.mark_stopped(stop.run_id, stop.step)
    subject = f"{notify.subject_prefix(False)} canary stopped at {stop.step}"
    body = json.dumps(
        {
            "summary": stop.sentence(),
            "cluster": settings.hyperpod_cluster_name,
            "run": stop.run_id,
            "stopped_at": stop.step,
            "last_reached": stop.last_reached,
            "steps": run.steps if run else [],
        },
        indent=2,
    )
    notify.publish(settings.topic_arn, subject[:100], body)
    logger.warning("canary stopped", extra={"run": stop.run_id, "step": stop.step})
    return stop


__all__ = [
    "APPROVER",
    "SETTLE_ACTION",
    "STEPS",
    "STEP_NAMES",
    "CanaryApprovalRefused",
    "Run",
    "RunStore",
    "Stop",
    "admit",
    "ask_approve",
    "canary_report",
    "canary_run_of",
    "check",
    "cordon_result",
    "is_canary",
    "progress",
    "reach",
    "refuse_reserved_node",
    "settle_approval",
    "settle_event",
    "start_run",
    "stopped_at",
    "verify_report",
]


def cordon_result(suspect: Suspect) -> CordonResult:
    """Cordon (and uncordon) of the canary: its node is no Kubernetes node, so nothing is read
    or patched; the result is a dry run's."""
    logger.info("canary: dry run, no node to cordon", extra={"node": suspect.node_name})
    return CordonResult(node_name=suspect.node_name, cordoned=False, changed=False, dry_run=True)
