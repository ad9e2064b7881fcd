"""Pydantic models: the workflow's inputs and outputs, the agent's report, the alarm event.

Parse once at the edge (``parse_step``), then logic code works on typed objects. Every model of a
workflow state ignores extra keys: each step receives the whole Map item state and reads only what
it needs (docs/CONTRACT.md, "Workflow state").
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal, TypeVar

from aws_lambda_powertools.utilities.parser import parse
from aws_lambda_powertools.utilities.parser.models import EventBridgeModel
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_serializer,
    field_validator,
    model_validator,
)

from . import contract
from .errors import InvalidAlarmEvent, InvalidStepInput
from .hyperpod import is_instance_id, node_name_of
from .kube import is_subdomain_name

MAX_TENSOR_NAMES = 3
"""How many divergent tensor names a suspect carries through the workflow (the full list stays
in the report, in CloudWatch Logs, which the suspect references)."""
MAX_TENSOR_NAME_CHARS = 120

SDC_METRICS = contract.SDC_ALARM_METRICS
ALARM_SCHEMA = "sdc.alarm/v1"
RANKMAP_SCHEMA = "sdc.rankmap/v1"


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


# --- The EventBridge "CloudWatch Alarm State Change" event -------------------------------------


class MetricRef(_Model):
    """``configuration.metrics[].metricStat.metric`` of the alarm event."""

    namespace: str
    name: str
    dimensions: dict[str, str] = Field(default_factory=dict)


class MetricStat(_Model):
    """``metricStat``: the metric, its period and statistic."""

    metric: MetricRef
    period: int | None = None
    stat: str | None = None


class MetricQuery(_Model):
    """One entry of ``configuration.metrics``; math expressions have no metricStat."""

    id: str
    metric_stat: MetricStat | None = Field(default=None, alias="metricStat")
    expression: str | None = None


class AlarmConfiguration(_Model):
    """``detail.configuration``."""

    description: str | None = None
    metrics: list[MetricQuery] = Field(default_factory=list)


class AlarmStateValue(_Model):
    """``detail.state`` / ``detail.previousState``."""

    value: str
    reason: str = ""
    timestamp: datetime


class AlarmDetail(_Model):
    """``detail`` of a CloudWatch Alarm State Change event."""

    alarm_name: str = Field(alias="alarmName")
    state: AlarmStateValue
    previous_state: AlarmStateValue | None = Field(default=None, alias="previousState")
    configuration: AlarmConfiguration = Field(default_factory=AlarmConfiguration)


class AlarmStateChangeEvent(EventBridgeModel):
    """The workflow input: Powertools' EventBridge envelope with a typed alarm detail."""

    source: Literal["aws.cloudwatch"]
    detail_type: Literal["CloudWatch Alarm State Change"] = Field(alias="detail-type")
    detail: AlarmDetail  # type: ignore[assignment]


# --- The agent's report (schema sdc.alarm/v1) ---------------------------------------------------


def check_rank_keys(ranks: dict[str, Any]) -> dict[str, Any]:
    """Rank maps are keyed by the global rank as a decimal string ("0", "17")."""
    bad = [k for k in ranks if not (k.isascii() and k.isdigit())]
    if bad:
        raise ValueError(f"rank keys must be non-negative integers, got {bad[:3]}")
    return ranks


def check_window(window: list[int]) -> list[int]:
    """``suspect_window`` is [first, last] step, 0 <= first <= last."""
    if len(window) != 2 or not 0 <= window[0] <= window[1]:
        raise ValueError(
            f"suspect_window must be [first, last] with 0 <= first <= last, got {window}"
        )
    return window


class RankInfo(_Model):
    """Where one global rank runs, as the agent reports it."""

    node_name: str | None = None
    instance_id: str | None = None
    gpu_uuid: str | None = None
    local_rank: int | None = None
    pod_name: str | None = None


