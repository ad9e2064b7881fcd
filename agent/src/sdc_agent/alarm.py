"""The alarm: what the guard decided, identical on every rank, and its JSON report.

The report's schema, its check names and verdict kinds and the metric names are the contract's
(``sdc_contract``), which the remediation pipeline reads them by.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from sdc_contract import metrics
from sdc_contract.report import ALARM_SCHEMA, Check, VerdictKind

SCHEMA = ALARM_SCHEMA

CheckName = Check
"""Which check fired (``sdc_contract.report.Check``)."""


@dataclass(frozen=True)
class RankInfo:
    """Where one global rank runs: what the remediation pipeline needs to find its node."""

    rank: int
    node_name: str
    instance_id: str
    gpu_uuid: str
    local_rank: int
    pod_name: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The report's per-rank entry (without the rank, which is the key)."""
        out = {
            "node_name": self.node_name,
            "instance_id": self.instance_id,
            "gpu_uuid": self.gpu_uuid,
            "local_rank": self.local_rank,
        }
        if self.pod_name:
            out["pod_name"] = self.pod_name
        return out


@dataclass(frozen=True)
class Verdict:
    """The outcome of confirming one mismatch (or one non-finite rank) by replaying it again.

    ``pair`` is (target, replayer); for a non-finite gradient the replayer is the target itself.
    ``third`` is the GPU that replayed the target's batch to break the tie; ``suspect`` the rank
    the confirmation blames, or None.
    """

    pair: tuple[int, int]
    third: int | None
    suspect: int | None
    kind: VerdictKind

    def to_dict(self) -> dict[str, Any]:
        """JSON form: the pair as a two-element list."""
        return {
            "pair": list(self.pair),
            "third": self.third,
            "suspect": self.suspect,
            "kind": self.kind,
        }


@dataclass(frozen=True)
class SensorCandidate:
    """An online GEMM sensor's flag that raised a candidate (sdc_agent.sensors): which rank,
    which protected layer and GEMM, the checksum ratio it read and the threshold it crossed."""

    rank: int
    layer: str
    gemm: str
    """``forward``, ``dgrad`` (input gradient) or ``wgrad`` (weight gradient)."""
    ratio: float | None
    """The largest checksum difference over its rounding bound; None when not finite."""
    threshold: float | None
    kind: str = "linear"
    """The protected layer's kind: ``linear`` or ``layer_norm`` (whose ``gemm`` is ``forward``,
    its output)."""

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return asdict(self)


@dataclass(frozen=True)
class Alarm:
    """A failed check. Every rank holds an identical copy (the decision is collective).

    ``suspects`` are the ranks the alarm names, sorted, or None when it names nobody (for example
    a disagreement without a strict majority). ``suspect_window`` is [first, last]: from the last
    pass of the check that fired to the step that failed.
    """

    step: int
    check: CheckName
    nonfinite: list[int] = field(default_factory=list)
    mismatched_pairs: list[tuple[int, int]] = field(default_factory=list)
    culprits: list[int] = field(default_factory=list)
    verdicts: list[Verdict] = field(default_factory=list)
    suspects: list[int] | None = None
    suspect_window: tuple[int, int] = (0, 0)
    last_audit_pass: int | None = None
    last_weight_check_pass: int | None = None
    divergent_tensors: list[str] = field(default_factory=list)
    ranks: dict[str, RankInfo] = field(default_factory=dict)
    diagnosis: str | None = None
    """A sentence for the reader when the evidence points away from hardware (a non-finite
    gradient that reproduced on another GPU: numerics or data); None otherwise."""
    sensor_candidates: list[SensorCandidate] = field(default_factory=list)
    """The online sensor flags that raised this alarm's candidate (confirmed by replays);
    reported under the optional key ``sensor_candidates`` only when there are any."""
    setup: dict[str, Any] | None = None
    """A finding that is the job's set-up, not a GPU (``sdc_contract.report.SETUP_KEYS``: cause,
    detail, fix, audits): such an alarm names nobody and counts as ``sdc_audit_skipped``, never
    as an SDC metric; reported under the optional key ``setup`` only then."""
    workload: dict[str, Any] | None = None
    """The job's op shapes recorded on the first forward pass (``sdc.workload/v1``,
    :mod:`sdc_agent.workload`: what ``python -m sdc_agent.screen --workload`` runs); reported
    under the optional key ``workload`` only when something was recorded."""
    schema: str = SCHEMA

    @property
    def is_setup(self) -> bool:
        """Whether this is a set-up finding (the guard's audits, not a GPU, are at fault)."""
        return self.setup is not None

    @property
    def metric_value(self) -> int:
        """The count the alarm's CloudWatch metric carries: ranks, pairs or tensors."""
        if self.setup is not None:
            return 1
        if self.check == "weights":
            return len(self.divergent_tensors)
        if self.nonfinite:
            return len(self.nonfinite)
        if self.mismatched_pairs:
            return len(self.mismatched_pairs)
        return 1

    @property
    def metric_name(self) -> str:
        """Which of the three SDC metrics this alarm increments (``sdc_audit_skipped`` for a
        set-up finding, which is none of them)."""
        if self.setup is not None:
            return metrics.AUDIT_SKIPPED_METRIC
        if self.check == "weights":
            return metrics.DIVERGENT_TENSORS_METRIC
        if self.check == "reduced_gradient" or self.nonfinite:
            return metrics.NONFINITE_GRAD_METRIC
        return metrics.REPLAY_MISMATCH_METRIC

    def to_dict(self) -> dict[str, Any]:
        """The ``sdc.alarm/v1`` report: JSON-serialisable, keys in a stable order."""
        out = asdict(self)
        out["mismatched_pairs"] = [list(p) for p in self.mismatched_pairs]
        out["verdicts"] = [v.to_dict() for v in self.verdicts]
        out["suspect_window"] = list(self.suspect_window)
        out["ranks"] = {k: v.to_dict() for k, v in self.ranks.items()}
        out["metric"] = {"name": self.metric_name, "value": self.metric_value}
        # Additive within sdc.alarm/v1: the key is present only on a sensor's alarm.
        candidates = out.pop("sensor_candidates")
        if candidates:
            out["sensor_candidates"] = candidates
        setup = out.pop("setup")
        if setup is not None:
            out["setup"] = setup
        workload = out.pop("workload")
        if workload is not None:
            out["workload"] = workload
        return out
