"""The agent's report (schema ``sdc.alarm/v1``) and rank map (``sdc.rankmap/v1``) as localize
reads them from CloudWatch Logs. Keys, check and verdict names are the contract's
(``sdc_contract.report``); reports are written by training pods, so nothing here is trusted
until localize checked it against HyperPod and Kubernetes.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import AfterValidator, Field

from sdc_contract.report import (
    ALARM_SCHEMA,
    RANKMAP_SCHEMA,
    Check,
    check_rank_keys,
    check_window,
)

from .base import Model as _Model


def _rank_keyed(value: dict[str, RankInfo]) -> dict[str, RankInfo]:
    check_rank_keys(value)
    return value


def _window(value: list[int]) -> list[int]:
    check_window(value)
    return value


class RankInfo(_Model):
    """Where one global rank runs, as the agent reports it."""

    node_name: str | None = None
    instance_id: str | None = None
    gpu_uuid: str | None = None
    local_rank: int | None = None
    pod_name: str | None = None


RankMapping = Annotated[dict[str, RankInfo], AfterValidator(_rank_keyed)]
"""Ranks keyed by the global rank as a decimal string (``sdc_contract.report.check_rank_keys``)."""
SuspectWindow = Annotated[list[int], AfterValidator(_window)]
"""``[first, last]`` step, ``0 <= first <= last`` (``sdc_contract.report.check_window``)."""


class VerdictEntry(_Model):
    """One confirmation result: the pair replayed, the third GPU, whom it blames, and how."""

    pair: list[int]
    third: int | None = None
    suspect: int | None = None
    kind: str
    """How the confirmation settled (``sdc_contract.report.VERDICT_KINDS``). Kept as the agent
    wrote it: a newer agent's kind is not refused here, and whatever the pipeline derives from it
    reads ``unknown`` (``sdc_contract.report.verdict_name``)."""


class ReportMetric(_Model):
    """Which SDC metric the report incremented and by how much."""

    name: str
    value: float


class Report(_Model):
    """One ``sdc.alarm/v1`` log event, written by the agent next to the metrics."""

    report_schema: Literal[ALARM_SCHEMA] = Field(alias="schema")
    cluster: str
    job: str
    time: datetime
    step: int
    check: Check
    nonfinite: list[int] = Field(default_factory=list)
    mismatched_pairs: list[list[int]] = Field(default_factory=list)
    culprits: list[int] = Field(default_factory=list)
    verdicts: list[VerdictEntry] = Field(default_factory=list)
    suspects: list[int] | None = None
    suspect_window: SuspectWindow = Field(default_factory=lambda: [0, 0])
    last_audit_pass: int | None = None
    last_weight_check_pass: int | None = None
    divergent_tensors: list[str] = Field(default_factory=list)
    ranks: RankMapping = Field(default_factory=dict)
    metric: ReportMetric | None = None
    log_stream: str | None = Field(default=None, exclude=True)
    """Where localize read the report (not part of the agent's schema)."""
    canary_run: str | None = None
    """Set only by the canary function (``logic/canary/start.py``): the run this synthetic
    report belongs to, which localize checks against the run the canary recorded in the ledger."""


class RankMap(_Model):
    """The ``sdc.rankmap/v1`` event the agent writes at job start."""

    report_schema: Literal[RANKMAP_SCHEMA] = Field(alias="schema")
    cluster: str
    job: str
    time: datetime
    ranks: RankMapping = Field(default_factory=dict)


__all__ = [
    "RankInfo",
    "RankMap",
    "RankMapping",
    "Report",
    "ReportMetric",
    "SuspectWindow",
    "VerdictEntry",
]