class VerdictEntry(_Model):
    """One confirmation result: the pair replayed, the third GPU, whom it blames, and how."""

    pair: list[int]
    third: int | None = None
    suspect: int | None = None
    kind: str


class ReportMetric(_Model):
    """Which SDC metric the report incremented and by how much."""

    name: str
    value: float


class Report(_Model):
    """One ``sdc.alarm/v1`` log event, written by the agent next to the metrics."""

    report_schema: Literal["sdc.alarm/v1"] = Field(alias="schema")
    cluster: str
    job: str
    time: datetime
    step: int
    check: Literal["compute", "reduced_gradient", "weights"]
    nonfinite: list[int] = Field(default_factory=list)
    mismatched_pairs: list[list[int]] = Field(default_factory=list)
    culprits: list[int] = Field(default_factory=list)
    verdicts: list[VerdictEntry] = Field(default_factory=list)
    suspects: list[int] | None = None
    suspect_window: list[int] = Field(default_factory=lambda: [0, 0])
    last_audit_pass: int | None = None
    last_weight_check_pass: int | None = None
    divergent_tensors: list[str] = Field(default_factory=list)
    ranks: dict[str, RankInfo] = Field(default_factory=dict)
    metric: ReportMetric | None = None
    log_stream: str | None = Field(default=None, exclude=True)
    """Where localize read the report (not part of the agent's schema)."""
    canary_run: str | None = None
    """Set only by the canary function (``canary.py``): the run this synthetic report belongs
    to, which localize checks against the run the canary recorded in the ledger."""

    @field_validator("ranks")
    @classmethod
    def _rank_keys(cls, value: dict[str, RankInfo]) -> dict[str, RankInfo]:
        return check_rank_keys(value)

    @field_validator("suspect_window")
    @classmethod
    def _suspect_window(cls, value: list[int]) -> list[int]:
        return check_window(value)


class RankMap(_Model):
    """The ``sdc.rankmap/v1`` event the agent writes at job start."""

    report_schema: Literal["sdc.rankmap/v1"] = Field(alias="schema")
    cluster: str
    job: str
    time: datetime
    ranks: dict[str, RankInfo] = Field(default_factory=dict)

    @field_validator("ranks")
    @classmethod
    def _rank_keys(cls, value: dict[str, RankInfo]) -> dict[str, RankInfo]:
        return check_rank_keys(value)


# --- Workflow state ---------------------------------------------------------------------------


class Alarm(_Model):
    """The alarm as localize normalises it; every later step carries it."""

    alarm_name: str
    alarm_arn: str
    state: str
    reason: str
    time: str
    metric_name: str | None
    namespace: str
    cluster_name: str
    window_start: str
    window_end: str
    canary: bool = False
    """The canary's own alarm (its metric's JobName is the reserved canary job): localize reads
    only canary reports for it, and only training reports for every other alarm."""


