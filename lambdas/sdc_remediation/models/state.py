"""The workflow state: the alarm localize normalised, the suspects it named, and the Map item's
state every per-node step receives (docs/CONTRACT.md, "Workflow state").

Bounded so the state stays far under Step Functions' 256 KiB whatever a report says: a suspect
carries at most ``MAX_RANKS_PER_SUSPECT`` ranks and ``MAX_TENSOR_NAMES`` tensor names, and
where the full report is in CloudWatch Logs.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_serializer, field_validator, model_validator

from sdc_contract.canary import CANARY_INSTANCE_ID, CANARY_JOB
from sdc_contract.names import is_instance_id, is_subdomain_name, node_name_of
from sdc_contract.report import Check, SuspectVerdict, verdict_name

from .. import text
from .base import LedgerInt
from .base import Model as _Model
from .report import JobName, RankInfo, RankMapping, SuspectWindow
from .results import HealthResult, StepResults

MAX_RANKS_PER_SUSPECT = 8
"""Ranks listed per suspect in the workflow state (a GPU node runs 8; the report has them all,
and ``rank_count`` says how many the reports named on the node)."""
MAX_TENSOR_NAMES = 3
"""How many divergent tensor names a suspect carries through the workflow (the full list stays
in the report, in CloudWatch Logs, which the suspect references)."""
MAX_TENSOR_NAME_CHARS = 120
MAX_SUSPECTS = 64
"""Nodes one localize output lists (suspects and pending nodes together; ``suspect_count`` says
how many the alarm named). The agent names at most 64 nodes in one report; an alarm naming more
is a storm, which the guard refuses whole (it reads ``suspect_count``), so listing more would
only grow the state towards Step Functions' 256 KiB."""
MAX_REFUSALS = 16
"""Refusals one localize output lists (``refused_count`` says how many there were)."""
MAX_REASON_CHARS = 400


class Alarm(_Model):
    """The alarm as localize normalises it; every later step carries it."""

    alarm_name: str
    alarm_arn: str
    state: str
    reason: str = Field(max_length=2048)
    time: str
    metric_name: str | None
    namespace: str
    cluster_name: str
    window_start: str
    window_end: str
    canary: bool = False
    """The canary's own alarm (its metric's JobName is the reserved canary job): localize reads
    only canary reports for it, and only training reports for every other alarm."""
    job: JobName | None = None
    """The job whose data put the alarm's contributor in ALARM (one contributor per job):
    localize reads that job's series and reports only. None: an alarm not scoped to one job."""


def report_identity(job: str, step: int, check: str, report_time: str | None) -> str:
    """A report's identity: job, step, check and report time (ISO 8601, ``clock.iso``). The
    ledger keeps one remediation per report and node under it (``Suspect.report_key``), a
    refusal per report, and the sweeper's backstop reads a report from the log group by it."""
    return f"{job}#{step}#{check}#{report_time or '-'}"


