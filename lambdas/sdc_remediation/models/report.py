"""The agent's report (schema ``sdc.alarm/v1``) and rank map (``sdc.rankmap/v1``) as localize
reads them from CloudWatch Logs. Keys, check and verdict names are the contract's
(``sdc_contract.report``); reports are written by training pods, so nothing here is trusted
until localize checked it against HyperPod and Kubernetes.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field, field_validator

from sdc_contract.report import (
    ALARM_SCHEMA,
    RANKMAP_SCHEMA,
    Check,
    check_rank_keys,
    check_window,
)

from .base import Model as _Model


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
    suspect_window: list[int] = Field(default_factory=lambda: [0, 0])
    last_audit_pass: int | None = None
    last_weight_check_pass: int | None = None
    divergent_tensors: list[str] = Field(default_factory=list)
    ranks: dict[str, RankInfo] = Field(default_factory=dict)
    metric: ReportMetric | None = None
    log_stream: str | None = Field(default=None, exclude=True)
    """Where localize read the report (not part of the agent's schema)."""
    canary_run: str | None = None
    """Set only by the canary function (``logic/canary/start.py``): the run this synthetic
    report belongs to, which localize checks against the run the canary recorded in the ledger."""

    @field_validator("ranks")
    @classmethod
    def _rank_keys(cls, value: dict[str, RankInfo]) -> dict[str, RankInfo]:
        check_rank_keys(value)
        return value

    @field_validator("suspect_window")
    @classmethod
    def _suspect_window(cls, value: list[int]) -> list[int]:
        check_window(value)
        return value


class RankMap(_Model):
    """The ``sdc.rankmap/v1`` event the agent writes at job start."""

    report_schema: Literal[RANKMAP_SCHEMA] = Field(alias="schema")
    cluster: str
    job: str
    time: datetime
    ranks: dict[str, RankInfo] = Field(default_factory=dict)

    @field_validator("ranks")
    @classmethod
    def _rank_keys(cls, value: dict[str, RankInfo]) -> dict[str, RankInfo]:
        check_rank_keys(value)
        return value


__all__ = ["RankInfo", "RankMap", "Report", "ReportMetric", "VerdictEntry"]