class Suspect(_Model):
    """One node to contain, with the evidence that names it."""

    node_name: str
    instance_id: str
    instance_group: str
    job: str
    ranks: dict[str, RankInfo]
    rank_count: int = 0
    """How many ranks the reports named on this node (``ranks`` lists at most 8 of them)."""
    check: str
    verdict: str
    step: int
    suspect_window: list[int]
    last_audit_pass: int | None = None
    last_weight_check_pass: int | None = None
    divergent_tensors: list[str] = Field(default_factory=list, max_length=MAX_TENSOR_NAMES)
    """At most ``MAX_TENSOR_NAMES`` of the report's divergent tensors, for the message."""
    divergent_tensor_count: int = 0
    """How many tensors the report named as divergent (all of them are in the report)."""
    nonfinite_count: int = 0
    """How many ranks the report found with a non-finite gradient (the resume rule reads it)."""
    report_log_group: str | None = None
    report_log_stream: str | None = None
    """The report's place in CloudWatch Logs: the full evidence (every tensor, every rank)."""
    canary_run: str | None = None
    """The canary run this suspect is (None: a real suspect). Only the reserved canary job and
    node may carry one, so a damaged or forged state cannot turn a real node into a canary."""

    @model_validator(mode="after")
    def _canary_is_the_reserved_node(self) -> Suspect:
        if self.canary_run is not None and (
            self.instance_id != contract.CANARY_INSTANCE_ID or self.job != contract.CANARY_JOB
        ):
            raise ValueError(
                f"canary_run is reserved for job {contract.CANARY_JOB} on instance "
                f"{contract.CANARY_INSTANCE_ID}, not {self.job} on {self.instance_id}"
            )
        return self

    @model_validator(mode="after")
    def _node_is_the_instances(self) -> Suspect:
        # HyperPod names an instance's node hyperpod-<instance id>: a suspect whose two names
        # disagree would have the approver approve one node and replace act on another.
        if self.node_name != node_name_of(self.instance_id):
            raise ValueError(
                f"node_name {self.node_name!r} is not instance {self.instance_id}'s node "
                f"({node_name_of(self.instance_id)!r})"
            )
        return self

    @field_serializer("ranks")
    def _compact_ranks(self, ranks: dict[str, RankInfo]) -> dict[str, dict[str, Any]]:
        # Unset fields are left out: the state carries up to 16 ranks per suspect.
        return {key: info.model_dump(exclude_none=True) for key, info in ranks.items()}

    @field_validator("node_name")
    @classmethod
    def _node_name(cls, value: str) -> str:
        if not is_subdomain_name(value):
            raise ValueError(f"{value!r} is not a Kubernetes node name (DNS-1123 subdomain)")
        return value

    @field_validator("instance_id")
    @classmethod
    def _instance_id(cls, value: str) -> str:
        if not is_instance_id(value):
            raise ValueError(f"{value!r} is not an instance id (i- and 8 or 17 hex digits)")
        return value

    @field_validator("ranks")
    @classmethod
    def _rank_keys(cls, value: dict[str, RankInfo]) -> dict[str, RankInfo]:
        return check_rank_keys(value)

    @field_validator("suspect_window")
    @classmethod
    def _suspect_window(cls, value: list[int]) -> list[int]:
        return check_window(value)


class LocalizeResult(_Model):
    """Output of localize."""

    alarm: Alarm
    suspects: list[Suspect]
    ambiguous: bool
    reports: int


class Admission(_Model):
    """Output of admit."""

    decision: Literal["admitted", "duplicate", "circuit_open"]
    remediation_id: str | None
    reason: str
    mode: Literal["enforce", "shadow"] = "enforce"
    """``shadow``: the check x verdict is not enforced (CHECK_MODES); the workflow records and
    notifies what it would have done and touches nothing. Nothing was claimed in the ledger."""


class CordonResult(_Model):
    """Output of cordon and uncordon."""

    node_name: str
    cordoned: bool
    changed: bool
    dry_run: bool
    health_check_label: str | None = None
    """The node's ``sagemaker.amazonaws.com/deep-health-check-status`` label when cordon read
    it (None: no label): the verdict of an EARLIER check, which start_health_check passes on as
    ``label_before`` so the poll does not take it for this check's verdict."""


HealthStatus = Literal["in_progress", "passed", "failed", "replaced_by_hyperpod", "timed_out"]


class HealthResult(_Model):
    """Output of start_health_check / poll_health_check."""

    status: HealthStatus
    started_at: str
    checks: list[str] = Field(default_factory=list)
    dry_run: bool = False
    detail: str = ""
    label_before: str | None = None
    """The deep-health-check label before this check was started (None: none): a Passed/Failed
    label equal to it may be an earlier check's verdict."""
    seen_in_progress: bool = False
    """Whether this check was observed running (label InProgress or instance status
    DeepHealthCheckInProgress); after that, a Passed/Failed label is this check's verdict."""


class ApprovalDecision(_Model):
    """What the CLI sends with SendTaskSuccess: the request_approval task's output."""

    decision: Literal["approve", "reject"]
    release: bool = False
    approver: str
    reason: str = ""
    approval_id: str


