"""The agent's report (schema ``sdc.alarm/v1``) and rank map (``sdc.rankmap/v1``) as localize
reads them from CloudWatch Logs. Keys, check and verdict names are the contract's
(``sdc_contract.report``); reports are written by training pods, so nothing here is trusted
until localize checked it against HyperPod and Kubernetes.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, StringConstraints

from sdc_contract.names import (
    MAX_JOB_NAME_CHARS,
    MAX_SUBDOMAIN_CHARS,
    is_gpu_uuid,
    is_job_name,
)
from sdc_contract.report import (
    ALARM_SCHEMA,
    RANKMAP_SCHEMA,
    Check,
    check_rank_keys,
    check_window,
)

from .base import LEDGER_INT_LIMIT, LedgerFloat, LedgerInt, LedgerRank
from .base import Model as _Model


def _rank_keyed(value: dict[str, RankInfo]) -> dict[str, RankInfo]:
    check_rank_keys(value)
    # A decimal key of any length passes the contract's check; a rank is an integer like any
    # other the ledger keeps.
    big = [key[:40] for key in value if len(key) > 19 or int(key) >= LEDGER_INT_LIMIT]
    if big:
        raise ValueError(f"rank keys must be below 2**63, got {big[:3]}")
    return value


def _window(value: list[int]) -> list[int]:
    check_window(value)
    return value


def _job_name(value: str) -> str:
    if not is_job_name(value):
        raise ValueError(
            f"{value[:80]!r} is not a job name the pipeline accepts: a Kubernetes label value "
            f"(at most {MAX_JOB_NAME_CHARS} letters, digits, '-', '_', '.'), as the job-name "
            "label of the job's pods"
        )
    return value


def _gpu_uuid(value: str | None) -> str | None:
    if value is not None and not is_gpu_uuid(value):
        raise ValueError(f"{value[:80]!r} is not a GPU id (GPU-<uuid>, cuda:<n> or cpu)")
    return value


JobName = Annotated[str, AfterValidator(_job_name)]
"""A report's ``job``: bounded and corroborated by the job-name label of the job's pods
(``sdc_contract.names.JOB_NAME``)."""
Name = Annotated[str, StringConstraints(max_length=MAX_SUBDOMAIN_CHARS)]
"""A node, pod or instance name as a report carries it: bounded here, checked where it is used
(localize checks each against Kubernetes and HyperPod)."""
GpuUuid = Annotated[str | None, AfterValidator(_gpu_uuid)]


class RankInfo(_Model):
    """Where one global rank runs, as the agent reports it."""

    node_name: Name | None = None
    instance_id: Name | None = None
    gpu_uuid: GpuUuid = None
    local_rank: int | None = Field(default=None, ge=0, le=65535)
    pod_name: Name | None = None


RankMapping = Annotated[dict[str, RankInfo], AfterValidator(_rank_keyed)]
"""Ranks keyed by the global rank as a decimal string (``sdc_contract.report.check_rank_keys``)."""
SuspectWindow = Annotated[list[LedgerInt], AfterValidator(_window)]
"""``[first, last]`` step, ``0 <= first <= last`` (``sdc_contract.report.check_window``)."""


class VerdictEntry(_Model):
    """One confirmation result: the pair replayed, the third GPU, whom it blames, and how."""

    pair: list[LedgerRank]
    third: LedgerRank | None = None
    suspect: LedgerRank | None = None
    kind: str = Field(max_length=64)
    """How the confirmation settled (``sdc_contract.report.VERDICT_KINDS``). Kept as the agent
    wrote it: a newer agent's kind is not refused here, and whatever the pipeline derives from it
    reads ``unknown`` (``sdc_contract.report.verdict_name``)."""


class ReportMetric(_Model):
    """Which SDC metric the report incremented and by how much."""

    name: str
    value: LedgerFloat


class Report(_Model):
    """One ``sdc.alarm/v1`` log event, written by the agent next to the metrics."""

    report_schema: Literal[ALARM_SCHEMA] = Field(alias="schema")  # type: ignore[valid-type]  # the contract's constant; PEP 586 allows no name
    cluster: str = Field(max_length=256)
    job: JobName
    time: datetime
    step: LedgerInt
    """Every integer of a report is within the ledger's range, refused here with its field named
    otherwise: steps and passes ``LedgerInt`` (``0 <= n < 2**63``), ranks ``LedgerRank``
    (``|n| < 2**63``)."""
    check: Check
    nonfinite: list[LedgerRank] = Field(default_factory=list)
    mismatched_pairs: list[list[LedgerRank]] = Field(default_factory=list)
    culprits: list[LedgerRank] = Field(default_factory=list)
    verdicts: list[VerdictEntry] = Field(default_factory=list)
    suspects: list[LedgerRank] | None = None
    suspect_window: SuspectWindow = Field(default_factory=lambda: [0, 0])
    last_audit_pass: LedgerInt | None = None
    last_weight_check_pass: LedgerInt | None = None
    divergent_tensors: list[str] = Field(default_factory=list)
    ranks: RankMapping = Field(default_factory=dict)
    metric: ReportMetric | None = None
    log_stream: str | None = Field(default=None, exclude=True)
    """Where localize read the report (not part of the agent's schema)."""
    canary_run: str | None = Field(default=None, max_length=64)
    """Set only by the canary function (``logic/canary/start.py``): the run this synthetic
    report belongs to, which localize checks against the run the canary recorded in the ledger."""


class RankMap(_Model):
    """The ``sdc.rankmap/v1`` event the agent writes at job start."""

    report_schema: Literal[RANKMAP_SCHEMA] = Field(alias="schema")  # type: ignore[valid-type]  # the contract's constant; PEP 586 allows no name
    cluster: str = Field(max_length=256)
    job: JobName
    time: datetime
    ranks: RankMapping = Field(default_factory=dict)


__all__ = [
    "GpuUuid",
    "JobName",
    "Name",
    "RankInfo",
    "RankMap",
    "RankMapping",
    "Report",
    "ReportMetric",
    "SuspectWindow",
    "VerdictEntry",
]