class Suspect(_Model):
    """One node to contain, with the evidence that names it."""

    node_name: str
    instance_id: str
    instance_group: str = Field(max_length=64)
    job: JobName
    ranks: RankMapping
    rank_count: LedgerInt = 0
    """How many ranks the reports named on this node (``ranks`` lists at most 8 of them)."""
    check: Check
    verdict: SuspectVerdict
    """How the reports named the node: one of the contract's verdicts, ``unknown`` for a kind
    the contract does not list (a newer agent's); never free text."""
    step: LedgerInt
    suspect_window: SuspectWindow
    last_audit_pass: LedgerInt | None = None
    last_weight_check_pass: LedgerInt | None = None
    divergent_tensors: list[str] = Field(default_factory=list, max_length=MAX_TENSOR_NAMES)
    """At most ``MAX_TENSOR_NAMES`` of the report's divergent tensors, for the message."""
    divergent_tensor_count: LedgerInt = 0
    """How many tensors the report named as divergent (all of them are in the report)."""
    nonfinite_count: LedgerInt = 0
    """How many ranks the report found with a non-finite gradient (the resume rule reads it)."""
    report_log_group: str | None = Field(default=None, max_length=512)
    report_log_stream: str | None = Field(default=None, max_length=512)
    """The report's place in CloudWatch Logs: the full evidence (every tensor, every rank)."""
    report_time: str | None = None
    """The ``time`` of the report whose evidence this is (ISO 8601): with ``job``, ``step`` and
    ``check`` the report's identity, under which the ledger keeps one remediation per report."""
    canary_run: str | None = None
    """The canary run this suspect is (None: a real suspect). Only the reserved canary job and
    node may carry one, so a damaged or forged state cannot turn a real node into a canary."""

    @field_validator("verdict", mode="before")
    @classmethod
    def _known_verdict(cls, value: object) -> SuspectVerdict:
        return verdict_name(value)

    @field_validator("divergent_tensors")
    @classmethod
    def _printable_tensor_names(cls, value: list[str]) -> list[str]:
        # Tensor names come from the report and reach messages and terminals.
        return [text.printable(name, MAX_TENSOR_NAME_CHARS) for name in value]

    @property
    def report_key(self) -> str:
        """The identity of the report that names this node: job, step, check, report time (the
        ledger admits one remediation per report and node)."""
        return report_identity(self.job, self.step, self.check, self.report_time)

    @model_validator(mode="after")
    def _canary_is_the_reserved_node(self) -> Suspect:
        if self.canary_run is not None and (
            self.instance_id != CANARY_INSTANCE_ID or self.job != CANARY_JOB
        ):
            raise ValueError(
                f"canary_run is reserved for job {CANARY_JOB} on instance "
                f"{CANARY_INSTANCE_ID}, not {self.job} on {self.instance_id}"
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


class PendingNode(_Model):
    """A node with a non-zero series of the alarm's job but no visible report naming it yet
    (CloudWatch Logs is eventually consistent): localize looks for its report again in its own
    Map item (``localize_late``), so the other suspects do not wait for it."""

    job: JobName
    node_name: str

    @field_validator("node_name")
    @classmethod
    def _node_name(cls, value: str) -> str:
        if not is_subdomain_name(value):
            raise ValueError(f"{value[:80]!r} is not a Kubernetes node name")
        return value


class Refusal(_Model):
    """A report, or one node a report names, that localize refused: nothing acts on it, the
    record step records and notifies it, and the other reports and nodes go on."""

    error: str = Field(max_length=64)
    """The error class it would have been (``UntrustedReport``, ``InstanceNotInCluster``,
    ``NodeNotFound``)."""
    field: str = Field(default="", max_length=120)
    """What did not hold (``job``, ``ranks.3.instance_id``, ``suspect_window``...)."""
    reason: str = Field(max_length=MAX_REASON_CHARS)
    job: JobName | None = None
    stream: str | None = Field(default=None, max_length=120)
    """The log stream of the refused report (printable, bounded)."""
    node_name: str | None = Field(default=None, max_length=253)

    @field_validator("reason", "field", "stream", mode="before")
    @classmethod
    def _printable(cls, value: object) -> object:
        if value is None:
            return None
        return text.printable(value, MAX_REASON_CHARS)


class LocalizeResult(_Model):
    """Output of localize."""

    alarm: Alarm
    suspects: list[Suspect] = Field(max_length=MAX_SUSPECTS)
    ambiguous: bool
    reports: int
    pending: list[PendingNode] = Field(default_factory=list, max_length=MAX_SUSPECTS)
    """Nodes of the alarm's job whose report is not visible yet (looked for again, each in its
    own Map item)."""
    suspect_count: int = 0
    """How many nodes the alarm names in all (suspects and pending, also beyond
    ``MAX_SUSPECTS``): the guard refuses an alarm naming more than its budget as a whole."""
    refused: list[Refusal] = Field(default_factory=list, max_length=MAX_REFUSALS)
    """Reports or nodes refused (at most ``MAX_REFUSALS``; ``refused_count`` says how many)."""
    refused_count: int = 0


class ItemState(StepResults):
    """The Map item's state: what every per-node step receives."""

    alarm: Alarm
    suspect: Suspect
    execution: str = ""
    suspects_in_alarm: LedgerInt = Field(default=1, ge=1)
    """How many nodes the same alarm names (the Map's item count)."""
    item: LedgerInt | None = None
    """The Map item's index (``$$.Map.Item.Index``): with ``execution``, what the execution
    itself knows about this remediation, whatever the steps returned."""


class LateInput(_Model):
    """A Map item of a pending node: localize looks for its report again (``localize_late``)."""

    alarm: Alarm
    pending: PendingNode
    execution: str = ""


class PollInput(ItemState):
    """poll_health_check needs the previous health result."""

    health: HealthResult


class ApprovalRequestInput(ItemState):
    """request_approval receives the task token beside the item state."""

    task_token: str = Field(min_length=1)


__all__ = [
    "MAX_RANKS_PER_SUSPECT",
    "MAX_REASON_CHARS",
    "MAX_REFUSALS",
    "MAX_SUSPECTS",
    "MAX_TENSOR_NAMES",
    "MAX_TENSOR_NAME_CHARS",
    "Alarm",
    "ApprovalRequestInput",
    "ItemState",
    "LateInput",
    "LocalizeResult",
    "PendingNode",
    "PollInput",
    "Refusal",
    "Suspect",
    "report_identity",
]