class ReplaceResult(_Model):
    """Output of replace."""

    mode: Literal["api", "label"]
    requested: bool
    dry_run: bool
    detail: str


class ItemState(_Model):
    """The Map item's state: what every per-node step receives."""

    alarm: Alarm
    suspect: Suspect
    execution: str = ""
    suspects_in_alarm: int = Field(default=1, ge=1)
    """How many nodes the same alarm names (the Map's item count)."""
    item: int | None = None
    """The Map item's index (``$$.Map.Item.Index``): with ``execution``, what the execution
    itself knows about this remediation, whatever the steps returned."""
    admission: Admission | None = None
    cordon: CordonResult | None = None
    health: HealthResult | None = None
    approval: ApprovalDecision | None = None
    replacement: ReplaceResult | None = None
    uncordon: CordonResult | None = None


class PollInput(ItemState):
    """poll_health_check needs the previous health result."""

    health: HealthResult


class ApprovalRequestInput(ItemState):
    """request_approval receives the task token beside the item state."""

    task_token: str = Field(min_length=1)


Transition = Literal[
    "ambiguous",
    "no_suspects",
    "duplicate",
    "circuit_open",
    "cordoned",
    "health_check_passed",
    "health_check_failed",
    "health_check_timed_out",
    "replaced_by_hyperpod",
    "awaiting_approval",
    "approved",
    "rejected",
    "released",
    "approval_timed_out",
    "replaced",
    "failed",
    "abandoned",
    "shadow",
]


class StepError(_Model):
    """The ``{Error, Cause}`` object a Catch puts in the state."""

    error: str = Field(default="", alias="Error")
    cause: str = Field(default="", alias="Cause")


class RecordState(_Model):
    """The state record receives: a Map item's state, localize's output, or the raw event."""

    alarm: Alarm | None = None
    suspect: Suspect | None = None
    suspects: list[Suspect] = Field(default_factory=list)
    execution: str = ""
    item: int | None = None
    admission: Admission | None = None
    cordon: CordonResult | None = None
    health: HealthResult | None = None
    approval: ApprovalDecision | None = None
    replacement: ReplaceResult | None = None
    uncordon: CordonResult | None = None


class RecordInput(_Model):
    """Input of record."""

    transition: Transition
    notify: bool = False
    state: RecordState = Field(default_factory=RecordState)
    error: StepError | None = None
    execution: str = ""
    """``$$.Execution.Id``, set by the workflow on every record task (the state may lack it)."""


class RecordResult(_Model):
    """Output of record."""

    recorded: bool = True


M = TypeVar("M", bound=BaseModel)


def parse_step(event: Any, model: type[M]) -> M:
    """Parse a step's input with Powertools Parser; a mismatch is ``InvalidStepInput``."""
    try:
        return parse(event=event, model=model)
    except (ValidationError, ValueError, TypeError) as exc:
        raise InvalidStepInput(f"{model.__name__}: {_first_errors(exc)}") from exc


def parse_alarm_event(event: Any) -> AlarmStateChangeEvent:
    """Parse the workflow input; anything but a CloudWatch alarm state change is rejected."""
    try:
        return parse(event=event, model=AlarmStateChangeEvent)
    except (ValidationError, ValueError, TypeError) as exc:
        raise InvalidAlarmEvent(
            f"not a CloudWatch Alarm State Change event: {_first_errors(exc)}"
        ) from exc


def _first_errors(exc: Exception, limit: int = 3) -> str:
    """A short, one-line description of a validation failure."""
    cause = exc.__cause__ if not isinstance(exc, ValidationError) else exc
    if isinstance(cause, ValidationError):
        parts = [
            f"{'.'.join(str(p) for p in err['loc']) or '<root>'}: {err['msg']}"
            for err in cause.errors()[:limit]
        ]
        return "; ".join(parts)
    return str(exc)
